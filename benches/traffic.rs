//! The keys users send: claim+commit pairs from 64 clients on UUIDv4 keys (random) and UUIDv7
//! keys (time-ordered), in stores of 100,000 and 1,000,000 records, and a store that holds a
//! TTL's worth of keys while the sweeper evicts the expired ones. Every other bench writes
//! keys in order (`key-{i:012}`) to stores that fit in memory; real keys are random, and a
//! real store is as large as its TTL makes it.
//!
//! `cargo bench --bench traffic` (Linux, for `/proc`; at the defaults about 2.5M pairs in all,
//! an estimated 5 to 10 minutes on a quiet 2-core machine, not yet timed at full size). For
//! each key kind (v4, v7) and each size, on a fresh store in a fresh directory:
//!
//! 1. fill: pairs/s per tenth of the fill, and the last tenth ÷ the first;
//! 2. after `checkpoint`: bytes on disk per record (the redb file, and the whole directory
//!    with the log: file lengths, so preallocated log segments count in full), and bytes
//!    written per pair over the fill and that checkpoint, log and redb alike, from
//!    `/proc/self/io`: `write_bytes` (pages the process dirtied in the page cache; the kernel
//!    counts whole folios, so with large folios it can far exceed what reaches the device: on
//!    the Linux 6.18 bench machine it was ten times `wchar` and the device's own count) and
//!    `wchar` (bytes passed to write calls: what the store asked to write);
//! 3. timed: pairs/s of 3 runs of 1 s each (median, min–max; each run adds keys, the count at
//!    its start is printed), and the p50/p99 latency of one pair over all of them;
//! 4. replays: p50/p99 latency of a `begin` answering `Replay` for 10,000 keys picked at random
//!    among the fill's, from one thread;
//! 5. peak RSS (`VmHWM`), reset at the start of each phase (through `/proc/self/clear_refs`;
//!    the output says if the kernel refused, in which case it is the process's peak so far);
//! 6. once the store is closed, what redb says it uses per record: bytes in allocated pages,
//!    and bytes of keys and values in leaves (`WriteTransaction::stats`). The file's length
//!    (step 2) moves in redb's large growth steps; these do not. Then how long the store
//!    takes to open again: start-up, with the file in the kernel's page cache.
//!
//! Then the **steady state**, v4 keys: a probe store (sweep off) is filled to the live size
//! to measure the fill rate, and the TTL set to live ÷ rate, so that about that many records
//! are live. A fresh store with that TTL and the sweeper on (every TTL/20, between 100 ms and
//! 1 s, batches of 1,000; the real clock) is filled to the live size, then written to for one
//! TTL more, in 1-second windows: the store turns over once. Printed: pairs/s over the
//! turnover, records at the end, the disk, write and RSS figures as above (writes over the
//! turnover). Then the same store is reopened with the sweeper off and measured as in step 3
//! from the same record count: the ratio "with eviction ÷ without".
//!
//! Environment (all optional):
//! - `TRAFFIC_MAX`: the largest store size (default 1000000); sizes are 100k, 1M, 10M, ... up to
//!   it (`TRAFFIC_MAX=10000000` for 10M; a max below 100k is the one size);
//! - `TRAFFIC_SIZES`: the sizes instead, a comma-separated list (`TRAFFIC_SIZES=1000000`: that
//!   size alone, in a process of its own, so that its peak RSS owes nothing to another size);
//! - `TRAFFIC_LIVE`: live records in the steady state (default 200000; the full target is
//!   2000000);
//! - `TRAFFIC_TURNOVERS`: TTLs to run after the steady fill (default 1);
//! - `TRAFFIC_RUNS`, `TRAFFIC_RUN_MS`: timed runs per size and their length (default 3, 1000);
//!   `TRAFFIC_RUN_MS` is also the window length of the turnover;
//! - `TRAFFIC_REPLAYS`: keys replayed per size (default 10000);
//! - `TRAFFIC_KINDS`: `v4,v7` (default), or one of them;
//! - `TRAFFIC_DIR`: where the temporary store directories go (default the system's temporary
//!   directory; put it on the disk to measure, not on a tmpfs);
//! - `TRAFFIC_ROW`: how each pair's 100-byte business row is keyed: `by-number` (default, an
//!   order number handed out in order, as most services key their rows) or `by-key` (the
//!   idempotency key itself: with random keys, a business table that grows at random too,
//!   whose cost is the application's, not the store's).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{ORDERS, ORDERS_BY_NUMBER, Row};
use idemstore::{Begin, Fingerprint, Store, Sweep};

const CLIENTS: u64 = 64;
const WRITE_BYTES: &str = "written B/pair, write_bytes (fill + checkpoint; steady: turnover)";
const WCHAR: &str = "written B/pair, wchar (same span)";

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.replace(['_', ','], "")
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
    })
}

/// splitmix64: a small, fast generator, one per client thread.
struct Rng(u64);

impl Rng {
    /// A generator for thread `thread` of run `run`: every (run, thread) its own stream.
    fn new(run: u64, thread: u64) -> Rng {
        let mut seed = Rng((run << 8) | thread);
        Rng(seed.next())
    }

    fn next(&mut self) -> u64 {
        let z = common::mix(self.0);
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z
    }
}

/// A fresh stream number for each run of client threads, so no two runs draw the same keys.
fn next_run() -> u64 {
    static RUN: AtomicU64 = AtomicU64::new(1);
    RUN.fetch_add(1, Ordering::Relaxed)
}

/// Milliseconds since the Unix epoch, never going back (the UUIDv7 timestamp).
fn now_ms() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    LAST.fetch_max(now, Ordering::Relaxed).max(now)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Random: 122 random bits, version 4, RFC 9562 variant.
    V4,
    /// Time-ordered: 48 bits of milliseconds, version 7, 74 random bits, RFC 9562 variant.
    V7,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::V4 => "v4",
            Kind::V7 => "v7",
        }
    }

    /// A key in the canonical text form (36 characters, lowercase hex with dashes).
    fn key(self, rng: &mut Rng) -> String {
        let (hi, lo) = (rng.next(), rng.next());
        let hi = match self {
            Kind::V4 => (hi & !0xf000) | 0x4000,
            Kind::V7 => ((now_ms() & 0xffff_ffff_ffff) << 16) | (hi & 0x0fff) | 0x7000,
        };
        common::uuid_text(hi, lo)
    }
}

/// How every pair's business row is keyed (`TRAFFIC_ROW`).
fn row() -> Row {
    static ROW: std::sync::OnceLock<Row> = std::sync::OnceLock::new();
    *ROW.get_or_init(|| Row::from_env("TRAFFIC_ROW"))
}

/// A key kept for replays: its client (tenant) and text.
type Kept = (u64, String);

struct Fill {
    rate: f64,
    /// Pairs/s in each tenth of the fill.
    tenths: Vec<f64>,
    /// About `sample` of the keys written, picked uniformly at random.
    kept: Vec<Kept>,
}

/// Writes `count` pairs of `kind` keys from 64 clients, client `t` as tenant `t % 16`.
fn fill(store: &Store, kind: Kind, count: u64, sample: u64) -> Fill {
    let run = next_run();
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let marks: Vec<AtomicU64> = (0..=10).map(|_| AtomicU64::new(0)).collect();
    let keep = ((sample as f64 / count as f64).min(1.0) * u64::MAX as f64) as u64;
    let started = Instant::now();
    let kept = std::thread::scope(|s| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|t| {
                let (next, done, marks, started) = (&next, &done, &marks, &started);
                s.spawn(move || {
                    let mut rng = Rng::new(run, t);
                    let mut kept = Vec::new();
                    while next.fetch_add(1, Ordering::Relaxed) < count {
                        let key = kind.key(&mut rng);
                        if rng.next() < keep {
                            kept.push((t, key.clone()));
                        }
                        common::pair_with(store, &common::scope(t, key), row());
                        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                        let tenth = d * 10 / count;
                        if tenth > (d - 1) * 10 / count {
                            let at = started.elapsed().as_nanos() as u64;
                            marks[tenth as usize].store(at, Ordering::Relaxed);
                        }
                    }
                    kept
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("a client thread"))
            .collect()
    });
    let rate = count as f64 / started.elapsed().as_secs_f64();
    let marks: Vec<u64> = marks.iter().map(|m| m.load(Ordering::Relaxed)).collect();
    let tenths = (1..=10)
        .map(|k| {
            let pairs = (k * count / 10 - (k - 1) * count / 10) as f64;
            pairs / ((marks[k as usize].saturating_sub(marks[k as usize - 1])) as f64 / 1e9)
        })
        .collect();
    Fill { rate, tenths, kept }
}

impl Fill {
    /// Pairs/s in the last tenth ÷ in the first.
    fn ratio(&self) -> f64 {
        self.tenths[9] / self.tenths[0]
    }

    /// The fill's cells of the summary.
    fn cells(&self) -> [(&'static str, String); 3] {
        let tenths: Vec<String> = self.tenths.iter().map(|&r| rate(r)).collect();
        let ratio = self.ratio();
        [
            ("fill pairs/s", rate(self.rate)),
            ("fill pairs/s per tenth", tenths.join(" ")),
            ("fill last tenth ÷ first", format!("{ratio:.2}")),
        ]
    }
}

/// The disk, write and memory cells every phase of the summary ends with.
fn footprint(
    redb: u64,
    all: u64,
    records: u64,
    (dirtied, wchar): (String, String),
    rss: Option<u64>,
) -> [(&'static str, String); 5] {
    [
        ("redb file B/record", per(redb, records)),
        ("directory B/record (log included)", per(all, records)),
        (WRITE_BYTES, dirtied),
        (WCHAR, wchar),
        ("peak RSS", mib(rss)),
    ]
}

struct Timed {
    done: u64,
    rate: f64,
    /// Nanoseconds per pair, unsorted.
    latencies: Vec<u64>,
}

/// Pairs of new `kind` keys from 64 clients for `duration`.
fn timed(store: &Store, kind: Kind, duration: Duration, latencies: bool) -> Timed {
    let run = next_run();
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let per_thread: Vec<(u64, Vec<u64>)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..CLIENTS)
            .map(|t| {
                let stop = &stop;
                s.spawn(move || {
                    let mut rng = Rng::new(run, t);
                    let (mut done, mut lat) = (0, Vec::new());
                    while !stop.load(Ordering::Relaxed) {
                        let scope = common::scope(t, kind.key(&mut rng));
                        let at = Instant::now();
                        common::pair_with(store, &scope, row());
                        if latencies {
                            lat.push(at.elapsed().as_nanos() as u64);
                        }
                        done += 1;
                    }
                    (done, lat)
                })
            })
            .collect();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        threads
            .into_iter()
            .map(|t| t.join().expect("a client thread"))
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let done: u64 = per_thread.iter().map(|(d, _)| d).sum();
    Timed {
        done,
        rate: done as f64 / elapsed,
        latencies: per_thread.into_iter().flat_map(|(_, l)| l).collect(),
    }
}

/// `runs` timed runs; prints each. Returns the rates and every pair's latency, sorted.
fn timed_runs(store: &Store, kind: Kind, runs: u64, run: Duration) -> (Vec<f64>, Vec<u64>) {
    let (mut rates, mut latencies) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let at = records(store);
        let t = timed(store, kind, run, true);
        println!("  run starting at {at} records: {:.0} pairs/s", t.rate);
        rates.push(t.rate);
        latencies.extend(t.latencies);
    }
    latencies.sort_unstable();
    (rates, latencies)
}

/// One thread's `begin` of each kept key (in random order), each answering `Replay`.
/// Returns the latencies in nanoseconds, sorted.
fn replays(store: &Store, mut kept: Vec<Kept>) -> Vec<u64> {
    let mut rng = Rng::new(next_run(), 0);
    for i in (1..kept.len()).rev() {
        kept.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut latencies: Vec<u64> = kept
        .into_iter()
        .map(|(t, key)| {
            let fingerprint = Fingerprint::of_bytes(key.as_bytes());
            let scope = common::scope(t, key);
            let at = Instant::now();
            let answer = store.begin(&scope, fingerprint).expect("begin");
            let took = at.elapsed().as_nanos() as u64;
            assert!(matches!(answer, Begin::Replay(_)), "{scope} did not replay");
            took
        })
        .collect();
    latencies.sort_unstable();
    latencies
}

fn records(store: &Store) -> u64 {
    store.exact_stats().expect("counts").records
}

fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    let last = sorted.len().checked_sub(1)?;
    Some(sorted[(last as f64 * p).round() as usize])
}

fn median(rates: &[f64]) -> f64 {
    let mut rates = rates.to_vec();
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A field of `/proc/self/<file>` ("write_bytes", "VmHWM"), as a number (kB fields in bytes).
fn proc_field(file: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/{file}")).ok()?;
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    let (number, scale) = match value.trim().strip_suffix("kB") {
        Some(kb) => (kb, 1024),
        None => (value, 1),
    };
    number.trim().parse::<u64>().ok().map(|n| n * scale)
}

/// What the process wrote so far: (`write_bytes`, `wchar`) of `/proc/self/io`.
fn written() -> Option<(u64, u64)> {
    Some((proc_field("io", "write_bytes")?, proc_field("io", "wchar")?))
}

/// Bytes written per pair between two [`written`] readings: (`write_bytes`, `wchar`).
fn written_per(before: Option<(u64, u64)>, pairs: u64) -> (String, String) {
    match before.zip(written()) {
        Some(((b, bc), (a, ac))) => (
            per(a.saturating_sub(b), pairs),
            per(ac.saturating_sub(bc), pairs),
        ),
        None => ("–".into(), "–".into()),
    }
}

fn peak_rss() -> Option<u64> {
    proc_field("status", "VmHWM")
}

/// Resets the peak RSS to the current RSS (Linux 4.0+). False if the kernel refused.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Bytes of the files under `dir`, subdirectories included.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    })
}

/// Disk per record after a checkpoint: (records, redb file bytes, directory bytes).
fn disk(store: &Store, dir: &Path) -> (u64, u64, u64) {
    store.checkpoint().expect("checkpoint");
    let redb = std::fs::metadata(dir.join("idemstore.redb")).map_or(0, |m| m.len());
    (records(store), redb, dir_bytes(dir))
}

/// What redb itself says it uses, read from the closed store's file: bytes in allocated
/// pages, and bytes of keys and values stored in leaves. The file's length is not a measure
/// of the records: redb grows it in large steps (the same 1,074 B/record at 1M whatever the
/// record size), and does not shrink it.
fn redb_in_use(dir: &Path) -> (u64, u64) {
    // A small cache: redb's default (1 GiB) would fill with the pages the count reads, and the
    // allocator would keep that memory for the next phase's peak RSS.
    let db = idemstore::redb::Database::builder()
        .set_cache_size(4 << 20)
        .open(dir.join("idemstore.redb"))
        .expect("reopen redb");
    let txn = db.begin_write().expect("a redb write transaction");
    let stats = txn.stats().expect("redb stats");
    let page = stats.page_size() as u64;
    txn.abort().expect("abort");
    (stats.allocated_pages() * page, stats.stored_bytes())
}

fn temp_dir() -> tempfile::TempDir {
    match std::env::var_os("TRAFFIC_DIR") {
        Some(parent) => tempfile::tempdir_in(parent),
        None => tempfile::tempdir(),
    }
    .expect("a temporary directory")
}

/// How long opening the closed store at `dir` takes: start-up, which reads every sealed
/// partition's row to rebuild the key filters.
fn reopened(dir: &Path) -> Duration {
    let started = Instant::now();
    let store = open(dir, None, Sweep::default());
    let took = started.elapsed();
    drop(store);
    took
}

fn open(dir: &Path, ttl: Option<Duration>, sweep: Sweep) -> Store {
    let builder = Store::builder()
        .table(ORDERS)
        .table(ORDERS_BY_NUMBER)
        .sweep(sweep);
    match ttl {
        Some(ttl) => builder.ttl(ttl),
        None => builder,
    }
    .open(dir)
    .expect("open")
}

/// `100k`, `1M`, `1.5M`, `20k`, `512`.
fn count(n: u64) -> String {
    let short = |v: f64, unit: &str| {
        let text = format!("{v:.1}");
        format!("{}{unit}", text.trim_end_matches(".0"))
    };
    if n >= 1_000_000 {
        short(n as f64 / 1e6, "M")
    } else if n >= 1_000 {
        short(n as f64 / 1e3, "k")
    } else {
        n.to_string()
    }
}

fn rate(r: f64) -> String {
    if r >= 10_000.0 {
        format!("{:.1}k", r / 1e3)
    } else {
        format!("{r:.0}")
    }
}

fn latency(ns: Option<u64>) -> String {
    match ns {
        None => "–".into(),
        Some(ns) if ns < 1_000_000 => format!("{:.1} µs", ns as f64 / 1e3),
        Some(ns) => format!("{:.2} ms", ns as f64 / 1e6),
    }
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("–".into(), |b| {
        format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0))
    })
}

fn per(bytes: u64, n: u64) -> String {
    format!("{:.0}", bytes as f64 / n.max(1) as f64)
}

fn spread(rates: &[f64]) -> String {
    let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
    let max = rates.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{} ({}–{})", rate(median(rates)), rate(min), rate(max))
}

/// One column of the summary: a phase's figures, each already formatted.
struct Column {
    name: String,
    cells: Vec<(&'static str, String)>,
}

struct Settings {
    runs: u64,
    run: Duration,
    replays: u64,
    rss_reset: bool,
}

/// One key kind at one size, on a fresh store.
fn size(kind: Kind, size: u64, s: &Settings) -> Column {
    let dir = temp_dir();
    let store = open(dir.path(), None, Sweep::default());
    let rss_reset = s.rss_reset && reset_peak_rss();
    println!("\n## {} keys, {} records", kind.name(), count(size));
    let before = written();
    let mut filled = fill(&store, kind, size, s.replays);
    let (records, redb, all) = disk(&store, dir.path());
    let (dirtied, wchar) = written_per(before, size);
    for (k, r) in filled.tenths.iter().enumerate() {
        let k = k as u64;
        println!(
            "  {}–{}: {r:.0} pairs/s",
            count(k * size / 10),
            count((k + 1) * size / 10)
        );
    }
    let ratio = filled.ratio();
    println!(
        "  fill: {:.0} pairs/s; last tenth ÷ first: {ratio:.2}",
        filled.rate
    );
    println!(
        "  after checkpoint: {records} records; redb file {} B/record, directory {} B/record",
        per(redb, records),
        per(all, records)
    );
    println!(
        "  written (fill + checkpoint): {dirtied} B/pair dirtied in the page cache (write_bytes), {wchar} B/pair in write calls (wchar)"
    );
    let (rates, lat) = timed_runs(&store, kind, s.runs, s.run);
    let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
    println!(
        "  timed: {} pairs/s median (min–max); pair p50 {} p99 {} ({} pairs)",
        spread(&rates),
        latency(p50),
        latency(p99),
        lat.len()
    );
    let replayed = replays(&store, std::mem::take(&mut filled.kept));
    let (r50, r99) = (percentile(&replayed, 0.5), percentile(&replayed, 0.99));
    println!(
        "  replay begin (1 thread, {} random keys of the fill): p50 {} p99 {}",
        replayed.len(),
        latency(r50),
        latency(r99)
    );
    let rss = peak_rss();
    println!(
        "  peak RSS{}: {}",
        if rss_reset { "" } else { " (process so far)" },
        mib(rss)
    );
    let at_end = crate::records(&store);
    drop(store);
    let (allocated, stored) = redb_in_use(dir.path());
    println!(
        "  redb at the end ({at_end} records): {} B/record in allocated pages, {} B/record of stored key and value bytes",
        per(allocated, at_end),
        per(stored, at_end)
    );
    let reopen = Some(u64::try_from(reopened(dir.path()).as_nanos()).unwrap_or(u64::MAX));
    println!(
        "  reopen after a clean close (the file in the page cache): {}",
        latency(reopen)
    );
    Column {
        name: format!("{} {}", kind.name(), count(size)),
        cells: [("records (steady: at the end)", records.to_string())]
            .into_iter()
            .chain(filled.cells())
            .chain([
                ("timed pairs/s, median (min–max)", spread(&rates)),
                (
                    "pair p50 / p99",
                    format!("{} / {}", latency(p50), latency(p99)),
                ),
                (
                    "replay begin p50 / p99 (1 thread)",
                    format!("{} / {}", latency(r50), latency(r99)),
                ),
            ])
            .chain(footprint(redb, all, records, (dirtied, wchar), rss))
            .chain([
                (
                    "redb allocated pages B/record (at the end)",
                    per(allocated, at_end),
                ),
                (
                    "redb stored key + value B/record (at the end)",
                    per(stored, at_end),
                ),
                ("reopen after a clean close", latency(reopen)),
            ])
            .collect(),
    }
}

/// The steady state: about `live` records live, the sweeper evicting, v4 keys.
fn steady(live: u64, turnovers: u64, s: &Settings) -> Column {
    println!("\n## steady state, v4 keys, {} live", count(live));
    let probe = {
        let dir = temp_dir();
        let store = open(dir.path(), None, Sweep::Off);
        fill(&store, Kind::V4, live, 0).rate
    };
    let ttl = Duration::from_secs_f64(live as f64 / probe).max(Duration::from_secs(1));
    let interval = (ttl / 20).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let sweep = Sweep::Every {
        interval,
        batch: 1_000,
    };
    println!(
        "  probe fill (sweep off): {probe:.0} pairs/s, so TTL = {} ÷ {probe:.0} = {:.1} s; sweep every {} ms, batches of 1000",
        live,
        ttl.as_secs_f64(),
        interval.as_millis()
    );

    let dir = temp_dir();
    let store = open(dir.path(), Some(ttl), sweep);
    let rss_reset = s.rss_reset && reset_peak_rss();
    let filled = fill(&store, Kind::V4, live, 0);
    let ratio = filled.ratio();
    println!(
        "  fill to {}: {:.0} pairs/s, last tenth ÷ first {ratio:.2}",
        count(live),
        filled.rate
    );
    let before = written();
    let turnover = ttl * turnovers as u32;
    let started = Instant::now();
    let mut windows = Vec::new();
    while started.elapsed() < turnover {
        let window = s.run.min(turnover - started.elapsed());
        let t = timed(&store, Kind::V4, window, false);
        windows.push((t.rate, t.done));
    }
    let elapsed = started.elapsed().as_secs_f64();
    let pairs: u64 = windows.iter().map(|(_, d)| d).sum();
    let overall = pairs as f64 / elapsed;
    let rates: Vec<f64> = windows.iter().map(|(r, _)| *r).collect();
    let at_end = crate::records(&store);
    let (records, redb, all) = disk(&store, dir.path());
    let (dirtied, wchar) = written_per(before, pairs);
    let rss = peak_rss();
    println!(
        "  turnover ({:.1} s, {} windows): {overall:.0} pairs/s overall, {} per window median (min–max)",
        elapsed,
        rates.len(),
        spread(&rates)
    );
    println!(
        "  records at the end: {at_end} (target {live}); after checkpoint: redb file {} B/record, directory {} B/record",
        per(redb, records),
        per(all, records)
    );
    println!(
        "  written (turnover + checkpoint): {dirtied} B/pair dirtied (write_bytes), {wchar} B/pair in write calls (wchar)"
    );
    println!(
        "  peak RSS{}: {}",
        if rss_reset { "" } else { " (process so far)" },
        mib(rss)
    );
    drop(store);

    let store = open(dir.path(), Some(ttl), Sweep::Off);
    println!("  the same store reopened with the sweeper off:");
    let (without, _) = timed_runs(&store, Kind::V4, s.runs, s.run);
    let vs = median(&rates) / median(&without);
    println!(
        "  without eviction: {} pairs/s median (min–max); with eviction ÷ without: {vs:.2}",
        spread(&without)
    );
    drop(store);
    Column {
        name: format!("v4 steady {}", count(live)),
        cells: [("records (steady: at the end)", at_end.to_string())]
            .into_iter()
            .chain(filled.cells())
            .chain([
                (
                    "timed pairs/s, median (min–max)",
                    format!("{} turnover windows", spread(&rates)),
                ),
                ("steady: turnover pairs/s overall", rate(overall)),
                (
                    "steady: TTL, sweep interval",
                    format!("{:.1} s, {} ms", ttl.as_secs_f64(), interval.as_millis()),
                ),
                (
                    "steady: without eviction, median (min–max)",
                    spread(&without),
                ),
                ("steady: with eviction ÷ without", format!("{vs:.2}")),
            ])
            .chain(footprint(redb, all, records, (dirtied, wchar), rss))
            .collect(),
    }
}

/// The summary: one row per figure, one column per phase.
fn summary(columns: &[Column]) {
    let mut rows: Vec<&'static str> = Vec::new();
    for c in columns {
        for (name, _) in &c.cells {
            if !rows.contains(name) {
                rows.push(name);
            }
        }
    }
    println!("\n| figure | {} |", {
        let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
        names.join(" | ")
    });
    println!("| --- |{}", " --- |".repeat(columns.len()));
    for row in rows {
        let cells: Vec<&str> = columns
            .iter()
            .map(|c| {
                c.cells
                    .iter()
                    .find(|(n, _)| *n == row)
                    .map_or("–", |(_, v)| v.as_str())
            })
            .collect();
        println!("| {row} | {} |", cells.join(" | "));
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench --list`: nothing criterion-shaped here.
    }
    let max = env("TRAFFIC_MAX", 1_000_000);
    let live = env("TRAFFIC_LIVE", 200_000);
    let turnovers = env("TRAFFIC_TURNOVERS", 1).max(1);
    let settings = Settings {
        runs: env("TRAFFIC_RUNS", 3).max(1),
        run: Duration::from_millis(env("TRAFFIC_RUN_MS", 1_000).max(1)),
        replays: env("TRAFFIC_REPLAYS", 10_000),
        rss_reset: reset_peak_rss(),
    };
    let kinds: Vec<Kind> = std::env::var("TRAFFIC_KINDS")
        .unwrap_or_else(|_| "v4,v7".into())
        .split(',')
        .map(|k| match k.trim() {
            "v4" => Kind::V4,
            "v7" => Kind::V7,
            other => panic!("TRAFFIC_KINDS: {other:?} is neither v4 nor v7"),
        })
        .collect();
    let mut sizes: Vec<u64> = match std::env::var("TRAFFIC_SIZES") {
        Ok(list) => list
            .split(',')
            .map(|s| {
                s.trim()
                    .replace('_', "")
                    .parse()
                    .unwrap_or_else(|_| panic!("TRAFFIC_SIZES: {s:?} is not a number"))
            })
            .collect(),
        Err(_) => std::iter::successors(Some(100_000u64), |s| s.checked_mul(10))
            .take_while(|&s| s <= max)
            .collect(),
    };
    if sizes.is_empty() {
        sizes.push(max.max(10));
    }
    println!(
        "traffic: {CLIENTS} clients; business rows {}; sizes {}; kinds {}; steady state {} live; peak RSS {}",
        row().name(),
        sizes
            .iter()
            .map(|&s| count(s))
            .collect::<Vec<_>>()
            .join(", "),
        kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", "),
        count(live),
        if settings.rss_reset {
            "reset per phase"
        } else {
            "not resettable here: the process's peak so far"
        }
    );
    let started = Instant::now();
    let mut columns = Vec::new();
    for &kind in &kinds {
        for &s in &sizes {
            columns.push(size(kind, s, &settings));
        }
    }
    if live > 0 {
        columns.push(steady(live, turnovers, &settings));
    }
    summary(&columns);
    println!("\n(total {:.0} s)", started.elapsed().as_secs_f64());
}
