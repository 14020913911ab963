//! Generations: sixteen consecutive partitions under one filter of all their keys, so that a
//! lookup probes one filter block per generation rather than one per partition.
//!
//! A lookup of a key no partition holds (every new key) costs one cache line per filter it
//! probes; with a filter per partition that grows with the store (150 partitions at 10M
//! records). A generation's filter holds the keys of all its partitions, so such a lookup
//! probes a sixteenth as many; only a generation that may hold the key has its partitions'
//! own filters probed, to find which one does.
//!
//! Row in `idemstore.generations` (key: the generation's number, u32 BE): `1 version = 1 ‖ the
//! filter` (`filter.rs`), folded to the keys it holds so far. It is written with every
//! partition row, so it covers every sealed partition of the generation (and the keys its
//! open partition had then); read back, it is grown to its full size again. A generation
//! without a usable row is rebuilt from its partitions' records when the store opens.

use super::filter::Filter;
use super::partition::PartitionNo;

/// Partitions a generation holds: numbers `16 g ..= 16 g + 15`.
pub(crate) const PARTITIONS_PER_GENERATION: u32 = 16;
/// Bits per key of a generation's filter: about 0.1% false positives.
pub(crate) const GENERATION_BITS: u64 = 16;
const VERSION: u8 = 1;

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
    /// Keys added so far (an upper bound: a key written twice counts twice), to fold its row.
    keys: std::sync::atomic::AtomicU64,
}

impl Generation {
    /// An empty generation whose partitions take `partition_records` records each.
    pub(crate) fn new(number: GenerationNo, partition_records: u64) -> Self {
        Generation {
            number,
            filter: Filter::with_capacity(full(partition_records), GENERATION_BITS),
            keys: Default::default(),
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
        self.keys.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts keys its row's filter holds already (read back at open), so that its next row
    /// is folded for all of them.
    pub(crate) fn holds(&self, keys: u64) {
        self.keys
            .fetch_add(keys, std::sync::atomic::Ordering::Relaxed);
    }

    /// Its row: the filter folded to the keys it holds.
    pub(crate) fn row(&self) -> Vec<u8> {
        let mut out = vec![VERSION];
        let keys = self.keys.load(std::sync::atomic::Ordering::Relaxed);
        self.filter.folded_for(keys).encode(&mut out);
        out
    }

    /// The generation a row describes, its filter grown to hold the keys of partitions of
    /// `partition_records` records; an error that says what is wrong with the row.
    pub(crate) fn from_row(
        number: GenerationNo,
        row: &[u8],
        partition_records: u64,
    ) -> Result<Self, String> {
        match row.split_first() {
            Some((&VERSION, rest)) => {
                let (filter, rest) = Filter::decode(rest)?;
                if !rest.is_empty() {
                    return Err(format!("{} bytes after the filter", rest.len()));
                }
                Ok(Generation {
                    number,
                    filter: filter.expanded_for(full(partition_records)),
                    keys: Default::default(),
                })
            }
            Some((version, _)) => Err(format!("row version {version}, this build reads {VERSION}")),
            None => Err("an empty row".into()),
        }
    }

    /// Memory its filter takes.
    pub(crate) fn filter_bytes(&self) -> usize {
        self.filter.bytes()
    }
}

/// The keys a generation of partitions of `partition_records` records holds when full.
fn full(partition_records: u64) -> u64 {
    partition_records.saturating_mul(u64::from(PARTITIONS_PER_GENERATION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_partitions_a_generation_and_rows_round_trip() -> Result<(), String> {
        assert_eq!(generation_of(0), 0);
        assert_eq!(generation_of(15), 0);
        assert_eq!(generation_of(16), 1);
        let g = Generation::new(3, 4_096);
        g.insert(7);
        let row = g.row();
        assert!(row.len() < 100, "folded to one key: {} bytes", row.len());
        let back = Generation::from_row(3, &row, 4_096)?;
        assert!(back.may_hold(7));
        assert_eq!(back.number(), 3);
        assert_eq!(
            back.filter_bytes(),
            g.filter_bytes(),
            "grown back to its full size"
        );
        assert!(Generation::from_row(3, &[], 4_096).is_err());
        assert!(Generation::from_row(3, &[9, 0, 0, 0, 0], 4_096).is_err());
        let mut extra = g.row();
        extra.push(0);
        assert!(Generation::from_row(3, &extra, 4_096).is_err());
        Ok(())
    }
}
