//! Errors from backing up a store.

use std::path::PathBuf;
use std::sync::Arc;

use super::StoreError;

/// [`Store::backup`](crate::Store::backup) made no copy. Nothing was left at the destination
/// (it is as it was: absent, or an empty directory), and the store goes on serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// The destination exists and is a directory that holds something: a backup never writes
    /// over or beside anything.
    #[error(
        "the backup's destination {path} exists and is not empty; give a path that does not exist yet, or an empty directory"
    )]
    DestinationNotEmpty {
        /// The destination given.
        path: PathBuf,
    },
    /// The destination exists and is not a directory (a file, a symbolic link, a device).
    #[error(
        "the backup's destination {path} exists and is not a directory; give a path that does not exist yet, or an empty directory"
    )]
    DestinationNotADirectory {
        /// The destination given.
        path: PathBuf,
    },
    /// The store's file holds a table this store did not register. A backup copies a table
    /// through its key and value types (redb orders keys by them), so it copies only the
    /// tables it knows, and would rather refuse than leave one out.
    #[error(
        "the store's file holds table {name:?}, which this store did not register, so a backup cannot copy it; open the store with Builder::table for it (with its key and value types), then back up again"
    )]
    UnregisteredTable {
        /// The table's name.
        name: String,
    },
    /// Creating, syncing or renaming the copy's files failed.
    #[error(
        "cannot write the backup at {path}: {source}; nothing was left at the destination; check that its directory is writable and has room for a copy of the store"
    )]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// redb failed while the tables were copied (reading the snapshot, or writing the copy).
    #[error(
        "copying the store's tables failed: {0}; nothing was left at the destination, and the store is unchanged; retry, and check the disk if this repeats"
    )]
    Copy(#[source] Arc<redb::Error>),
    /// The store could not take its snapshot (poisoned, closed, a storage error).
    #[error(transparent)]
    Store(#[from] StoreError),
}

super::from_redb!(BackupError::Copy);
