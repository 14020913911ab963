//! idemstore against what teams use instead, measured back to back in one process run, on the
//! same workload: one "pair" is a claim of a new idempotency key plus a completion that writes a
//! ~100-byte business row and stores a ~200-byte response, keys spread over 16 tenants.
//!
//! `cargo bench --bench peers` (3 runs of 3 s per configuration, medians; about 6 minutes).
//! `cargo bench --bench peers -- --quick` does 1 run of 1 s each. `PEERS_KEYS=v4` sends every
//! peer random UUIDv4 keys instead of keys in order.
//!
//! Each peer is measured at the concurrency where it is at its best as well as at the product's
//! 64 clients: SQLite convoys on its write lock at 64 connections, so it gets 1, 4, 16 and 64,
//! and the headline ratio is idemstore at its best against SQLite at its best.
//!
//! Peers:
//! - idemstore `Wal` and `Redb`: the product, two-phase (a durable claim, then a durable
//!   commit); and `Wal` with `Store::execute` (claim and commit in one step, for local work);
//!   and `Wal` two-phase through the async API, 64 tokio tasks on a runtime of 2 workers (what an
//!   axum service does; the other peers use one OS thread per client);
//! - naive redb: one durable redb commit per claim and per completion, no batching;
//! - SQLite (rusqlite, bundled) in WAL journal mode, `synchronous=FULL`: the classic pattern,
//!   `INSERT ... ON CONFLICT DO NOTHING RETURNING` to claim, then one transaction inserting the
//!   business row and updating the record to completed;
//! - the same with `synchronous=NORMAL`, which does not sync each commit (not durable per commit);
//! - Redis 7 with `appendonly yes`, `appendfsync always` (durable per write), started by the
//!   bench on a free loopback port in a temporary directory: `SET key fingerprint NX PX lease`
//!   to claim, then `SET key completed-record XX PX ttl` with the response. One connection per
//!   client thread. No business row and no transaction tying it to the record: generous to
//!   Redis. Skipped, saying why, when `redis-server` is not installed;
//! - the CPU ceiling: redb with non-durable commits, batched, doing the same writes in one
//!   thread. Nothing that stores in redb can beat it;
//! - with `--features postgres`: idemstore's PostgreSQL backend (`PgStore`: `begin`, then the
//!   claim's transaction with the business row, then `PgTx::commit`) at 1 and 64 clients, and
//!   the hand-written PostgreSQL pattern (`INSERT ... ON CONFLICT DO NOTHING RETURNING` to
//!   claim, then one transaction with the business row and an `UPDATE`) at 1 client and at 64
//!   with pools of 8 to 64, in the database at `IDEMSTORE_PG_URL`; the same at pool 16 through
//!   PgBouncer (`IDEMSTORE_PGBOUNCER_URL`, `.ci/pgbouncer`); and with `--features
//!   postgres,testing`, a prototype that sends `execute`'s statements pipelined
//!   (`benches/peers/pipelined.rs`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{BODY, ORDERS, ROW};
use idemstore::redb::{self, ReadableTable, TableDefinition};
use idemstore::{Durability, Fingerprint, Store};

const PRODUCT_CLIENTS: usize = 64;
/// The async API's row: 64 tokio tasks, two runtime workers.
const ASYNC: &str = "idemstore Wal async (tokio tasks)";
/// SQLite's connection counts: its best is usually 1 or 4, its worst 64.
const SQLITE_CLIENTS: [usize; 4] = [1, 4, 16, 64];

/// A peer set up in a directory, or why it could not be (a server not installed).
type Made = Result<Box<dyn Peer>, String>;

/// Something that can perform pairs from many client threads.
trait Peer: Send + Sync {
    /// Claims key `i` for `client` and completes it.
    fn pair(&self, client: usize, i: u64);
}

/// The keys every peer is sent, from `PEERS_KEYS`: `ordered` (the default, `c{client}-{i}`)
/// or `v4`, random UUIDv4 text, the keys users send (see the `traffic` bench).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    Ordered,
    V4,
}

fn keys() -> Keys {
    static KEYS: std::sync::OnceLock<Keys> = std::sync::OnceLock::new();
    *KEYS.get_or_init(|| match std::env::var("PEERS_KEYS").as_deref() {
        Ok("v4") => Keys::V4,
        Ok("ordered") | Err(_) => Keys::Ordered,
        Ok(other) => panic!("PEERS_KEYS is `ordered` or `v4`, not {other:?}"),
    })
}

fn key(client: usize, i: u64) -> (String, String) {
    let tenant = format!("tenant-{}", client % 16);
    let key = match keys() {
        Keys::Ordered => format!("c{client}-{i:012}"),
        Keys::V4 => {
            // `n` is distinct for every (client, i) (`i` < 2^40), and `mix` maps distinct
            // words to distinct words: 118 of the 128 bits survive the version and variant.
            let n = ((client as u64) << 40) | i;
            let (hi, lo) = (common::mix(n), common::mix(n ^ 0x5555_5555_5555_5555));
            common::uuid_text((hi & !0xf000) | 0x4000, lo)
        }
    };
    (tenant, key)
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

/// idemstore with `Store::execute`: the claim and the commit in one writer step.
struct Execute(Store);

impl Peer for Execute {
    fn pair(&self, client: usize, i: u64) {
        let (_, key) = key(client, i);
        common::execute(&self.0, &common::scope(client as u64, key));
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

// -------------------------------------------------------------------------------------- Redis

/// A durable Redis server of the bench's own: every write is in the append-only file, synced,
/// before Redis answers.
struct RedisServer {
    child: std::process::Child,
    port: u16,
}

impl RedisServer {
    /// Starts `redis-server` in `dir`, or says why it cannot.
    fn start(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ])
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "redis-server could not be started ({e}); install it (Debian/Ubuntu: \
                     apt-get install redis-server) to include durable Redis"
                )
            })?;
        let mut server = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = server.connect()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return Ok(server);
            }
            if Instant::now() > deadline {
                let _ = server.child.kill();
                return Err("redis-server did not answer within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn connect(&mut self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Redis pattern: claim with `SET NX`, complete with `SET XX`, one connection per client.
struct Redis {
    _server: RedisServer,
    connections: Vec<Mutex<redis::Connection>>,
}

impl Redis {
    fn open(dir: &Path, clients: usize) -> Result<Self, String> {
        let mut server = RedisServer::start(dir)?;
        let connections = (0..clients)
            .map(|_| server.connect().map(Mutex::new))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        Ok(Redis {
            _server: server,
            connections,
        })
    }
}

impl Peer for Redis {
    fn pair(&self, client: usize, i: u64) {
        let (tenant, key) = key(client, i);
        let name = format!("idem:{tenant}:create_order:{key}");
        let hash = Fingerprint::of_bytes(key.as_bytes());
        let mut c = self.connections[client].lock().expect("connection");
        let claimed: Option<String> = redis::cmd("SET")
            .arg(&name)
            .arg(hash.as_bytes().as_slice())
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query(&mut *c)
            .expect("claim");
        assert!(claimed.is_some(), "{key} was not new");
        // The completed record: fingerprint, status and response, as one value.
        let mut record = hash.as_bytes().to_vec();
        record.extend_from_slice(&201u16.to_le_bytes());
        record.extend_from_slice(&BODY);
        let _: Option<String> = redis::cmd("SET")
            .arg(&name)
            .arg(record)
            .arg("XX")
            .arg("PX")
            .arg(86_400_000)
            .query(&mut *c)
            .expect("complete");
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

// --------------------------------------------------------------------------------- PostgreSQL

// A file of its own under benches/peers/: a bench's root file takes its modules from benches/,
// where every file is a bench.
#[cfg(feature = "postgres")]
#[path = "peers/postgres_peers.rs"]
mod postgres_peers;

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

/// Pairs per second from `tasks` tokio tasks on a runtime of two workers (the machine's
/// cores), each doing two-phase pairs through the async API for `duration`.
#[cfg(feature = "tokio")]
fn run_async(store: &Store, tasks: usize, duration: Duration) -> f64 {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let total = std::sync::Arc::new(AtomicU64::new(0));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    runtime.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|task| {
                let (store, total, stop) = (store.clone(), total.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let (_, key) = key(task, i);
                        common::pair_async(&store, &common::scope(task as u64, key)).await;
                        i += 1;
                    }
                    total.fetch_add(i, Ordering::Relaxed);
                })
            })
            .collect();
        let started = Instant::now();
        tokio::time::sleep(duration).await;
        stop.store(true, Ordering::Relaxed);
        for handle in handles {
            handle.await.expect("a client task");
        }
        total.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
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
        "peers: {runs} run(s) of {duration:?} per configuration, pairs/s, keys {:?}, in {}",
        keys(),
        root.display()
    );

    let mut rows: Vec<Row> = Vec::new();
    // `PEERS_ONLY=<prefix>`: only the configurations whose name starts with it.
    let only = std::env::var("PEERS_ONLY").unwrap_or_default();
    let mut measure =
        |name: &str, clients: usize, durable: &'static str, make: &dyn Fn(&Path) -> Made| {
            if !name.starts_with(&only) {
                return;
            }
            let mut results = Vec::new();
            for r in 0..runs {
                let dir = fresh(&format!("{name}-{clients}-{r}"));
                let peer = match make(&dir) {
                    Ok(peer) => peer,
                    Err(why) => {
                        println!("  {name:<28} skipped: {why}");
                        return;
                    }
                };
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
            Ok(Box::new(Idemstore::open(d, Durability::Wal)))
        });
        measure("idemstore Wal execute", clients, "yes", &|d| {
            Ok(Box::new(Execute(Idemstore::open(d, Durability::Wal).0)))
        });
        measure("idemstore Redb", clients, "yes", &|d| {
            Ok(Box::new(Idemstore::open(d, Durability::Redb)))
        });
        measure("naive redb", clients, "yes", &|d| {
            Ok(Box::new(NaiveRedb::open(d)))
        });
        measure("Redis appendfsync=always", clients, "yes", &|d| {
            Ok(Box::new(Redis::open(d, clients)?))
        });
    }
    for clients in SQLITE_CLIENTS {
        measure("SQLite synchronous=FULL", clients, "yes", &|d| {
            Ok(Box::new(Sqlite::open(d, clients, Synchronous::Full)))
        });
    }
    measure(
        "SQLite synchronous=NORMAL",
        PRODUCT_CLIENTS,
        "NO: not durable per commit",
        &|d| {
            Ok(Box::new(Sqlite::open(
                d,
                PRODUCT_CLIENTS,
                Synchronous::Normal,
            )))
        },
    );
    #[cfg(feature = "postgres")]
    {
        for (name, clients, make) in postgres_peers::configurations(PRODUCT_CLIENTS) {
            measure(&name, clients, "yes", &|_| make());
        }
        if "PostgreSQL".starts_with(&only) || only.starts_with("PostgreSQL") {
            postgres_peers::print_costs(PRODUCT_CLIENTS);
        }
    }
    #[cfg(feature = "tokio")]
    if ASYNC.starts_with(&only) {
        let mut results = Vec::new();
        for r in 0..runs {
            let dir = fresh(&format!("async-{r}"));
            let store = Idemstore::open(&dir, Durability::Wal);
            results.push(run_async(&store.0, PRODUCT_CLIENTS, duration));
            drop(store);
            let _ = std::fs::remove_dir_all(&dir);
        }
        println!(
            "  {:<28} {PRODUCT_CLIENTS:>2} tasks:   {:>9.0} pairs/s",
            ASYNC,
            median(results.clone())
        );
        rows.push(Row {
            name: ASYNC.to_owned(),
            clients: PRODUCT_CLIENTS,
            runs: results,
            durable: "yes",
        });
    }
    // The ceiling and the latencies belong to the whole run, not to a `PEERS_ONLY` part.
    if only.is_empty() {
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
    }

    // Latency of one pair, and two raw fdatasyncs on the same disk.
    std::fs::create_dir_all(&root).expect("bench dir");
    let sync_p50 = common::fdatasync_median(&root, 400);
    let mut latency_lines = Vec::new();
    let latency_clients: &[usize] = if only.is_empty() {
        &[1, PRODUCT_CLIENTS]
    } else {
        &[]
    };
    for &clients in latency_clients {
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
    let exact = |name: &str, clients: usize| {
        rows.iter()
            .find(|r| r.name == name && r.clients == clients)
            .map(|r| median(r.runs.clone()))
    };
    // Best against best: each at the concurrency where its median is highest.
    let best = |name: &str| {
        rows.iter()
            .filter(|r| r.name == name)
            .map(|r| (median(r.runs.clone()), r.clients))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    };
    let wal = exact("idemstore Wal", PRODUCT_CLIENTS).unwrap_or(f64::NAN);
    let execute = exact("idemstore Wal execute", PRODUCT_CLIENTS).unwrap_or(f64::NAN);
    println!("\n| ratio, best against best (each at its best concurrency) | value |");
    println!("| --- | --- |");
    for (ours, theirs) in [
        ("idemstore Wal", "SQLite synchronous=FULL"),
        ("idemstore Wal execute", "SQLite synchronous=FULL"),
        ("idemstore Wal", "Redis appendfsync=always"),
        ("idemstore Wal execute", "Redis appendfsync=always"),
        (ASYNC, "Redis appendfsync=always"),
        (ASYNC, "SQLite synchronous=FULL"),
    ] {
        if let (Some((a, ca)), Some((b, cb))) = (best(ours), best(theirs)) {
            println!(
                "| {ours} ({ca} clients) / {theirs} ({cb}) | {:.2}x |",
                a / b
            );
        }
    }
    if execute.is_finite() && wal.is_finite() {
        println!(
            "| idemstore Wal execute / two-phase, 64 clients | {:.2}x |",
            execute / wal
        );
    }
    println!(
        "\n| ratio at equal concurrency (idemstore Wal, {PRODUCT_CLIENTS} clients, to ...) | value |"
    );
    println!("| --- | --- |");
    for (label, name, clients) in [
        (
            "SQLite synchronous=FULL, 64 clients",
            "SQLite synchronous=FULL",
            PRODUCT_CLIENTS,
        ),
        (
            "SQLite synchronous=NORMAL (not durable), 64 clients",
            "SQLite synchronous=NORMAL",
            PRODUCT_CLIENTS,
        ),
        (
            "Redis appendfsync=always, 64 clients",
            "Redis appendfsync=always",
            PRODUCT_CLIENTS,
        ),
        (
            "idemstore Redb, 64 clients",
            "idemstore Redb",
            PRODUCT_CLIENTS,
        ),
        ("naive redb, 64 clients", "naive redb", PRODUCT_CLIENTS),
        ("CPU ceiling", "CPU ceiling: redb, batched, no sync", 1),
    ] {
        if let Some(other) = exact(name, clients) {
            println!("| {label} | {:.2}x |", wal / other);
        }
    }
    #[cfg(feature = "postgres")]
    {
        // The hand-written pattern at its best pool size, against the backend at the same
        // concurrency (and its best pool).
        let best_of = |prefix: &str, path: &str, clients: usize| {
            rows.iter()
                .filter(|r| {
                    r.name.starts_with(prefix)
                        && r.name.contains("execute") == (path == "execute")
                        && r.clients == clients
                })
                .map(|r| (median(r.runs.clone()), r.name.clone()))
                .max_by(|a, b| a.0.total_cmp(&b.0))
        };
        println!(
            "\n| PostgreSQL: backend / hand-written ({} round trips per pair each at one client) | value |",
            postgres_peers::ROUND_TRIPS
        );
        println!("| --- | --- |");
        for path in ["two-phase", "execute"] {
            for clients in [1, PRODUCT_CLIENTS] {
                if let (Some((ours, on)), Some((theirs, against))) = (
                    best_of("PostgreSQL backend", path, clients),
                    best_of("PostgreSQL hand-written", "two-phase", clients),
                ) {
                    println!(
                        "| {clients} client(s): {on} / {against} (its best) | {:.2}x |",
                        ours / theirs
                    );
                }
            }
        }
        postgres_peers::print_ratios(PRODUCT_CLIENTS, &|name, clients| exact(name, clients));
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
