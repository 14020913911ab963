//! idemstore against what teams use instead, measured back to back in one process run, on the
//! same workload: one "pair" is a claim of a new idempotency key plus a completion that writes a
//! ~100-byte business row and stores a ~200-byte response, keys spread over 16 tenants.
//!
//! `cargo bench --bench peers` (3 runs of 3 s per configuration, medians; about 4 minutes).
//! `cargo bench --bench peers -- --quick` does 1 run of 1 s each.
//!
//! Peers:
//! - idemstore `Wal` and `Redb`: the product;
//! - naive redb: one durable redb commit per claim and per completion, no batching;
//! - SQLite (rusqlite, bundled) in WAL journal mode, `synchronous=FULL`: the classic pattern,
//!   `INSERT ... ON CONFLICT DO NOTHING RETURNING` to claim, then one transaction inserting the
//!   business row and updating the record to completed;
//! - the same with `synchronous=NORMAL`, which does not sync each commit (not durable per commit);
//! - the CPU ceiling: redb with non-durable commits, batched, doing the same writes in one
//!   thread. Nothing that stores in redb can beat it.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{BODY, ORDERS, ROW};
use idemstore::redb::{self, ReadableTable, TableDefinition};
use idemstore::{Durability, Fingerprint, Store};

const PRODUCT_CLIENTS: usize = 64;

/// Something that can perform pairs from many client threads.
trait Peer: Send + Sync {
    /// Claims key `i` for `client` and completes it.
    fn pair(&self, client: usize, i: u64);
}

fn key(client: usize, i: u64) -> (String, String) {
    (
        format!("tenant-{}", client % 16),
        format!("c{client}-{i:012}"),
    )
}

// ---------------------------------------------------------------------------------- idemstore

struct Idemstore(Store);

impl Idemstore {
    fn open(dir: &Path, durability: Durability) -> Self {
        Idemstore(
            Store::builder()
                .durability(durability)
                .table(ORDERS)
                .open(dir)
                .expect("open idemstore"),
        )
    }
}

impl Peer for Idemstore {
    fn pair(&self, client: usize, i: u64) {
        let (_, key) = key(client, i);
        common::pair(&self.0, &common::scope(client as u64, key));
    }
}

// --------------------------------------------------------------------------------- naive redb

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const LEASES: TableDefinition<&[u8], ()> = TableDefinition::new("leases");
const EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");

/// The bytes a record of this size takes, in progress and completed (as idemstore's).
fn in_progress_record() -> Vec<u8> {
    vec![1; 75]
}

fn completed_record() -> Vec<u8> {
    vec![2; 82 + BODY.len()]
}

fn index_key(at: u64, scope: &[u8]) -> Vec<u8> {
    let mut k = at.to_be_bytes().to_vec();
    k.extend_from_slice(scope);
    k
}

/// What a first implementation on redb looks like: a durable transaction for the claim and
/// another for the completion, each on its own.
struct NaiveRedb(redb::Database);

impl NaiveRedb {
    fn open(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("dir");
        NaiveRedb(redb::Database::create(dir.join("naive.redb")).expect("create redb"))
    }
}

impl Peer for NaiveRedb {
    fn pair(&self, client: usize, i: u64) {
        let (tenant, key) = key(client, i);
        let scope = format!("{tenant}/create_order/{key}").into_bytes();
        let txn = self.0.begin_write().expect("begin");
        {
            let mut records = txn.open_table(RECORDS).expect("records");
            assert!(records.get(scope.as_slice()).expect("get").is_none());
            records
                .insert(scope.as_slice(), in_progress_record().as_slice())
                .expect("insert");
            let mut leases = txn.open_table(LEASES).expect("leases");
            leases
                .insert(index_key(1, &scope).as_slice(), ())
                .expect("lease");
        }
        txn.commit().expect("commit claim");
        let txn = self.0.begin_write().expect("begin");
        {
            txn.open_table(ORDERS)
                .expect("orders")
                .insert(key.as_str(), ROW.as_slice())
                .expect("row");
            txn.open_table(RECORDS)
                .expect("records")
                .insert(scope.as_slice(), completed_record().as_slice())
                .expect("complete");
            txn.open_table(LEASES)
                .expect("leases")
                .remove(index_key(1, &scope).as_slice())
                .expect("unlease");
            txn.open_table(EXPIRY)
                .expect("expiry")
                .insert(index_key(2, &scope).as_slice(), ())
                .expect("expiry");
        }
        txn.commit().expect("commit completion");
    }
}

// ------------------------------------------------------------------------------------ SQLite

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Synchronous {
    Full,
    Normal,
}

/// The classic relational pattern, one connection per client thread.
struct Sqlite {
    connections: Vec<Mutex<rusqlite::Connection>>,
}

impl Sqlite {
    fn open(dir: &Path, clients: usize, sync: Synchronous) -> Self {
        std::fs::create_dir_all(dir).expect("dir");
        let path = dir.join("sqlite.db");
        let connect = || {
            let c = rusqlite::Connection::open(&path).expect("sqlite open");
            c.busy_timeout(Duration::from_secs(60))
                .expect("busy timeout");
            c.pragma_update(None, "journal_mode", "WAL").expect("wal");
            c.pragma_update(
                None,
                "synchronous",
                match sync {
                    Synchronous::Full => "FULL",
                    Synchronous::Normal => "NORMAL",
                },
            )
            .expect("synchronous");
            c
        };
        connect()
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS idempotency_keys (
                   account_id       TEXT    NOT NULL,
                   operation        TEXT    NOT NULL,
                   idempotency_key  TEXT    NOT NULL,
                   request_hash     BLOB    NOT NULL,
                   status           TEXT    NOT NULL,
                   response_status  INTEGER,
                   response_body    BLOB,
                   lease_expires_at INTEGER,
                   expires_at       INTEGER NOT NULL,
                   created_at       INTEGER NOT NULL,
                   PRIMARY KEY (account_id, operation, idempotency_key)
                 );
                 CREATE INDEX IF NOT EXISTS idempotency_expiry ON idempotency_keys (expires_at);
                 CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, body BLOB NOT NULL);",
            )
            .expect("schema");
        Sqlite {
            connections: (0..clients).map(|_| Mutex::new(connect())).collect(),
        }
    }
}

impl Peer for Sqlite {
    fn pair(&self, client: usize, i: u64) {
        let (tenant, key) = key(client, i);
        let mut c = self.connections[client].lock().expect("connection");
        let hash = Fingerprint::of_bytes(key.as_bytes());
        let claimed: Option<String> = c
            .prepare_cached(
                "INSERT INTO idempotency_keys
                   (account_id, operation, idempotency_key, request_hash, status,
                    lease_expires_at, expires_at, created_at)
                 VALUES (?1, 'create_order', ?2, ?3, 'in_progress', ?4, ?5, ?6)
                 ON CONFLICT DO NOTHING
                 RETURNING idempotency_key",
            )
            .expect("prepare claim")
            .query_row(
                rusqlite::params![
                    tenant,
                    key,
                    hash.as_bytes().as_slice(),
                    30_000,
                    86_400_000,
                    1
                ],
                |row| row.get(0),
            )
            .ok();
        assert!(claimed.is_some(), "{key} was not new");
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .expect("begin");
        tx.prepare_cached("INSERT INTO orders (id, body) VALUES (?1, ?2)")
            .expect("prepare row")
            .execute(rusqlite::params![key, ROW.as_slice()])
            .expect("row");
        tx.prepare_cached(
            "UPDATE idempotency_keys
             SET status = 'completed', response_status = 201, response_body = ?1,
                 lease_expires_at = NULL, expires_at = ?2
             WHERE account_id = ?3 AND operation = 'create_order' AND idempotency_key = ?4",
        )
        .expect("prepare complete")
        .execute(rusqlite::params![BODY.as_slice(), 86_400_000, tenant, key])
        .expect("complete");
        tx.commit().expect("commit");
    }
}

// ----------------------------------------------------------------------------- the ceiling

/// redb doing the same writes as a pair (read the record, write it in progress with its lease
/// entry and the fence counter, then the business row, the completed record, the lease entry
/// removed and the expiry entry), many pairs per transaction, never synced.
fn ceiling(dir: &Path, duration: Duration) -> f64 {
    std::fs::create_dir_all(dir).expect("dir");
    let db = redb::Database::create(dir.join("ceiling.redb")).expect("create");
    const BATCH: u64 = 256;
    let meta: TableDefinition<&[u8], &[u8]> = TableDefinition::new("meta");
    let started = Instant::now();
    let mut pairs = 0u64;
    while started.elapsed() < duration {
        let mut txn = db.begin_write().expect("begin");
        txn.set_durability(redb::Durability::None)
            .expect("durability");
        {
            let mut records = txn.open_table(RECORDS).expect("records");
            let mut leases = txn.open_table(LEASES).expect("leases");
            let mut expiry = txn.open_table(EXPIRY).expect("expiry");
            let mut orders = txn.open_table(ORDERS).expect("orders");
            let mut meta = txn.open_table(meta).expect("meta");
            for n in pairs..pairs + BATCH {
                let (tenant, key) = key((n % 64) as usize, n);
                let scope = format!("{tenant}/create_order/{key}").into_bytes();
                assert!(records.get(scope.as_slice()).expect("get").is_none());
                records
                    .insert(scope.as_slice(), in_progress_record().as_slice())
                    .expect("claim");
                leases
                    .insert(index_key(1, &scope).as_slice(), ())
                    .expect("lease");
                meta.insert(b"next_fence".as_slice(), n.to_le_bytes().as_slice())
                    .expect("fence");
                orders.insert(key.as_str(), ROW.as_slice()).expect("row");
                records
                    .insert(scope.as_slice(), completed_record().as_slice())
                    .expect("done");
                leases
                    .remove(index_key(1, &scope).as_slice())
                    .expect("unlease");
                expiry
                    .insert(index_key(2, &scope).as_slice(), ())
                    .expect("expiry");
            }
        }
        txn.commit().expect("commit");
        pairs += BATCH;
    }
    pairs as f64 / started.elapsed().as_secs_f64()
}

// --------------------------------------------------------------------------------- the runs

/// Pairs per second from `clients` threads for `duration`; with `latencies`, each pair's time.
fn run(
    peer: &dyn Peer,
    clients: usize,
    duration: Duration,
    latencies: Option<&Mutex<Vec<Duration>>>,
) -> f64 {
    let total = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Barrier::new(clients + 1);
    let elapsed = std::thread::scope(|s| {
        for client in 0..clients {
            let (total, stop, start) = (&total, &stop, &start);
            s.spawn(move || {
                let mut mine = Vec::new();
                start.wait();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    peer.pair(client, i);
                    if latencies.is_some() {
                        mine.push(t.elapsed());
                    }
                    i += 1;
                }
                total.fetch_add(i, Ordering::Relaxed);
                if let Some(all) = latencies {
                    all.lock().expect("latencies").extend(mine);
                }
            });
        }
        start.wait();
        let started = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        started
    });
    // Pairs that finished after the stop signal count, and so does their time.
    total.load(Ordering::Relaxed) as f64 / elapsed.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Median time of a 512-byte overwrite plus `fdatasync` on the bench directory's disk.
fn fdatasync_p50(dir: &Path) -> Duration {
    use std::io::{Seek, SeekFrom, Write};
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path).expect("probe");
    f.write_all(&vec![0u8; 1 << 20]).expect("preallocate");
    f.sync_all().expect("sync");
    let mut times = Vec::new();
    for i in 0..400u64 {
        f.seek(SeekFrom::Start((i * 512) % (1 << 20)))
            .expect("seek");
        f.write_all(&[i as u8; 512]).expect("write");
        let t = Instant::now();
        f.sync_data().expect("fdatasync");
        times.push(t.elapsed());
    }
    times.sort();
    let _ = std::fs::remove_file(path);
    percentile(&times, 0.5)
}

struct Row {
    name: String,
    clients: usize,
    runs: Vec<f64>,
    durable: &'static str,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (runs, duration) = if quick {
        (1, Duration::from_secs(1))
    } else {
        (3, Duration::from_secs(3))
    };
    let base: PathBuf =
        std::env::var("IDEMSTORE_BENCH_DIR").map_or_else(|_| std::env::temp_dir(), Into::into);
    let root = base.join(format!("idemstore-peers-{}", std::process::id()));
    let fresh = |name: &str| {
        let dir = root.join(name);
        let _ = std::fs::remove_dir_all(&dir);
        dir
    };
    println!(
        "peers: {runs} run(s) of {duration:?} per configuration, pairs/s, in {}",
        root.display()
    );

    let mut rows: Vec<Row> = Vec::new();
    let mut measure = |name: &str,
                       clients: usize,
                       durable: &'static str,
                       make: &dyn Fn(&Path) -> Box<dyn Peer>| {
        let mut results = Vec::new();
        for r in 0..runs {
            let dir = fresh(&format!("{name}-{clients}-{r}"));
            let peer = make(&dir);
            results.push(run(peer.as_ref(), clients, duration, None));
            drop(peer);
            let _ = std::fs::remove_dir_all(&dir);
        }
        println!(
            "  {name:<28} {clients:>2} clients: {:>9.0} pairs/s (runs: {})",
            median(results.clone()),
            results
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        rows.push(Row {
            name: name.to_owned(),
            clients,
            runs: results,
            durable,
        });
    };

    for clients in [1, PRODUCT_CLIENTS] {
        measure("idemstore Wal", clients, "yes", &|d| {
            Box::new(Idemstore::open(d, Durability::Wal))
        });
        measure("idemstore Redb", clients, "yes", &|d| {
            Box::new(Idemstore::open(d, Durability::Redb))
        });
        measure("naive redb", clients, "yes", &|d| {
            Box::new(NaiveRedb::open(d))
        });
        measure("SQLite synchronous=FULL", clients, "yes", &|d| {
            Box::new(Sqlite::open(d, clients, Synchronous::Full))
        });
    }
    measure(
        "SQLite synchronous=NORMAL",
        PRODUCT_CLIENTS,
        "NO: not durable per commit",
        &|d| Box::new(Sqlite::open(d, PRODUCT_CLIENTS, Synchronous::Normal)),
    );
    let mut ceilings = Vec::new();
    for r in 0..runs {
        let dir = fresh(&format!("ceiling-{r}"));
        ceilings.push(ceiling(&dir, duration));
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!(
        "  {:<28}  1 thread:  {:>9.0} pairs/s",
        "CPU ceiling (redb, no sync)",
        median(ceilings.clone())
    );
    rows.push(Row {
        name: "CPU ceiling: redb, batched, no sync".into(),
        clients: 1,
        runs: ceilings,
        durable: "NO: the limit",
    });

    // Latency of one pair, and two raw fdatasyncs on the same disk.
    std::fs::create_dir_all(&root).expect("bench dir");
    let sync_p50 = fdatasync_p50(&root);
    let mut latency_lines = Vec::new();
    for clients in [1, PRODUCT_CLIENTS] {
        let dir = fresh(&format!("latency-{clients}"));
        let store = Idemstore::open(&dir, Durability::Wal);
        let all = Mutex::new(Vec::new());
        run(&store, clients, duration, Some(&all));
        let mut all = all.into_inner().expect("latencies");
        all.sort();
        latency_lines.push(format!(
            "| idemstore Wal, {clients} client{} | {:.3} ms | {:.3} ms | {} |",
            if clients == 1 { "" } else { "s" },
            percentile(&all, 0.5).as_secs_f64() * 1e3,
            percentile(&all, 0.99).as_secs_f64() * 1e3,
            all.len()
        ));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    let get = |name: &str, clients: usize| {
        rows.iter()
            .find(|r| r.name.starts_with(name) && r.clients == clients)
            .map(|r| median(r.runs.clone()))
    };
    println!("\n| system | clients | pairs/s (median) | runs | durable per commit |");
    println!("| --- | --- | --- | --- | --- |");
    for r in &rows {
        let mut sorted = r.runs.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "| {} | {} | {:.0} | {} | {} |",
            r.name,
            r.clients,
            median(r.runs.clone()),
            sorted
                .iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" / "),
            r.durable
        );
    }
    let wal = get("idemstore Wal", PRODUCT_CLIENTS).unwrap_or(f64::NAN);
    println!("\n| ratio (idemstore Wal, {PRODUCT_CLIENTS} clients, to ...) | value |");
    println!("| --- | --- |");
    for (label, name, clients) in [
        (
            "SQLite synchronous=FULL, 64 clients",
            "SQLite synchronous=FULL",
            PRODUCT_CLIENTS,
        ),
        (
            "SQLite synchronous=FULL, 1 client",
            "SQLite synchronous=FULL",
            1,
        ),
        (
            "SQLite synchronous=NORMAL (not durable), 64 clients",
            "SQLite synchronous=NORMAL",
            PRODUCT_CLIENTS,
        ),
        (
            "idemstore Redb, 64 clients",
            "idemstore Redb",
            PRODUCT_CLIENTS,
        ),
        ("naive redb, 64 clients", "naive redb", PRODUCT_CLIENTS),
        ("CPU ceiling", "CPU ceiling", 1),
    ] {
        if let Some(other) = get(name, clients) {
            println!("| {label} | {:.2}x |", wal / other);
        }
    }
    println!("\n| latency of one pair | p50 | p99 | pairs |");
    println!("| --- | --- | --- | --- |");
    for line in latency_lines {
        println!("{line}");
    }
    println!(
        "| two raw 512-byte fdatasyncs, same disk | {:.3} ms | | 400 syncs |",
        2.0 * sync_p50.as_secs_f64() * 1e3
    );
    let _ = std::fs::remove_dir_all(&root);
}
