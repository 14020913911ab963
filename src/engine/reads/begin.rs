//! `begin` and `begin_or_wait`: the read path answers everything that writes nothing; a claim
//! or a take-over goes to the writer, which decides again inside its transaction.

use std::time::{Duration, Instant};

use crate::error::{ExecuteError, StoreError};
use crate::model::begin::Begin;
use crate::model::clock::Timestamp;
use crate::model::config::MetricLabels;
use crate::model::decision::decide;
use crate::model::fingerprint::Fingerprint;
use crate::model::record::Record;
use crate::model::response::Response;
use crate::model::scope::{Scope, spans_wanted};

use crate::engine::Engine;
use crate::engine::requests;
use crate::engine::requests::answers::{Held, UserWork};

/// The longest `begin_or_wait` waits when asked for more than the clock can represent.
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// The span every `begin` runs in.
fn begin_span(scope: &Scope) -> tracing::Span {
    if !spans_wanted() {
        return tracing::Span::none();
    }
    tracing::debug_span!(
        "idemstore.begin",
        tenant = scope.tenant(),
        operation = scope.operation(),
        key = scope.key(),
    )
}

/// The span every `execute` runs in.
fn execute_span(scope: &Scope) -> tracing::Span {
    if !spans_wanted() {
        return tracing::Span::none();
    }
    tracing::debug_span!(
        "idemstore.execute",
        tenant = scope.tenant(),
        operation = scope.operation(),
        key = scope.key(),
    )
}

impl Engine {
    /// Decides, atomically, what to do with a request for `scope`. Only a claim or a
    /// take-over writes; every other outcome is answered from a read transaction when possible
    /// and never waits for a sync.
    pub(crate) fn begin(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<Begin<Held>, StoreError> {
        let started = Instant::now();
        let span = begin_span(scope);
        let _entered = span.enter();
        let answer = match self.read_path(scope, fingerprint) {
            Ok(Some(answer)) => Ok(answer),
            Ok(None) => self
                .run(requests::begin(scope.clone(), fingerprint))
                .and_then(|answer| answer),
            Err(e) => Err(e),
        };
        self.answered(answer, scope, started)
    }

    /// [`Engine::begin`] for async callers (the read as [`Engine::read_path_async`] runs it).
    #[cfg(feature = "tokio")]
    pub(crate) async fn begin_async(
        self: &std::sync::Arc<Self>,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<Begin<Held>, StoreError> {
        let started = Instant::now();
        let span = begin_span(scope);
        let answer = async {
            match self.read_path_async(scope, fingerprint).await? {
                Some(answer) => Ok(answer),
                None => {
                    self.run_async(requests::begin(scope.clone(), fingerprint))
                        .await?
                }
            }
        }
        .await;
        let _entered = span.enter();
        self.answered(answer, scope, started)
    }

    /// Claims and commits in one writer step: `work` runs only when `begin` would have claimed
    /// (or taken over), inside the transaction that stores its response as the completed
    /// record. Every other answer comes from the read path, as `begin`'s does.
    pub(crate) fn execute(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        work: UserWork<Response>,
    ) -> Result<Begin<Response>, ExecuteError> {
        let started = Instant::now();
        let span = execute_span(scope);
        let _entered = span.enter();
        let answer = match self.read_path(scope, fingerprint)? {
            Some(answer) => Ok(answer),
            None => self.run(requests::execute(scope.clone(), fingerprint, work))?,
        };
        self.executed(answer, scope, started)
    }

    /// [`Engine::execute`] for async callers.
    #[cfg(feature = "tokio")]
    pub(crate) async fn execute_async(
        self: &std::sync::Arc<Self>,
        scope: &Scope,
        fingerprint: Fingerprint,
        work: UserWork<Response>,
    ) -> Result<Begin<Response>, ExecuteError> {
        let started = Instant::now();
        let span = execute_span(scope);
        let answer = match self.read_path_async(scope, fingerprint).await? {
            Some(answer) => Ok(answer),
            None => {
                self.run_async(requests::execute(scope.clone(), fingerprint, work))
                    .await?
            }
        };
        let _entered = span.enter();
        self.executed(answer, scope, started)
    }

    /// Counts and traces an `execute` answer.
    fn executed(
        &self,
        answer: Result<Begin<Response>, ExecuteError>,
        scope: &Scope,
        started: Instant,
    ) -> Result<Begin<Response>, ExecuteError> {
        match &answer {
            Ok(begun) => {
                let took = started.elapsed();
                self.shared
                    .counters
                    .answered(begun, self.tenant_label(scope), took);
                // One step claimed and committed: the commit is acknowledged with the answer.
                if let Begin::Claimed(_) | Begin::Recovered(_) = begun {
                    self.shared.counters.committed(took);
                }
                let status = match begun {
                    Begin::Claimed(response)
                    | Begin::Recovered(response)
                    | Begin::Replay(response) => Some(response.status()),
                    _ => None,
                };
                tracing::debug!(outcome = begun.outcome(), status);
            }
            Err(e) => tracing::debug!(error = %e, "execute stored nothing"),
        }
        answer
    }

    /// Like [`Engine::begin`], but when the scope is held by a live claim *of this process*,
    /// waits (up to `max_wait`) for that claim to finish instead of answering `InProgress`.
    /// Waiting is on a notification from the claim itself: no polling.
    pub(crate) fn begin_or_wait(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        max_wait: Duration,
    ) -> Result<Begin<Held>, StoreError> {
        let start = Instant::now();
        let deadline = start.checked_add(max_wait).unwrap_or(start + MAX_WAIT);
        loop {
            let watch = self.shared.watchers.watch(scope.encode());
            // Read before asking, so that a claim finishing in between is not missed.
            let seen = watch.slot.generation();
            match self.begin(scope, fingerprint)? {
                Begin::InProgress { .. } if watch.slot.worth_waiting(seen) => {
                    if !watch.slot.wait_past(seen, deadline) {
                        drop(watch);
                        return self.begin(scope, fingerprint);
                    }
                }
                other => return Ok(other),
            }
        }
    }

    /// [`Engine::begin_or_wait`] for async callers: waits on a notification from the holder,
    /// bounded by `tokio::time` (so paused time in tests works).
    #[cfg(feature = "tokio")]
    pub(crate) async fn begin_or_wait_async(
        self: &std::sync::Arc<Self>,
        scope: &Scope,
        fingerprint: Fingerprint,
        max_wait: Duration,
    ) -> Result<Begin<Held>, StoreError> {
        // `Duration::MAX` means "as long as it takes": cap it where the sum would overflow.
        let start = tokio::time::Instant::now();
        let deadline = start.checked_add(max_wait).unwrap_or(start + MAX_WAIT);
        loop {
            let watch = self.shared.watchers.watch(scope.encode());
            let slot = watch.slot.clone();
            // Registered before the generation is read: a change in between still wakes it.
            let changed = slot.notify.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let seen = slot.generation();
            match self.begin_async(scope, fingerprint).await? {
                Begin::InProgress { .. } if watch.slot.worth_waiting(seen) => {
                    if tokio::time::timeout_at(deadline, changed).await.is_err() {
                        drop(watch);
                        return self.begin_async(scope, fingerprint).await;
                    }
                }
                other => return Ok(other),
            }
        }
    }

    /// `begin`'s first step, from a read transaction: the answer if it writes nothing, `None`
    /// if the writer must decide.
    fn read_path<C>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<Option<Begin<C>>, StoreError> {
        let now = self.shared.config.clock.now();
        let existing = self.read_record(scope, now)?;
        Ok(self.without_writing(scope, existing, fingerprint, now))
    }

    /// [`Engine::read_path`] for async callers: inline when the file is free (a read of cached
    /// pages: microseconds, far less than a hop to the blocking pool), on the blocking pool
    /// while a compaction or a reopen holds it.
    #[cfg(feature = "tokio")]
    async fn read_path_async<C: Send + 'static>(
        self: &std::sync::Arc<Self>,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<Option<Begin<C>>, StoreError> {
        if let Some(read) = self.try_read_path(scope, fingerprint) {
            return read;
        }
        let (engine, scope) = (self.clone(), scope.clone());
        tokio::task::spawn_blocking(move || engine.read_path(&scope, fingerprint))
            .await
            .map_err(|e| StoreError::Internal {
                message: format!("a blocking read failed to run: {e}"),
            })?
    }

    /// [`Engine::read_path`] if it can run without waiting for a compaction to finish.
    #[cfg(feature = "tokio")]
    pub(in crate::engine) fn try_read_path<C>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Option<Result<Option<Begin<C>>, StoreError>> {
        let now = self.shared.config.clock.now();
        let existing = self.try_read_record(scope, now)?;
        Some(existing.map(|existing| self.without_writing(scope, existing, fingerprint, now)))
    }

    /// What `begin` answers from the record it read, or `None`: a claim or a take-over, which
    /// the writer decides again inside its transaction, where racing claims for the same scope
    /// are serialised and exactly one wins.
    fn without_writing<C>(
        &self,
        scope: &Scope,
        existing: Option<Record>,
        fingerprint: Fingerprint,
        now: Timestamp,
    ) -> Option<Begin<C>> {
        let decided = decide(
            existing.as_ref(),
            &fingerprint,
            now,
            self.shared.config.tombstone_ttl,
        );
        Begin::without_writing(decided, &self.shared.pace, scope.operation())
    }

    /// The tenant, as a metric label, if the user opted in to it.
    fn tenant_label<'s>(&self, scope: &'s Scope) -> Option<&'s str> {
        match self.shared.config.metric_labels {
            MetricLabels::WithTenant => Some(scope.tenant()),
            _ => None,
        }
    }

    /// Counts and traces a `begin` answer.
    fn answered(
        &self,
        answer: Result<Begin<Held>, StoreError>,
        scope: &Scope,
        started: Instant,
    ) -> Result<Begin<Held>, StoreError> {
        let answer = answer.inspect_err(|e| {
            tracing::warn!(error = %e, "begin failed");
        })?;
        self.shared
            .counters
            .answered(&answer, self.tenant_label(scope), started.elapsed());
        let outcome = answer.outcome();
        match &answer {
            Begin::Claimed(held) | Begin::Recovered(held) => {
                tracing::debug!(
                    outcome,
                    fence = held.grant.fence,
                    attempt = held.grant.attempt
                );
            }
            Begin::Replay(response) => tracing::debug!(outcome, status = response.status()),
            Begin::InProgress { retry_after } => {
                tracing::debug!(outcome, retry_after_ms = retry_after.as_millis() as u64);
            }
            Begin::Mismatch | Begin::Expired { .. } => tracing::debug!(outcome),
        }
        Ok(answer)
    }
}
