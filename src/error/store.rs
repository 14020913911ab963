//! The failures every storage-touching operation shares.

use std::sync::Arc;

use super::CorruptRecord;

/// The store could not read or write what an operation needed. Nothing the operation asked for
/// was acknowledged.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// redb reported an error. If it came from a commit, the store is now poisoned.
    #[error(
        "storage error: {0}; the operation was not acknowledged, retry it or reopen the store if this repeats"
    )]
    Redb(Arc<redb::Error>),
    /// A stored record could not be decoded.
    #[error(
        "the record for {scope} is corrupt ({source}); the file was changed outside idemstore or by a bug: restore it from a backup, or remove the key with the store's tools"
    )]
    CorruptRecord {
        /// The scope, as text.
        scope: String,
        /// What is wrong with its bytes.
        source: CorruptRecord,
    },
    /// An earlier failure to make data durable poisoned the store.
    #[error(
        "the store is poisoned by an earlier failure ({cause}); nothing can be written until it is dropped and reopened, which recovers every acknowledged write"
    )]
    Poisoned {
        /// The failure that poisoned it.
        cause: Arc<str>,
    },
    /// A store operation was called from inside a commit or write closure. Closures run on the
    /// store's writer thread, which would wait for itself.
    #[error(
        "a store operation was called from inside a commit or write closure; use the Tx handle the closure receives instead"
    )]
    Reentrant,
    /// A bug inside idemstore: a request panicked. Its writes were dropped; the store is intact.
    #[error(
        "internal error ({message}); the request's writes were dropped and the store is intact; please report this as a bug"
    )]
    Internal {
        /// The panic message.
        message: String,
    },
    /// The store's writer thread has stopped.
    #[error("the store's writer has stopped; drop every handle and reopen the store")]
    Closed,
}

macro_rules! from_redb {
    ($($source:ty),*) => {$(
        impl From<$source> for StoreError {
            fn from(e: $source) -> Self {
                StoreError::Redb(Arc::new(e.into()))
            }
        }
    )*};
}

from_redb!(
    redb::Error,
    redb::StorageError,
    redb::TransactionError,
    redb::TableError,
    redb::CommitError,
    redb::SetDurabilityError
);
