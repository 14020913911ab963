//! The settings of a [`PgStore`](super::PgStore) and the builder that checks them.

use std::sync::Arc;
use std::time::Duration;

use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use super::bounds::Bounds;
use super::pooler;
use super::schema::{Names, migrate};
use super::store::PgStore;
use crate::error::PgOpenError;
use crate::model::clock::{Clock, duration_millis};
use crate::model::config::Sweep;
use crate::model::settings::Settings;

/// A pooled connection idle this long is pinged before it is used.
const IDLE_PING: Duration = Duration::from_secs(1);

/// The store's own connections, besides the pool: lease renewals (keep-alives and
/// `extend`, one short statement each) share two, and the `LISTEN` connection of
/// `begin_or_wait` holds one.
const UPKEEP_CONNECTIONS: u32 = 3;

/// The settings an open store runs with.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) lease: Duration,
    pub(crate) ttl: Duration,
    pub(crate) tombstone_ttl: Duration,
    pub(crate) max_response_bytes: usize,
    pub(crate) max_checkpoint_bytes: usize,
    /// Every time limit, from the lease and the timeout.
    pub(crate) bounds: Bounds,
    /// A clock that replaces the database's (tests only); `None`: the database's.
    pub(crate) clock: Option<Arc<dyn Clock>>,
}

impl Config {
    /// The `now` parameter of every statement: null, so the database reads its own clock,
    /// unless a test injected one.
    pub(crate) fn now(&self) -> Option<i64> {
        self.clock.as_ref().map(|c| millis_i64(c.now().as_millis()))
    }
}

/// A pool of at most `size` connections, bounded by `bounds`.
///
/// A connection idle for a while is pinged before use, so one that died (a restarted server,
/// a dropped idle connection) is replaced; a hot one is not, which would cost a round trip
/// per call. A connection that dies while in use fails its call with `StoreError::Backend`
/// and is replaced by the next.
///
/// A connection handed back with work still in flight (a call cancelled by its client-side
/// limit, a transaction dropped with its `ROLLBACK` queued) first finishes that work within
/// one statement's limit, or is closed: sqlx's own check on release waits for it without a
/// limit, and a connection gone silent would keep its place in the pool for good (until the
/// kernel gave up), so that a pool whose connections all went silent at once would never
/// hand out another. `Connection::flush` (hidden in sqlx's docs, public in its trait) waits
/// only for what is in flight: nothing, so no round trip, on a clean connection.
pub(crate) fn pool_options(bounds: Bounds, size: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(size)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::raw_sql(AssertSqlSafe(bounds.session_statements()))
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .acquire_timeout(bounds.statement)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= IDLE_PING {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .after_release(move |conn, _| {
            Box::pin(async move {
                match tokio::time::timeout(bounds.statement, sqlx::Connection::flush(conn)).await {
                    Ok(flushed) => flushed.map(|()| true),
                    // An error, not `Ok(false)`: closing politely would write to a socket
                    // that may not take it.
                    Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "a connection handed back to the pool did not finish its last call",
                    ))),
                }
            })
        })
}

/// Milliseconds as PostgreSQL's `bigint`.
pub(crate) fn millis_i64(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// A duration as `bigint` milliseconds (rounded up, as everywhere in the store).
pub(crate) fn duration_i64(d: Duration) -> i64 {
    millis_i64(duration_millis(d))
}

/// Opens a [`PgStore`]: `PgStore::builder(url).lease(..).open().await`.
///
/// Every setting is checked at `open`; none panics.
///
/// # Time limits
///
/// Two settings, [`lease`](Self::lease) and [`timeout`](Self::timeout), bound everything the
/// backend waits for, by one rule:
///
/// | what is bounded | by |
/// | --- | --- |
/// | each statement (`statement_timeout`: the server cancels it) | `timeout` |
/// | the wait for a pooled connection | `timeout` |
/// | one call, on the client (a connection that hangs without closing) | 2 × `timeout` |
/// | a session idle inside a transaction (`idle_in_transaction_session_timeout`) | the silence bound |
/// | a client whose machine stopped answering (`tcp_keepalives_*`: half of it idle, then 3 probes; `tcp_user_timeout`) | about the silence bound |
/// | the relay's lock session, idle outside a transaction (`idle_session_timeout`) | the silence bound |
/// | each statement of the schema's setup at `open` (it may wait for another instance's) | `timeout`, at least 60 s |
///
/// The **silence bound** is the lease, but never less than 2 × `timeout` (one call) or 4 s
/// (a loaded client may pause that long; keepalives count whole seconds). It is what a lost
/// network answer costs a key: a `COMMIT` lost on its way leaves the server's session idle
/// in its transaction, holding the record's row lock, so that every `begin` of the key times
/// out; the server ends that session within the silence bound, and the key answers again (a
/// take-over once its lease ends, a replay if the commit landed). So keep each gap between
/// the statements of a claim's transaction under a lease: do slow work before
/// [`PgClaim::transaction`](crate::PgClaim::transaction), not inside it. The client has no
/// socket keepalives (sqlx cannot set them): there, the call limit is the bound.
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until open is called"]
pub struct PgBuilder {
    url: String,
    prefix: String,
    /// Lease, TTLs and size caps: the settings every backend shares, checked by one rule.
    settings: Settings,
    pool_size: u32,
    timeout: Duration,
    sweep: Sweep,
    clock: Option<Arc<dyn Clock>>,
}

impl PgBuilder {
    pub(crate) fn new(url: &str) -> Self {
        PgBuilder {
            url: url.to_owned(),
            prefix: "idemstore_".to_owned(),
            settings: Settings::default(),
            pool_size: 10,
            timeout: Duration::from_secs(5),
            sweep: Sweep::default(),
            clock: None,
        }
    }

    /// The prefix of the store's table, sequence and index names, so that several stores
    /// share one database. Default `idemstore_`; 1 to 40 of `a-z`, `0-9`, `_`, not starting
    /// with a digit.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = prefix.to_owned();
        self
    }

    /// How long a claim holds its key. Default 30 s; 1 ms ..= 7 days. Also the longest a
    /// silent session lives on the server (see "Time limits").
    pub fn lease(mut self, lease: Duration) -> Self {
        self.settings.lease = lease;
        self
    }

    /// How long a completed record answers retries. Default 24 h; at most 10 years.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.settings.ttl = ttl;
        self
    }

    /// How long after the TTL a retry is told `Expired` instead of running again. Default
    /// zero (off); at most 10 years.
    pub fn tombstone_ttl(mut self, tombstone_ttl: Duration) -> Self {
        self.settings.tombstone_ttl = tombstone_ttl;
        self
    }

    /// The largest response a commit may store, encoded. Default 1 MiB; at most 64 MiB.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_response_bytes = bytes;
        self
    }

    /// The largest checkpoint. Default 64 KiB; at most 16 MiB.
    pub fn max_checkpoint_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_checkpoint_bytes = bytes;
        self
    }

    /// Connections in the pool. Default 10; 1 ..= 10,000. Every open claim transaction holds
    /// one while it runs. The store keeps up to 3 more of its own (lease renewals, and the
    /// `LISTEN` connection of `begin_or_wait`), opened when first needed, so that a pool full
    /// of the holders' own transactions never starves the renewals that keep them holders.
    pub fn pool_size(mut self, connections: u32) -> Self {
        self.pool_size = connections;
        self
    }

    /// The most one call may take: the wait for a pooled connection, and each statement
    /// (sent as the session's `statement_timeout`, so the server cancels it too). A call past
    /// it fails with [`StoreError::Backend`](crate::StoreError::Backend), or
    /// [`StoreError::OutcomeUnknown`](crate::StoreError::OutcomeUnknown) for a commit. The
    /// other limits follow from it and the lease (see "Time limits").
    /// Default 5 s; 1 ms ..= 1 hour.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Background eviction, as the local store's: default every 10 s in batches of 1,000.
    /// Several instances may sweep at once: they skip each other's rows.
    pub fn sweep(mut self, sweep: Sweep) -> Self {
        self.sweep = sweep;
        self
    }

    /// Replaces the database's clock with `clock`, **for tests only** (a
    /// [`ManualClock`](crate::ManualClock) moves leases without sleeping). In production
    /// leave it: leases and TTLs are then judged by the database's clock, which every
    /// instance shares, so instances whose own clocks are skewed still agree.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Connects, creates or upgrades the schema (idempotent), and starts the sweeper.
    ///
    /// # Errors
    /// [`PgOpenError`] for a bad prefix or setting, an unreachable database, or a failed
    /// migration.
    pub async fn open(self) -> Result<PgStore, PgOpenError> {
        let names = Names::new(&self.prefix)?;
        let invalid = |setting, reason: String| PgOpenError::InvalidSetting { setting, reason };
        self.settings
            .validate()
            .map_err(|e| invalid(e.setting, e.reason))?;
        if !(1..=10_000).contains(&self.pool_size) {
            return Err(invalid("pool_size", "1 ..= 10000 connections".into()));
        }
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(3600) {
            return Err(invalid("timeout", "1 ms ..= 1 hour".into()));
        }
        let connect = |e: sqlx::Error| PgOpenError::Connect {
            message: e.to_string(),
        };
        let options: PgConnectOptions = self.url.parse().map_err(connect)?;
        let bounds = Bounds::new(self.settings.lease, self.timeout);
        let options = options.application_name("idemstore");
        pooler::check(&options, bounds).await?;
        let upkeep = pool_options(bounds, UPKEEP_CONNECTIONS).connect_lazy_with(options.clone());
        let pool = pool_options(bounds, self.pool_size)
            .connect_with(options)
            .await
            .map_err(connect)?;
        migrate(&pool, &names, bounds).await?;
        let config = Config {
            lease: self.settings.lease,
            ttl: self.settings.ttl,
            tombstone_ttl: self.settings.tombstone_ttl,
            max_response_bytes: self.settings.max_response_bytes,
            max_checkpoint_bytes: self.settings.max_checkpoint_bytes,
            bounds,
            clock: self.clock,
        };
        Ok(PgStore::start([pool, upkeep], names, config, self.sweep))
    }
}
