//! Why a store directory could not be inspected.

use std::path::PathBuf;

use super::below;
use crate::error::{Holder, RecoveryError};

/// A store directory could not be inspected. Nothing was changed on disk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// The path does not exist, or is not a directory.
    #[error("no such directory: {path}; give the directory the store was opened in")]
    NoSuchDirectory {
        /// The path given.
        path: PathBuf,
    },
    /// The directory holds no store, or a file that is not one.
    #[error(
        "{path} is not an idemstore store: {reason}{}",
        below::hint(stores_below)
    )]
    NotAStore {
        /// The directory.
        path: PathBuf,
        /// What is missing or wrong.
        reason: String,
        /// For a directory without a database file: the store directories found in its
        /// sub-directories (a bounded search, a few levels deep; nearest first), the path the
        /// caller probably meant; the message names them. At most a few (one more than the
        /// message lists, to say there are others); empty when there are none, or when the
        /// directory has a database file that is not a store's.
        stores_below: Vec<PathBuf>,
    },
    /// The store's directory is locked: a running process has the store open (its lock admits
    /// no reader beside the writer), or, for `evict` and `compact`, which open it for writing,
    /// a read command is reading it.
    #[error("{path} is in use by {holder}, {}", advice(holder))]
    InUse {
        /// The store's directory.
        path: PathBuf,
        /// Who holds it, as its lock file says.
        holder: Holder,
    },
    /// redb could not open or read the database file.
    #[error(
        "cannot read the database {path}: {detail}; if the file is damaged, restore it from a backup"
    )]
    Database {
        /// The database file.
        path: PathBuf,
        /// redb's message.
        detail: String,
    },
    /// The store's metadata is missing or damaged.
    #[error(
        "the store's metadata entry {key:?} is damaged ({detail}); restore the store from a backup"
    )]
    CorruptMeta {
        /// The meta key.
        key: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The store was written by a format this build does not read.
    #[error(
        "the store is in format version {found}, this build reads versions 1 to {supported}; use the newer idemstore that wrote it"
    )]
    UnsupportedFormat {
        /// The version found.
        found: u64,
        /// The newest version this build reads.
        supported: u32,
    },
    /// The store is of an older format, which the store moves to the current one the next
    /// time it is opened for writing; this build reads only the current format.
    #[error(
        "the store is in format version {found}, which this build reads only after moving it to version {current}: open it once with this build (the service, or `idemstore evict`, does it), then inspect it"
    )]
    OlderFormat {
        /// The version found.
        found: u64,
        /// The version this build reads (and moves older stores to).
        current: u32,
    },
    /// The write-ahead log cannot be read back (damage in the middle, a missing segment, a
    /// segment of another format): the message names the segment and offset.
    #[error(transparent)]
    Log(#[from] RecoveryError),
    /// A record does not decode.
    #[error(
        "the record of {scope} is damaged ({detail}); run `idemstore verify` and restore from a backup"
    )]
    CorruptRecord {
        /// The record's scope.
        scope: String,
        /// What is wrong.
        detail: String,
    },
    /// A file of the store could not be read.
    #[error("cannot read {path}: {source}; check permissions")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

fn advice(holder: &Holder) -> &'static str {
    match holder {
        Holder::Readers => "wait for it to finish",
        _ => "stop it or use the service's /stats",
    }
}

impl InspectError {
    /// `dir` exists but has no database file: not a store, naming the stores below it, if
    /// any (the read commands and the tool's maintenance commands both refuse it with this).
    pub(crate) fn no_database(dir: PathBuf) -> InspectError {
        let stores_below = below::stores_below(&dir);
        InspectError::NotAStore {
            path: dir,
            reason: format!("it has no {}", crate::storage::DB_FILE),
            stores_below,
        }
    }

    pub(crate) fn database(path: PathBuf, e: impl std::fmt::Display) -> InspectError {
        InspectError::Database {
            path,
            detail: e.to_string(),
        }
    }
}
