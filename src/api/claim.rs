//! The claim a winner of `begin` holds while it works: a facade that builds the engine's
//! requests for its scope and fence and maps their answers to errors.

use std::fmt;
use std::time::Duration;

use crate::api::store::Store;
use crate::engine::{CommitRefusal, Held, HoldToken, Refusal, Request, Tx, UserFailure, request};
use crate::error::{BoxError, ClaimError, StoreError};
use crate::model::claim::Recovery;
use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::protocol::claim::{Holding, check_checkpoint, check_lease};
use crate::protocol::keep_alive::{KeepAlive, Renew, Renewed};

/// The outcome of [`Store::begin`]: see [`Begin`](enum@crate::model::begin::Begin) for each case. The
/// default claim is the local store's.
pub type Begin<C = Claim> = crate::model::begin::Begin<C>;

/// `commit` (or `complete`) did not store the response: see
/// [`CommitError`](enum@crate::protocol::CommitError) for each case. The default claim is the
/// local store's.
pub type CommitError<C = Claim> = crate::error::CommitError<C>;

/// Ownership of a scope while the work runs.
///
/// Every operation is checked against the claim's **fence**: if the lease expired and another
/// attempt took over, this claim can no longer commit, release, extend or checkpoint, and gets
/// [`StaleClaim`](crate::StaleClaim). Dropping a claim without finishing it leaves the scope
/// in progress until its lease expires (the work's outcome is unknown, so nothing is released
/// silently).
#[must_use = "an unfinished claim holds its key until the lease expires"]
pub struct Claim {
    store: Store,
    pub(super) holding: Holding,
    /// Counts the claim as its scope's holder for `begin_or_wait`; its drop wakes the waiters.
    _hold: HoldToken,
}

impl fmt::Debug for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.holding.debug("Claim", f)
    }
}

impl Claim {
    pub(crate) fn new(store: Store, scope: Scope, fingerprint: Fingerprint, held: Held) -> Self {
        Claim {
            store,
            holding: Holding::new(scope, fingerprint, held.grant),
            _hold: held.hold,
        }
    }

    /// The scope this claim holds.
    pub fn scope(&self) -> &Scope {
        self.holding.scope()
    }

    /// The fingerprint of the request that made the claim.
    pub fn fingerprint(&self) -> Fingerprint {
        self.holding.fingerprint()
    }

    /// The fence: new on every claim and take-over, never repeated in this store.
    pub fn fence(&self) -> u64 {
        self.holding.fence()
    }

    /// 1 for a fresh claim; n + 1 when taking over from attempt n.
    pub fn attempt(&self) -> u32 {
        self.holding.attempt()
    }

    /// When this claim's lease ends (by the store's clock).
    pub fn lease_until(&self) -> Timestamp {
        self.holding.lease_until()
    }

    /// The latest checkpoint stored for this scope: the previous attempt's when recovered, then
    /// this claim's own once it calls [`Claim::checkpoint`].
    pub fn last_checkpoint(&self) -> Option<&[u8]> {
        self.holding.last_checkpoint()
    }

    /// Why this claim is a recovery, when [`Begin::Recovered`](crate::Begin::Recovered) gave
    /// it: [`Recovery::LeaseExpired`] for a take-over, [`Recovery::Restored`] for a key this
    /// store, recently restored from a copy that may lag, has no record of. `None` for a
    /// `Claimed` one. Either way, find out downstream (with [`Claim::downstream_key`]) what an
    /// earlier attempt did before doing it again.
    pub fn recovery(&self) -> Option<Recovery> {
        self.holding.recovery()
    }

    /// An idempotency key to pass to downstream APIs (a payment processor, a mail service).
    ///
    /// It names the request: 32 lowercase hex characters derived from the scope and the
    /// request's fingerprint, and from nothing this store keeps. So it is the same for every
    /// attempt of this operation, take-overs included, and on a store restored from a copy of
    /// this one ([`Recovery::Restored`]): a recovered attempt that repeats a downstream call,
    /// here or on the new box, is deduplicated downstream.
    ///
    /// The same request on the same key gets the same downstream key after a release, a
    /// `forget` or once the TTL passed, too: downstream then deduplicates it against the
    /// earlier attempt (a downstream API that stored a failure under the key answers it
    /// again). A different request on the key (after its record went) gets a different one.
    /// An operation begun by an earlier build (0.1.0, whose keys came from the first
    /// attempt's fence) keeps the key its first attempt had (see `docs/design.md`, "Fences").
    pub fn downstream_key(&self) -> String {
        self.holding.downstream_key()
    }

    /// Runs `work` inside the store's writer transaction and stores its response as the
    /// scope's completed record, atomically with every business write `work` makes.
    ///
    /// When this returns `Ok`, the business writes and the completed record are durable
    /// together. On any error nothing of `work` was kept: [`CommitError::into_claim`] gives the
    /// claim back when it is still held, to release it or to commit a failure response.
    ///
    /// `work` runs on the store's writer thread while other requests wait: keep it to reads and
    /// writes through the [`Tx`]; do slow calls (network, downstream APIs) before `commit`.
    ///
    /// # Errors
    /// See [`CommitError`].
    pub fn commit<F>(self, work: F) -> Result<Response, CommitError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static,
    {
        let span = self.holding.span("commit");
        let _entered = span.enter();
        let answer = self.store.engine().run(self.commit_request(work));
        self.committed(answer)
    }

    /// Gives the scope up: the work did not happen (no side effect), and the next `begin` of
    /// the scope is `Claimed`. Durable when it returns.
    ///
    /// # Errors
    /// [`ClaimError::Stale`] if another attempt holds the scope; storage errors.
    pub fn release(self) -> Result<(), ClaimError> {
        let span = self.holding.span("release");
        let _entered = span.enter();
        let answer = self.store.engine().run(self.release_request());
        self.refused(answer)
    }

    /// Moves the end of the lease to `lease` from now, for work that runs long.
    ///
    /// # Errors
    /// [`ClaimError::InvalidLease`] for zero or more than 7 days; [`ClaimError::Stale`] if
    /// another attempt holds the scope; storage errors.
    pub fn extend(&mut self, lease: Duration) -> Result<(), ClaimError> {
        let span = self.holding.span("extend");
        let _entered = span.enter();
        let request = self.extend_request(lease)?;
        let answer = self.store.engine().run(request);
        let until = self.refused(answer)?;
        self.holding.extended(until);
        Ok(())
    }

    /// Stores progress (a step reached, a downstream id obtained) for a later attempt to read
    /// if this one dies: it arrives as [`Claim::last_checkpoint`] on the `Recovered` claim.
    /// Durable when it returns. Does not extend the lease.
    ///
    /// # Errors
    /// [`ClaimError::CheckpointTooLarge`] over `Builder::max_checkpoint_bytes`;
    /// [`ClaimError::Stale`] if another attempt holds the scope; storage errors.
    pub fn checkpoint(&mut self, bytes: impl Into<Vec<u8>>) -> Result<(), ClaimError> {
        let span = self.holding.span("checkpoint");
        let _entered = span.enter();
        let bytes = bytes.into();
        let request = self.checkpoint_request(bytes.clone())?;
        let answer = self.store.engine().run(request);
        self.refused(answer)?;
        self.holding.checkpointed(bytes);
        Ok(())
    }

    #[cfg(feature = "tokio")]
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// The engine's request for `commit`.
    pub(crate) fn commit_request<F>(&self, work: F) -> Request<Result<Response, CommitRefusal>>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static,
    {
        request::commit(
            self.scope().clone(),
            self.fence(),
            self.holding.claimed_at(),
            Box::new(work),
        )
    }

    /// `commit`'s answer, with the claim handed back when it is still held.
    pub(crate) fn committed(
        self,
        answer: Result<Result<Response, CommitRefusal>, StoreError>,
    ) -> Result<Response, CommitError> {
        let refusal = match answer {
            Ok(Ok(response)) => {
                tracing::debug!(status = response.status(), "committed");
                return Ok(response);
            }
            Ok(Err(refusal)) => refusal,
            Err(e) => return Err(e.into()),
        };
        let claim = Box::new(self);
        Err(match refusal {
            CommitRefusal::User(UserFailure::Aborted(source)) => {
                CommitError::Aborted { source, claim }
            }
            CommitRefusal::User(UserFailure::Panicked(message)) => {
                CommitError::Panicked { message, claim }
            }
            CommitRefusal::InvalidResponse(source) => {
                CommitError::InvalidResponse { source, claim }
            }
            CommitRefusal::Refused(Refusal::Stale(reason)) => claim.holding.stale(reason).into(),
            CommitRefusal::Refused(Refusal::Store(e)) => e.into(),
        })
    }

    /// The engine's request for `release`.
    pub(crate) fn release_request(&self) -> Request<Result<(), Refusal>> {
        request::release(self.scope().clone(), self.fence())
    }

    /// The engine's request for `extend`, after checking the lease.
    pub(crate) fn extend_request(
        &self,
        lease: Duration,
    ) -> Result<Request<Result<Timestamp, Refusal>>, ClaimError> {
        check_lease(lease)?;
        Ok(request::extend(self.scope().clone(), self.fence(), lease))
    }

    /// The engine's request for `checkpoint`, after checking the size.
    pub(crate) fn checkpoint_request(
        &self,
        bytes: Vec<u8>,
    ) -> Result<Request<Result<(), Refusal>>, ClaimError> {
        check_checkpoint(&bytes, self.store.limits().max_checkpoint_bytes)?;
        Ok(request::checkpoint(
            self.scope().clone(),
            self.fence(),
            bytes,
        ))
    }

    /// A fence-checked operation's answer as the caller sees it.
    pub(crate) fn refused<T>(
        &self,
        answer: Result<Result<T, Refusal>, StoreError>,
    ) -> Result<T, ClaimError> {
        match answer {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(Refusal::Stale(reason))) => Err(self.holding.stale(reason).into()),
            Ok(Err(Refusal::Store(e))) | Err(e) => Err(e.into()),
        }
    }
}

impl Renew for Store {
    fn lease(&self) -> Duration {
        self.limits().lease
    }

    #[cfg(feature = "tokio")]
    async fn renew(
        &self,
        scope: &Scope,
        fence: u64,
        lease: Duration,
    ) -> Result<Renewed, ClaimError> {
        let request = request::renew(scope.clone(), fence, lease);
        renewed(self.engine().run_async(request).await?)
    }

    fn renew_blocking(
        &self,
        scope: &Scope,
        fence: u64,
        lease: Duration,
    ) -> Option<Result<Renewed, ClaimError>> {
        let request = request::renew(scope.clone(), fence, lease);
        Some(
            self.engine()
                .run(request)
                .map_err(ClaimError::from)
                .and_then(renewed),
        )
    }
}

/// A renewal's answer as the keep-alive sees it.
fn renewed(answer: Result<Timestamp, Refusal>) -> Result<Renewed, ClaimError> {
    match answer {
        Ok(until) => Ok(Renewed::Until(until)),
        Err(Refusal::Stale(reason)) => Ok(Renewed::Over(Some(reason))),
        Err(Refusal::Store(e)) => Err(e.into()),
    }
}

impl Claim {
    /// Keeps this claim's lease from running out while the holder works: see [`KeepAlive`].
    /// The claim stays the caller's to commit or release.
    pub fn keep_alive(&self) -> KeepAlive {
        self.holding.keep_alive(self.store.clone())
    }
}
