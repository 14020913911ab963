//! A blocked Bloom filter: which keys a partition may hold.
//!
//! Each key sets 8 bits inside one 64-byte block (one cache line), chosen by the low bits of
//! its hash; the bits inside the block come from the high bits. A probe therefore touches one
//! cache line. At 16 bits per key a filter answers "maybe" for about 0.1% of the keys it does
//! not hold, at 8 bits about 2.5% (a unit test measures both), and never answers "no" for a key
//! it holds: a "maybe" only costs a lookup that finds nothing, so answers stay exact.
//!
//! The number of blocks is a power of two, so a filter can be **folded** in half (block `i`
//! OR block `i + n/2`) and every key still finds its bits: a partition sealed before it filled
//! up keeps a filter sized for what it holds.
//!
//! Bits are atomic: the writer adds keys to the open partition's filter while readers probe
//! it. A key's bits are set before its record is acknowledged, so a reader that starts after
//! the acknowledgement sees them.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bits set per key, all in one block.
const PROBES: u32 = 8;
/// Words (of 64 bits) per block: 512 bits, one cache line.
const WORDS: usize = 8;
/// Bytes of one encoded block.
const BLOCK_BYTES: usize = WORDS * 8;
/// The most blocks a filter has: 2^24 blocks (1 GiB), far past any partition.
const MAX_BLOCKS: u64 = 1 << 24;

#[repr(align(64))]
#[derive(Debug, Default)]
struct Block([AtomicU64; WORDS]);

/// A set of 64-bit hashes with false positives and no false negatives.
#[derive(Debug)]
pub(crate) struct Filter {
    blocks: Box<[Block]>,
    /// Bits per key it is sized for (and folded down to).
    bits_per_key: u64,
}

/// The word and bit masks a hash sets in its block.
fn bits(hash: u64) -> impl Iterator<Item = (usize, u64)> {
    // The block index uses the low bits; these come from the high ones, remixed per probe.
    let mut x = hash.rotate_left(32) | 1;
    (0..PROBES).map(move |_| {
        x = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let bit = x >> 55; // 0..512
        ((bit >> 6) as usize, 1u64 << (bit & 63))
    })
}

impl Filter {
    /// An empty filter for about `keys` keys at `bits_per_key`.
    pub(crate) fn with_capacity(keys: u64, bits_per_key: u64) -> Self {
        let blocks = blocks_for(keys, bits_per_key);
        Filter {
            blocks: (0..blocks).map(|_| Block::default()).collect(),
            bits_per_key,
        }
    }

    fn block(&self, hash: u64) -> &Block {
        let mask = self.blocks.len() as u64 - 1;
        &self.blocks[(hash & mask) as usize]
    }

    /// Adds a key's hash.
    pub(crate) fn insert(&self, hash: u64) {
        let block = self.block(hash);
        for (word, mask) in bits(hash) {
            block.0[word].fetch_or(mask, Ordering::Release);
        }
    }

    /// `false` if the key was never inserted; `true` if it may have been.
    pub(crate) fn may_contain(&self, hash: u64) -> bool {
        let block = self.block(hash);
        bits(hash).all(|(word, mask)| block.0[word].load(Ordering::Acquire) & mask != 0)
    }

    /// A copy folded down to the fewest blocks that still hold `keys` keys at its bits per
    /// key: a sealed partition's filter, sized for what it holds.
    pub(crate) fn folded_for(&self, keys: u64) -> Filter {
        Filter::from_words(&self.folded_words(keys), self.bits_per_key)
    }

    /// The words of [`Filter::folded_for`], in one pass: folding in half until `target`
    /// blocks is OR-ing every block into block `index mod target`.
    fn folded_words(&self, keys: u64) -> Vec<u64> {
        let target = blocks_for(keys, self.bits_per_key).min(self.blocks.len() as u64) as usize;
        let mut words = vec![0u64; target * WORDS];
        for (j, block) in self.blocks.iter().enumerate() {
            let at = (j % target) * WORDS;
            for (w, word) in block.0.iter().enumerate() {
                words[at + w] |= word.load(Ordering::Acquire);
            }
        }
        words
    }

    fn from_words(words: &[u64], bits_per_key: u64) -> Filter {
        Filter {
            blocks: words
                .chunks_exact(WORDS)
                .map(|chunk| Block(std::array::from_fn(|i| AtomicU64::new(chunk[i]))))
                .collect(),
            bits_per_key,
        }
    }

    /// Memory the filter's bits take.
    pub(crate) fn bytes(&self) -> usize {
        self.blocks.len() * BLOCK_BYTES
    }

    /// `u8 bits per key ‖ u32 LE block count ‖ each block's 8 words, u64 LE`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(5 + self.bytes());
        out.push(self.bits_per_key as u8);
        out.extend_from_slice(&(self.blocks.len() as u32).to_le_bytes());
        for block in self.blocks.iter() {
            for word in &block.0 {
                out.extend_from_slice(&word.load(Ordering::Acquire).to_le_bytes());
            }
        }
    }

    /// The filter [`Filter::encode`] wrote at the start of `bytes`, and the bytes after it.
    pub(crate) fn decode(bytes: &[u8]) -> Result<(Filter, &[u8]), String> {
        let (&bits_per_key, bytes) = bytes
            .split_first()
            .ok_or("the filter's bits per key are cut off")?;
        if !(1..=64).contains(&bits_per_key) {
            return Err(format!("a filter of {bits_per_key} bits a key (1 to 64)"));
        }
        let (count, rest) = bytes
            .split_first_chunk::<4>()
            .ok_or("the filter's block count is cut off")?;
        let count = u32::from_le_bytes(*count) as usize;
        if count == 0 || !count.is_power_of_two() || count as u64 > MAX_BLOCKS {
            return Err(format!(
                "a filter of {count} blocks (a power of two, at most {MAX_BLOCKS})"
            ));
        }
        let len = count * BLOCK_BYTES;
        if rest.len() < len {
            return Err(format!(
                "the filter needs {len} bytes, {} are left",
                rest.len()
            ));
        }
        let (body, rest) = rest.split_at(len);
        let words: Vec<u64> = body
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .collect();
        Ok((Filter::from_words(&words, u64::from(bits_per_key)), rest))
    }
}

/// Blocks for `keys` keys at `bits_per_key`: a power of two, at least one.
fn blocks_for(keys: u64, bits_per_key: u64) -> u64 {
    let bits = keys.saturating_mul(bits_per_key);
    bits.div_ceil(WORDS as u64 * 64)
        .max(1)
        .next_power_of_two()
        .min(MAX_BLOCKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64's output: well-spread hashes for the tests.
    fn hash(i: u64) -> u64 {
        let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn false_positives(filter: &Filter, from: u64, n: u64) -> f64 {
        let hits = (from..from + n)
            .filter(|&i| filter.may_contain(hash(i)))
            .count();
        hits as f64 / n as f64
    }

    #[test]
    fn holds_every_key_and_few_others() {
        let keys = 65_536;
        for (bits, most) in [(16, 0.002), (8, 0.04)] {
            let filter = Filter::with_capacity(keys, bits);
            assert_eq!(filter.bytes() as u64, (keys * bits / 8).next_power_of_two());
            for i in 0..keys {
                filter.insert(hash(i));
            }
            assert!(
                (0..keys).all(|i| filter.may_contain(hash(i))),
                "no false negative"
            );
            let rate = false_positives(&filter, 1 << 40, 200_000);
            assert!(rate < most, "{bits} bits a key: false positives {rate}");
        }
    }

    #[test]
    fn folding_keeps_every_key() {
        let filter = Filter::with_capacity(65_536, 16);
        for i in 0..5_000 {
            filter.insert(hash(i));
        }
        let folded = filter.folded_for(5_000);
        assert_eq!(folded.bytes() as u64, blocks_for(5_000, 16) * 64);
        assert!(folded.bytes() < filter.bytes());
        assert!((0..5_000).all(|i| folded.may_contain(hash(i))));
        let rate = false_positives(&folded, 1 << 40, 100_000);
        assert!(rate < 0.005, "false positives after folding {rate}");
        // Folding never grows a filter.
        assert_eq!(filter.folded_for(1 << 30).bytes(), filter.bytes());
    }

    #[test]
    fn round_trips_and_refuses_damage() -> Result<(), String> {
        let filter = Filter::with_capacity(1_000, 16);
        for i in 0..1_000 {
            filter.insert(hash(i));
        }
        let mut bytes = Vec::new();
        filter.encode(&mut bytes);
        bytes.extend_from_slice(b"rest");
        let (back, rest) = Filter::decode(&bytes)?;
        assert_eq!(rest, b"rest");
        assert!((0..1_000).all(|i| back.may_contain(hash(i))));
        assert!(Filter::decode(&bytes[..3]).is_err());
        assert!(Filter::decode(&bytes[..100]).is_err());
        let with_count = |n: u32| [&[16u8][..], &n.to_le_bytes()].concat();
        assert!(
            Filter::decode(&with_count(3)).is_err(),
            "not a power of two"
        );
        assert!(Filter::decode(&with_count(0)).is_err());
        assert!(Filter::decode(&[0u8, 1, 0, 0, 0]).is_err(), "no bits a key");
        Ok(())
    }
}
