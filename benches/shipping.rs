//! Log shipping to NATS JetStream (issue 31): what shipping costs the writer, how far the
//! replica lags, how long a restore and a standby's take-over take.
//!
//! `cargo bench --bench shipping --features nats` (4½ to 5 minutes at the defaults on the
//! 2-core bench machine), against NATS with JetStream at `IDEMSTORE_NATS_URL` (default
//! `nats://127.0.0.1:4222`). Every store is in a temporary directory of its own and ships to a
//! stream of its own (`shipbench-<pid>-<what>-<n>`), whose stream, writer bucket and snapshot
//! bucket are deleted when the store is done (and, at the start, any left by a run that died).
//! One pair is `begin` then `commit` with a 100-byte business row and a 200-byte response, on
//! a random UUIDv4 key, as in `benches/common`.
//!
//! 1. **Pairs/s without shipping, asynchronous and synchronous** (`Shipping::Async`,
//!    `Shipping::Sync(Unreachable::Refuse)`), at 64 client threads and at 1, closed loop:
//!    rounds of off, async, sync back to back (the order turning each round), each on a fresh
//!    store: a warm-up, then a timed run (and one uncounted run before part 1 settles the
//!    machine). Before each run, 50 raw `fdatasync`s probe the disk, again every 0.5 s (up
//!    to 5 s) while their median is over 0.5 ms: the disk is shared, and for seconds at a
//!    time every sync takes about 4 ms; the probe's last median is printed with the run. Printed: each run (pairs/s, pair p50/p99, groups and frames shipped per second,
//!    snapshots and queue overflows during it), the medians with min–max, and the ratios
//!    async ÷ off and sync ÷ off of each round (issue 31's targets at 64 clients: ≥ 0.9× and
//!    ≥ 0.6×).
//! 2. **Lag at a paced load, asynchronous**: open loop, `SHIP_LAG_RATE` pairs/s spread over
//!    `SHIP_LAG_THREADS` threads, each starting its pairs on a fixed schedule (a thread that
//!    falls behind starts its next pair at once, never skips it). Printed: the rate reached,
//!    how late pairs started, `Stats::shipping`'s `lag_p50`/`lag_p99` (local sync to the
//!    replica's ack, over the last 4,096 frames) at the end, and `Stats::shipping.lag` (age of
//!    the oldest frame not yet acknowledged) sampled every 10 ms: its p50, p99 and max. Twice,
//!    each on a fresh store: at the default `ship_snapshot_bytes`, then at its maximum, so
//!    that no snapshot is made during the load (what snapshots add to the lag).
//! 3. **Restore of a large store**: a store shipping asynchronously filled with
//!    `SHIP_RESTORE_RECORDS` completed pairs from 64 threads, closed cleanly (which waits for
//!    the replica); what the stream holds (the snapshot's frame and bytes, the frames after
//!    it); then `Store::restore(.., Takeover::Yes)` into a fresh directory, timed, and the
//!    first open of it (which replays the frames after the snapshot), timed; the snapshot's
//!    download and the frames' read alone, timed again separately, to say where the restore's
//!    time goes; the restored store's completed records checked against the pairs written.
//! 4. **A standby's take-over**: a store shipping asynchronously under a paced load of
//!    `SHIP_STANDBY_RATE` pairs/s for `SHIP_STANDBY_SECS`, followed by `Standby::follow` with a
//!    poll of `SHIP_STANDBY_POLL_MS`; how far behind the standby was (sampled every 100 ms);
//!    the load stopped and the replica caught up; a cold `Store::restore` of the same stream
//!    and its first open, for comparison; then `take_over()` and the first open of its
//!    directory (shipping to the same stream, as the new box would), timed, with the tail it
//!    replayed.
//!
//! The raw `fdatasync` time of the disk (512 bytes, median of 400) is printed at the start and
//! the end, and a summary table for BENCHMARKS.md at the end.
//!
//! Environment (all optional; defaults in brackets):
//! - `SHIP_PARTS`: which parts to run [`1,2,3,4`];
//! - `SHIP_CLIENTS`: client threads of part 1 [`64,1`];
//! - `SHIP_ROUNDS`: rounds of off/async/sync per client count [`5`: the machine is shared];
//! - `SHIP_WARMUP_MS`, `SHIP_RUN_MS`: part 1's warm-up and timed run [`1000`, `3000`];
//! - `SHIP_LAG_RATE`, `SHIP_LAG_THREADS`, `SHIP_LAG_SECS`: part 2's offered pairs/s, its
//!   threads, and its timed length after a 2 s warm-up [`10000`, `32`, `10`];
//! - `SHIP_RESTORE_RECORDS`: part 3's store size [`1000000`];
//! - `SHIP_STANDBY_RATE`, `SHIP_STANDBY_SECS`, `SHIP_STANDBY_POLL_MS`: part 4's load and the
//!   standby's poll [`2000`, `20`, `50`];
//! - `SHIP_ROW`: how each pair's business row is keyed, `by-number` or `by-key`
//!   [`by-number`: an order number handed out in order, as in `benches/traffic.rs`];
//! - `SHIP_DIR`: where the temporary store directories go [the system's temporary directory;
//!   it must be on the disk to measure, not a tmpfs].

mod common;

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{ORDERS, ORDERS_BY_NUMBER, Row};
use idemstore::replica::JetStream;
use idemstore::{
    ReplicaSource, ShipState, Shipping, ShippingStats, Standby, Stats, Store, Takeover, Unreachable,
};
use parking_lot::Mutex;

/// Every stream name this bench makes begins with it (after the pid-free server prefixes).
const PREFIX: &str = "shipbench-";

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.replace(['_', ','], "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

fn env_list(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{name}={v:?}: a comma-separated list of numbers"))
        })
        .collect()
}

fn url() -> String {
    std::env::var("IDEMSTORE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

fn row() -> Row {
    static ROW: OnceLock<Row> = OnceLock::new();
    *ROW.get_or_init(|| Row::from_env("SHIP_ROW"))
}

fn temp_dir() -> tempfile::TempDir {
    match std::env::var_os("SHIP_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("a temporary directory")
}

// ---------------------------------------------------------------------------------------------
// NATS: the bench's own look at the server, and the clean-up.

/// Runs `f` against the server on a runtime of its own; `None` if the server does not answer.
fn nats<T>(f: impl AsyncFnOnce(async_nats::jetstream::Context) -> T) -> Option<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    runtime.block_on(async {
        let connected = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(url()));
        match connected.await {
            Ok(Ok(client)) => Some(f(async_nats::jetstream::new(client)).await),
            _ => None,
        }
    })
}

/// The server-side streams of the replica named `name`: the log, the writer bucket's and the
/// snapshot bucket's.
fn server_streams(name: &str) -> [String; 3] {
    [
        format!("IDEMSTORE_LOG_{name}"),
        format!("KV_IDEMSTORE_WRITER_{name}"),
        format!("OBJ_IDEMSTORE_SNAP_{name}"),
    ]
}

/// Deletes what a run of this bench that died left on the server (its pid is gone).
fn sweep_leftovers() {
    use futures_util::StreamExt;
    let deleted = nats(async |js| {
        let mut names = js.stream_names();
        let mut gone = Vec::new();
        while let Some(Ok(name)) = names.next().await {
            let Some((_, rest)) = name.split_once(&format!("_{PREFIX}")) else {
                continue;
            };
            let pid = rest.split('-').next().unwrap_or("");
            if !Path::new("/proc").join(pid).exists() {
                gone.push(name);
            }
        }
        for name in &gone {
            let _ = js.delete_stream(name).await;
        }
        gone.len()
    });
    match deleted {
        Some(0) => {}
        Some(n) => println!("(deleted {n} streams left by an earlier run that died)"),
        None => panic!(
            "NATS does not answer at {}: start it with JetStream (-js)",
            url()
        ),
    }
}

/// A replica stream name of one store; its stream and buckets are deleted on drop.
struct StreamName(String);

impl StreamName {
    fn new(what: &str) -> StreamName {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        StreamName(format!("{PREFIX}{}-{what}-{n}", std::process::id()))
    }

    fn replica(&self) -> JetStream {
        JetStream::connect(&url(), &self.0).expect("a replica handle")
    }

    /// What the log stream holds now: messages, bytes, first and last stream sequence.
    fn log(&self) -> Option<LogState> {
        let name = server_streams(&self.0)[0].clone();
        nats(async move |js| {
            let mut stream = js.get_stream(name).await.ok()?;
            let state = stream.info().await.ok()?.state.clone();
            Some(LogState {
                messages: state.messages,
                bytes: state.bytes,
                first: state.first_sequence,
                last: state.last_sequence,
            })
        })
        .flatten()
    }
}

impl Drop for StreamName {
    fn drop(&mut self) {
        let names = server_streams(&self.0);
        let done = nats(async move |js| {
            for name in names {
                let _ = js.delete_stream(name).await;
            }
        });
        if done.is_none() {
            eprintln!(
                "could not delete the streams of {}: NATS did not answer",
                self.0
            );
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct LogState {
    messages: u64,
    bytes: u64,
    first: u64,
    last: u64,
}

// ---------------------------------------------------------------------------------------------
// Stores and pairs.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Off,
    Async,
    Sync,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Off, Mode::Async, Mode::Sync];

    fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Async => "async",
            Mode::Sync => "sync",
        }
    }
}

fn open(dir: &Path, mode: Mode, stream: Option<&StreamName>) -> Store {
    open_with(dir, mode, stream, None)
}

/// [`open`], with `Builder::ship_snapshot_bytes` set if `snapshot_bytes` is given.
fn open_with(
    dir: &Path,
    mode: Mode,
    stream: Option<&StreamName>,
    snapshot_bytes: Option<u64>,
) -> Store {
    let builder = Store::builder().table(ORDERS).table(ORDERS_BY_NUMBER);
    let builder = match (mode, stream) {
        (Mode::Off, _) => builder,
        (Mode::Async, Some(s)) => builder.ship(s.replica(), Shipping::Async),
        (Mode::Sync, Some(s)) => builder.ship(s.replica(), Shipping::Sync(Unreachable::Refuse)),
        (_, None) => panic!("a shipping store needs a stream"),
    };
    match snapshot_bytes {
        Some(bytes) => builder.ship_snapshot_bytes(bytes),
        None => builder,
    }
    .open(dir)
    .expect("open")
}

/// A fresh seed for a client thread's keys: no two threads of the process draw the same.
fn seed() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    common::mix(NEXT.fetch_add(1, Ordering::Relaxed) ^ u64::from(std::process::id()) << 32)
}

/// One pair from client `client` on its next random key.
fn pair(store: &Store, client: u64, keys: &mut u64) {
    common::pair_with(store, &common::scope(client, common::uuid_v4(keys)), row());
}

fn shipping(stats: &Stats) -> Option<&ShippingStats> {
    stats.shipping.as_ref()
}

fn stats(store: &Store) -> Stats {
    store.stats().expect("stats")
}

/// Waits until the replica holds every frame synced so far; how long that took.
fn wait_caught_up(store: &Store, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let s = stats(store);
        let Some(ship) = shipping(&s) else {
            return Duration::ZERO;
        };
        if ship.state == ShipState::Shipping && ship.lag_frames == 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "the replica did not catch up within {limit:?}: {ship:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until the store shipping to a new stream has sent its first snapshot (a stream
/// begins with one) and ships frames.
fn wait_shipping(store: &Store) {
    let started = Instant::now();
    loop {
        let s = stats(store);
        let ship = shipping(&s).expect("a shipping store");
        if ship.state == ShipState::Shipping && ship.snapshots >= 1 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no first snapshot within 60 s: {ship:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The disk's sync time right before a timed run: the median of 50 `fdatasync`s in `dir`,
/// probed again every 0.5 s (at most 10 times) while it is over 0.5 ms. The disk is shared:
/// for seconds at a time every sync takes about 4 ms instead of 0.1 (seen in trials, by this
/// probe too), which a run with one client would measure instead of shipping. Returns the
/// last median and how long it waited.
fn settle(dir: &Path) -> (Duration, Duration) {
    let started = Instant::now();
    let mut median = common::fdatasync_median(dir, 50);
    for _ in 0..10 {
        if median <= Duration::from_micros(500) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        median = common::fdatasync_median(dir, 50);
    }
    (median, started.elapsed())
}

fn percentile<T: Copy + Ord>(sorted: &[T], p: f64) -> T {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn spread(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// "12.3k" style.
fn k(v: f64) -> String {
    if v >= 1000.0 {
        format!("{:.1}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

// ---------------------------------------------------------------------------------------------
// Part 1: pairs/s, off / async / sync.

struct Run {
    pairs_per_s: f64,
    p50: Duration,
    p99: Duration,
    groups_per_s: f64,
    frames_per_s: f64,
    snapshots: u64,
    overflows: u64,
    ack_p50: Duration,
    ack_p99: Duration,
}

/// `clients` threads running pairs back to back for `warmup`, then `length` timed.
fn closed_loop(store: &Store, clients: u64, warmup: Duration, length: Duration) -> Run {
    let stop = AtomicBool::new(false);
    let timing = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let latencies = Mutex::new(Vec::new());
    let (before, after, pairs, elapsed) = std::thread::scope(|s| {
        for client in 0..clients {
            let (stop, timing, done, latencies) = (&stop, &timing, &done, &latencies);
            s.spawn(move || {
                let mut keys = seed();
                let mut mine = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    pair(store, client, &mut keys);
                    done.fetch_add(1, Ordering::Relaxed);
                    if timing.load(Ordering::Relaxed) {
                        mine.push(started.elapsed());
                    }
                }
                latencies.lock().extend(mine);
            });
        }
        std::thread::sleep(warmup);
        let before = stats(store);
        let (c0, t0) = (done.load(Ordering::Relaxed), Instant::now());
        timing.store(true, Ordering::Relaxed);
        std::thread::sleep(length);
        let (c1, t1) = (done.load(Ordering::Relaxed), Instant::now());
        timing.store(false, Ordering::Relaxed);
        let after = stats(store);
        stop.store(true, Ordering::Relaxed);
        (before, after, c1 - c0, t1 - t0)
    });
    let mut latencies = latencies.into_inner();
    latencies.sort_unstable();
    let per_s = |n: u64| n as f64 / elapsed.as_secs_f64();
    let (b, a) = (shipping(&before), shipping(&after));
    Run {
        pairs_per_s: per_s(pairs),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
        groups_per_s: per_s(after.groups_committed - before.groups_committed),
        frames_per_s: match (b, a) {
            (Some(b), Some(a)) => per_s(a.frames_shipped - b.frames_shipped),
            _ => 0.0,
        },
        snapshots: match (b, a) {
            (Some(b), Some(a)) => a.snapshots - b.snapshots,
            _ => 0,
        },
        overflows: a.map_or(0, |a| a.overflows),
        ack_p50: a.map_or(Duration::ZERO, |a| a.lag_p50),
        ack_p99: a.map_or(Duration::ZERO, |a| a.lag_p99),
    }
}

fn part1(summary: &mut Vec<String>) {
    let clients = env_list("SHIP_CLIENTS", "64,1");
    let rounds = env("SHIP_ROUNDS", 5);
    let warmup = Duration::from_millis(env("SHIP_WARMUP_MS", 1000));
    let length = Duration::from_millis(env("SHIP_RUN_MS", 3000));
    println!(
        "\n## 1. pairs/s: off, async, sync ({rounds} rounds each, {} ms warm-up + {} ms timed, a fresh store per run)",
        warmup.as_millis(),
        length.as_millis()
    );
    for &n in &clients {
        println!("\n{n} client(s):");
        let mut rates: [Vec<f64>; 3] = Default::default();
        let mut ratios: [Vec<f64>; 2] = Default::default();
        let mut p99s: [Vec<Duration>; 3] = Default::default();
        let mut p50s: [Vec<Duration>; 3] = Default::default();
        let mut acks: Vec<(Duration, Duration)> = Vec::new();
        for round in 1..=rounds {
            let mut this = [0.0; 3];
            // The order turns each round (off/async/sync, async/sync/off, sync/off/async), so
            // that no mode always runs first, right after a store's directory was removed.
            let mut order: Vec<(usize, Mode)> = Mode::ALL.into_iter().enumerate().collect();
            order.rotate_left(((round - 1) % 3) as usize);
            for (i, mode) in order {
                let dir = temp_dir();
                let (disk, waited) = settle(dir.path());
                let stream = (mode != Mode::Off).then(|| StreamName::new(mode.name()));
                let store = open(dir.path(), mode, stream.as_ref());
                if mode != Mode::Off {
                    wait_shipping(&store);
                }
                let run = closed_loop(&store, n, warmup, length);
                let closing = Instant::now();
                drop(store);
                let closed = closing.elapsed();
                drop(stream);
                println!(
                    "  round {round} {:>5}: {:>7.0} pairs/s, pair p50 {} p99 {}; {:.0} groups/s, {:.0} frames shipped/s; snapshots {}, overflows {}{}; close {}; disk sync before: {} (waited {})",
                    mode.name(),
                    run.pairs_per_s,
                    ms(run.p50),
                    ms(run.p99),
                    run.groups_per_s,
                    run.frames_per_s,
                    run.snapshots,
                    run.overflows,
                    if mode == Mode::Off {
                        String::new()
                    } else {
                        format!(
                            "; sync-to-ack p50 {} p99 {}",
                            ms(run.ack_p50),
                            ms(run.ack_p99)
                        )
                    },
                    ms(closed),
                    ms(disk),
                    secs(waited),
                );
                this[i] = run.pairs_per_s;
                rates[i].push(run.pairs_per_s);
                p50s[i].push(run.p50);
                p99s[i].push(run.p99);
                if mode == Mode::Sync {
                    acks.push((run.ack_p50, run.ack_p99));
                }
            }
            ratios[0].push(this[1] / this[0]);
            ratios[1].push(this[2] / this[0]);
            println!(
                "  round {round} ratios: async ÷ off {:.2}, sync ÷ off {:.2}",
                this[1] / this[0],
                this[2] / this[0]
            );
        }
        println!("  medians (min–max):");
        for (i, mode) in Mode::ALL.into_iter().enumerate() {
            let (lo, hi) = spread(&rates[i]);
            let med = median(rates[i].clone());
            let mut p50 = p50s[i].clone();
            p50.sort_unstable();
            let mut p99 = p99s[i].clone();
            p99.sort_unstable();
            println!(
                "    {:>5}: {med:.0} pairs/s ({lo:.0}–{hi:.0}); pair p50 {} p99 {} (medians of the runs)",
                mode.name(),
                ms(p50[p50.len() / 2]),
                ms(p99[p99.len() / 2])
            );
            let runs: Vec<String> = rates[i].iter().map(|r| format!("{r:.0}")).collect();
            summary.push(format!(
                "| pairs/s, {n} client(s), shipping {} | **{}** ({}–{}) | {} | pair p50 {} / p99 {} |",
                mode.name(),
                k(med),
                k(lo),
                k(hi),
                runs.join(" / "),
                ms(p50[p50.len() / 2]),
                ms(p99[p99.len() / 2])
            ));
        }
        for (j, name) in ["async ÷ off", "sync ÷ off"].into_iter().enumerate() {
            let med = median(ratios[j].clone());
            let each: Vec<String> = ratios[j].iter().map(|r| format!("{r:.2}")).collect();
            println!("    {name}: median {med:.2} (rounds: {})", each.join(", "));
            let target = match (n, j) {
                (64, 0) => format!(
                    " (target ≥ 0.9×: {})",
                    if med >= 0.9 { "met" } else { "missed" }
                ),
                (64, _) => format!(
                    " (target ≥ 0.6×: {})",
                    if med >= 0.6 { "met" } else { "missed" }
                ),
                _ => String::new(),
            };
            summary.push(format!(
                "| {name}, {n} client(s), same round | **{med:.2}×**{target} | {} | |",
                each.join(" / ")
            ));
        }
        if let Some(&(a50, a99)) = acks.get(acks.len() / 2) {
            summary.push(format!(
                "| sync: local sync to the replica's ack, {n} client(s) (`lag_p50`/`lag_p99`, middle round) | {} / {} | | |",
                ms(a50),
                ms(a99)
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Open-loop load: part 2 and part 4.

struct Paced {
    /// Pairs completed per second over the timed part.
    reached: f64,
    /// How late pairs started against their schedule: p50, p99, max.
    late: (Duration, Duration, Duration),
    /// Pairs completed in all.
    pairs: u64,
}

/// `rate` pairs/s from `threads` threads for `warmup` + `length`, each thread on a fixed
/// schedule; `sample` is called every `every` during the timed part (on this thread).
fn paced(
    store: &Store,
    rate: f64,
    threads: u64,
    warmup: Duration,
    length: Duration,
    every: Duration,
    mut sample: impl FnMut(),
) -> Paced {
    let interval = Duration::from_secs_f64(threads as f64 / rate);
    let done = AtomicU64::new(0);
    let lateness = Mutex::new(Vec::new());
    let begin = Instant::now() + Duration::from_millis(20);
    let timed_from = begin + warmup;
    let end = timed_from + length;
    let (pairs, elapsed) = std::thread::scope(|s| {
        for t in 0..threads {
            let (done, lateness) = (&done, &lateness);
            s.spawn(move || {
                let mut keys = seed();
                let mut mine = Vec::new();
                let mut next = begin + interval.mul_f64(t as f64 / threads as f64);
                while next < end {
                    let now = Instant::now();
                    if now < next {
                        std::thread::sleep(next - now);
                    }
                    let started = Instant::now();
                    if started >= end {
                        break;
                    }
                    if next >= timed_from {
                        mine.push(started.saturating_duration_since(next));
                    }
                    pair(store, t, &mut keys);
                    done.fetch_add(1, Ordering::Relaxed);
                    next += interval;
                }
                lateness.lock().extend(mine);
            });
        }
        let now = Instant::now();
        if now < timed_from {
            std::thread::sleep(timed_from - now);
        }
        let (c0, t0) = (done.load(Ordering::Relaxed), Instant::now());
        let mut tick = t0;
        while Instant::now() < end {
            sample();
            tick += every;
            let now = Instant::now();
            if now < tick {
                std::thread::sleep(tick - now);
            }
        }
        let (c1, t1) = (done.load(Ordering::Relaxed), Instant::now());
        (c1 - c0, t1 - t0)
    });
    let mut late = lateness.into_inner();
    late.sort_unstable();
    Paced {
        reached: pairs as f64 / elapsed.as_secs_f64(),
        late: (
            percentile(&late, 0.5),
            percentile(&late, 0.99),
            late.last().copied().unwrap_or_default(),
        ),
        pairs: done.load(Ordering::Relaxed),
    }
}

// ---------------------------------------------------------------------------------------------
// Part 2: lag at a paced load.

/// What one paced asynchronous run showed.
struct Lag {
    load: Paced,
    /// `lag_p50`, `lag_p99` at the end.
    ack: (Duration, Duration),
    /// `lag` sampled every 10 ms: p50, p99, max.
    age: (Duration, Duration, Duration),
    /// Frames behind, sampled: p50, p99, max.
    behind: (u64, u64, u64),
    frames_per_s: f64,
    snapshots: u64,
    overflows: u64,
}

fn lag_run(
    rate: f64,
    threads: u64,
    warmup: Duration,
    length: Duration,
    snapshot_bytes: Option<u64>,
) -> Lag {
    let dir = temp_dir();
    let stream = StreamName::new("lag");
    let store = open_with(dir.path(), Mode::Async, Some(&stream), snapshot_bytes);
    wait_shipping(&store);
    let before = stats(&store);
    let mut lags = Vec::new();
    let mut frames_behind = Vec::new();
    let load = paced(
        &store,
        rate,
        threads,
        warmup,
        length,
        Duration::from_millis(10),
        || {
            let s = stats(&store);
            if let Some(ship) = shipping(&s) {
                lags.push(ship.lag);
                frames_behind.push(ship.lag_frames);
            }
        },
    );
    let after = stats(&store);
    drop(store);
    drop(stream);
    let (b, a) = (
        shipping(&before).expect("shipping"),
        shipping(&after).expect("shipping"),
    );
    lags.sort_unstable();
    frames_behind.sort_unstable();
    let frames = a.frames_shipped - b.frames_shipped;
    Lag {
        ack: (a.lag_p50, a.lag_p99),
        age: (
            percentile(&lags, 0.5),
            percentile(&lags, 0.99),
            *lags.last().expect("samples"),
        ),
        behind: (
            percentile(&frames_behind, 0.5),
            percentile(&frames_behind, 0.99),
            *frames_behind.last().expect("samples"),
        ),
        frames_per_s: frames as f64 / (warmup + length).as_secs_f64(),
        snapshots: a.snapshots - b.snapshots,
        overflows: a.overflows,
        load,
    }
}

fn part2(summary: &mut Vec<String>) {
    let rate = env("SHIP_LAG_RATE", 10_000) as f64;
    let threads = env("SHIP_LAG_THREADS", 32);
    let length = Duration::from_secs(env("SHIP_LAG_SECS", 10));
    let warmup = Duration::from_secs(2);
    println!(
        "\n## 2. lag, asynchronous, {rate:.0} pairs/s offered from {threads} threads ({} s warm-up + {} s timed), a fresh store each",
        warmup.as_secs(),
        length.as_secs()
    );
    // The default snapshot size first; then `ship_snapshot_bytes` at its maximum, so that no
    // snapshot is made during the load: what the snapshots add to the lag.
    let runs = [
        ("default snapshots (64 MiB)", None),
        ("no snapshot during the load", Some(64 << 30)),
    ];
    for (name, snapshot_bytes) in runs {
        let run = lag_run(rate, threads, warmup, length, snapshot_bytes);
        let reached = run.load.reached >= rate * 0.98;
        println!("  {name}:");
        println!(
            "    reached {:.0} pairs/s ({}; {} pairs in all); pairs started late by p50 {} p99 {} max {}",
            run.load.reached,
            if reached {
                "the offered rate"
            } else {
                "BELOW the offered rate"
            },
            run.load.pairs,
            ms(run.load.late.0),
            ms(run.load.late.1),
            ms(run.load.late.2),
        );
        println!(
            "    Stats::shipping at the end: sync-to-ack lag_p50 {} lag_p99 {} (last 4,096 frames); {:.0} frames shipped/s ({:.1} pairs a frame); snapshots during the load {}, overflows {}",
            ms(run.ack.0),
            ms(run.ack.1),
            run.frames_per_s,
            run.load.pairs as f64 / (run.frames_per_s * (warmup + length).as_secs_f64()).max(1.0),
            run.snapshots,
            run.overflows,
        );
        println!(
            "    Stats::shipping.lag (the oldest unacknowledged frame's age) every 10 ms: p50 {} p99 {} max {}; frames behind p50 {} p99 {} max {}",
            ms(run.age.0),
            ms(run.age.1),
            ms(run.age.2),
            run.behind.0,
            run.behind.1,
            run.behind.2,
        );
        summary.push(format!(
            "| async at {} pairs/s offered, {name}: reached | **{}** ({}) | pairs started late p99 {}; {} snapshots during the load | |",
            k(rate),
            k(run.load.reached),
            if reached { "reached" } else { "not reached" },
            ms(run.load.late.1),
            run.snapshots,
        ));
        summary.push(format!(
            "| … local sync to the replica's ack (`lag_p50` / `lag_p99`, last 4,096 frames) | **{} / {}** | {:.0} frames/s | |",
            ms(run.ack.0),
            ms(run.ack.1),
            run.frames_per_s,
        ));
        summary.push(format!(
            "| … age of the oldest unshipped frame (`lag`, every 10 ms) p50 / p99 / max | **{} / {}** / {} | frames behind p99 {}, max {} | |",
            ms(run.age.0),
            ms(run.age.1),
            ms(run.age.2),
            run.behind.1,
            run.behind.2,
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Part 3: restore of a large store.

/// Fills `store` with `count` pairs from 64 threads, printing progress every tenth.
fn fill(store: &Store, count: u64) -> f64 {
    const THREADS: u64 = 64;
    let next = AtomicU64::new(0);
    let started = Instant::now();
    let tenth = (count / 10).max(1);
    let mut last = (0, started);
    std::thread::scope(|s| {
        for client in 0..THREADS {
            let next = &next;
            s.spawn(move || {
                let mut keys = seed();
                while next.fetch_add(1, Ordering::Relaxed) < count {
                    pair(store, client, &mut keys);
                }
            });
        }
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let n = next.load(Ordering::Relaxed).min(count);
            if n >= last.0 + tenth || n >= count {
                let s = stats(store);
                let ship = shipping(&s).expect("shipping");
                println!(
                    "    {n:>9} pairs, {:>6.0} pairs/s since the last line; shipping {:?}, {} frames behind, {} snapshots (last at frame {:?}), {} overflows",
                    (n - last.0) as f64 / last.1.elapsed().as_secs_f64(),
                    ship.state,
                    ship.lag_frames,
                    ship.snapshots,
                    ship.last_snapshot,
                    ship.overflows
                );
                last = (n, Instant::now());
            }
            if n >= count {
                break;
            }
        }
    });
    count as f64 / started.elapsed().as_secs_f64()
}

fn part3(summary: &mut Vec<String>) {
    let records = env("SHIP_RESTORE_RECORDS", 1_000_000);
    println!("\n## 3. restore of {records} completed pairs from JetStream");
    let source_dir = temp_dir();
    let stream = StreamName::new("restore");
    let store = open(source_dir.path(), Mode::Async, Some(&stream));
    wait_shipping(&store);
    let rate = fill(&store, records);
    let caught_up = wait_caught_up(&store, Duration::from_secs(600));
    let s = stats(&store);
    let ship = shipping(&s).expect("shipping").clone();
    println!(
        "  filled at {rate:.0} pairs/s; the replica caught up {} after the last pair; {} frames shipped, {} snapshots (the last at frame {:?}), {} overflows; log {}",
        ms(caught_up),
        ship.frames_shipped,
        ship.snapshots,
        ship.last_snapshot,
        ship.overflows,
        mib(s.log_bytes),
    );
    // A clean close: waits for the replica, and for a snapshot under way to be sent.
    let closing = Instant::now();
    drop(store);
    let closed = closing.elapsed();
    drop(source_dir);

    let source = stream.replica();
    let snapshot = source
        .latest_snapshot()
        .expect("the stream answers")
        .expect("a snapshot");
    let log = stream.log().expect("the log stream");
    println!(
        "  closed in {}; the stream holds a snapshot at frame {} ({}), then {} messages ({}, stream sequences {}..={})",
        ms(closed),
        snapshot.seq,
        mib(snapshot.bytes),
        log.messages,
        mib(log.bytes),
        log.first,
        log.last
    );

    // Where the time goes: the download alone, and the frames' read alone.
    let scratch = temp_dir();
    let t = Instant::now();
    source
        .fetch_snapshot(&scratch.path().join("snapshot.redb"))
        .expect("download");
    let download = t.elapsed();
    let t = Instant::now();
    let mut read = (0u64, 0u64);
    source
        .frames_after(snapshot.seq, &mut |frame, _| {
            read.0 += 1;
            read.1 += frame.payload.len() as u64;
            Ok(())
        })
        .expect("read the frames");
    let frames_read = t.elapsed();
    drop(scratch);
    println!(
        "  alone: the snapshot's download {} ({:.0} MB/s); the {} frames after it ({}) read in {}",
        secs(download),
        snapshot.bytes as f64 / 1e6 / download.as_secs_f64(),
        read.0,
        mib(read.1),
        secs(frames_read)
    );

    let dest = temp_dir();
    let target = dest.path().join("restored");
    let t = Instant::now();
    let restored = Store::restore(&source, &target, Takeover::Yes).expect("restore");
    let restore_time = t.elapsed();
    let t = Instant::now();
    let store = open(&target, Mode::Off, None);
    let open_time = t.elapsed();
    let report = store.recovery_report();
    let completed = store.exact_stats().expect("stats").completed;
    println!(
        "  Store::restore: {} (snapshot at frame {}, {} frames after it written to the log, last frame {}); first open: {} (replayed {} frames, {} of log, replay {})",
        secs(restore_time),
        restored.snapshot,
        restored.frames,
        restored.last_frame,
        secs(open_time),
        report.frames_replayed,
        mib(report.bytes_replayed),
        secs(report.duration),
    );
    println!(
        "  the restored store holds {completed} completed records ({})",
        if completed == records {
            "every pair written".to_owned()
        } else {
            format!("NOT the {records} written")
        }
    );
    drop(store);
    summary.push(format!(
        "| restore of {} pairs: `Store::restore` (snapshot download + {} frames) | **{}** | snapshot {} at frame {}; download alone {}, frames alone {} | |",
        k(records as f64),
        restored.frames,
        secs(restore_time),
        mib(snapshot.bytes),
        snapshot.seq,
        secs(download),
        secs(frames_read),
    ));
    summary.push(format!(
        "| … then the first open (replays the tail) | **{}** | {} frames, {} replayed | |",
        secs(open_time),
        report.frames_replayed,
        mib(report.bytes_replayed),
    ));
    summary.push(format!(
        "| … the fill: pairs/s with async shipping, 64 clients; snapshots sent | {} | {} snapshots, {} overflows | |",
        k(rate),
        ship.snapshots,
        ship.overflows,
    ));
    drop(dest);
    drop(stream);
}

// ---------------------------------------------------------------------------------------------
// Part 4: a standby's take-over.

fn part4(summary: &mut Vec<String>) {
    let rate = env("SHIP_STANDBY_RATE", 2000) as f64;
    let length = Duration::from_secs(env("SHIP_STANDBY_SECS", 20));
    let poll = Duration::from_millis(env("SHIP_STANDBY_POLL_MS", 50));
    println!(
        "\n## 4. standby (poll {} ms) behind a store at {rate:.0} pairs/s for {} s, then take-over",
        poll.as_millis(),
        length.as_secs()
    );
    let source_dir = temp_dir();
    let stream = StreamName::new("standby");
    let store = open(source_dir.path(), Mode::Async, Some(&stream));
    wait_shipping(&store);
    let standby_root = temp_dir();
    let standby_dir = standby_root.path().join("standby");
    let t = Instant::now();
    let standby = Standby::follow(stream.replica(), &standby_dir, poll).expect("follow");
    println!("  following after {}", ms(t.elapsed()));
    let mut behind = Vec::new();
    let mut stale = Vec::new();
    let load = paced(
        &store,
        rate,
        16,
        Duration::ZERO,
        length,
        Duration::from_millis(100),
        || {
            let durable = shipping(&stats(&store)).map_or(0, |s| s.durable_frame);
            let status = standby.status();
            behind.push(durable.saturating_sub(status.last_frame));
            stale.push(status.caught_up_at.elapsed());
        },
    );
    let caught_up = wait_caught_up(&store, Duration::from_secs(120));
    let s = stats(&store);
    let ship = shipping(&s).expect("shipping").clone();
    let status = standby.status();
    behind.sort_unstable();
    stale.sort_unstable();
    println!(
        "  load: {:.0} pairs/s reached, {} pairs; the replica caught up {} after it stopped; store at frame {}, {} snapshots",
        load.reached,
        load.pairs,
        ms(caught_up),
        ship.durable_frame,
        ship.snapshots
    );
    println!(
        "  the standby during the load (every 100 ms): frames behind the store p50 {} p99 {} max {}; time since it last reached the stream's end p50 {} p99 {} max {}",
        percentile(&behind, 0.5),
        percentile(&behind, 0.99),
        behind.last().expect("samples"),
        ms(percentile(&stale, 0.5)),
        ms(percentile(&stale, 0.99)),
        ms(*stale.last().expect("samples")),
    );
    println!(
        "  the standby now: snapshot at frame {}, last frame {}, {} frames of tail, {} rebases, last error {:?}",
        status.snapshot, status.last_frame, status.tail_frames, status.rebases, status.last_error
    );

    // For comparison: a cold restore of the same stream, and its first open.
    let cold_root = temp_dir();
    let cold_dir = cold_root.path().join("cold");
    let t = Instant::now();
    let cold = Store::restore(&stream.replica(), &cold_dir, Takeover::No).expect("cold restore");
    let cold_restore = t.elapsed();
    let t = Instant::now();
    let cold_store = open(&cold_dir, Mode::Off, None);
    let cold_open = t.elapsed();
    let cold_report = cold_store.recovery_report();
    drop(cold_store);
    drop(cold_root);
    println!(
        "  cold Store::restore of the same stream: {} ({} frames after the snapshot), first open {} (replayed {} frames, replay {})",
        secs(cold_restore),
        cold.frames,
        secs(cold_open),
        cold_report.frames_replayed,
        secs(cold_report.duration),
    );

    let t = Instant::now();
    let restored = standby.take_over().expect("take over");
    let take_over = t.elapsed();
    let t = Instant::now();
    let new_store = open(&standby_dir, Mode::Async, Some(&stream));
    let first_open = t.elapsed();
    let report = new_store.recovery_report();
    let completed = new_store.exact_stats().expect("stats").completed;
    println!(
        "  take_over(): {} (snapshot at frame {}, {} frames of tail, last frame {}); first open (shipping to the stream): {} (replayed {} frames, {}, replay {}); together {}",
        ms(take_over),
        restored.snapshot,
        restored.frames,
        restored.last_frame,
        ms(first_open),
        report.frames_replayed,
        mib(report.bytes_replayed),
        ms(report.duration),
        ms(take_over + first_open),
    );
    println!(
        "  the new store holds {completed} completed records ({})",
        if completed == load.pairs {
            "every pair written".to_owned()
        } else {
            format!("NOT the {} written", load.pairs)
        }
    );
    drop(new_store);
    drop(store); // the old store, fenced off by the take-over: its release is refused
    summary.push(format!(
        "| standby (poll {} ms) at {} pairs/s: frames behind the store p50 / p99 / max | {} / {} / {} | time since it last reached the stream's end p99 {} | |",
        poll.as_millis(),
        k(rate),
        percentile(&behind, 0.5),
        percentile(&behind, 0.99),
        behind.last().expect("samples"),
        ms(percentile(&stale, 0.99)),
    ));
    summary.push(format!(
        "| standby: `take_over()` + first open ({} frames of tail replayed) | **{}** | take_over {}, open {} | cold restore + open: {} + {} |",
        report.frames_replayed,
        ms(take_over + first_open),
        ms(take_over),
        ms(first_open),
        ms(cold_restore),
        ms(cold_open),
    ));
    drop(standby_root);
    drop(source_dir);
    drop(stream);
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let parts = env_list("SHIP_PARTS", "1,2,3,4");
    sweep_leftovers();
    let probe = temp_dir();
    let sync_before = common::fdatasync_median(probe.path(), 400);
    println!(
        "idemstore log shipping to {} (business row {}); raw fdatasync of 512 B in {}: median {}",
        url(),
        row().name(),
        probe.path().display(),
        ms(sync_before)
    );
    let started = Instant::now();
    // A run that counts for nothing first: the disk, the page cache and NATS settle (the first
    // timed run of a fresh process was the slowest in trials).
    {
        let dir = temp_dir();
        let stream = StreamName::new("warmup");
        let store = open(dir.path(), Mode::Async, Some(&stream));
        wait_shipping(&store);
        let run = closed_loop(
            &store,
            64,
            Duration::from_millis(500),
            Duration::from_secs(2),
        );
        println!(
            "(warm-up, not counted: {:.0} pairs/s async at 64 clients)",
            run.pairs_per_s
        );
    }
    let mut summary = Vec::new();
    for part in parts {
        match part {
            1 => part1(&mut summary),
            2 => part2(&mut summary),
            3 => part3(&mut summary),
            4 => part4(&mut summary),
            other => panic!("SHIP_PARTS: no part {other}"),
        }
    }
    let sync_after = common::fdatasync_median(probe.path(), 400);
    println!(
        "\nraw fdatasync of 512 B, median of 400: {} at the start, {} at the end; the whole run {}",
        ms(sync_before),
        ms(sync_after),
        secs(started.elapsed())
    );
    println!("\n| figure | value | detail | |\n| --- | --- | --- | --- |");
    for line in &summary {
        println!("{line}");
    }
    println!(
        "| raw fdatasync, 512 B (median of 400, start / end) | {} / {} | | |",
        ms(sync_before),
        ms(sync_after)
    );
}
