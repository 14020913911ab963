//! Seeded random workloads for crash cases: deterministic for a seed, so a failure is
//! reproduced by its seed alone.

use super::crash::CrashOp;

/// SplitMix64: tiny, fast, and good enough to shuffle test workloads.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A workload of `len` steps over `keys` keys, weighted towards claims and commits.
pub fn workload(seed: u64, len: usize, keys: u8) -> Vec<CrashOp> {
    let mut rng = Rng::new(seed);
    let keys = u64::from(keys.max(1));
    (0..len)
        .map(|_| {
            // `below(keys)` is below 256: keys is a u8.
            let key = rng.below(keys) as u8;
            match rng.below(100) {
                0..=29 => CrashOp::Begin {
                    key,
                    other_request: rng.below(10) == 0,
                },
                30..=47 => CrashOp::Commit {
                    key,
                    rows: rng.below(4) as u8,
                    abort: rng.below(8) == 0,
                },
                48..=54 => CrashOp::Execute {
                    key,
                    other_request: rng.below(10) == 0,
                    rows: rng.below(4) as u8,
                    abort: rng.below(8) == 0,
                },
                55..=61 => CrashOp::Release { key },
                62..=67 => CrashOp::Extend {
                    key,
                    secs: 1 + rng.below(20) as u8,
                },
                68..=73 => CrashOp::Checkpoint { key },
                74..=78 => CrashOp::StoreCheckpoint,
                79..=83 => CrashOp::Evict,
                84..=93 => CrashOp::Advance {
                    secs: rng.below(40) as u8,
                },
                _ => CrashOp::Write {
                    n: rng.below(200) as u8,
                },
            }
        })
        .collect()
}
