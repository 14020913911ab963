//! The claim as a handler sees it: the [`IdempotentRequest`] extractor.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::IntoResponse;
use parking_lot::Mutex;

use super::convert::{self, Delivery};
use super::problem::problem;
use crate::Tx;
use crate::api::store::Store;
use crate::error::{
    BoxError, ClaimError, CommitError, ExecuteError, ResponseError, StaleClaim, StoreError,
};
use crate::model::claim::Recovery;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::protocol::{Protocol, ProtocolClaim};

/// Where the claim is between the middleware and the handler.
enum Slot<C> {
    /// Not yet finished: whoever finishes it takes it out.
    Held(C),
    /// Taken out by an operation in flight (a commit, a checkpoint).
    Busy,
    /// Finished by the handler, or taken back by the middleware.
    Done(Finish),
}

/// How the claim was finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Finish {
    /// The handler committed its writes and its response.
    Committed,
    /// The handler released the claim: no side effect, a retry runs again.
    Released,
    /// The handler left the claim in progress: its outcome is unknown, and a retry after the
    /// lease is a recovery.
    LeftInProgress,
    /// The handler returned and the middleware took the claim back to store its response.
    Returned,
}

impl fmt::Display for Finish {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Finish::Committed => "committed",
            Finish::Released => "released",
            Finish::LeftInProgress => "left in progress",
            Finish::Returned => "taken back by the middleware after the handler returned",
        })
    }
}

/// Set on the response of a [`HandlerError`]: the handler's operation failed with its outcome
/// unknown to the middleware (it may have called a payment processor before its commit
/// failed), so the claim is left in progress rather than stored as a final answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaveInProgress;

/// What the middleware finds after the handler returned.
pub(crate) enum AfterHandler<C> {
    /// The handler did not finish the claim: the middleware stores the response (or releases).
    Unfinished(C),
    /// The handler finished it (or an operation of its is still in flight).
    Finished,
}

struct Shared<C> {
    scope: Scope,
    attempt: u32,
    recovery: Option<Recovery>,
    fence: u64,
    downstream_key: String,
    slot: Mutex<Slot<C>>,
    checkpoint: Mutex<Option<Vec<u8>>>,
}

/// The claim of an idempotent request, for its handler.
///
/// The [`IdempotencyLayer`](super::IdempotencyLayer) claims the key before the handler runs and
/// puts this in the request's extensions. A handler that takes it can make its business
/// writes and its response **one** commit ([`IdempotentRequest::commit`]); one that does not,
/// has its response stored by the middleware when it returns.
///
/// A recovery ([`recovery`](Self::recovery) is `Some`: the previous attempt's lease expired,
/// or the store was recently restored from a copy that may lack this request) may find an
/// earlier attempt's side effects done: pass [`downstream_key`](Self::downstream_key) to
/// downstream APIs so that they deduplicate (it is the key every attempt of the request had,
/// on this store or the one it was restored from), and read
/// [`last_checkpoint`](Self::last_checkpoint).
///
/// If the handler panics or its future is dropped (the client went away, a timeout layer
/// fired), the claim is left in progress: the work's outcome is unknown, so the next attempt
/// after the lease is a recovery, never a silent fresh start.
///
/// `P` is the backend of the layer that claimed the request: a handler takes the same
/// `IdempotentRequest<P>` as its layer's `IdempotencyLayer<P>` (both default to [`Store`]).
pub struct IdempotentRequest<P: Protocol = Store> {
    shared: Arc<Shared<P::Claim>>,
}

impl<P: Protocol> Clone for IdempotentRequest<P> {
    fn clone(&self) -> Self {
        IdempotentRequest {
            shared: self.shared.clone(),
        }
    }
}

impl<P: Protocol> fmt::Debug for IdempotentRequest<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotentRequest")
            .field("scope", &self.shared.scope)
            .field("attempt", &self.shared.attempt)
            .field("fence", &self.shared.fence)
            .finish_non_exhaustive()
    }
}

impl<P: Protocol> IdempotentRequest<P> {
    pub(crate) fn new(claim: P::Claim) -> Self {
        IdempotentRequest {
            shared: Arc::new(Shared {
                scope: claim.scope().clone(),
                attempt: claim.attempt(),
                recovery: claim.recovery(),
                fence: claim.fence(),
                downstream_key: claim.downstream_key(),
                checkpoint: Mutex::new(claim.last_checkpoint().map(<[u8]>::to_vec)),
                slot: Mutex::new(Slot::Held(claim)),
            }),
        }
    }

    /// The `(tenant, operation, key)` claimed.
    pub fn scope(&self) -> &Scope {
        &self.shared.scope
    }

    /// 1 for a first attempt; n + 1 when this request took over from attempt n, whose lease
    /// expired (its process crashed, or its handler left the claim in progress).
    pub fn attempt(&self) -> u32 {
        self.shared.attempt
    }

    /// Why this request is a recovery, if it is ([`ProtocolClaim::recovery`]): a take-over of
    /// an expired lease (`attempt` > 1), or a key the store, restored from a copy that may lag
    /// within its restore window, has no record of (`attempt` 1). Check downstream with
    /// [`downstream_key`](Self::downstream_key) before repeating a side effect.
    pub fn recovery(&self) -> Option<Recovery> {
        self.shared.recovery
    }

    /// The claim's fence (see [`ProtocolClaim::fence`]).
    pub fn fence(&self) -> u64 {
        self.shared.fence
    }

    /// A key for downstream APIs, the same for every attempt of this request, here or on a
    /// store restored from a copy of this one ([`ProtocolClaim::downstream_key`]).
    pub fn downstream_key(&self) -> &str {
        &self.shared.downstream_key
    }

    /// The latest checkpoint: the previous attempt's on a recovery, then this attempt's own.
    pub fn last_checkpoint(&self) -> Option<Vec<u8>> {
        self.shared.checkpoint.lock().clone()
    }

    /// Takes the claim out for an operation.
    pub(super) fn take(&self) -> Result<P::Claim, HandlerError> {
        let mut slot = self.shared.slot.lock();
        match std::mem::replace(&mut *slot, Slot::Busy) {
            Slot::Held(claim) => Ok(claim),
            Slot::Busy => Err(HandlerError::Busy),
            Slot::Done(finish) => {
                *slot = Slot::Done(finish);
                Err(HandlerError::Finished(finish))
            }
        }
    }

    pub(super) fn put_back(&self, claim: P::Claim) {
        *self.shared.slot.lock() = Slot::Held(claim);
    }

    pub(super) fn finish(&self, finish: Finish) {
        *self.shared.slot.lock() = Slot::Done(finish);
    }

    /// Stores `response` as the key's completed record, with no business writes, and
    /// answers it as HTTP, exactly as a replay will carry it (without `Idempotent-Replayed`).
    /// For business writes in the same transaction, the local store's
    /// [`commit`](IdempotentRequest::commit).
    ///
    /// # Errors
    /// See [`HandlerError`]; its `IntoResponse` answers 500 (503 for storage).
    pub async fn complete(
        &self,
        response: Response,
    ) -> Result<axum::http::Response<Body>, HandlerError> {
        let claim = self.take()?;
        let completed = claim.complete(response).await;
        self.committed(completed)
    }

    /// A commit's answer: the stored response as HTTP, or the claim back to this request when
    /// the error left it held.
    pub(super) fn committed(
        &self,
        result: Result<Response, CommitError<P::Claim>>,
    ) -> Result<axum::http::Response<Body>, HandlerError> {
        match result {
            Ok(stored) => {
                self.finish(Finish::Committed);
                Ok(convert::to_http(&stored, Delivery::First))
            }
            Err(CommitError::Aborted { source, claim }) => {
                self.put_back(*claim);
                Err(HandlerError::Aborted(source))
            }
            Err(CommitError::Panicked { message, claim }) => {
                self.put_back(*claim);
                Err(HandlerError::Panicked(message))
            }
            Err(CommitError::InvalidResponse { source, claim }) => {
                self.put_back(*claim);
                Err(HandlerError::InvalidResponse(source))
            }
            Err(CommitError::Stale(stale)) => {
                self.finish(Finish::LeftInProgress);
                Err(HandlerError::Stale(stale))
            }
            Err(CommitError::Store(e)) => {
                self.finish(Finish::LeftInProgress);
                Err(HandlerError::Store(e))
            }
        }
    }

    /// Gives the key up: nothing happened, and a retry runs the handler again. The middleware
    /// then returns the handler's response without storing it.
    ///
    /// # Errors
    /// [`HandlerError`] if the claim is already finished, stale, or storage failed.
    pub async fn release(&self) -> Result<(), HandlerError> {
        let claim = self.take()?;
        let released = claim.release().await;
        self.finish(if released.is_ok() {
            Finish::Released
        } else {
            Finish::LeftInProgress
        });
        released.map_err(HandlerError::Claim)
    }

    /// Leaves the claim in progress and tells the middleware not to store the response: for
    /// an outcome the handler cannot know (a downstream call timed out). Retries within the
    /// lease get 409; the first after it is a recovery, which asks downstream with
    /// [`downstream_key`](Self::downstream_key) what happened.
    ///
    /// # Errors
    /// [`HandlerError`] if the claim is already finished or an operation on it is in flight.
    pub fn leave_in_progress(&self) -> Result<(), HandlerError> {
        drop(self.take()?);
        self.finish(Finish::LeftInProgress);
        Ok(())
    }

    /// Stores progress for a later attempt ([`ProtocolClaim::checkpoint`]).
    ///
    /// # Errors
    /// [`HandlerError`] if the claim is finished, stale, the checkpoint too large, or storage
    /// failed.
    pub async fn checkpoint(&self, bytes: impl Into<Vec<u8>>) -> Result<(), HandlerError> {
        let bytes = bytes.into();
        let mut claim = self.take()?;
        let stored = claim.checkpoint(bytes.clone()).await;
        self.put_back(claim);
        stored.map_err(HandlerError::Claim)?;
        *self.shared.checkpoint.lock() = Some(bytes);
        Ok(())
    }

    /// Moves the end of the lease to `lease` from now ([`ProtocolClaim::extend`]).
    ///
    /// # Errors
    /// [`HandlerError`] if the claim is finished, stale, the lease invalid, or storage failed.
    pub async fn extend(&self, lease: Duration) -> Result<(), HandlerError> {
        let mut claim = self.take()?;
        let extended = claim.extend(lease).await;
        self.put_back(claim);
        extended.map_err(HandlerError::Claim)
    }

    /// The middleware's side: takes the claim back once the handler returned.
    pub(crate) fn after_handler(&self) -> AfterHandler<P::Claim> {
        let mut slot = self.shared.slot.lock();
        match std::mem::replace(&mut *slot, Slot::Done(Finish::Returned)) {
            Slot::Held(claim) => AfterHandler::Unfinished(claim),
            other => {
                *slot = other;
                AfterHandler::Finished
            }
        }
    }
}

impl IdempotentRequest<Store> {
    /// Runs `work` in the store's writer transaction and stores its response as the key's
    /// completed record, atomically with every business write `work` makes; answers the stored
    /// response as HTTP, exactly as a replay will carry it (without `Idempotent-Replayed`).
    ///
    /// `work` runs on the store's writer thread: do slow calls (the payment processor) before.
    /// On an error that leaves the claim held (the closure failed or panicked, the response
    /// was refused), the claim goes back to this request: the handler may try again, release,
    /// or return an error response for the middleware to store.
    ///
    /// # Errors
    /// See [`HandlerError`]; its `IntoResponse` answers 500 (503 for storage).
    pub async fn commit<F>(&self, work: F) -> Result<axum::http::Response<Body>, HandlerError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static,
    {
        let claim = self.take()?;
        let committed = claim.commit_async(work).await;
        self.committed(committed)
    }
}

/// Why an [`IdempotentRequest`] operation did not happen.
///
/// Returned as the handler's response (its `IntoResponse`, or `?` in a handler returning
/// `Result<_, HandlerError>`), it tells the middleware to leave a claim the handler still
/// holds **in progress**, whatever the [`Failures`](super::Failures) policy: the handler may
/// have had side effects before the operation failed, so neither storing a 500 for good nor
/// releasing the key is safe. Retries get 409 until the lease ends; the next is a recovery.
/// A handler that knows better (nothing happened yet) releases the claim itself, and a
/// business refusal belongs in the commit closure's `Ok` response (a 4xx), not in its `Err`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// The claim was already finished.
    #[error("the claim is already {0}; commit, release or leave it in progress once")]
    Finished(Finish),
    /// Another operation on the claim is in flight (two tasks share the request).
    #[error("another operation on this claim is in flight; finish the claim from one task")]
    Busy,
    /// The commit closure failed; nothing was written and the claim is still held.
    #[error("the commit closure failed ({0}); nothing was written and the claim is still held")]
    Aborted(BoxError),
    /// The commit closure panicked; nothing was written and the claim is still held.
    #[error("the commit closure panicked ({0}); nothing was written and the claim is still held")]
    Panicked(String),
    /// The closure's response does not fit the store's limits; the claim is still held.
    #[error("the response was refused ({0}); nothing was written and the claim is still held")]
    InvalidResponse(ResponseError),
    /// Another attempt owns the key now (this one outlived its lease).
    #[error(transparent)]
    Stale(StaleClaim),
    /// A release, checkpoint or extend was refused.
    #[error(transparent)]
    Claim(ClaimError),
    /// Storage failed; the claim is left in progress.
    #[error(transparent)]
    Store(StoreError),
    /// [`LocalRequest::execute`](super::LocalRequest::execute) stored nothing: its closure
    /// failed, panicked or made a refused response, or storage failed. There was no claim, so
    /// nothing is left behind; a retry runs the request again.
    #[error(transparent)]
    NotExecuted(ExecuteError),
}

impl IntoResponse for HandlerError {
    fn into_response(self) -> axum::response::Response {
        // The detail says what the client should do; what failed inside (scopes, fences,
        // storage errors) goes to the log.
        tracing::warn!(error = %self, "an idempotent handler failed");
        let (status, kind, detail) = match &self {
            HandlerError::Store(_) | HandlerError::NotExecuted(ExecuteError::Store(_)) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "idempotency-store-unavailable",
                "the service could not record the request's outcome, so it is unknown: retry with the same key after the Retry-After seconds, and the retry finds it out",
            ),
            HandlerError::Stale(_) => (
                StatusCode::CONFLICT,
                "claim-taken-over",
                "this attempt ran past its lease and another attempt of the same request took over; retry with the same key after the Retry-After seconds to get that attempt's outcome",
            ),
            HandlerError::NotExecuted(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "idempotent-handler-failed",
                "the request failed and nothing of it was recorded: fix it, or retry with the same key",
            ),
            HandlerError::Finished(_) | HandlerError::Busy => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "idempotent-handler-failed",
                "the service finished this request's claim twice (a bug in the service); the request's outcome is unknown: retry with the same key once its lease ends",
            ),
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "idempotent-handler-failed",
                "the request's outcome is unknown: retry with the same key once its lease ends, and the retry finds it out",
            ),
        };
        let mut response = problem(status, kind, "The request could not be completed", detail);
        if matches!(
            self,
            HandlerError::Stale(_)
                | HandlerError::Store(_)
                | HandlerError::NotExecuted(ExecuteError::Store(_))
        ) {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response.extensions_mut().insert(LeaveInProgress);
        response
    }
}

/// The handler asked for an [`IdempotentRequest`] but the request carries no claim.
#[derive(Debug, Clone, Copy)]
pub struct MissingClaim;

impl IntoResponse for MissingClaim {
    fn into_response(self) -> axum::response::Response {
        problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "missing-idempotency-layer",
            "The handler expects an idempotent request",
            "this route's handler takes an IdempotentRequest but the request was not claimed: add IdempotencyLayer to the route and cover its method, or take Option<IdempotentRequest> when the key is optional",
        )
    }
}

impl<S: Send + Sync, P: Protocol> FromRequestParts<S> for IdempotentRequest<P> {
    type Rejection = MissingClaim;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<IdempotentRequest<P>>()
            .cloned()
            .ok_or(MissingClaim)
    }
}

impl<S: Send + Sync, P: Protocol> OptionalFromRequestParts<S> for IdempotentRequest<P> {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<IdempotentRequest<P>>().cloned())
    }
}
