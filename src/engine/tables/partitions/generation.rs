//! Generations: sixteen consecutive partitions under one filter of all their keys, so that a
//! lookup probes one filter block per generation rather than one per partition.
//!
//! A lookup of a key no partition holds (every new key) costs one cache line per filter it
//! probes; with a filter per partition that grows with the store (150 partitions at 10M
//! records). A generation's filter holds the keys of all its partitions, so such a lookup
//! probes a sixteenth as many; only a generation that may hold the key has its partitions'
//! own filters probed, to find which one does.
//!
//! A generation's filter lives in memory only: when the store opens, it is rebuilt from the
//! hashes of its partitions' keys, which each partition's row keeps (a full generation's
//! filter is 2 MiB; written at every seal it cost writes and, in the allocator, memory).

use super::filter::Filter;
use super::partition::PartitionNo;

/// Partitions a generation holds: numbers `16 g ..= 16 g + 15`.
pub(crate) const PARTITIONS_PER_GENERATION: u32 = 16;
/// Bits per key of a generation's filter: about 0.1% false positives.
pub(crate) const GENERATION_BITS: u64 = 16;

/// A generation's number: a partition's number divided by sixteen.
pub(crate) type GenerationNo = u32;

/// The generation partition `number` belongs to.
pub(crate) fn generation_of(number: PartitionNo) -> GenerationNo {
    number / PARTITIONS_PER_GENERATION
}

#[derive(Debug)]
pub(crate) struct Generation {
    number: GenerationNo,
    filter: Filter,
}

impl Generation {
    /// An empty generation whose partitions take `partition_records` records each.
    pub(crate) fn new(number: GenerationNo, partition_records: u64) -> Self {
        Generation {
            number,
            filter: Filter::with_capacity(
                partition_records.saturating_mul(u64::from(PARTITIONS_PER_GENERATION)),
                GENERATION_BITS,
            ),
        }
    }

    pub(crate) fn number(&self) -> GenerationNo {
        self.number
    }

    /// Whether one of its partitions may hold a key with this hash.
    pub(crate) fn may_hold(&self, hash: u64) -> bool {
        self.filter.may_contain(hash)
    }

    /// Adds a key written to one of its partitions.
    pub(crate) fn insert(&self, hash: u64) {
        self.filter.insert(hash);
    }

    /// Memory its filter takes.
    pub(crate) fn filter_bytes(&self) -> usize {
        self.filter.bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_partitions_a_generation() {
        assert_eq!(generation_of(0), 0);
        assert_eq!(generation_of(15), 0);
        assert_eq!(generation_of(16), 1);
        let g = Generation::new(3, 100);
        g.insert(7);
        assert!(g.may_hold(7));
        assert_eq!(g.number(), 3);
    }
}
