//! [`PgClaim`]: what a winner of `begin` holds over PostgreSQL. Every operation is one
//! statement whose `WHERE` names the claim's fence; no row changed means the claim is stale.

use std::fmt;
use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use super::codec::encode_headers;
use super::config::duration_i64;
use super::driver::{backend, commit_failed, timed, unknown};
use super::record::timestamp;
use super::schema::IN_PROGRESS;
use super::store::PgStore;
use super::tx::PgTx;
use crate::error::{ClaimError, CommitError, StaleClaim, StaleReason, StoreError};
use crate::model::claim::{Extension, Grant, Phase, Recovery, check_holder};
use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::protocol::claim::{Holding, check_checkpoint, check_lease};
use crate::protocol::keep_alive::{Renew, Renewed};

/// Ownership of a scope in a [`PgStore`], checked against its fence by every operation.
///
/// Finish it with [`PgClaim::transaction`] and [`PgTx::commit`] (business SQL and the
/// completed record in one PostgreSQL transaction), with `complete` (no business writes), or
/// with `release` (the work did not happen). Dropped unfinished, the key stays in progress
/// until its lease ends, and the next attempt recovers it.
pub struct PgClaim {
    pub(crate) store: PgStore,
    pub(crate) holding: Holding,
}

impl fmt::Debug for PgClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.holding.debug("PgClaim", f)
    }
}

impl PgClaim {
    /// The claim in the claiming statement's returned row.
    pub(crate) fn from_row(
        store: PgStore,
        scope: Scope,
        fingerprint: Fingerprint,
        row: &PgRow,
    ) -> Result<Self, StoreError> {
        let read = |e: sqlx::Error| backend("read the claim", &e);
        let number = |what: &str, value: i64| {
            u64::try_from(value).map_err(|_| not_a_claim(&format!("{what} {value}")))
        };
        let fence = number("fence", row.try_get("fence").map_err(read)?)?;
        let origin_fence = number("origin fence", row.try_get("origin_fence").map_err(read)?)?;
        let attempt: i32 = row.try_get("attempt").map_err(read)?;
        let attempt =
            u32::try_from(attempt).map_err(|_| not_a_claim(&format!("attempt {attempt}")))?;
        let lease_until: Option<i64> = row.try_get("lease_until_ms").map_err(read)?;
        let lease_until = lease_until.unwrap_or(0);
        // The statement's own `now`: when this grant was made, whatever lease it was given.
        let claimed_at: i64 = row.try_get("claimed_ms").map_err(read)?;
        let grant = Grant {
            fence,
            origin_fence,
            attempt,
            // The statement takes a lease over only once it expired; a database is never
            // restored from a copy that may lag, so a first attempt is never a recovery.
            recovery: (attempt > 1).then_some(Recovery::LeaseExpired),
            lease_until: timestamp(lease_until),
            claimed_at: timestamp(claimed_at),
            checkpoint: row.try_get("checkpoint").map_err(read)?,
        };
        if let Some(broken) = grant.invalid() {
            return Err(not_a_claim(&format!("a grant for {scope} where {broken}")));
        }
        Ok(PgClaim {
            store,
            holding: Holding::new(scope, fingerprint, grant),
        })
    }

    /// Opens the PostgreSQL transaction the business SQL and the completion run in: see
    /// [`PgTx`]. The claim moves into it, and comes back from [`PgTx::rollback`].
    ///
    /// # Errors
    /// [`CommitError::Store`] if no connection or transaction could be had; the key stays in
    /// progress (until its lease ends, when a retry recovers it).
    pub async fn transaction(self) -> Result<PgTx, CommitError<PgClaim>> {
        let limit = self.store.call_limit();
        let tx = timed(limit, "begin a transaction", self.store.pool().begin()).await?;
        Ok(PgTx::new(tx, self))
    }

    /// Why this claim's fence no longer holds, read after a fenced statement changed nothing.
    pub(crate) async fn stale(&self) -> Result<StaleClaim, StoreError> {
        let inner = &self.store.inner;
        let row = timed(
            self.store.call_limit(),
            "read the holder",
            sqlx::query(AssertSqlSafe(inner.sql.holder.clone()))
                .bind(self.scope().tenant())
                .bind(self.scope().operation())
                .bind(self.scope().key())
                .fetch_optional(&inner.pool),
        )
        .await?;
        let read = |e: sqlx::Error| backend("read the holder", &e);
        let stored = match row {
            None => None,
            Some(row) => {
                let fence: i64 = row.try_get("fence").map_err(read)?;
                let state: i16 = row.try_get("state").map_err(read)?;
                let phase = if state == IN_PROGRESS {
                    Phase::InProgress
                } else {
                    Phase::Finished
                };
                Some((u64::try_from(fence).unwrap_or(0), phase))
            }
        };
        // Held after all: the statement missed a record that holds, which only a race with a
        // change that was undone could do; report it as taken over by itself.
        let reason = check_holder(stored, self.fence())
            .err()
            .unwrap_or(StaleReason::TakenOver {
                current_fence: self.fence(),
            });
        inner.counters.stale();
        Ok(self.holding.stale(reason))
    }

    /// The completion statement, bound for `response`, for [`PgTx::commit`] and `complete`.
    pub(crate) fn completion(
        &self,
        response: &Response,
    ) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
        self.completion_in(self.store.inner.sql.complete.clone(), response)
    }

    /// The completion that also records `messages` (`(id, subject, payload)` in publishing
    /// order) in the outbox, in the same statement.
    pub(crate) fn completion_publishing(
        &self,
        response: &Response,
        messages: Vec<(String, String, Vec<u8>)>,
    ) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let mut ids = Vec::with_capacity(messages.len());
        let mut subjects = Vec::with_capacity(messages.len());
        let mut payloads = Vec::with_capacity(messages.len());
        for (id, subject, payload) in messages {
            ids.push(id);
            subjects.push(subject);
            payloads.push(payload);
        }
        let sql = self.store.inner.sql.complete_publishing.clone();
        self.completion_in(sql, response)
            .bind(ids)
            .bind(subjects)
            .bind(payloads)
    }

    /// `sql` (a completion statement) with the completion's ten parameters bound.
    fn completion_in(
        &self,
        sql: std::sync::Arc<str>,
        response: &Response,
    ) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let inner = &self.store.inner;
        sqlx::query(AssertSqlSafe(sql))
            .bind(self.scope().tenant().to_owned())
            .bind(self.scope().operation().to_owned())
            .bind(self.scope().key().to_owned())
            .bind(fence_i64(self.fence()))
            .bind(duration_i64(inner.config.ttl))
            .bind(inner.config.now())
            .bind(i32::from(response.status()))
            .bind(encode_headers(response))
            .bind(response.body().to_vec())
            .bind(PgStore::payload(self.scope()))
    }

    /// `complete`: the completion alone, as one autocommitted statement (one round trip).
    pub(crate) async fn complete_alone(
        self,
        response: Response,
    ) -> Result<Response, CommitError<PgClaim>> {
        if let Err(source) = response.validate(self.store.inner.config.max_response_bytes) {
            return Err(CommitError::InvalidResponse {
                source,
                claim: Box::new(self),
            });
        }
        let started = std::time::Instant::now();
        let limit = self.store.call_limit();
        let done = tokio::time::timeout(
            limit,
            self.completion(&response).fetch_optional(self.store.pool()),
        )
        .await;
        match done {
            Ok(Ok(Some(row))) => {
                self.completed(&row, started);
                Ok(response)
            }
            Ok(Ok(None)) => Err(CommitError::Stale(self.stale().await?)),
            // Refused before it was sent: nothing happened.
            Ok(Err(e @ (sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed))) => {
                Err(CommitError::Store(backend("complete", &e)))
            }
            Ok(Err(e)) => Err(CommitError::Store(commit_failed(&e))),
            Err(_) => Err(CommitError::Store(unknown(
                "complete",
                &format!("no answer from the database within {limit:?}"),
            ))),
        }
    }

    /// Counts the commit that began at `started`, and adds this claim's time from claim to
    /// completion (`row`, a completion statement's answer) to its operation's pace. Call only
    /// once the completion is committed.
    pub(crate) fn completed(&self, row: &PgRow, started: std::time::Instant) {
        self.store.inner.counters.committed(started.elapsed());
        match row.try_get::<i64, _>("completed_ms") {
            Ok(completed) => self.store.inner.pace.completed(
                self.scope().operation(),
                timestamp(completed).saturating_since(self.holding.claimed_at()),
            ),
            Err(e) => tracing::debug!(error = %e, "a completion without its time"),
        }
    }

    /// `release`: one fenced `DELETE`.
    pub(crate) async fn release(self) -> Result<(), ClaimError> {
        let inner = &self.store.inner;
        let gone = timed(
            self.store.call_limit(),
            "release",
            sqlx::query(AssertSqlSafe(inner.sql.release.clone()))
                .bind(self.scope().tenant())
                .bind(self.scope().operation())
                .bind(self.scope().key())
                .bind(fence_i64(self.fence()))
                .bind(PgStore::payload(self.scope()))
                .fetch_optional(&inner.pool),
        )
        .await?;
        match gone {
            Some(_) => {
                inner.counters.released();
                Ok(())
            }
            None => Err(ClaimError::Stale(self.stale().await?)),
        }
    }

    /// `extend`: one fenced `UPDATE`.
    pub(crate) async fn extend(&mut self, lease: Duration) -> Result<(), ClaimError> {
        check_lease(lease)?;
        let extended = self
            .store
            .extend(self.scope(), self.fence(), lease, Extension::Exactly)
            .await?;
        match extended {
            Some(until) => {
                self.holding.extended(until);
                Ok(())
            }
            None => Err(ClaimError::Stale(self.stale().await?)),
        }
    }

    /// `checkpoint`: one fenced `UPDATE`.
    pub(crate) async fn checkpoint(&mut self, bytes: Vec<u8>) -> Result<(), ClaimError> {
        check_checkpoint(&bytes, self.store.inner.config.max_checkpoint_bytes)?;
        let inner = &self.store.inner;
        let updated = timed(
            self.store.call_limit(),
            "checkpoint",
            sqlx::query(AssertSqlSafe(inner.sql.checkpoint.clone()))
                .bind(self.scope().tenant())
                .bind(self.scope().operation())
                .bind(self.scope().key())
                .bind(fence_i64(self.fence()))
                .bind(&bytes[..])
                .fetch_optional(&inner.pool),
        )
        .await?;
        match updated {
            Some(_) => {
                self.holding.checkpointed(bytes);
                Ok(())
            }
            None => Err(ClaimError::Stale(self.stale().await?)),
        }
    }

    pub(crate) fn scope(&self) -> &Scope {
        self.holding.scope()
    }

    pub(crate) fn fence(&self) -> u64 {
        self.holding.fence()
    }
}

impl PgStore {
    /// Moves the lease of the holder of `fence`; `None` if it no longer holds. On the store's
    /// own connections, never the pool the holder's transactions may fill.
    async fn extend(
        &self,
        scope: &Scope,
        fence: u64,
        lease: Duration,
        extension: Extension,
    ) -> Result<Option<Timestamp>, StoreError> {
        let inner = &self.inner;
        let row = timed(
            self.call_limit(),
            "extend a lease",
            sqlx::query(AssertSqlSafe(inner.sql.extend.clone()))
                .bind(scope.tenant())
                .bind(scope.operation())
                .bind(scope.key())
                .bind(fence_i64(fence))
                .bind(duration_i64(lease))
                .bind(inner.config.now())
                .bind(extension == Extension::AtLeast)
                .fetch_optional(&inner.upkeep),
        )
        .await?;
        row.map(|row| {
            row.try_get::<Option<i64>, _>("lease_until_ms")
                .map(|ms| timestamp(ms.unwrap_or(0)))
                .map_err(|e| backend("extend a lease", &e))
        })
        .transpose()
    }
}

impl Renew for PgStore {
    fn lease(&self) -> Duration {
        self.inner.config.lease
    }

    async fn renew(
        &self,
        scope: &Scope,
        fence: u64,
        lease: Duration,
    ) -> Result<Renewed, ClaimError> {
        Ok(
            match self.extend(scope, fence, lease, Extension::AtLeast).await? {
                Some(until) => Renewed::Until(until),
                // Finished or taken over: the statement does not say which.
                None => Renewed::Over(None),
            },
        )
    }

    /// The renewals run on the runtime the claim was made on.
    fn renew_blocking(
        &self,
        _: &Scope,
        _: u64,
        _: Duration,
    ) -> Option<Result<Renewed, ClaimError>> {
        None
    }
}

/// A claiming statement returned `what`, which no claim writes.
fn not_a_claim(what: &str) -> StoreError {
    StoreError::Backend {
        message: format!(
            "the claim's row holds {what}, which no claim writes: is the table idemstore's?"
        )
        .into(),
    }
}

/// A fence as PostgreSQL's `bigint` (fences come from a sequence, so they fit).
pub(crate) fn fence_i64(fence: u64) -> i64 {
    i64::try_from(fence).unwrap_or(i64::MAX)
}
