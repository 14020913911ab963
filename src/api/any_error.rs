//! The umbrella error over every operation's error, for callers that do not branch on the
//! operation (`?` into one type). It names the local store's claim (a commit error carries it),
//! so it lives above the engine, apart from the errors the engine returns.

use crate::api::claim::CommitError;
use crate::error::{
    ClaimError, CompactError, ExecuteError, FingerprintError, OpenError, ReadError, ScopeError,
    StoreError, TxError, WriteError,
};

/// Any error this crate returns, for callers that do not branch on the operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// See [`OpenError`].
    #[error(transparent)]
    Open(#[from] OpenError),
    /// See [`ScopeError`].
    #[error(transparent)]
    Scope(#[from] ScopeError),
    /// See [`FingerprintError`].
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    /// See [`CommitError`].
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// See [`ExecuteError`].
    #[error(transparent)]
    Execute(#[from] ExecuteError),
    /// See [`ClaimError`].
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// See [`WriteError`].
    #[error(transparent)]
    Write(#[from] WriteError),
    /// See [`CompactError`].
    #[error(transparent)]
    Compact(#[from] CompactError),
    /// See [`ReadError`].
    #[error(transparent)]
    Read(#[from] ReadError),
    /// See [`TxError`].
    #[error(transparent)]
    Tx(#[from] TxError),
    /// See [`StoreError`].
    #[error(transparent)]
    Store(#[from] StoreError),
}
