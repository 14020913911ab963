//! The failures every storage-touching operation shares.

use std::sync::Arc;

use super::CorruptRecord;

/// The store could not read or write what an operation needed. Nothing the operation asked for
/// was acknowledged.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// redb reported an error before anything of the request reached the disk. If it came
    /// from the writer, the store is now poisoned.
    #[error(
        "storage error: {0}; the operation was not carried out; retry it, or reopen the store if this repeats"
    )]
    Redb(Arc<redb::Error>),
    /// Making the request's group durable failed part way (a failed write or sync of the log or
    /// of redb). The group may or may not have reached the disk; the store is now poisoned.
    #[error(
        "could not confirm that the request reached the disk ({cause}); it may or may not have. The store is poisoned: reopen it, then call begin for the key (a Replay means it landed). Do not blindly repeat a keyless write"
    )]
    OutcomeUnknown {
        /// The I/O or commit failure.
        cause: Arc<str>,
    },
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
