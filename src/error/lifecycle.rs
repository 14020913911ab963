//! Errors from the claim lifecycle: commit, release, extend, checkpoint, execute, and plain
//! writes.

use super::{BoxError, ResponseError, StaleReason, StoreError};
use crate::model::scope::Scope;

/// A claim's fence no longer matches the stored record. Nothing was changed.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "the claim on {scope} with fence {fence} is stale: {reason}; stop this attempt, its result will not be stored (extend the lease or checkpoint more often if work outlives it)"
)]
pub struct StaleClaim {
    /// The scope.
    pub scope: Scope,
    /// The stale claim's fence.
    pub fence: u64,
    /// Why it is stale.
    pub reason: StaleReason,
}

/// `commit` (or `complete`) did not store the response.
///
/// Variants that carry the claim leave it held: nothing of the request was written, and the
/// caller may release it (no side effect happened) or commit a failure response.
/// [`CommitError::into_claim`] takes it back. `C` is the backend's claim type;
/// [`idemstore::CommitError`](crate::CommitError) has the local store's as its default.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError<C> {
    /// The closure returned an error. None of its writes were kept.
    #[error(
        "the commit closure failed ({source}); nothing was written and the claim is still held: release it or commit a failure response"
    )]
    Aborted {
        /// The closure's error.
        source: BoxError,
        /// The claim, still held (boxed: it is large, and errors travel by value).
        claim: Box<C>,
    },
    /// The closure panicked. None of its writes were kept; the store is unaffected.
    #[error(
        "the commit closure panicked ({message}); nothing was written and the claim is still held"
    )]
    Panicked {
        /// The panic message.
        message: String,
        /// The claim, still held (boxed: it is large, and errors travel by value).
        claim: Box<C>,
    },
    /// The closure's response does not fit the limits.
    #[error("the response was refused ({source}); nothing was written and the claim is still held")]
    InvalidResponse {
        /// What is wrong with it.
        source: ResponseError,
        /// The claim, still held (boxed: it is large, and errors travel by value).
        claim: Box<C>,
    },
    /// The claim's fence is stale: another attempt owns the scope.
    #[error(transparent)]
    Stale(#[from] StaleClaim),
    /// Storage failed; the group's writes were not acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl<C> CommitError<C> {
    /// The claim, if this error left it held.
    pub fn into_claim(self) -> Option<C> {
        match self {
            CommitError::Aborted { claim, .. }
            | CommitError::Panicked { claim, .. }
            | CommitError::InvalidResponse { claim, .. } => Some(*claim),
            CommitError::Stale(_) | CommitError::Store(_) => None,
        }
    }
}

/// `execute` did not commit. Nothing of the request was written and no claim is left behind:
/// the key stays as it was, so a retry runs the work again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecuteError {
    /// The closure returned an error. None of its writes were kept.
    #[error("the execute closure failed ({0}); nothing was written and the key is not held")]
    Aborted(#[source] BoxError),
    /// The closure panicked. None of its writes were kept; the store is unaffected.
    #[error("the execute closure panicked ({0}); nothing was written and the key is not held")]
    Panicked(String),
    /// The closure's response does not fit the limits.
    #[error("the response was refused ({0}); nothing was written and the key is not held")]
    InvalidResponse(#[source] ResponseError),
    /// Storage failed; nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `consume`: the consumer's name or the message id is not a valid scope part. Nothing
    /// was read or written.
    #[error("the inbox scope is invalid ({0}); nothing was written")]
    BadScope(#[from] super::ScopeError),
}

/// `release`, `extend` or `checkpoint` failed. Nothing was changed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// The claim's fence is stale: another attempt owns the scope.
    #[error(transparent)]
    Stale(#[from] StaleClaim),
    /// The checkpoint is larger than the store accepts.
    #[error(
        "the checkpoint is {len} bytes, over the limit of {max}; store a reference, not the data"
    )]
    CheckpointTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A lease extension of zero or beyond the maximum.
    #[error("a lease of {requested_ms} ms is outside 1 ms ..= {max_ms} ms")]
    InvalidLease {
        /// What was asked, in milliseconds.
        requested_ms: u128,
        /// The largest lease accepted.
        max_ms: u128,
    },
    /// Storage failed; nothing was acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A keyless `Store::write` did not commit. Nothing of it was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The closure returned an error.
    #[error("the write closure failed ({0}); nothing was written")]
    Aborted(#[source] BoxError),
    /// The closure panicked.
    #[error("the write closure panicked ({message}); nothing was written")]
    Panicked {
        /// The panic message.
        message: String,
    },
    /// Storage failed; the group's writes were not acknowledged.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// `Store::forget` removed nothing.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ForgetError {
    /// There is no record for the scope.
    #[error("there is no record for {scope}; nothing to forget")]
    Absent {
        /// The scope.
        scope: Scope,
    },
    /// The record's fence is not the one given: another attempt took it over, or it completed.
    #[error("{0}; nothing was forgotten (list it again to see who holds it now)")]
    Stale(StaleClaim),
    /// The record is in progress, and `Forget::Completed` was asked: its outcome is unknown.
    #[error(
        "the record for {scope} is in progress (fence {fence}) and its outcome is unknown; find out what its attempt did downstream (by its downstream key), then forget it by its fence"
    )]
    InProgress {
        /// The scope.
        scope: Scope,
        /// The fence that holds it.
        fence: u64,
    },
    /// Storage failed; nothing was changed.
    #[error(transparent)]
    Store(#[from] StoreError),
}
