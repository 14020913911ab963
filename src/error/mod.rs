//! Errors: one `#[non_exhaustive]` enum per operation, an umbrella [`Error`] over all of them.
//!
//! Every variant's Display says what happened and what to do about it.

/// `From` every redb error type for an error enum, into the variant that holds an
/// `Arc<redb::Error>`.
macro_rules! from_redb {
    ($error:ident :: $variant:ident) => {
        $crate::error::from_redb!(@each $error $variant
            redb::Error, redb::StorageError, redb::TransactionError, redb::TableError,
            redb::CommitError, redb::SetDurabilityError);
    };
    (@each $error:ident $variant:ident $($source:ty),*) => {$(
        impl From<$source> for $error {
            fn from(e: $source) -> Self {
                $error::$variant(std::sync::Arc::new(e.into()))
            }
        }
    )*};
}
pub(crate) use from_redb;

mod input;
mod lifecycle;
mod maintenance;
mod open;
mod recovery;
mod store;
mod tx;

pub use input::{CorruptRecord, FingerprintError, ResponseError, ScopeError};
pub use lifecycle::{
    BeginError, ClaimError, CommitError, ForgetError, StaleClaim, StaleReason, WriteError,
};
pub use maintenance::CompactError;
pub use open::OpenError;
pub use recovery::RecoveryError;
pub use store::StoreError;
pub use tx::{ReadError, TxError};

/// The error a commit or write closure returns: any error, boxed. Use `?` on anything, or
/// `Err("reason".into())`; [`CommitError::Aborted`] gives it back for downcasting.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

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
    /// See [`BeginError`].
    #[error(transparent)]
    Begin(#[from] BeginError),
    /// See [`CommitError`].
    #[error(transparent)]
    Commit(#[from] CommitError),
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
