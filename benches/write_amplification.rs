//! Bytes written to disk, and syncs, per claim+commit pair, in each durability mode, counted
//! by the simulated disk (`idemstore::testing::SimDisk`) so the figures are exact and
//! independent of the machine.
//!
//! `cargo bench --bench write_amplification --features testing` (20,000 pairs per run; pass a
//! number to change it). The same pair as the throughput benches: a new key, a ~100-byte
//! business row and a ~200-byte response.
//!
//! "Log frames" is what the log appends (frame headers and payloads); "log file writes" adds
//! the zeros written once when a new segment file is preallocated (8 MiB each, until enough
//! segments exist to be reused between checkpoints), so it overstates the steady state for
//! short runs. "redb file writes" includes the final checkpoint at close.

mod common;

use common::ORDERS;
use idemstore::testing::SimDisk;
use idemstore::{Durability, Store};

fn pairs(store: &Store, threads: u64, count: u64) {
    common::pairs_from_threads(store, threads, count, |i| format!("key-{i:010}"));
}

fn main() {
    let count: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    println!(
        "| mode | clients | log frames, bytes/pair | log file writes, bytes/pair | redb file writes, bytes/pair | syncs/pair | groups/pair |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for durability in [Durability::Wal, Durability::Redb] {
        for threads in [1, 64] {
            let disk = SimDisk::new();
            let store = Store::builder()
                .durability(durability)
                .table(ORDERS)
                .open_simulated(&disk)
                .expect("open");
            let before = disk.counters();
            pairs(&store, threads, count);
            // Close: in Wal mode this is a checkpoint, the cost every logged byte eventually
            // pays in redb as well.
            let stats = store.stats().expect("stats");
            drop(store);
            let after = disk.counters();
            let per = |n: u64| n as f64 / count as f64;
            let log = after.log_bytes - before.log_bytes;
            let db = after.db_bytes - before.db_bytes;
            println!(
                "| {durability:?} | {threads} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
                per(stats.log_bytes),
                per(log),
                per(db),
                per(after.syncs() - before.syncs()),
                per(stats.groups_committed)
            );
        }
    }
}
