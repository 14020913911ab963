//! [`PgStore`]: the store side of the protocol over PostgreSQL: `begin` (one upsert that
//! claims, else one read that answers), eviction, the abandoned-work listing and stats.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};

use super::batch::{Batches, Claimed};
use super::claim::PgClaim;
use super::config::{Config, PgBuilder, duration_i64};
use super::driver::{backend, timed};
use super::listen::Wakeups;
use super::record::{record_of, timestamp};
use super::schema::Names;
use super::sql::{EVICTION, Hold, Planning, Sql};
use crate::error::StoreError;
use crate::model::begin::Begin;
use crate::model::config::Sweep;
use crate::model::decision::decide;
use crate::model::fingerprint::Fingerprint;
use crate::model::hex::hex;
use crate::model::limits::Limits;
use crate::model::maintenance::{Abandoned, Backlog, Evicted};
use crate::model::outcomes::Outcomes;
use crate::model::pace::{InFlight, Pace};
use crate::model::scope::Scope;
use crate::model::stats::Stats;

/// How many times in a row `begin` may find the record changed between its upsert and its
/// read (released, evicted, or its lease ended in between) before it gives up. Each round is
/// two statements, never a wait; more than two in a row takes a pathological race.
const RACES: usize = 8;

/// The idempotency store over PostgreSQL (feature `postgres`): the same claim protocol as the
/// local [`Store`](crate::Store), for several service instances sharing one database.
///
/// # The transaction shape
///
/// A claim hands out a PostgreSQL transaction ([`PgTx`](crate::PgTx), which derefs to
/// [`sqlx::Transaction`]); the business SQL runs in it, and [`PgTx::commit`](crate::PgTx::commit)
/// completes the record in the same transaction:
///
/// ```no_run
/// use std::time::Duration;
/// use idemstore::{Begin, Fingerprint, PgStore, Protocol, Response, Scope};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PgStore::builder("postgres://postgres@127.0.0.1:5432/test")
///     .lease(Duration::from_secs(30))
///     .open()
///     .await?;
/// idemstore::sqlx::query("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, item text)")
///     .execute(store.pool())
///     .await?;
///
/// let scope = Scope::new("acct_42", "create_order", "6d4cbddc-9f7c-4e8c")?;
/// match store.begin(&scope, Fingerprint::of(&("widget", 3u32))?).await? {
///     Begin::Claimed(claim) | Begin::Recovered(claim) => {
///         let mut tx = claim.transaction().await?; // BEGIN
///         idemstore::sqlx::query("INSERT INTO orders (id, item) VALUES ($1, $2)")
///             .bind("order-1")
///             .bind("widget x3")
///             .execute(tx.conn())
///             .await?;
///         // UPDATE <prefix>records ... WHERE fence = <the claim's>; then COMMIT. No row
///         // updated (another attempt took over): rolled back, CommitError::Stale.
///         tx.commit(Response::new(201, "order-1")).await?;
///     }
///     Begin::Replay(stored) => assert_eq!(stored.body(), b"order-1"), // a retry
///     Begin::InProgress { retry_after } => println!("409, retry in {retry_after:?}"),
///     Begin::Mismatch => println!("422: key reused for another request"),
///     Begin::Expired { .. } => println!("410: done long ago"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// How each part of the protocol is kept in SQL (the one-statement claim, fences from a
/// sequence, the database's clock, `begin_or_wait`'s notifications, eviction, time limits and
/// what a lost answer means, the schema, the outbox and its single relay) is told once, in
/// `docs/design.md`, "The PostgreSQL backend". [`PgBuilder`] lists the settings and their
/// ranges; [`PgTx::publish`](crate::PgTx::publish) records outbox messages in the claim's
/// transaction, and a [`Relay`](crate::relay::Relay) delivers them.
///
/// Cheap to clone: clones share one pool. Dropping the last clone stops its sweeper.
#[derive(Clone)]
pub struct PgStore {
    pub(crate) inner: Arc<Inner>,
}

/// What the clones of a store share.
pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    /// The store's own connections, apart from the caller's work: lease renewals and the
    /// `LISTEN` connection. A pool full of the holders' open transactions would otherwise
    /// make their renewals wait until the lease ran out, and another attempt took a live
    /// holder over.
    pub(crate) upkeep: PgPool,
    pub(crate) names: Names,
    pub(crate) sql: Sql,
    pub(crate) config: Config,
    /// Answers since open, in this process.
    pub(crate) counters: Outcomes,
    /// How long each operation's claims made here take to complete, for `InProgress`
    /// answers (this instance's view: another instance's completions are not seen).
    pub(crate) pace: Pace,
    /// Completions and releases announced by the database, for `begin_or_wait`.
    pub(crate) wakeups: Wakeups,
    /// The claims of concurrent `begin`s, waiting to go in one statement.
    pub(crate) batches: Batches,
    sweeper: parking_lot::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.sweeper.lock().take() {
            task.abort();
        }
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("records", &self.inner.names.records)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A builder for a store at `url` (`postgres://user@host:5432/db`).
    pub fn builder(url: &str) -> PgBuilder {
        PgBuilder::new(url)
    }

    /// Opens a store at `url` with the default settings.
    ///
    /// # Errors
    /// See [`PgBuilder::open`].
    pub async fn connect(url: &str) -> Result<PgStore, crate::error::PgOpenError> {
        PgBuilder::new(url).open().await
    }

    /// A store over `pool` (the caller's work) and `upkeep` (its own).
    pub(crate) fn start(
        [pool, upkeep]: [PgPool; 2],
        names: Names,
        config: Config,
        sweep: Sweep,
    ) -> Self {
        let sql = Sql::new(&names);
        let store = PgStore {
            inner: Arc::new(Inner {
                pool,
                upkeep,
                names,
                sql,
                config,
                counters: Outcomes::default(),
                pace: Pace::default(),
                wakeups: Wakeups::new(),
                batches: Batches::default(),
                sweeper: parking_lot::Mutex::new(None),
            }),
        };
        if let Sweep::Every { interval, batch } = sweep {
            let task = super::sweep::start(Arc::downgrade(&store.inner), interval, batch);
            *store.inner.sweeper.lock() = Some(task);
        }
        store
    }

    /// The pool, for business reads and writes outside a claim.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The records table's name (the prefix and `records`), for operators' queries.
    pub fn records_table(&self) -> &str {
        &self.inner.names.records
    }

    /// The payload of the notification sent when `scope` completes or is released.
    pub(crate) fn payload(scope: &Scope) -> String {
        hex(scope.encode())
    }

    /// One `begin`: the claiming upsert, in one statement with the other `begin`s of this
    /// store that arrive while one is out (see `batch`); if it claimed nothing for `scope`,
    /// the read that answers, on a pooled connection. Autocommitted.
    pub(crate) async fn begin_once(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<Begin<PgClaim>, StoreError> {
        let started = std::time::Instant::now();
        for _ in 0..RACES {
            match self.claim_in_batch(scope, fingerprint).await? {
                Claimed::Row(row) => return self.claimed(scope, fingerprint, &row, started),
                Claimed::Busy => return Ok(self.busy(scope, started)),
                Claimed::Unclaimed => {}
            }
            let mut conn = timed(
                self.call_limit(),
                "read a record",
                self.inner.pool.acquire(),
            )
            .await?;
            if let Some(answer) = self
                .answer_unclaimed(&mut conn, scope, fingerprint, started)
                .await?
            {
                return Ok(answer);
            }
        }
        Err(Self::raced(scope))
    }

    /// `begin`'s rule on `conn`, inside the transaction that will hold the business writes
    /// (`execute`): the claiming upsert for `scope` alone, then, if it wrote nothing, the read
    /// that answers.
    pub(crate) async fn begin_on(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<Begin<PgClaim>, StoreError> {
        let started = std::time::Instant::now();
        for _ in 0..RACES {
            let claimed = self
                .claim_rows(conn, &[(scope, fingerprint)], Hold::Exclusive)
                .await?;
            // A lock wait the user's own `lock_timeout` cut short: someone holds the row.
            let Ok(mut rows) = claimed else {
                return Ok(self.busy(scope, started));
            };
            if let Some(row) = rows.pop() {
                return self.claimed(scope, fingerprint, &row, started);
            }
            if let Some(answer) = self
                .answer_unclaimed(conn, scope, fingerprint, started)
                .await?
            {
                return Ok(answer);
            }
        }
        Err(Self::raced(scope))
    }

    /// The answer for a scope another session holds in an open transaction: in progress, for
    /// about as long as the operation takes (the holder's lease is not known here).
    fn busy(&self, scope: &Scope, started: std::time::Instant) -> Begin<PgClaim> {
        let inner = &self.inner;
        let in_flight = InFlight {
            lease_left: inner.config.lease,
            running_for: Duration::ZERO,
        };
        let answer = Begin::InProgress {
            retry_after: inner.pace.advise(scope.operation(), in_flight),
        };
        inner.counters.answered(&answer, None, started.elapsed());
        answer
    }

    /// The answer for a claim the statement made: `Claimed`, or `Recovered` for a take-over.
    fn claimed(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        row: &PgRow,
        started: std::time::Instant,
    ) -> Result<Begin<PgClaim>, StoreError> {
        let claim = PgClaim::from_row(self.clone(), scope.clone(), fingerprint, row)?;
        let answer = if claim.holding.attempt() == 1 {
            Begin::Claimed(claim)
        } else {
            Begin::Recovered(claim)
        };
        self.inner
            .counters
            .answered(&answer, None, started.elapsed());
        Ok(answer)
    }

    /// The answer for a scope the statement did not claim, from its record read on `conn`;
    /// `None` if it became claimable (or went) in between: claim again.
    async fn answer_unclaimed(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        fingerprint: Fingerprint,
        started: std::time::Instant,
    ) -> Result<Option<Begin<PgClaim>>, StoreError> {
        let inner = &self.inner;
        let found = timed(
            self.call_limit(),
            "read a record",
            sqlx::query(AssertSqlSafe(inner.sql.lookup.clone()))
                .bind(scope.tenant())
                .bind(scope.operation())
                .bind(scope.key())
                .bind(inner.config.now())
                .fetch_optional(&mut *conn),
        )
        .await?;
        // Gone between the two statements (released, evicted): claim again.
        let Some(row) = found else { return Ok(None) };
        let (record, now) = record_of(scope, &row)?;
        let decided = decide(Some(&record), &fingerprint, now, inner.config.tombstone_ttl);
        // `None`: the record became claimable between the two statements.
        let answer = Begin::without_writing(decided, &inner.pace, scope.operation());
        if let Some(answer) = &answer {
            inner.counters.answered(answer, None, started.elapsed());
        }
        Ok(answer)
    }

    /// The error of a `begin` that lost [`RACES`] races in a row.
    fn raced(scope: &Scope) -> StoreError {
        StoreError::Backend {
            message: format!(
                "the record for {scope} changed between claim and read {RACES} times in a row; retry"
            )
            .into(),
        }
    }

    /// Marks `scope`'s in-progress record as waited for, so that its completion or release
    /// notifies; false if it is no longer in progress.
    pub(crate) async fn mark_waiting(&self, scope: &Scope) -> Result<bool, StoreError> {
        let inner = &self.inner;
        let marked = timed(
            self.call_limit(),
            "wait for a holder",
            sqlx::query(AssertSqlSafe(inner.sql.mark_waiting.clone()))
                .bind(scope.tenant())
                .bind(scope.operation())
                .bind(scope.key())
                .fetch_optional(&inner.pool),
        )
        .await?;
        Ok(marked.is_some())
    }

    /// Evicts up to `limit` due records: completed ones first (deleted, or turned into
    /// tombstones), then tombstones, oldest first through their partial indexes.
    pub(crate) async fn evict(&self, limit: usize) -> Result<Evicted, StoreError> {
        let inner = &self.inner;
        let limit = limit.max(1);
        let (removed, more_completed) = self
            .evict_pass(&inner.sql.evict_completed, limit, true)
            .await?;
        let budget = limit - removed.min(limit);
        let (tombstones_removed, more_tombstones) = self
            .evict_pass(&inner.sql.evict_tombstones, budget, false)
            .await?;
        inner
            .counters
            .evicted(removed as u64, tombstones_removed as u64);
        Ok(Evicted {
            removed,
            tombstones_removed,
            backlog: if more_completed || more_tombstones {
                Backlog::More
            } else {
                Backlog::Empty
            },
        })
    }

    async fn evict_pass(
        &self,
        sql: &Arc<str>,
        limit: usize,
        with_tombstone_ttl: bool,
    ) -> Result<(usize, bool), StoreError> {
        let config = &self.inner.config;
        let mut query = sqlx::query(AssertSqlSafe(sql.clone()))
            .persistent(EVICTION == Planning::Cached)
            .bind(config.now())
            .bind(i64::try_from(limit).unwrap_or(i64::MAX));
        if with_tombstone_ttl {
            query = query.bind(duration_i64(config.tombstone_ttl));
        }
        let row = timed(
            self.call_limit(),
            "evict",
            query.fetch_one(&self.inner.pool),
        )
        .await?;
        let done: i64 = row.try_get("done").map_err(|e| backend("evict", &e))?;
        let more: bool = row.try_get("more").map_err(|e| backend("evict", &e))?;
        Ok((usize::try_from(done).unwrap_or(0), more))
    }

    pub(crate) async fn list_abandoned(&self, limit: usize) -> Result<Vec<Abandoned>, StoreError> {
        let config = &self.inner.config;
        let rows = timed(
            self.call_limit(),
            "list abandoned work",
            sqlx::query(AssertSqlSafe(self.inner.sql.abandoned.clone()))
                .bind(config.now())
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.inner.pool),
        )
        .await?;
        rows.iter().map(abandoned_of).collect()
    }

    pub(crate) async fn exact_stats(&self) -> Result<Stats, StoreError> {
        let config = &self.inner.config;
        let row = timed(
            self.call_limit(),
            "count records",
            sqlx::query(AssertSqlSafe(self.inner.sql.stats.clone()))
                .bind(config.now())
                .fetch_one(&self.inner.pool),
        )
        .await?;
        let read = |e: sqlx::Error| backend("count records", &e);
        let count = |name: &str| -> Result<u64, StoreError> {
            let n: i64 = row.try_get(name).map_err(read)?;
            Ok(u64::try_from(n).unwrap_or(0))
        };
        let first: Option<i64> = row.try_get("first_in_progress").map_err(read)?;
        let first_pending: Option<i64> = row.try_get("first_pending").map_err(read)?;
        let now: i64 = row.try_get("now").map_err(read)?;
        let mut stats = Stats {
            records: count("records")?,
            in_progress: count("in_progress")?,
            completed: count("completed")?,
            tombstones: count("tombstones")?,
            oldest_in_progress: first
                .map(|created| timestamp(now).saturating_since(timestamp(created))),
            waiting: self.inner.wakeups.waiting(),
            outbox_pending: count("outbox_pending")?,
            oldest_pending_message: first_pending
                .map(|committed| timestamp(now).saturating_since(timestamp(committed))),
            dead_letters: count("dead_letters")?,
            ..Stats::default()
        };
        self.inner.counters.fill(&mut stats);
        // Set where they are counted, as on the local store: a scrape that asks for the stats
        // first (the edge service's /metrics does) reads them fresh.
        crate::metrics::records(
            stats.in_progress,
            stats.completed,
            stats.tombstones,
            stats.oldest_in_progress,
        );
        Ok(stats)
    }

    pub(crate) fn limits_of(&self) -> Limits {
        let c = &self.inner.config;
        Limits {
            lease: c.lease,
            ttl: c.ttl,
            max_response_bytes: c.max_response_bytes,
            max_checkpoint_bytes: c.max_checkpoint_bytes,
        }
    }

    /// The time limit of one call that may wait for a connection and then run a statement.
    pub(crate) fn call_limit(&self) -> Duration {
        self.inner.config.bounds.call
    }
}

fn abandoned_of(row: &PgRow) -> Result<Abandoned, StoreError> {
    let read = |e: sqlx::Error| backend("list abandoned work", &e);
    let tenant: String = row.try_get("tenant").map_err(read)?;
    let operation: String = row.try_get("operation").map_err(read)?;
    let key: String = row.try_get("key").map_err(read)?;
    let scope = Scope::new(&tenant, &operation, &key).map_err(|e| StoreError::Backend {
        message: format!("a stored scope is invalid ({e})").into(),
    })?;
    let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(read)?;
    let fingerprint = Fingerprint::from_slice(&fingerprint).map_err(|e| StoreError::Backend {
        message: format!("the stored fingerprint of {scope} is invalid ({e})").into(),
    })?;
    let fence: i64 = row.try_get("fence").map_err(read)?;
    let attempt: i32 = row.try_get("attempt").map_err(read)?;
    let created: i64 = row.try_get("created_ms").map_err(read)?;
    let lease_until: Option<i64> = row.try_get("lease_until_ms").map_err(read)?;
    Ok(Abandoned {
        scope,
        fingerprint,
        fence: u64::try_from(fence).unwrap_or(0),
        attempt: u32::try_from(attempt).unwrap_or(0),
        created_at: timestamp(created),
        lease_until: timestamp(lease_until.unwrap_or(0)),
        checkpoint: row.try_get("checkpoint").map_err(read)?,
    })
}
