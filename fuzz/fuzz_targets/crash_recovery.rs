//! An arbitrary workload, crash point and fault kind (and a second fault while the store heals
//! from the first), checked against the reference model in `idemstore::testing` (the same
//! body the crash matrix test runs on stable).
#![no_main]

use arbitrary::Arbitrary;
use idemstore::Durability;
use idemstore::testing::{CrashCase, CrashOp, Fault, SecondFault, Tear, Then, run_case};
use libfuzzer_sys::fuzz_target;

/// Longest workload tried: long enough for checkpoints and segment reuse, short enough that
/// each input runs in milliseconds.
const MAX_STEPS: usize = 64;
/// Keys in play: few, so that steps collide.
const KEYS: u8 = 4;

#[derive(Debug, Arbitrary)]
enum FuzzFault {
    None,
    CrashAt(u16),
    FailAt(u16),
    FailSync(u8),
    FullAt(u16),
}

/// A second fault, some operations after the first.
#[derive(Debug, Arbitrary)]
enum FuzzThen {
    None,
    Fail(u8),
    Full(u8),
    Crash(u8),
}

#[derive(Debug, Arbitrary)]
enum FuzzOp {
    Begin { key: u8, other_request: bool },
    Commit { key: u8, rows: u8, abort: bool },
    Execute { key: u8, other_request: bool, rows: u8, abort: bool },
    Release { key: u8 },
    Extend { key: u8, secs: u8 },
    Checkpoint { key: u8 },
    StoreCheckpoint,
    Evict,
    Advance { secs: u8 },
    Write { n: u8 },
}

#[derive(Debug, Arbitrary)]
struct Input {
    redb_mode: bool,
    fault: FuzzFault,
    then: FuzzThen,
    torn_sectors: u8,
    ops: Vec<FuzzOp>,
}

impl FuzzOp {
    fn bounded(self) -> CrashOp {
        match self {
            FuzzOp::Begin { key, other_request } => CrashOp::Begin {
                key: key % KEYS,
                other_request,
            },
            FuzzOp::Commit { key, rows, abort } => CrashOp::Commit {
                key: key % KEYS,
                rows: rows % 4,
                abort,
            },
            FuzzOp::Execute {
                key,
                other_request,
                rows,
                abort,
            } => CrashOp::Execute {
                key: key % KEYS,
                other_request,
                rows: rows % 4,
                abort,
            },
            FuzzOp::Release { key } => CrashOp::Release { key: key % KEYS },
            FuzzOp::Extend { key, secs } => CrashOp::Extend {
                key: key % KEYS,
                secs: 1 + secs % 30,
            },
            FuzzOp::Checkpoint { key } => CrashOp::Checkpoint { key: key % KEYS },
            FuzzOp::StoreCheckpoint => CrashOp::StoreCheckpoint,
            FuzzOp::Evict => CrashOp::Evict,
            FuzzOp::Advance { secs } => CrashOp::Advance { secs: secs % 90 },
            FuzzOp::Write { n } => CrashOp::Write { n },
        }
    }
}

fuzz_target!(|input: Input| {
    let case = CrashCase {
        durability: if input.redb_mode {
            Durability::Redb
        } else {
            Durability::Wal
        },
        ops: input
            .ops
            .into_iter()
            .take(MAX_STEPS)
            .map(FuzzOp::bounded)
            .collect(),
        fault: match input.fault {
            FuzzFault::None => Fault::None,
            FuzzFault::CrashAt(n) => Fault::CrashAt(u64::from(n)),
            FuzzFault::FailAt(n) => Fault::FailAt(u64::from(n)),
            FuzzFault::FailSync(n) => Fault::FailSync(u64::from(n)),
            FuzzFault::FullAt(n) => Fault::FullAt(u64::from(n)),
        },
        tear: match input.torn_sectors % 4 {
            0 => Tear::Drop,
            n => Tear::Sectors(u64::from(n)),
        },
        then: match input.then {
            FuzzThen::None => None,
            FuzzThen::Fail(n) => second(n, SecondFault::Fail),
            FuzzThen::Full(n) => second(n, SecondFault::Full),
            FuzzThen::Crash(n) => second(n, SecondFault::Crash),
        },
    };
    if let Err(violation) = run_case(&case) {
        panic!("{violation}\n{case:?}");
    }
});

/// A second fault `1 + n % 32` operations after the first: within the heal that follows it.
fn second(n: u8, fault: SecondFault) -> Option<Then> {
    Some(Then {
        after: 1 + u64::from(n % 32),
        fault,
    })
}
