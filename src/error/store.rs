//! The failures every storage-touching operation shares.

use std::fmt;
use std::io;
use std::sync::Arc;

use super::CorruptRecord;

/// The store could not read or write what an operation needed. Nothing the operation asked for
/// was acknowledged.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// redb reported an error. Nothing of the request was acknowledged; if it came from the
    /// writer, the store recovers its file in place from the log before it writes again.
    #[error(
        "storage error: {0}; the operation was not carried out; retry it, and check the disk if this repeats"
    )]
    Redb(Arc<redb::Error>),
    /// The request was refused before anything of it reached the disk (the log could not
    /// take it: most often a full disk). Nothing was written, and the store goes on serving:
    /// reads and replays are answered, and writes succeed again once the cause is gone.
    #[error("{}", not_written(*kind, cause))]
    NotWritten {
        /// The I/O error's kind (`StorageFull` for a full disk).
        kind: io::ErrorKind,
        /// What failed.
        cause: Arc<str>,
    },
    /// Making the request durable failed part way: locally a failed sync (the group may or
    /// may not have reached the disk; the store is poisoned until it has recovered from its
    /// log, which it does in place); over PostgreSQL a `COMMIT` whose answer was lost.
    #[error(
        "could not confirm that the request was made durable ({cause}); it may or may not have been. {recovery}; then call begin for the key (a Replay means it landed). Do not blindly repeat a keyless write"
    )]
    OutcomeUnknown {
        /// The I/O error's kind, when an I/O error was the cause.
        kind: Option<io::ErrorKind>,
        /// The I/O or commit failure.
        cause: Arc<str>,
        /// What the backend does about it, in its own words.
        recovery: &'static str,
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
    /// An earlier failure of unknown outcome poisoned the store: writes are refused until it
    /// has recovered from its log (automatically with `Builder::self_heal`, or with
    /// `Store::reopen`). Reads and replays are still answered while the file is readable.
    #[error(
        "the store refuses writes after an earlier failure ({cause}); it recovers in place from its log (Store::reopen forces it), then writes succeed again; reads and replays are still answered"
    )]
    Poisoned {
        /// The I/O error's kind, when an I/O error was the cause.
        kind: Option<io::ErrorKind>,
        /// The failure that poisoned it.
        cause: Arc<str>,
    },
    /// A store operation was called from inside a commit or write closure. Closures run on the
    /// store's writer thread, which would wait for itself.
    #[error(
        "a store operation was called from inside a commit or write closure; use the Tx handle the closure receives instead"
    )]
    Reentrant,
    /// A bug inside idemstore or a panic in code the store calls (the clock, a table's key
    /// type): the request's writes were dropped and the store is intact.
    #[error(
        "internal error ({message}); the request's writes were dropped and the store is intact; if it is not your clock or key type panicking, please report this as a bug"
    )]
    Internal {
        /// The panic message.
        message: String,
    },
    /// The database file is damaged: redb found structures it cannot read (it panicked while
    /// reading, and the panic was caught). The store answers what it can still read.
    #[error(
        "the database file is damaged ({detail}); the operation was not carried out. Run `idemstore verify` on the store's directory (with the service stopped) to see what is wrong, and restore the directory from a backup"
    )]
    Damaged {
        /// What redb reported.
        detail: String,
    },
    /// The store's writer thread has stopped.
    #[error("the store's writer has stopped; drop every handle and reopen the store")]
    Closed,
    /// A database backend (PostgreSQL, feature `postgres`) failed before it answered: the
    /// connection was lost or refused, no connection came free in time, or a statement ran
    /// past its timeout. Nothing of the request was acknowledged and the transaction it ran in
    /// was rolled back (a commit whose answer was lost is [`StoreError::OutcomeUnknown`]
    /// instead). The pool opens new connections by itself.
    #[error(
        "the database failed ({message}); the operation was not carried out. Retry it: the pool reconnects by itself; if this repeats, check that the database is up and reachable"
    )]
    Backend {
        /// The driver's error, as text.
        message: Arc<str>,
    },
}

/// What the local store does after an outcome it could not confirm.
const LOCAL_RECOVERY: &str = "The store recovers from its log in place";

fn not_written(kind: io::ErrorKind, cause: &str) -> String {
    if kind == io::ErrorKind::StorageFull {
        format!(
            "the disk is full ({cause}); nothing of the request was written. Free disk space and retry: the store keeps answering reads and replays meanwhile"
        )
    } else {
        format!(
            "the request was refused before it reached the disk ({cause}); nothing of it was written; retry it"
        )
    }
}

impl StoreError {
    /// A failure that wrote nothing durable, from the I/O error that caused it.
    pub(crate) fn not_written(what: &str, source: &io::Error) -> Self {
        StoreError::NotWritten {
            kind: source.kind(),
            cause: format!("{what}: {source}").into(),
        }
    }

    /// A failure of unknown outcome, from the I/O error that caused it.
    pub(crate) fn outcome_unknown(what: &str, source: &io::Error) -> Self {
        StoreError::OutcomeUnknown {
            kind: Some(source.kind()),
            cause: format!("{what}: {source}").into(),
            recovery: LOCAL_RECOVERY,
        }
    }

    /// A failure of unknown outcome whose cause is not an I/O error of ours.
    pub(crate) fn unknown(what: &str, cause: &dyn fmt::Display) -> Self {
        Self::unknown_in(what, cause, LOCAL_RECOVERY)
    }

    /// A failure of unknown outcome in a backend that says, in `recovery`, what it does
    /// about it (the PostgreSQL backend's words are its own: `postgres::driver`).
    pub(crate) fn unknown_in(what: &str, cause: &dyn fmt::Display, recovery: &'static str) -> Self {
        StoreError::OutcomeUnknown {
            kind: None,
            cause: format!("{what}: {cause}").into(),
            recovery,
        }
    }

    /// The I/O error kind behind this error, if an I/O error caused it: `StorageFull` for a
    /// full disk.
    pub fn io_kind(&self) -> Option<io::ErrorKind> {
        match self {
            StoreError::Redb(e) => redb_io_kind(e),
            StoreError::NotWritten { kind, .. } => Some(*kind),
            StoreError::OutcomeUnknown { kind, .. } | StoreError::Poisoned { kind, .. } => *kind,
            _ => None,
        }
    }

    /// Whether retrying the same call later may succeed (the store is healing or the disk
    /// was full), as opposed to a misuse or a corrupt record that will fail again.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Redb(_)
                | StoreError::NotWritten { .. }
                | StoreError::OutcomeUnknown { .. }
                | StoreError::Poisoned { .. }
                | StoreError::Backend { .. }
        )
    }
}

/// The I/O error kind inside a redb error, if it is an I/O error.
pub(crate) fn redb_io_kind(e: &redb::Error) -> Option<io::ErrorKind> {
    match e {
        redb::Error::Io(e) => Some(e.kind()),
        _ => None,
    }
}

super::from_redb!(StoreError::Redb);
