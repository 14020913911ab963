//! Errors from rebuilding a store from a replica.

use std::path::PathBuf;
use std::sync::Arc;

use super::ReplicaError;

/// [`Store::restore`](crate::Store::restore) rebuilt nothing: nothing was left at the
/// destination (it is as it was: absent, or an empty directory).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestoreError {
    /// The destination exists and is not an empty directory: a restore never writes over or
    /// beside anything.
    #[error(
        "the restore's destination {path} exists and is not an empty directory; give a path that does not exist yet, or an empty directory"
    )]
    Destination {
        /// The destination given.
        path: PathBuf,
    },
    /// The stream holds no snapshot: no store has shipped to it yet, or the first one has
    /// not finished sending its first snapshot (it sends one before any frame).
    #[error(
        "the stream holds no snapshot yet: no store has shipped to it, or its store has not finished sending its first snapshot; check the stream's name, or wait and restore again"
    )]
    NoSnapshot,
    /// The replica failed (unreachable, no such stream, frames missing, another writer).
    #[error("{}{}", .0, again_when(.0))]
    Replica(#[from] ReplicaError),
    /// The snapshot the replica holds is not a store's database of this build.
    #[error(
        "the replica's snapshot is not a store database this build can use ({detail}); nothing was restored"
    )]
    Snapshot {
        /// What is wrong with it.
        detail: String,
    },
    /// Writing the restored store's files failed.
    #[error(
        "cannot write the restored store at {path}: {source}; nothing was left at the destination; check that its directory is writable and has room"
    )]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// redb failed while the restored store's metadata was written.
    #[error(
        "writing the restored store's metadata failed: {0}; nothing was left at the destination"
    )]
    Meta(#[source] Arc<redb::Error>),
}

super::from_redb!(RestoreError::Meta);

/// When a failed restore may be run again, by what the replica said.
fn again_when(e: &ReplicaError) -> &'static str {
    match e {
        ReplicaError::Unreachable { .. } => {
            "; a restore does not retry: run it again once the replica answers"
        }
        _ => "",
    }
}

impl From<super::BackupError> for RestoreError {
    fn from(e: super::BackupError) -> Self {
        use super::BackupError;
        match e {
            BackupError::DestinationNotEmpty { path }
            | BackupError::DestinationNotADirectory { path } => RestoreError::Destination { path },
            BackupError::Io { path, source } => RestoreError::Io { path, source },
            BackupError::Copy(e) => RestoreError::Meta(e),
            other => RestoreError::Io {
                path: PathBuf::new(),
                source: std::io::Error::other(other.to_string()),
            },
        }
    }
}
