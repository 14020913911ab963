//! The PostgreSQL peers (feature `postgres`), in the database at `IDEMSTORE_PG_URL` (default
//! the machine's, `postgres://postgres@127.0.0.1:5432/test`) or through the PgBouncer at
//! `IDEMSTORE_PGBOUNCER_URL` (default `postgres://postgres@127.0.0.1:6432/test`, the session
//! pool `.ci/pgbouncer` starts), each run under a table prefix of its own, dropped afterwards.
//! Client threads drive a shared tokio runtime with `block_on`, as the other peers' threads
//! call their stores.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idemstore::sqlx::{self, AssertSqlSafe, PgPool};
use idemstore::{Begin, Execution, Fingerprint, PgStore, PgTx, Protocol, Response, Scope, Sweep};

use super::{BODY, Made, Peer, ROW, key};

/// Statements per pair from one client, both peers: the claim; then BEGIN, the business
/// row, the completion UPDATE and COMMIT, all through sqlx (one round trip each). With
/// many clients the backend's claims share statements (its claim batches), the
/// hand-written peer's do not.
pub(super) const ROUND_TRIPS: usize = 5;

/// Where a peer's connections go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// The server itself.
    Direct,
    /// PgBouncer in front of it, in session mode.
    PgBouncer,
}

impl Target {
    fn url(self) -> String {
        match self {
            Target::Direct => std::env::var("IDEMSTORE_PG_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned()),
            Target::PgBouncer => std::env::var("IDEMSTORE_PGBOUNCER_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:6432/test".to_owned()),
        }
    }

    /// Why a peer could not be made there.
    fn unreachable(self, e: &dyn std::fmt::Display) -> String {
        match self {
            Target::Direct => format!("PostgreSQL at {}: {e}", self.url()),
            Target::PgBouncer => format!(
                "PgBouncer at {}: {e} (start it with .ci/pgbouncer)",
                self.url()
            ),
        }
    }
}

fn url() -> String {
    Target::Direct.url()
}

fn prefix(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "bench_{tag}_{}_{}_",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Drops every table and sequence under `prefix`.
async fn drop_all(pool: &PgPool, prefix: &str) {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE starts_with(tablename, $1)",
    )
    .bind(prefix)
    .fetch_all(pool)
    .await
    .unwrap_or_default();
    for t in tables {
        let _ = sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {t}")))
            .execute(pool)
            .await;
    }
    let _ = sqlx::query(AssertSqlSafe(format!(
        "DROP SEQUENCE IF EXISTS {prefix}fences"
    )))
    .execute(pool)
    .await;
}

/// What the server did per pair, counted on its side.
pub(super) struct ServerCost {
    /// WAL bytes written: `pg_current_wal_lsn()` before and after.
    pub(super) wal_bytes: f64,
    /// Transactions that wrote: transaction ids handed out (the next xid before and after;
    /// reads take none).
    pub(super) writes: f64,
    /// WAL flushes (`pg_stat_wal.wal_sync`: by backends and the WAL writer): below
    /// `writes` where commits shared a flush.
    pub(super) flushes: f64,
    /// Statements run, from `pg_stat_statements` (`None` where the server does not load it:
    /// `shared_preload_libraries`); a `BEGIN` or `COMMIT` counts as one, and several
    /// statements sent in one message count each.
    pub(super) statements: Option<f64>,
}

/// How long a backend may keep its statistics before it reports them (PostgreSQL's
/// `PGSTAT_IDLE_INTERVAL`, 10 s, and a margin): `pg_stat_wal` is read after this pause.
const STATS_SETTLE: Duration = Duration::from_secs(11);

/// [`ServerCost`] over `pairs` pairs from `clients` threads after a warm-up. The whole
/// server's counters: on a quiet database, the peer's. The peer is dropped before the last
/// reading, so its connections report their statistics as they close.
pub(super) fn server_cost(
    peer: Box<dyn Peer>,
    clients: usize,
    pairs: u64,
) -> Result<ServerCost, String> {
    let runtime = runtime();
    let admin = runtime
        .block_on(PgPool::connect(&url()))
        .map_err(|e| format!("PostgreSQL at {}: {e}", url()))?;
    let read = || {
        runtime
            .block_on(
                sqlx::query_as::<_, (i64, i64)>(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, \
                 pg_snapshot_xmax(pg_current_snapshot())::text::bigint",
                )
                .fetch_one(&admin),
            )
            .map_err(|e| format!("read the server's counters: {e}"))
    };
    let syncs = || {
        runtime
            .block_on(
                sqlx::query_scalar::<_, i64>("SELECT wal_sync FROM pg_stat_wal").fetch_one(&admin),
            )
            .map_err(|e| format!("read pg_stat_wal: {e}"))
    };
    let statements = || {
        runtime
            .block_on(
                sqlx::query_scalar::<_, i64>(
                    "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements",
                )
                .fetch_one(&admin),
            )
            .ok()
    };
    // Statements the warm-up prepared are counted from here on, not the creation of the
    // extension's view.
    let _ = runtime
        .block_on(sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").execute(&admin));
    for i in 0..100 {
        peer.pair(0, i);
    }
    std::thread::sleep(STATS_SETTLE);
    let syncs0 = syncs()?;
    let (wal0, xid0) = read()?;
    let statements0 = statements();
    let each = pairs / clients as u64;
    std::thread::scope(|threads| {
        for client in 0..clients {
            let peer = &peer;
            threads.spawn(move || {
                for i in 100..100 + each {
                    peer.pair(client, i);
                }
            });
        }
    });
    let statements1 = statements();
    let (wal1, xid1) = read()?;
    drop(peer);
    std::thread::sleep(STATS_SETTLE);
    let syncs1 = syncs()?;
    let n = (each * clients as u64) as f64;
    Ok(ServerCost {
        wal_bytes: (wal1 - wal0) as f64 / n,
        writes: (xid1 - xid0) as f64 / n,
        flushes: (syncs1 - syncs0) as f64 / n,
        // The first count is itself counted by the second.
        statements: statements0
            .zip(statements1)
            .map(|(s0, s1)| (s1 - s0 - 1) as f64 / n),
    })
}

/// A store under `prefix` at `url` with `pool_size` connections, and the business table its
/// pairs write to: the store and the row's `INSERT`.
async fn store_with_orders(
    url: &str,
    prefix: &str,
    pool_size: u32,
) -> Result<(PgStore, String), idemstore::BoxError> {
    let store = PgStore::builder(url)
        .prefix(prefix)
        .pool_size(pool_size)
        .sweep(Sweep::Off)
        .open()
        .await?;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {prefix}orders (id text PRIMARY KEY, body bytea NOT NULL)"
    )))
    .execute(store.pool())
    .await?;
    let insert = format!("INSERT INTO {prefix}orders (id, body) VALUES ($1, $2)");
    Ok((store, insert))
}

/// How the backend runs a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Path {
    /// `begin`, then the claim's transaction with the business row, then `PgTx::commit`:
    /// two commits.
    TwoPhase,
    /// `PgStore::execute`: the claim, the row and the completion in one transaction.
    Execute,
}

/// idemstore's PostgreSQL backend, on either path.
pub(super) struct Backend {
    runtime: tokio::runtime::Runtime,
    store: PgStore,
    insert: String,
    prefix: String,
    path: Path,
}

impl Backend {
    pub(super) fn open(pool_size: u32, path: Path, target: Target) -> Made {
        let runtime = runtime();
        let prefix = prefix("idem");
        let (store, insert) = runtime
            .block_on(store_with_orders(&target.url(), &prefix, pool_size))
            .map_err(|e| target.unreachable(&e))?;
        Ok(Box::new(Backend {
            runtime,
            store,
            insert,
            prefix,
            path,
        }))
    }
}

impl Peer for Backend {
    fn pair(&self, client: usize, i: u64) {
        let (tenant, key) = key(client, i);
        self.runtime.block_on(async {
            let scope = Scope::new(&tenant, "create_order", &key).expect("scope");
            let fingerprint = Fingerprint::of_bytes(key.as_bytes());
            if self.path == Path::Execute {
                let insert = self.insert.clone();
                let done = self
                    .store
                    .execute(&scope, fingerprint, async |tx: &mut PgTx| {
                        sqlx::query(AssertSqlSafe(insert))
                            .bind(&key)
                            .bind(&ROW[..])
                            .execute(tx.conn())
                            .await?;
                        Ok(Response::new(201, BODY.to_vec()))
                    })
                    .await
                    .expect("execute");
                assert!(matches!(done, Execution::Executed(_)), "{key} was not new");
                return;
            }
            let begun = self.store.begin(&scope, fingerprint).await.expect("begin");
            let Begin::Claimed(claim) = begun else {
                panic!("{key} was not new: {}", begun.outcome());
            };
            let mut tx = claim.transaction().await.expect("transaction");
            sqlx::query(AssertSqlSafe(self.insert.clone()))
                .bind(&key)
                .bind(&ROW[..])
                .execute(tx.conn())
                .await
                .expect("row");
            tx.commit(Response::new(201, BODY.to_vec()))
                .await
                .expect("commit");
        });
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        let pool = self.store.pool().clone();
        self.runtime.block_on(drop_all(&pool, &self.prefix));
    }
}

/// The pattern written by hand (Brandur's, Stripe's): claim with `INSERT ... ON CONFLICT
/// DO NOTHING RETURNING`, then one transaction with the business row and an `UPDATE` of
/// the key to completed. No fences, no take-over, no replay path: less than the backend
/// does, and the same round trips.
pub(super) struct HandWritten {
    runtime: tokio::runtime::Runtime,
    pool: PgPool,
    prefix: String,
}

impl HandWritten {
    pub(super) fn open(pool_size: u32, target: Target) -> Made {
        let runtime = runtime();
        let prefix = prefix("hand");
        let pool = runtime
            .block_on(async {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(pool_size)
                    .test_before_acquire(false)
                    .connect(&target.url())
                    .await?;
                sqlx::query(AssertSqlSafe(format!(
                    "CREATE TABLE {prefix}keys (
                       tenant text NOT NULL, operation text NOT NULL, key text NOT NULL,
                       request_hash bytea NOT NULL, status text NOT NULL,
                       response_status integer, response_body bytea,
                       lease_expires_at timestamptz, expires_at timestamptz NOT NULL,
                       created_at timestamptz NOT NULL DEFAULT now(),
                       PRIMARY KEY (tenant, operation, key))"
                )))
                .execute(&pool)
                .await?;
                sqlx::query(AssertSqlSafe(format!(
                    "CREATE TABLE {prefix}orders (id text PRIMARY KEY, body bytea NOT NULL)"
                )))
                .execute(&pool)
                .await?;
                Ok::<_, sqlx::Error>(pool)
            })
            .map_err(|e| target.unreachable(&e))?;
        Ok(Box::new(HandWritten {
            runtime,
            pool,
            prefix,
        }))
    }
}

impl Peer for HandWritten {
    fn pair(&self, client: usize, i: u64) {
        let (tenant, key) = key(client, i);
        let p = &self.prefix;
        self.runtime.block_on(async {
            let claimed: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
                "INSERT INTO {p}keys (tenant, operation, key, request_hash, status,
                    lease_expires_at, expires_at)
                 VALUES ($1, 'create_order', $2, $3, 'in_progress',
                    now() + interval '30 seconds', now() + interval '1 day')
                 ON CONFLICT DO NOTHING RETURNING key"
            )))
            .bind(&tenant)
            .bind(&key)
            .bind(&Fingerprint::of_bytes(key.as_bytes()).as_bytes()[..])
            .fetch_optional(&self.pool)
            .await
            .expect("claim");
            assert!(claimed.is_some(), "{key} was not new");
            let mut tx = self.pool.begin().await.expect("begin");
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {p}orders (id, body) VALUES ($1, $2)"
            )))
            .bind(&key)
            .bind(&ROW[..])
            .execute(&mut *tx)
            .await
            .expect("row");
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE {p}keys SET status = 'completed', response_status = 201,
                    response_body = $3, lease_expires_at = NULL
                 WHERE tenant = $1 AND operation = 'create_order' AND key = $2"
            )))
            .bind(&tenant)
            .bind(&key)
            .bind(&BODY[..])
            .execute(&mut *tx)
            .await
            .expect("complete");
            tx.commit().await.expect("commit");
        });
    }
}

impl Drop for HandWritten {
    fn drop(&mut self) {
        let pool = self.pool.clone();
        self.runtime.block_on(drop_all(&pool, &self.prefix));
    }
}

/// A configuration to measure: its name, its clients, and how to make it.
pub(super) type Configuration = (String, usize, Box<dyn Fn() -> Made>);

/// The pool every 64-client row behind PgBouncer, and of the pipelined prototype, uses: the
/// best pool of the direct rows in every run so far.
const POOL: u32 = 16;

/// Every PostgreSQL configuration, in the order they run: directly, the backend on both
/// paths and the hand-written pattern at 1 client and at `clients` with several pools;
/// the pipelined prototype (feature `testing`); then the same through PgBouncer, pool 16.
pub(super) fn configurations(clients: usize) -> Vec<Configuration> {
    let mut all: Vec<Configuration> = Vec::new();
    for (name, path) in [
        ("PostgreSQL backend", Path::TwoPhase),
        ("PostgreSQL backend execute", Path::Execute),
    ] {
        all.push((
            name.to_owned(),
            1,
            Box::new(move || Backend::open(1, path, Target::Direct)),
        ));
        for pool in [16, 64] {
            all.push((
                format!("{name}, pool {pool}"),
                clients,
                Box::new(move || Backend::open(pool, path, Target::Direct)),
            ));
        }
    }
    all.push((
        "PostgreSQL hand-written".to_owned(),
        1,
        Box::new(|| HandWritten::open(1, Target::Direct)),
    ));
    for pool in [8, 16, 32, 64] {
        all.push((
            format!("PostgreSQL hand-written, pool {pool}"),
            clients,
            Box::new(move || HandWritten::open(pool, Target::Direct)),
        ));
    }
    for target in [Target::Direct, Target::PgBouncer] {
        let via = via(target);
        if target == Target::PgBouncer {
            for (name, path) in [
                ("backend", Path::TwoPhase),
                ("backend execute", Path::Execute),
            ] {
                all.push((
                    format!("PostgreSQL{via} {name}"),
                    1,
                    Box::new(move || Backend::open(1, path, target)),
                ));
                all.push((
                    format!("PostgreSQL{via} {name}, pool {POOL}"),
                    clients,
                    Box::new(move || Backend::open(POOL, path, target)),
                ));
            }
            all.push((
                format!("PostgreSQL{via} hand-written"),
                1,
                Box::new(move || HandWritten::open(1, target)),
            ));
            all.push((
                format!("PostgreSQL{via} hand-written, pool {POOL}"),
                clients,
                Box::new(move || HandWritten::open(POOL, target)),
            ));
        }
        #[cfg(feature = "testing")]
        {
            all.push((
                format!("PostgreSQL{via} pipelined execute"),
                1,
                Box::new(move || Pipelined::open(1, target)),
            ));
            all.push((
                format!("PostgreSQL{via} pipelined execute, pool {POOL}"),
                clients,
                Box::new(move || Pipelined::open(POOL, target)),
            ));
        }
    }
    all
}

/// How a row's name says where it connects.
fn via(target: Target) -> &'static str {
    match target {
        Target::Direct => "",
        Target::PgBouncer => " via PgBouncer",
    }
}

/// The same-run ratios to the hand-written pattern at the same pool, directly and through
/// PgBouncer: `execute`, and the pipelined prototype. `median` is a row's median by name
/// and clients.
pub(super) fn print_ratios(clients: usize, median: &dyn Fn(&str, usize) -> Option<f64>) {
    println!(
        "\n| PostgreSQL, same pool, ÷ hand-written | 1 client | {clients} clients, pool {POOL} |"
    );
    println!("| --- | --- | --- |");
    for target in [Target::Direct, Target::PgBouncer] {
        let via = via(target);
        for what in ["backend", "backend execute", "pipelined execute"] {
            let ratio = |one: bool| {
                let (pool, n) = if one {
                    (String::new(), 1)
                } else {
                    (format!(", pool {POOL}"), clients)
                };
                let ours = median(&format!("PostgreSQL{via} {what}{pool}"), n)?;
                let theirs = median(&format!("PostgreSQL{via} hand-written{pool}"), n)?;
                Some(format!("{:.2}x", ours / theirs))
            };
            let (one, many) = (ratio(true), ratio(false));
            if one.is_some() || many.is_some() {
                let dash = || "-".to_owned();
                println!(
                    "| {what}{via} | {} | {} |",
                    one.unwrap_or_else(dash),
                    many.unwrap_or_else(dash)
                );
            }
        }
    }
}

/// What the server did per pair ([`server_cost`]) on each path: 2,000 pairs from one
/// client, then 6,400 from `clients` (pools of 16), where the backend's claims share
/// statements; directly, then through PgBouncer at `clients`.
pub(super) fn print_costs(clients: usize) {
    let mut rows: Vec<Configuration> = Vec::new();
    for (n, pool) in [(1, 1), (clients, POOL)] {
        let who = if n == 1 {
            "1 client".to_owned()
        } else {
            format!("{n} clients")
        };
        rows.push((
            format!("backend two-phase, {who}"),
            n,
            Box::new(move || Backend::open(pool, Path::TwoPhase, Target::Direct)),
        ));
        rows.push((
            format!("backend execute, {who}"),
            n,
            Box::new(move || Backend::open(pool, Path::Execute, Target::Direct)),
        ));
        rows.push((
            format!("hand-written, {who}"),
            n,
            Box::new(move || HandWritten::open(pool, Target::Direct)),
        ));
        #[cfg(feature = "testing")]
        rows.push((
            format!("pipelined execute, {who}"),
            n,
            Box::new(move || Pipelined::open(pool, Target::Direct)),
        ));
    }
    let bouncer = Target::PgBouncer;
    rows.push((
        format!("backend execute via PgBouncer, {clients} clients"),
        clients,
        Box::new(move || Backend::open(POOL, Path::Execute, bouncer)),
    ));
    rows.push((
        format!("hand-written via PgBouncer, {clients} clients"),
        clients,
        Box::new(move || HandWritten::open(POOL, bouncer)),
    ));
    println!(
        "\n| PostgreSQL, per pair, server side | WAL bytes | transactions that wrote | WAL flushes | statements |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (name, n, make) in rows {
        let pairs = if n == 1 { 2_000 } else { 6_400 };
        match make().and_then(|peer| server_cost(peer, n, pairs)) {
            Ok(cost) => {
                let statements = cost.statements.map_or_else(
                    || "n/a (no pg_stat_statements loaded)".to_owned(),
                    |s| format!("{s:.2}"),
                );
                println!(
                    "| {name} | {:.0} | {:.2} | {:.2} | {statements} |",
                    cost.wal_bytes, cost.writes, cost.flushes
                )
            }
            Err(why) => println!("| {name} | skipped: {why} | | | |"),
        }
    }
}

#[cfg(feature = "testing")]
pub(super) use pipelined::Pipelined;

#[cfg(feature = "testing")]
#[path = "pipelined.rs"]
mod pipelined;
