//! The PostgreSQL backend under the conformance suite (features `testing` and `postgres`).
//!
//! Tests read the database's URL from `IDEMSTORE_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`). A database that cannot be reached fails the
//! test, with a message saying how to start one: no PostgreSQL test passes by skipping.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use super::conformance::{ExecuteHarness, Harness, Settings, Work, finish};
use super::outbox_conformance::{Committed, Ending, OutboxHarness};
use crate::error::{BoxError, CommitError, ExecuteError};
use crate::model::clock::ManualClock;
use crate::model::config::Sweep;
use crate::model::execution::Execution;
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::Scope;
pub use crate::postgres::Planning;
use crate::postgres::{EVICTION, Names, PgClaim, PgStore, PgTx, Sql};

/// The URL tests connect to: `IDEMSTORE_PG_URL`, else the machine's local PostgreSQL.
pub fn database_url() -> String {
    std::env::var("IDEMSTORE_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The same database through PgBouncer: `IDEMSTORE_PGBOUNCER_URL`, else the one `.ci/run`
/// starts on port 6432, whose database `test` is pooled in session mode (and `test_tx`, the
/// same database in transaction mode, which a store refuses at open).
pub fn pgbouncer_url() -> String {
    std::env::var("IDEMSTORE_PGBOUNCER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:6432/test".to_owned())
}

/// Starts the PgBouncer [`pgbouncer_url`] names by default, unless `IDEMSTORE_PGBOUNCER_URL`
/// names another: `.ci/pgbouncer` installs it if missing and starts it once (the machine has
/// PostgreSQL, not PgBouncer, so `cargo test` must not depend on `.ci/run` having run). Once a
/// process; what the script said goes to stderr, and a test that then cannot connect fails
/// with [`unreachable()`].
pub fn start_pgbouncer() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    STARTED.call_once(|| {
        if std::env::var_os("IDEMSTORE_PGBOUNCER_URL").is_some() {
            return;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/pgbouncer");
        match std::process::Command::new(script)
            .stdin(std::process::Stdio::null())
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "{script} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("could not run {script}: {e}"),
        }
    });
}

/// The error a test fails with when the database at `url` cannot be used: what went wrong,
/// and how to start PostgreSQL (or PgBouncer) or point the tests elsewhere.
pub fn unreachable(url: &str, error: &dyn std::fmt::Display) -> BoxError {
    let ci = if std::env::var("CI").as_deref() == Ok("true") {
        " (CI=true: .ci/run starts PostgreSQL and PgBouncer before the tests; it did not come up)"
    } else {
        ""
    };
    format!(
        "the PostgreSQL tests need a database at {url}: {error}{ci}. Start the machine's \
         PostgreSQL with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
         and PgBouncer with `.ci/pgbouncer` (it installs it if missing), \
         or set IDEMSTORE_PG_URL and IDEMSTORE_PGBOUNCER_URL to databases the tests may create tables in"
    )
    .into()
}

/// The statements a store under `prefix` sends to its records table, by name, and how each is
/// planned: every one but the count behind `stats` (which reads the whole table by design).
/// For a test that reads their plans.
///
/// # Errors
/// The prefix is not a plain identifier.
pub fn record_statements(prefix: &str) -> Result<Vec<(&'static str, String, Planning)>, BoxError> {
    let sql = Sql::new(&Names::new(prefix)?);
    let cached = Planning::Cached;
    Ok([
        ("claim", &sql.claim, cached),
        ("claim_held", &sql.claim_held, cached),
        ("lookup", &sql.lookup, cached),
        ("complete", &sql.complete, cached),
        ("complete_publishing", &sql.complete_publishing, cached),
        ("release", &sql.release, cached),
        ("mark_waiting", &sql.mark_waiting, cached),
        ("extend", &sql.extend, cached),
        ("checkpoint", &sql.checkpoint, cached),
        ("holder", &sql.holder, cached),
        ("evict_completed", &sql.evict_completed, EVICTION),
        ("evict_tombstones", &sql.evict_tombstones, EVICTION),
        ("abandoned", &sql.abandoned, cached),
    ]
    .into_iter()
    .map(|(name, text, planning)| (name, text.to_string(), planning))
    .collect())
}

/// A table prefix no other test uses: process, counter and time.
pub fn unique_prefix(tag: &str) -> String {
    static OPENED: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "t_{tag}_{}_{}_{}_",
        std::process::id(),
        OPENED.fetch_add(1, Ordering::Relaxed),
        nanos % 1_000_000
    )
}

/// Drops the tables, sequence and indexes of every prefix in `prefixes`, and every other
/// table whose name starts with one of them (best effort: a
/// failure is printed, not raised, because it runs from `Drop`). Blocks, on a thread of its
/// own, so it may run inside or outside a runtime.
pub fn drop_prefixes(url: &str, prefixes: Vec<String>) {
    if prefixes.is_empty() {
        return;
    }
    let url = url.to_owned();
    let dropping = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            // Bounded, so that a session a test left holding a lock fails the cleanup instead
            // of hanging it.
            let options: sqlx::postgres::PgConnectOptions = url.parse()?;
            let pool = sqlx::postgres::PgPoolOptions::new()
                .acquire_timeout(std::time::Duration::from_secs(5))
                .connect_with(options.options([("statement_timeout", "30000")]))
                .await?;
            for prefix in prefixes {
                let Ok(names) = Names::new(&prefix) else {
                    continue;
                };
                for statement in names.drop_statements() {
                    sqlx::query(sqlx::AssertSqlSafe(statement))
                        .execute(&pool)
                        .await?;
                }
                // And the tables a test made under the same prefix (its business tables).
                let others: Vec<String> = sqlx::query_scalar(
                    "SELECT tablename::text FROM pg_tables \
                     WHERE schemaname = current_schema() AND starts_with(tablename, $1)",
                )
                .bind(&prefix)
                .fetch_all(&pool)
                .await?;
                for table in others {
                    let plain = table
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                    if plain {
                        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
                            .execute(&pool)
                            .await?;
                    }
                }
            }
            pool.close().await;
            Ok::<_, BoxError>(())
        })
    });
    match dropping.join() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("could not drop a test's tables: {e}"),
        Err(_) => eprintln!("dropping a test's tables panicked"),
    }
}

/// The tables of one test under a prefix of their own ([`unique_prefix`]), in the database
/// at [`database_url`]; dropped when the test ends, pass or fail.
#[derive(Debug)]
pub struct Prefix {
    url: String,
    name: String,
}

impl Prefix {
    /// A fresh prefix, `tag` in its name.
    pub fn new(tag: &str) -> Self {
        Prefix {
            url: database_url(),
            name: unique_prefix(tag),
        }
    }

    /// The prefix itself.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The name of the table `suffix` under this prefix.
    pub fn table(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.name)
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        drop_prefixes(&self.url, vec![self.name.clone()]);
    }
}

/// The session holding the relay lock of the store under `prefix` (the two-key advisory
/// lock: "idem", and the hash of the outbox table's name), if any: its backend pid and, over
/// TCP, its client port.
///
/// # Errors
/// If the database does not answer.
pub async fn relay_lock_holder(
    admin: &sqlx::PgPool,
    prefix: &str,
) -> Result<Option<(i32, Option<i32>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT l.pid, a.client_port FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
         AND l.classid = 1768187245::oid \
         AND l.objid::bigint = (hashtext($1)::bigint + 4294967296) % 4294967296",
    )
    .bind(format!("{prefix}outbox"))
    .fetch_optional(admin)
    .await
}

/// Fresh stores in the database at [`database_url`], each under a table prefix of its own;
/// every table it created is dropped when the harness is.
#[derive(Debug)]
pub struct Postgres {
    url: String,
    prefixes: Mutex<Vec<String>>,
}

impl Postgres {
    /// A harness for the database at [`database_url`].
    pub fn new() -> Self {
        Self::at(database_url())
    }

    /// A harness for the same database through PgBouncer ([`pgbouncer_url`]), started
    /// first if need be ([`start_pgbouncer`]).
    pub fn behind_pgbouncer() -> Self {
        start_pgbouncer();
        Self::at(pgbouncer_url())
    }

    fn at(url: String) -> Self {
        Postgres {
            url,
            prefixes: Mutex::new(Vec::new()),
        }
    }
}

impl Default for Postgres {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        drop_prefixes(&self.url, std::mem::take(&mut *self.prefixes.lock()));
    }
}

impl Harness for Postgres {
    type Backend = PgStore;

    async fn open(&self, settings: Settings, clock: ManualClock) -> Result<PgStore, BoxError> {
        let prefix = unique_prefix("conf");
        self.prefixes.lock().push(prefix.clone());
        let store = PgStore::builder(&self.url)
            .prefix(&prefix)
            .lease(settings.lease)
            .ttl(settings.ttl)
            .tombstone_ttl(settings.tombstone_ttl)
            .clock(clock)
            .sweep(Sweep::Off)
            .pool_size(8)
            .open()
            .await
            .map_err(|e| unreachable(&self.url, &e))?;
        let rows = rows_table(&store);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE {rows} (name text PRIMARY KEY)"
        )))
        .execute(store.pool())
        .await?;
        Ok(store)
    }
}

/// The business table of the harness's `execute` work, under the store's prefix (so it is
/// dropped with the store's tables).
fn rows_table(store: &PgStore) -> String {
    format!("{}rows", store.inner.names.prefix())
}

impl ExecuteHarness for Postgres {
    async fn execute(
        backend: &PgStore,
        scope: &Scope,
        fingerprint: Fingerprint,
        row: String,
        work: Work,
        ran: Arc<AtomicU32>,
    ) -> Result<Execution, ExecuteError> {
        let insert = format!("INSERT INTO {} (name) VALUES ($1)", rows_table(backend));
        backend
            .execute(scope, fingerprint, async move |tx: &mut PgTx| {
                ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                sqlx::query(sqlx::AssertSqlSafe(insert))
                    .bind(row)
                    .execute(tx.conn())
                    .await?;
                finish(work)
            })
            .await
    }

    async fn rows(backend: &PgStore) -> Result<Vec<String>, BoxError> {
        let select = format!("SELECT name FROM {} ORDER BY name", rows_table(backend));
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(select))
            .fetch_all(backend.pool())
            .await?)
    }
}

impl OutboxHarness for Postgres {
    type Backend = PgStore;
    type Place = String;

    fn place(&self) -> String {
        let prefix = unique_prefix("obx");
        self.prefixes.lock().push(prefix.clone());
        prefix
    }

    async fn open_at(&self, prefix: &String, clock: ManualClock) -> Result<PgStore, BoxError> {
        PgStore::builder(&self.url)
            .prefix(prefix)
            .clock(clock)
            .sweep(Sweep::Off)
            .pool_size(8)
            .open()
            .await
            .map_err(|e| unreachable(&self.url, &e))
    }

    async fn commit(
        &self,
        claim: PgClaim,
        messages: Vec<(String, Vec<u8>)>,
        ending: Ending,
    ) -> Result<Committed, BoxError> {
        let mut tx = claim
            .transaction()
            .await
            .map_err(|e| format!("begin a transaction: {e}"))?;
        let mut ids = Vec::new();
        for (subject, payload) in messages {
            ids.push(tx.publish(&subject, payload)?);
        }
        match ending {
            Ending::Fail => {
                drop(tx.rollback().await);
                Ok(Committed::RolledBack)
            }
            Ending::Commit => match tx.commit(Response::new(201, "committed")).await {
                Ok(_) => Ok(Committed::Kept(ids)),
                Err(CommitError::Stale(_)) => Ok(Committed::Stale),
                Err(other) => Err(format!("the commit failed: {other}").into()),
            },
        }
    }
}
