//! Reopen times after a crash: `Wal` mode with 1,000,000 records and about 100 MB of log past
//! the last checkpoint (replay, checkpoints held back: the worst case), `Wal` at default
//! settings (what a SIGKILL of a real service leaves), and `Redb` mode with the same records
//! (redb's full repair, since `Redb` mode commits without quick-repair). Then, for both `Wal`
//! stores, a reopen after a clean close (median of three).
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

/// How a store is prepared and opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `Wal`, checkpoints held back, a fixed amount of log past the last one.
    WalForcedLog,
    /// `Wal` at default settings.
    WalDefault,
    /// `Redb`.
    Redb,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::WalForcedLog, Mode::WalDefault, Mode::Redb];

    fn name(self) -> &'static str {
        match self {
            Mode::WalForcedLog => "wal",
            Mode::WalDefault => "wal-default",
            Mode::Redb => "redb",
        }
    }

    fn parse(name: &str) -> Mode {
        Mode::ALL
            .into_iter()
            .find(|m| m.name() == name)
            .expect("a mode")
    }
}

fn open(dir: &Path, mode: Mode) -> Result<Store, idemstore::OpenError> {
    let builder = Store::builder().table(ORDERS);
    match mode {
        Mode::WalForcedLog => builder
            .durability(Durability::Wal)
            // No time-based checkpoints while preparing: the log past the last checkpoint is
            // exactly what the preparation wrote after its explicit checkpoint.
            .checkpoint_interval(Duration::from_secs(3600))
            .checkpoint_bytes(4 << 30),
        Mode::WalDefault => builder.durability(Durability::Wal),
        Mode::Redb => builder.durability(Durability::Redb),
    }
    .open(dir)
}

/// Claims and commits `count` new keys from 64 threads. Returns the pairs per second.
fn load(store: &Store, prefix: &str, count: u64) -> f64 {
    common::pairs_from_threads(store, THREADS, count, |i| format!("{prefix}-{i:010}"))
}

/// The child: prepare a store, then exit without closing it.
fn prepare(dir: &Path, mode: Mode, records: u64, log_mb: u64) {
    let store = open(dir, mode).expect("open");
    let rate = load(&store, "base", records);
    eprintln!("  prepared {records} records ({rate:.0} pairs/s)");
    if mode == Mode::WalForcedLog {
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
        prepare(Path::new(&args[1]), Mode::parse(&args[2]), records, log_mb);
        return;
    }
    let records: u64 = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let log_mb: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let base =
        std::env::var("IDEMSTORE_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    for mode in Mode::ALL {
        let dir = base.join(format!(
            "idemstore-recovery-{}-{}",
            mode.name(),
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        println!(
            "{}: preparing {records} records{}",
            mode.name(),
            if mode == Mode::WalForcedLog {
                format!(" and {log_mb} MB of log")
            } else {
                String::new()
            }
        );
        let status = Command::new(std::env::current_exe().expect("exe"))
            .args([
                "prepare",
                &dir.to_string_lossy(),
                mode.name(),
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
        let store = open(&dir, mode).expect("reopen after the crash");
        let store_reopen = started.elapsed();
        let report = store.recovery_report().clone();
        let counts = store.exact_stats().expect("counts");
        println!(
            "{}: {} records, {:.0} MB on disk ({:.0} MB redb file); redb reopen {:.3} s (full repair: {}); \
             store reopen {:.3} s (replayed {} frames, {:.1} MB of log); total {:.3} s",
            mode.name(),
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
        if mode != Mode::Redb {
            // A clean close checkpoints: the reopen replays nothing but still reads the live
            // segment to its end.
            let mut clean = Vec::new();
            for _ in 0..3 {
                let started = Instant::now();
                let store = open(&dir, mode).expect("reopen after a clean close");
                clean.push(started.elapsed());
                drop(store);
            }
            clean.sort();
            println!(
                "{}: reopen after a clean close {:.3} s (median of 3: {})",
                mode.name(),
                clean[1].as_secs_f64(),
                clean
                    .iter()
                    .map(|d| format!("{:.3}", d.as_secs_f64()))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
