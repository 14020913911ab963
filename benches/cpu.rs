//! CPU time per pair: what the whole process (clients, writer, log thread, kernel) spends on
//! each claim+commit, read from `/proc/self/stat` around a fixed number of pairs. Linux only.
//!
//! `cargo bench --bench cpu` (about 1 minute): 200,000 pairs from 64 client threads, two-phase
//! and `execute`, then the two-phase pairs through the async API from 64 tokio tasks on two
//! workers. Prints µs of CPU per pair (user, system, total) and pairs/s; three runs each,
//! medians. The 64 client threads are part of the cost: they block twice per pair and are
//! woken once per answer.
//!
//! Instructions per pair, the figure that does not move with the machine's noise: run one path
//! once under callgrind with two pair counts and divide the difference, which cancels the
//! fixed cost of starting (`IDEMSTORE_CPU_PATH` is `two-phase`, `execute` or `async`):
//!
//! ```text
//! for n in 2000 4000; do IDEMSTORE_CPU_PATH=two-phase IDEMSTORE_CPU_PAIRS=$n \
//!   valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n target/release/deps/cpu-*; done
//! # (Ir of /tmp/cg.4000 - Ir of /tmp/cg.2000) / 2000, from the "summary:" lines
//! ```

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use common::ORDERS;
use idemstore::Store;

const CLIENTS: u64 = 64;
/// Pairs per run unless `IDEMSTORE_CPU_PAIRS` says otherwise.
const PAIRS: u64 = 200_000;

/// Pairs per run.
fn pairs() -> u64 {
    std::env::var("IDEMSTORE_CPU_PAIRS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(PAIRS)
}

/// The one path to run (once), for callgrind; `None`: all three, three times each.
fn only() -> Option<String> {
    std::env::var("IDEMSTORE_CPU_PATH").ok()
}

/// User and system CPU seconds of this process so far.
fn cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of the file (utime, stime) are 11 and 12 after the state (field 3).
    let ticks = |i: usize| fields[i].parse::<f64>().expect("ticks");
    // Clock ticks are 100 a second on Linux (USER_HZ).
    (ticks(11) / 100.0, ticks(12) / 100.0)
}

struct Run {
    user_us: f64,
    system_us: f64,
    pairs_per_s: f64,
}

fn measure(label: &str, path: &str, work: &dyn Fn(&Store, &str)) {
    let runs_wanted = match only() {
        Some(wanted) if wanted == path => 1,
        Some(_) => return,
        None => 3,
    };
    let pairs = pairs();
    let mut runs = Vec::new();
    for r in 0..runs_wanted {
        let dir = tempfile::tempdir().expect("dir");
        let store = Store::builder()
            .table(ORDERS)
            .open(dir.path().join("idem"))
            .expect("open");
        let (user0, system0) = cpu();
        let started = Instant::now();
        work(&store, &format!("{label}-{r}"));
        let elapsed = started.elapsed().as_secs_f64();
        let (user1, system1) = cpu();
        if only().is_some() {
            // Under callgrind, per-epoch work is shared by however many pairs an epoch holds:
            // say how many, so that counts from two builds can be compared fairly.
            let stats = store.stats().expect("stats");
            eprintln!(
                "{path}: {pairs} pairs, {} groups, {} epochs, {} checkpoints",
                stats.groups_committed, stats.epochs, stats.checkpoints
            );
        }
        runs.push(Run {
            user_us: (user1 - user0) * 1e6 / pairs as f64,
            system_us: (system1 - system0) * 1e6 / pairs as f64,
            pairs_per_s: pairs as f64 / elapsed,
        });
    }
    runs.sort_by(|a, b| (a.user_us + a.system_us).total_cmp(&(b.user_us + b.system_us)));
    let m = &runs[runs.len() / 2];
    println!(
        "| {label} | {:.1} | {:.1} | {:.1} | {:.0} | {} |",
        m.user_us,
        m.system_us,
        m.user_us + m.system_us,
        m.pairs_per_s,
        runs.iter()
            .map(|r| format!("{:.1}", r.user_us + r.system_us))
            .collect::<Vec<_>>()
            .join(" / ")
    );
}

fn main() {
    println!(
        "cpu: {} pairs from {CLIENTS} clients per run, 3 runs, the median run by total CPU\n",
        pairs()
    );
    println!(
        "| path | user µs/pair | system µs/pair | total µs/pair | pairs/s | totals of the 3 runs |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    measure("two-phase, 64 threads", "two-phase", &|store, prefix| {
        common::pairs_from_threads(store, CLIENTS, pairs(), |i| format!("{prefix}-{i:010}"));
    });
    measure("execute, 64 threads", "execute", &|store, prefix| {
        let count = pairs();
        let next = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..CLIENTS {
                let next = &next;
                s.spawn(move || {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            break;
                        }
                        common::execute(store, &common::scope(t, format!("{prefix}-{i:010}")));
                    }
                });
            }
        });
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    measure("two-phase, 64 tokio tasks", "async", &|store, prefix| {
        let count = pairs();
        let next = Arc::new(AtomicU64::new(0));
        rt.block_on(async {
            let tasks: Vec<_> = (0..CLIENTS)
                .map(|t| {
                    let (store, next, prefix) = (store.clone(), next.clone(), prefix.to_owned());
                    tokio::spawn(async move {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= count {
                                break;
                            }
                            let scope = common::scope(t, format!("{prefix}-{i:010}"));
                            common::pair_async(&store, &scope).await;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("task");
            }
        });
    });
}
