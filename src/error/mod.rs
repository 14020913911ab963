//! Errors: one `#[non_exhaustive]` enum per kind of failure an operation can have of its own,
//! [`StoreError`] for the failures every operation shares (see `docs/design.md`, "Errors").
//! The umbrella [`Error`](crate::Error) over all of them is in `any_error`.
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

mod backup;
mod lifecycle;
mod maintenance;
mod open;
#[cfg(feature = "postgres")]
mod postgres;
mod recovery;
mod replica;
mod restore;
mod store;
mod tx;

pub use crate::model::invalid::{
    CorruptRecord, FingerprintError, ResponseError, ScopeError, StaleReason,
};
pub use backup::BackupError;
pub use lifecycle::{ClaimError, CommitError, ExecuteError, ForgetError, StaleClaim, WriteError};
pub use maintenance::CompactError;
pub use open::{BadTableReason, Holder, OpenError};
#[cfg(feature = "postgres")]
pub use postgres::PgOpenError;
pub use recovery::RecoveryError;
pub use replica::ReplicaError;
pub use restore::RestoreError;
pub use store::StoreError;
pub use tx::{ReadError, TxError};

/// The error a commit or write closure returns: any error, boxed. Use `?` on anything, or
/// `Err("reason".into())`; [`CommitError::Aborted`] gives it back for downcasting.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
