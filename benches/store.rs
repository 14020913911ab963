//! Criterion benches of the store's operations. `cargo bench --bench store` (all groups), or
//! one group: `cargo bench --bench store -- replay`.
//!
//! - `claim_commit/{Wal,Redb}/{1,4,16,64}`: pairs per second (a pair: `begin` claiming a new key
//!   plus a `commit` writing a ~100-byte business row and a ~200-byte response; keys over 16
//!   tenants) from that many client threads;
//! - `claim_commit_async/Wal/64`: the same pairs through `begin_async`/`commit_async` from 64
//!   tokio tasks on a 2-worker runtime, beside the 64 threads;
//! - `execute/Wal/{1,64}`: the same request through `Store::execute` (one step) from threads;
//! - `replay/{1,4}`: `begin` on completed keys from 1 and 4 threads;
//! - `in_progress`: `begin` on keys held by a live claim;
//! - `evict`: `evict_expired(1000)` on expired records, per record evicted.
//!
//! Throughput is reported as elements per second (criterion's `thrpt`).

mod common;

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::ORDERS;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_main};
use idemstore::{Begin, Durability, Fingerprint, ManualClock, Scope, Store, Timestamp};

fn open(dir: &Path, durability: Durability) -> Store {
    Store::builder()
        .durability(durability)
        .table(ORDERS)
        .open(dir)
        .expect("open")
}

fn scope(i: u64) -> Scope {
    common::scope(i, format!("key-{i:012}"))
}

fn pair(store: &Store, i: u64) {
    common::pair(store, &scope(i));
}

/// Runs `iters` pairs over `clients` threads and returns the time taken.
fn pairs(store: &Store, next: &AtomicU64, clients: u64, iters: u64) -> Duration {
    requests(store, next, clients, iters, pair)
}

/// Runs `iters` requests (`one(store, i)`) over `clients` threads; returns the time taken.
fn requests(
    store: &Store,
    next: &AtomicU64,
    clients: u64,
    iters: u64,
    one: fn(&Store, u64),
) -> Duration {
    let end = next.load(Ordering::Relaxed) + iters;
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        break;
                    }
                    one(store, i);
                }
            });
        }
    });
    started.elapsed()
}

fn claim_commit(c: &mut Criterion) {
    let mut group = c.benchmark_group("claim_commit");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(4));
    for durability in [Durability::Wal, Durability::Redb] {
        for clients in [1u64, 4, 16, 64] {
            let dir = tempfile::tempdir().expect("dir");
            let store = open(dir.path(), durability);
            let next = AtomicU64::new(0);
            group.bench_function(BenchmarkId::new(format!("{durability:?}"), clients), |b| {
                b.iter_custom(|iters| pairs(&store, &next, clients, iters.max(clients)));
            });
        }
    }
    group.finish();
}

/// Runs `iters` pairs over `tasks` tokio tasks through the async API.
fn pairs_async(
    rt: &tokio::runtime::Runtime,
    store: &Store,
    next: &Arc<AtomicU64>,
    tasks: u64,
    iters: u64,
) -> Duration {
    let end = next.load(Ordering::Relaxed) + iters;
    rt.block_on(async {
        let started = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (store, next) = (store.clone(), next.clone());
                tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= end {
                            break;
                        }
                        common::pair_async(&store, &scope(i)).await;
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.await.expect("task");
        }
        started.elapsed()
    })
}

fn claim_commit_async(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("claim_commit_async");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(4));
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path(), Durability::Wal);
    let next = Arc::new(AtomicU64::new(0));
    group.bench_function(BenchmarkId::new("Wal", 64), |b| {
        b.iter_custom(|iters| pairs_async(&rt, &store, &next, 64, iters.max(64)));
    });
    group.finish();
}

fn execute(c: &mut Criterion) {
    let mut group = c.benchmark_group("execute");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(4));
    for clients in [1u64, 64] {
        let dir = tempfile::tempdir().expect("dir");
        let store = open(dir.path(), Durability::Wal);
        let next = AtomicU64::new(0);
        group.bench_function(BenchmarkId::new("Wal", clients), |b| {
            b.iter_custom(|iters| {
                requests(&store, &next, clients, iters.max(clients), |store, i| {
                    common::execute(store, &scope(i));
                })
            });
        });
    }
    group.finish();
}

/// A store with `n` completed keys.
fn completed(dir: &Path, n: u64) -> Store {
    let store = open(dir, Durability::Wal);
    let next = AtomicU64::new(0);
    pairs(&store, &next, 16, n);
    store
}

fn replay(c: &mut Criterion) {
    const KEYS: u64 = 10_000;
    let dir = tempfile::tempdir().expect("dir");
    let store = completed(dir.path(), KEYS);
    let scopes: Vec<(Scope, Fingerprint)> = (0..KEYS)
        .map(|i| {
            let s = scope(i);
            let f = Fingerprint::of_bytes(s.key().as_bytes());
            (s, f)
        })
        .collect();
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(1));
    for threads in [1u64, 4] {
        group.bench_function(BenchmarkId::from_parameter(threads), |b| {
            b.iter_custom(|iters| {
                let per_thread = iters.div_ceil(threads);
                let started = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..threads {
                        let (store, scopes) = (&store, &scopes);
                        s.spawn(move || {
                            for i in 0..per_thread {
                                let (scope, fingerprint) =
                                    &scopes[((i * 7919 + t * 104_729) % KEYS) as usize];
                                match store.begin(scope, *fingerprint).expect("begin") {
                                    Begin::Replay(response) => {
                                        black_box(response);
                                    }
                                    other => panic!("expected a replay, got {other:?}"),
                                }
                            }
                        });
                    }
                });
                started.elapsed()
            });
        });
    }
    group.finish();
}

fn in_progress(c: &mut Criterion) {
    const KEYS: u64 = 1_000;
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path(), Durability::Wal);
    let mut held = Vec::new();
    let mut scopes = Vec::new();
    for i in 0..KEYS {
        let s = scope(i);
        let f = Fingerprint::of_bytes(s.key().as_bytes());
        let Begin::Claimed(claim) = store.begin(&s, f).expect("begin") else {
            panic!("not new");
        };
        held.push(claim);
        scopes.push((s, f));
    }
    let mut group = c.benchmark_group("in_progress");
    group.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    group.bench_function("1", |b| {
        b.iter(|| {
            let (scope, fingerprint) = &scopes[i % scopes.len()];
            i += 1;
            match store.begin(scope, *fingerprint).expect("begin") {
                Begin::InProgress { retry_after } => black_box(retry_after),
                other => panic!("expected InProgress, got {other:?}"),
            }
        });
    });
    group.finish();
    drop(held);
}

fn evict(c: &mut Criterion) {
    const BATCH: u64 = 1_000;
    let clock = ManualClock::new(Timestamp::from_millis(1_764_000_000_000));
    let dir = tempfile::tempdir().expect("dir");
    let store = Store::builder()
        .table(ORDERS)
        .ttl(Duration::from_secs(60))
        .clock(clock.clone())
        .open(dir.path())
        .expect("open");
    let next = AtomicU64::new(0);
    let mut group = c.benchmark_group("evict");
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(10);
    group.bench_function("batch_1000", |b| {
        b.iter_custom(|iters| {
            // Untimed: fill `iters` batches of completed keys, then let them expire.
            pairs(&store, &next, 16, iters * BATCH);
            clock.advance(Duration::from_secs(61));
            let started = Instant::now();
            for _ in 0..iters {
                let evicted = store.evict_expired(BATCH as usize).expect("evict");
                assert_eq!(evicted.removed as u64, BATCH);
            }
            started.elapsed()
        });
    });
    group.finish();
}

/// `criterion_group!` defines a public function; in a private module it needs no docs.
mod harness {
    use super::{claim_commit, claim_commit_async, evict, execute, in_progress, replay};
    criterion::criterion_group!(
        benches,
        claim_commit,
        claim_commit_async,
        execute,
        replay,
        in_progress,
        evict
    );
}
criterion_main!(harness::benches);
