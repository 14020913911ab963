//! Errors from opening a store.

use std::path::PathBuf;

/// The store could not be opened. Nothing was changed on disk, except that a missing directory
/// may have been created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// A builder setting is out of range.
    #[error("invalid setting {setting}: {reason}")]
    InvalidConfig {
        /// The builder method.
        setting: &'static str,
        /// What is wrong and what range is valid.
        reason: String,
    },
    /// The directory or a file in it could not be created or opened.
    #[error(
        "cannot use {path}: {source}; check that the path is a directory this process may write"
    )]
    Io {
        /// The path.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The store's directory is locked: another store has it open, in this process or another,
    /// or the `idemstore` tool is reading it. A store directory has one writer at a time, for
    /// the store's whole life (reopens included), so nothing was opened.
    #[error("the store in {path} is in use by {holder}; {}", holder.advice())]
    AlreadyOpen {
        /// The store's directory.
        path: PathBuf,
        /// Who holds it, as its lock file says.
        holder: Holder,
    },
    /// redb could not open the database file.
    #[error(
        "cannot open the database {path}: {source}; if the file is corrupt, restore it from a backup"
    )]
    Database {
        /// The database file.
        path: PathBuf,
        /// redb's error.
        source: redb::DatabaseError,
    },
    /// The file was written by an incompatible version of idemstore.
    #[error(
        "the store was written in format version {found}, this build reads versions 1 to {supported}; open it with the newer idemstore that wrote it"
    )]
    UnsupportedFormat {
        /// The version found in the file.
        found: u32,
        /// The newest version this build reads (and the one it writes).
        supported: u32,
    },
    /// The database file is damaged: redb found structures it cannot read while opening it
    /// (it panicked, and the panic was caught).
    #[error(
        "the database file {path} is damaged ({detail}); nothing was changed. Run `idemstore verify` on the store's directory to see what is wrong, and restore the directory from a backup"
    )]
    Damaged {
        /// The database file.
        path: PathBuf,
        /// What redb reported.
        detail: String,
    },
    /// The file is a redb database, but not an idemstore store.
    #[error(
        "{path} is a redb database that idemstore did not create (it has tables but no idemstore.meta); point the store at its own directory"
    )]
    NotAStore {
        /// The database file.
        path: PathBuf,
    },
    /// The store's own metadata is damaged.
    #[error(
        "the store's metadata entry {key:?} is damaged ({detail}); the file was changed outside idemstore: restore it from a backup"
    )]
    CorruptMeta {
        /// The meta key.
        key: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A store of an older format could not be moved to this build's format; it was left as
    /// it was.
    #[error(
        "the store of format {from} could not be moved to the current format ({detail}); it is unchanged: open it with the build that wrote it, or run `idemstore verify` on it"
    )]
    Migrate {
        /// The format the store has.
        from: u32,
        /// What stopped the move.
        detail: String,
    },
    /// The write-ahead log could not be replayed.
    #[error(transparent)]
    Recovery(#[from] super::RecoveryError),
    /// A table name is reserved or registered twice with different types.
    #[error("table {name:?} cannot be registered: {reason}")]
    BadTable {
        /// The table's name.
        name: String,
        /// Why.
        reason: BadTableReason,
    },
    /// Setting up the store's tables failed.
    #[error(
        "cannot set up the store's tables: {0}; if a business table changed its key or value types, migrate it or register it under a new name"
    )]
    Setup(#[source] redb::Error),
    /// The store's files or directories are readable by other users, and
    /// `LoosePermissions::Refuse` is set.
    #[error(
        "the store's files are readable by other users ({}); run chmod 700 on the directories and chmod 600 on the files, or open with LoosePermissions::Warn",
        files.iter().map(|f| format!("{} is {:o}", f.path.display(), f.mode)).collect::<Vec<_>>().join(", ")
    )]
    LoosePermissions {
        /// Each loose path and its mode.
        files: Vec<crate::model::config::LooseFile>,
    },
    /// The writer thread could not be started.
    #[error("cannot start the writer thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The store ships its log synchronously and refuses to serve while its replica lacks
    /// frames (`Unreachable::Refuse`), and the replica did not catch up in time: the store
    /// would otherwise serve frames synced locally that a restore elsewhere would not have.
    #[error(
        "the store ships its log synchronously and its replica did not catch up ({source}); make the replica reachable and open again, or open with Unreachable::FallBack to serve with an alert"
    )]
    Replica {
        /// What the replica answered.
        #[source]
        source: crate::error::ReplicaError,
    },
}

/// Who holds a store directory's lock, as the holder recorded it in the lock file: for
/// messages only. The lock decides who may open the store; a file with no lock held names
/// nobody.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holder {
    /// A process with the store open: another one, or this one (a second `Store::open` of a
    /// directory this process already has open).
    Process {
        /// Its process id.
        pid: u32,
        /// Its executable's name, when it could tell.
        name: Option<String>,
    },
    /// Read commands of the `idemstore` tool: they lock the directory shared while they read,
    /// and record nothing, because they must not write.
    Readers,
    /// A holder that recorded nothing: it has only just taken the lock, or it is an idemstore
    /// build older than the lock file, which locks only the database file.
    Unknown,
}

impl Holder {
    /// What to do about it, for a store that wants to open the directory.
    fn advice(&self) -> &'static str {
        match self {
            Holder::Process { pid, .. } if *pid == std::process::id() => {
                "use (clone) the Store already open instead of opening the directory twice, or drop it first"
            }
            Holder::Readers => "wait for it to finish, then open again",
            Holder::Process { .. } | Holder::Unknown => {
                "stop it first, or give each process a directory of its own (one writer per store directory)"
            }
        }
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holder::Process { pid, name } => {
                if *pid == std::process::id() {
                    f.write_str("this process, ")?;
                }
                write!(f, "process {pid}")?;
                match name {
                    Some(name) => write!(f, " ({name})"),
                    None => Ok(()),
                }
            }
            Holder::Readers => f.write_str("a read command of the idemstore tool"),
            Holder::Unknown => f.write_str("another process (it did not record its pid)"),
        }
    }
}

/// Why a business table could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadTableReason {
    /// Its name starts with `idemstore.`, which the store's own tables use.
    #[error("names starting with \"idemstore.\" are reserved; rename it")]
    Reserved,
    /// The name is already registered with other key or value types.
    #[error(
        "it is already registered as <{registered}>; register each name with one key and value type"
    )]
    Duplicate {
        /// The types it was registered with, as redb names them (`"K, V"`).
        registered: String,
    },
    /// The store already has 65,536 tables.
    #[error("too many tables (65,536 at most)")]
    TooMany,
}

impl From<crate::model::invalid::InvalidSetting> for OpenError {
    fn from(invalid: crate::model::invalid::InvalidSetting) -> Self {
        OpenError::InvalidConfig {
            setting: invalid.setting,
            reason: invalid.reason,
        }
    }
}
