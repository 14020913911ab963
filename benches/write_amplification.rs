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
//!
//! Then **eviction**: random keys (the keys users send) at a steady rate on a manual clock, 16
//! clients, a TTL of 100 simulated seconds, one sweeper pass per simulated second (as the
//! background sweeper would run it, [`sweep_pass`]). One TTL fills the store, two more turn it
//! over. Printed with eviction and without it (a TTL longer than the run): redb bytes per
//! pair while filling and while turning over, the records held at the end against the
//! TTL's worth, and the epochs and checkpoints per 1,000 pairs of the fill. `EVICT_RATE` sets
//! pairs per simulated second (default 500: 50,000 live).

mod common;

use common::ORDERS;
use std::time::Duration;

use idemstore::testing::{SimDisk, sweep_pass};
use idemstore::{Backlog, Durability, ManualClock, Store, Sweep, Timestamp};

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
    modes(count);
    let rate = std::env::var("EVICT_RATE").map_or(500, |v| v.parse().expect("EVICT_RATE"));
    eviction(rate);
}

fn modes(count: u64) {
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

/// A random 32-hex-digit key for pair `i` (splitmix64 twice): no two pairs share one.
fn random_key(i: u64) -> String {
    format!("{:016x}{:016x}", common::mix(i), common::mix(!i))
}

fn eviction(rate: u64) {
    const TTL_S: u64 = 100;
    println!(
        "\n## eviction, random keys, {rate} pairs per simulated second, TTL {TTL_S} s ({} live)\n",
        rate * TTL_S
    );
    println!(
        "| eviction | fill, redb bytes/pair | turnover, redb bytes/pair | turnover, log bytes/pair | records at the end | removed by the sweeper | fill, epochs and checkpoints per 1,000 pairs |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let runs = [
        (
            "none (TTL longer than the run)",
            Duration::from_secs(1_000 * TTL_S),
        ),
        ("every simulated second", Duration::from_secs(TTL_S)),
    ];
    for (name, ttl) in runs {
        let disk = SimDisk::new();
        let clock = ManualClock::new(Timestamp::from_millis(1_764_000_000_000));
        let store = Store::builder()
            .clock(clock.clone())
            .ttl(ttl)
            .sweep(Sweep::Off)
            .table(ORDERS)
            .open_simulated(&disk)
            .expect("open");
        let mut filled = None;
        let mut swept = 0;
        for second in 0..3 * TTL_S {
            if second == TTL_S {
                let stats = store.stats().expect("stats");
                filled = Some((disk.counters(), stats.epochs, stats.checkpoints));
            }
            let first = second * rate;
            common::pairs_from_threads(&store, 16, rate, |i| random_key(first + i));
            clock.advance(Duration::from_secs(1));
            loop {
                let pass = sweep_pass(&store, 1_000).expect("sweep");
                swept += pass.removed as u64;
                if pass.backlog == Backlog::Empty {
                    break;
                }
            }
        }
        store.checkpoint().expect("checkpoint");
        let end = disk.counters();
        let (filled, epochs, checkpoints) = filled.expect("the fill ended");
        let per_thousand = |n: u64| n as f64 * 1_000.0 / (TTL_S * rate) as f64;
        let turnover = 2 * TTL_S * rate;
        let records = store.exact_stats().expect("stats").records;
        println!(
            "| {name} | {} | {} | {} | {records} ({:.2} of the TTL's worth) | {swept} | {:.1} and {:.2} |",
            filled.db_bytes / (TTL_S * rate),
            (end.db_bytes - filled.db_bytes) / turnover,
            (end.log_bytes - filled.log_bytes) / turnover,
            records as f64 / (TTL_S * rate) as f64,
            per_thousand(epochs),
            per_thousand(checkpoints),
        );
    }
}
