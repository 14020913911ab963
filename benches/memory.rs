//! Memory on a small box: peak RSS, pairs/s and replays/s at the default memory budget and at
//! 1 GiB, in the same run.
//!
//! `cargo bench --bench memory` (about 3 minutes). Each budget runs in a child process of its
//! own (this binary again), so that each peak RSS (`VmHWM`) is that budget's alone. A child:
//!
//! 1. writes 1,000,000 pairs (`IDEMSTORE_MEMORY_PAIRS` to change it) from 64 client threads,
//!    keys spread at random over the key space as real idempotency keys (UUIDs) are;
//! 2. replays the 10,000 most recent keys from 64 threads (`begin` answering `Replay`);
//! 3. closes the store, reopens it (redb's cache is empty: a cold read set) and replays
//!    100,000 keys picked at random from all 1,000,000.
//!
//! Targets (issue 19): at the default, peak RSS ≤ 2 × the budget + 32 MiB, pairs/s ≥ 0.8 × the
//! 1 GiB figure, and replays of recent keys as fast as at 1 GiB.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use common::{ORDERS, pair, scope};
use idemstore::{Begin, Fingerprint, Store};

const CLIENTS: u64 = 64;
const RECENT: u64 = 10_000;
const COLD: u64 = 100_000;
const CHILD: &str = "IDEMSTORE_MEMORY_CHILD";
const GIB: usize = 1 << 30;

/// A key for pair `i`: a random-looking 16-hex-digit name (splitmix64 of `i`).
fn key(i: u64) -> String {
    format!("{:016x}", common::mix(i))
}

/// Runs `op(i)` for `i` in `0..count` from 64 threads; returns operations per second.
fn from_threads(count: u64, op: impl Fn(u64) + Sync) -> f64 {
    let next = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    op(i);
                }
            });
        }
    });
    count as f64 / started.elapsed().as_secs_f64()
}

fn replay(store: &Store, i: u64) {
    let k = key(i);
    let answer = store
        .begin(&scope(i, k.clone()), Fingerprint::of_bytes(k.as_bytes()))
        .expect("begin");
    assert!(
        matches!(answer, Begin::Replay(_)),
        "pair {i} did not replay"
    );
}

/// The process's peak resident set, from `/proc/self/status`, in bytes.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM in /proc/self/status")
        * 1024
}

fn open(dir: &std::path::Path, budget: Option<usize>) -> Store {
    let builder = Store::builder().table(ORDERS);
    match budget {
        Some(bytes) => builder.memory_budget(bytes),
        None => builder,
    }
    .open(dir)
    .expect("open")
}

/// One budget's run, in this (child) process; prints one `RESULT` line for the parent.
fn child(budget: Option<usize>, pairs: u64) {
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path(), budget);
    let written = from_threads(pairs, |i| pair(&store, &scope(i, key(i))));
    let stats = store.stats().expect("stats");
    let recent = from_threads(RECENT, |i| replay(&store, pairs - 1 - i));
    drop(store);
    let store = open(dir.path(), budget);
    let cold = from_threads(COLD, |i| {
        let mut z = i.wrapping_mul(0x2545_f491_4f6c_dd1d);
        z ^= z >> 29;
        replay(&store, z % pairs);
    });
    drop(store);
    let file = std::fs::metadata(dir.path().join("idemstore.redb")).map_or(0, |m| m.len());
    println!(
        "RESULT budget={} cache={} peak_rss={} pairs_per_s={written:.0} recent_per_s={recent:.0} cold_per_s={cold:.0} file={file}",
        stats.memory_budget,
        stats.redb_cache_bytes,
        peak_rss()
    );
}

struct Run {
    budget: u64,
    cache: u64,
    peak_rss: u64,
    pairs: f64,
    recent: f64,
    cold: f64,
    file: u64,
}

fn parse(line: &str) -> Run {
    let field = |name: &str| -> f64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing in {line:?}"))
    };
    Run {
        budget: field("budget") as u64,
        cache: field("cache") as u64,
        peak_rss: field("peak_rss") as u64,
        pairs: field("pairs_per_s"),
        recent: field("recent_per_s"),
        cold: field("cold_per_s"),
        file: field("file") as u64,
    }
}

fn spawn(budget: &str) -> Run {
    let exe = std::env::current_exe().expect("this bench's path");
    let out = Command::new(exe)
        .env(CHILD, budget)
        .output()
        .expect("the child process");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the {budget} run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse(
        stdout
            .lines()
            .find(|l| l.starts_with("RESULT"))
            .expect("a RESULT line"),
    )
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() {
    let pairs: u64 = std::env::var("IDEMSTORE_MEMORY_PAIRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    if let Ok(budget) = std::env::var(CHILD) {
        let budget = (budget != "default").then(|| budget.parse().expect("a budget in bytes"));
        child(budget, pairs);
        return;
    }
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench --list`: nothing criterion-shaped here.
    }
    println!("{pairs} pairs from {CLIENTS} threads per budget, each budget in its own process");
    let default = spawn("default");
    let large = spawn(&GIB.to_string());
    println!(
        "| budget | redb cache | peak RSS | pairs/s | recent replays/s | cold replays/s | file |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for run in [&default, &large] {
        println!(
            "| {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} | {:.0} | {:.0} | {:.0} MiB |",
            mib(run.budget),
            mib(run.cache),
            mib(run.peak_rss),
            run.pairs,
            run.recent,
            run.cold,
            mib(run.file)
        );
    }
    let bound = 2 * default.budget + 32 * 1024 * 1024;
    println!(
        "peak RSS at the default: {:.0} MiB, target ≤ {:.0} MiB (2 × budget + 32 MiB): {}",
        mib(default.peak_rss),
        mib(bound),
        if default.peak_rss <= bound {
            "met"
        } else {
            "MISSED"
        }
    );
    let ratio = default.pairs / large.pairs;
    println!(
        "pairs/s, default / 1 GiB: {ratio:.2}× (target ≥ 0.8×): {}",
        if ratio >= 0.8 { "met" } else { "MISSED" }
    );
    println!(
        "recent replays/s, default / 1 GiB: {:.2}×; cold replays/s: {:.2}×",
        default.recent / large.recent,
        default.cold / large.cold
    );
}
