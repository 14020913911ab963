//! Errors from the transaction handle and the read handle: table access.

use std::sync::Arc;

/// A business-table access inside a commit or write closure failed. Returned from the closure
/// with `?`, it aborts that request only: nothing it wrote is kept.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// The table was not registered with `Builder::table` when the store was opened.
    #[error(
        "table {name:?} is not registered; add it with Builder::table before open, so that its writes can be logged and replayed"
    )]
    UnknownTable {
        /// The table's name.
        name: String,
    },
    /// The table is registered with other key or value types.
    #[error(
        "table {name:?} is registered as <{registered}> but used as <{requested}>; use the same TableDefinition everywhere"
    )]
    TableTypeMismatch {
        /// The table's name.
        name: String,
        /// Key and value types it was registered with.
        registered: String,
        /// Key and value types of this access.
        requested: String,
    },
    /// One request wrote more than the store accepts in a single request.
    #[error(
        "this request wrote {bytes} bytes, over the limit of {max} for one request; split the work into several writes"
    )]
    TooLarge {
        /// Bytes written so far by the request, including this write.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// redb reported an error reading the group's transaction.
    #[error("storage error reading table: {0}")]
    Storage(Arc<redb::Error>),
}

super::from_redb!(TxError::Storage);

/// Opening a business table for reading failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The table or its types are not what was registered.
    #[error(transparent)]
    Table(#[from] TxError),
    /// The store could not start a read.
    #[error(transparent)]
    Store(#[from] super::StoreError),
}
