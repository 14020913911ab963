//! Errors from maintenance operations.

use std::sync::Arc;

use super::StoreError;

/// `compact` did not run. Nothing was changed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CompactError {
    /// A read snapshot is still open (a [`ReadTx`](crate::ReadTx) the caller holds):
    /// compaction moves pages that a snapshot may still read.
    #[error("a read snapshot (Store::read) is still open; drop it and compact again")]
    SnapshotOpen,
    /// redb refused or failed.
    #[error("compaction failed: {0}; the file is as it was, and the store goes on serving")]
    Storage(#[source] Arc<redb::CompactionError>),
    /// The store could not run it (poisoned, closed).
    #[error(transparent)]
    Store(#[from] StoreError),
}
