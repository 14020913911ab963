//! Reopen times after a crash: `Wal` mode with 1,000,000 records and about 100 MB of log past
//! the last checkpoint (replay), and `Redb` mode with the same records (redb's full repair,
//! since `Redb` mode commits without quick-repair).
//!
//! `cargo bench --bench recovery` (defaults: 1,000,000 records, 100 MB of log). Smaller runs:
//! `cargo bench --bench recovery -- 100000 10`. Each store is prepared by a child process that
//! exits without closing the store (no checkpoint at close, no clean redb shutdown), which is a
//! crash as far as the store can tell; the parent then times the reopen.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::ORDERS;
use idemstore::{Durability, Store};

const THREADS: u64 = 64;

fn open(dir: &Path, durability: Durability) -> Result<Store, idemstore::OpenError> {
    Store::builder()
        .durability(durability)
        .table(ORDERS)
        // No time-based checkpoints while preparing: the log past the last checkpoint is
        // exactly what the preparation wrote after its explicit checkpoint.
        .checkpoint_interval(Duration::from_secs(3600))
        .checkpoint_bytes(4 << 30)
        .open(dir)
}

/// Claims and commits `count` new keys from 64 threads. Returns the pairs per second.
fn load(store: &Store, prefix: &str, count: u64) -> f64 {
    common::pairs_from_threads(store, THREADS, count, |i| format!("{prefix}-{i:010}"))
}

/// The child: prepare a store, then exit without closing it.
fn prepare(dir: &Path, mode: &str, records: u64, log_mb: u64) {
    let durability = if mode == "wal" {
        Durability::Wal
    } else {
        Durability::Redb
    };
    let store = open(dir, durability).expect("open");
    let rate = load(&store, "base", records);
    eprintln!("  prepared {records} records ({rate:.0} pairs/s)");
    if durability == Durability::Wal {
        store.checkpoint().expect("checkpoint");
        let before = store.stats().expect("stats").log_bytes;
        let mut batch = 0;
        while store.stats().expect("stats").log_bytes - before < log_mb << 20 {
            load(&store, &format!("tail{batch}"), 10_000);
            batch += 1;
        }
        eprintln!(
            "  then {:.1} MB of log past the checkpoint",
            (store.stats().expect("stats").log_bytes - before) as f64 / 1e6
        );
    }
    // Exit with the store open: no checkpoint at close, no clean redb shutdown.
    std::process::exit(0);
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_size(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    if args.first().map(String::as_str) == Some("prepare") {
        let records = args[3].parse().expect("records");
        let log_mb = args[4].parse().expect("log MB");
        prepare(Path::new(&args[1]), &args[2], records, log_mb);
        return;
    }
    let records: u64 = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let log_mb: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let base =
        std::env::var("IDEMSTORE_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    for (mode, durability) in [("wal", Durability::Wal), ("redb", Durability::Redb)] {
        let dir = base.join(format!("idemstore-recovery-{mode}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        println!(
            "{mode}: preparing {records} records{}",
            if mode == "wal" {
                format!(" and {log_mb} MB of log")
            } else {
                String::new()
            }
        );
        let status = Command::new(std::env::current_exe().expect("exe"))
            .args([
                "prepare",
                &dir.to_string_lossy(),
                mode,
                &records.to_string(),
                &log_mb.to_string(),
            ])
            .status()
            .expect("child");
        assert!(status.success(), "prepare failed");
        let size = dir_size(&dir);
        let db_size = std::fs::metadata(dir.join("idemstore.redb")).map_or(0, |m| m.len());
        // redb's own recovery first, on the raw file, with a callback that tells whether redb
        // had to repair (walk the file to rebuild its allocator state).
        let repaired = Arc::new(AtomicU64::new(0));
        let flag = repaired.clone();
        let started = Instant::now();
        let raw = idemstore::redb::Database::builder()
            .set_repair_callback(move |_| {
                flag.store(1, Ordering::Relaxed);
            })
            .open(dir.join("idemstore.redb"))
            .expect("redb reopen");
        let redb_reopen = started.elapsed();
        drop(raw);
        // Then the store: for Wal, the log replay.
        let started = Instant::now();
        let store = open(&dir, durability).expect("reopen after the crash");
        let store_reopen = started.elapsed();
        let report = store.recovery_report().clone();
        let counts = store.exact_stats().expect("counts");
        println!(
            "{mode}: {} records, {:.0} MB on disk ({:.0} MB redb file); redb reopen {:.3} s (full repair: {}); \
             store reopen {:.3} s (replayed {} frames, {:.1} MB of log); total {:.3} s",
            counts.records,
            size as f64 / 1e6,
            db_size as f64 / 1e6,
            redb_reopen.as_secs_f64(),
            if repaired.load(Ordering::Relaxed) == 1 {
                "yes"
            } else {
                "no"
            },
            store_reopen.as_secs_f64(),
            report.frames_replayed,
            report.bytes_replayed as f64 / 1e6,
            (redb_reopen + store_reopen).as_secs_f64()
        );
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
