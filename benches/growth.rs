//! Does throughput hold as the store grows? Claim+commit pairs from 64 clients measured with
//! 10,000 keys stored and again with 1,000,000, plus the file size per stored pair before and
//! after `compact`.
//!
//! `cargo bench --bench growth` (about 2 minutes). The machine is noisy, so runs alternate
//! between the two sizes (five runs of 1 s each, medians compared): a fresh store loaded with
//! 10,000 keys for every small run (so it stays small), and one store loaded to 1,000,000 keys
//! (each run adds keys to it; the count at the start of each run is printed).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::ORDERS;
use idemstore::Store;

const CLIENTS: u64 = 64;

fn pair(store: &Store, i: u64) {
    common::pair(store, &common::scope(i, format!("key-{i:012}")));
}

/// Pairs per second from 64 clients: for `duration`, or until `until` keys exist.
fn run(store: &Store, next: &AtomicU64, duration: Option<Duration>, until: u64) -> f64 {
    let stop = AtomicBool::new(false);
    let start = next.load(Ordering::Relaxed);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= until {
                        break;
                    }
                    pair(store, i);
                }
            });
        }
        if let Some(d) = duration {
            std::thread::sleep(d);
            stop.store(true, Ordering::Relaxed);
        }
    });
    let done = next.load(Ordering::Relaxed).min(until.max(start)) - start;
    done as f64 / started.elapsed().as_secs_f64()
}

fn timed(store: &Store, next: &AtomicU64, label: &str) -> f64 {
    let at = store.exact_stats().expect("counts").records;
    let rate = run(store, next, Some(Duration::from_secs(1)), u64::MAX);
    println!("  {label} store, run starting at {at} keys: {rate:.0} pairs/s");
    rate
}

fn median(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

fn file_len(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("idemstore.redb")).map_or(0, |m| m.len())
}

fn open(dir: &Path) -> Store {
    Store::builder().table(ORDERS).open(dir).expect("open")
}

fn main() {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path());
    let next = AtomicU64::new(0);
    let target = 1_000_000;
    let loaded = run(&store, &next, None, target);
    println!("loaded {target} keys ({loaded:.0} pairs/s while loading)");
    let (mut small, mut large) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let small_dir = tempfile::tempdir().expect("dir");
        let small_store = open(small_dir.path());
        let small_next = AtomicU64::new(0);
        run(&small_store, &small_next, None, 10_000);
        small.push(timed(&small_store, &small_next, "10k"));
        drop(small_store);
        large.push(timed(&store, &next, "1M"));
    }
    let (small, large) = (median(small), median(large));
    println!(
        "\nthroughput at 1M keys / at 10k keys: {:.2} ({large:.0} / {small:.0} pairs/s, medians of 5 interleaved runs)",
        large / small
    );

    store.checkpoint().expect("checkpoint");
    let records = store.exact_stats().expect("counts").records;
    let before = file_len(dir.path());
    let compacted = store.compact().expect("compact");
    println!(
        "database file: {:.0} MB for {records} pairs = {:.0} bytes/pair; after compact {:.0} MB = {:.0} bytes/pair",
        before as f64 / 1e6,
        before as f64 / records as f64,
        compacted.bytes_after as f64 / 1e6,
        compacted.bytes_after as f64 / records as f64
    );
}
