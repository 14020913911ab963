//! The protocol's traits on the PostgreSQL backend, and `begin_or_wait` over `LISTEN`.

use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::claim::PgClaim;
use super::store::PgStore;
use crate::error::{ClaimError, CommitError, StoreError};
use crate::model::backoff::Doubling;
use crate::model::begin::Begin;
use crate::model::claim::Recovery;
use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::limits::Limits;
use crate::model::maintenance::{Abandoned, Evicted};
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::model::stats::Stats;
use crate::protocol::keep_alive::KeepAlive;
use crate::protocol::{Protocol, ProtocolClaim};

/// A waiter's poll interval: from 50 ms, doubling up to 1 s, the longest a waiter goes
/// without asking the database itself.
const POLLS: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

impl Protocol for PgStore {
    type Claim = PgClaim;

    async fn begin(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<Begin<PgClaim>, StoreError> {
        self.begin_once(scope, fingerprint).await
    }

    /// Waits for the holder's completion or release (announced by `NOTIFY`), the end of its
    /// lease, or `max_wait`, whichever comes first; between notifications it asks again at a
    /// bounded interval (50 ms doubling to 1 s), never in a busy loop.
    async fn begin_or_wait(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        max_wait: Duration,
    ) -> Result<Begin<PgClaim>, StoreError> {
        let deadline = Instant::now() + max_wait;
        let payload = PgStore::payload(scope);
        // Subscribed before asking, so a completion between the answer and the wait is seen.
        let mut waiter = self.inner.wakeups.subscribe(
            &self.inner.upkeep,
            &self.inner.names.channel,
            self.inner.config.bounds,
        );
        let polls = Doubling::new(POLLS.0, POLLS.1);
        let mut round = 1u32;
        loop {
            let answer = self.begin_once(scope, fingerprint).await?;
            let Begin::InProgress { retry_after } = answer else {
                return Ok(answer);
            };
            let now = Instant::now();
            if now >= deadline {
                return Ok(answer);
            }
            // Ask the holder's completion or release to notify (only waited-for keys are
            // notified). Nothing in progress any more: it finished meanwhile; ask again now.
            if !self.mark_waiting(scope).await? {
                continue;
            }
            let wait = (deadline - now)
                .min(retry_after.max(Duration::from_millis(1)))
                .min(polls.after(round));
            round = round.saturating_add(1);
            let woken = async {
                loop {
                    match waiter.receiver.recv().await {
                        Ok(done) if *done == *payload => return,
                        Ok(_) => {}
                        // Missed some: one of them may have been ours.
                        Err(RecvError::Lagged(_)) => return,
                        Err(RecvError::Closed) => std::future::pending::<()>().await,
                    }
                }
            };
            let _ = tokio::time::timeout(wait, woken).await;
        }
    }

    async fn evict_expired(&self, limit: usize) -> Result<Evicted, StoreError> {
        self.evict(limit).await
    }

    async fn abandoned(&self, limit: usize) -> Result<Vec<Abandoned>, StoreError> {
        self.list_abandoned(limit).await
    }

    /// Exact: counted with one scan of the records table (for monitoring, not per request).
    async fn stats(&self) -> Result<Stats, StoreError> {
        self.exact_stats().await
    }

    fn limits(&self) -> Limits {
        self.limits_of()
    }
}

impl ProtocolClaim for PgClaim {
    fn scope(&self) -> &Scope {
        self.holding.scope()
    }

    fn fingerprint(&self) -> Fingerprint {
        self.holding.fingerprint()
    }

    fn fence(&self) -> u64 {
        self.holding.fence()
    }

    fn attempt(&self) -> u32 {
        self.holding.attempt()
    }

    fn lease_until(&self) -> Timestamp {
        self.holding.lease_until()
    }

    fn last_checkpoint(&self) -> Option<&[u8]> {
        self.holding.last_checkpoint()
    }

    /// A take-over's: PostgreSQL is never restored from a copy that may lag.
    fn recovery(&self) -> Option<Recovery> {
        self.holding.recovery()
    }

    fn downstream_key(&self) -> String {
        self.holding.downstream_key()
    }

    fn keep_alive(&self) -> KeepAlive {
        self.holding.keep_alive(self.store.clone())
    }

    /// One autocommitted `UPDATE ... WHERE fence = $n`: one round trip.
    async fn complete(self, response: Response) -> Result<Response, CommitError<Self>> {
        self.complete_alone(response).await
    }

    async fn release(self) -> Result<(), ClaimError> {
        PgClaim::release(self).await
    }

    async fn extend(&mut self, lease: Duration) -> Result<(), ClaimError> {
        PgClaim::extend(self, lease).await
    }

    async fn checkpoint(&mut self, bytes: Vec<u8>) -> Result<(), ClaimError> {
        PgClaim::checkpoint(self, bytes).await
    }
}
