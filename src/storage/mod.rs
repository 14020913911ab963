//! Where a store keeps its bytes: a directory on the real file system, or (feature `testing`) a
//! simulated disk that can crash and fail on purpose.
//!
//! The engine sees two things through here: the redb database and the log directory, and a
//! backup's new directory (`backup`). Nothing else in the crate touches files, which is what
//! lets the crash tests swap the disk out. A real directory is also locked (`lock`) for as long
//! as its `Storage` lives.

mod backup;
mod dir;
mod fs;
mod leftovers;
mod lock;
#[cfg(feature = "cli")]
mod read_only;
mod rewrite;
/// The simulated disk (feature `testing`), re-exported by `testing`: a storage like the
/// real one, behind the same `Storage` enum.
#[cfg(feature = "testing")]
pub(crate) mod sim_disk;
mod watched;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, DatabaseError};

use crate::error::OpenError;
use crate::model::config::LooseFile;

pub(crate) use backup::{BackupDir, check_backup_destination};
pub(crate) use dir::FsLogDir;
#[cfg(feature = "testing")]
pub(crate) use fs::Created;
pub(crate) use fs::{create_private, create_private_dir, parent_of, swap_in_dir, sync_dir};
pub(crate) use leftovers::remove_dead_leftovers;
pub(crate) use lock::DirLock;
use lock::LOCK_FILE;
#[cfg(feature = "cli")]
pub(crate) use lock::{SharedLock, SharedLockError};
#[cfg(feature = "cli")]
pub(crate) use read_only::{CopyOnWrite, ReadOnlyLogDir, db_file};
pub(crate) use watched::SyncWatch;

/// The database file inside the store's directory.
pub(crate) const DB_FILE: &str = "idemstore.redb";
/// Where a new database file is built before it is renamed to [`DB_FILE`]: a crash while redb
/// initializes a file can leave it unreadable, so the final name only ever names a complete
/// database.
pub(crate) const DB_CREATING: &str = "idemstore.redb.creating";
/// Where the database file is copied to when it is rewritten after a failed sync, before the
/// copy is renamed over [`DB_FILE`]; a leftover is removed at open.
pub(crate) const DB_REWRITING: &str = "idemstore.redb.rewriting";
/// The log's directory inside the store's directory.
pub(crate) const LOG_DIR: &str = "wal";

/// The files of the write-ahead log: a flat directory of segment files.
pub(crate) trait LogDir: Send + Sync + fmt::Debug {
    /// Names of the files in the directory.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Opens an existing file for reading and writing.
    fn open(&self, name: &str) -> io::Result<Box<dyn LogFile>>;
    /// Creates a new empty file; an error if it exists.
    fn create(&self, name: &str) -> io::Result<Box<dyn LogFile>>;
    /// Deletes a file.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes the directory's entries (creations) durable.
    fn sync(&self) -> io::Result<()>;
}

/// One log segment file.
pub(crate) trait LogFile: Send + fmt::Debug {
    fn len(&self) -> io::Result<u64>;
    /// Fills `buf` from `offset`; an error if the file is shorter.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes every write so far durable (`fdatasync`).
    fn sync_data(&mut self) -> io::Result<()>;
}

/// The bytes behind a store.
#[derive(Clone)]
pub(crate) enum Storage {
    /// A directory on the real file system: `idemstore.redb`, `wal/` and `idemstore.lock`.
    Directory {
        dir: PathBuf,
        /// Held by every clone (the engine's and the writer's), so the directory stays locked
        /// across every reopen of the database and until the last database handle is gone.
        _lock: Arc<DirLock>,
    },
    /// A simulated disk for crash and fault tests.
    #[cfg(feature = "testing")]
    Simulated(sim_disk::SimDisk),
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::Directory { dir, .. } => f.debug_tuple("Directory").field(dir).finish(),
            #[cfg(feature = "testing")]
            Storage::Simulated(_) => f.write_str("Simulated"),
        }
    }
}

impl Storage {
    /// The store's directory `dir`, created (with every missing parent, durably) if absent and
    /// locked: a second `Storage` of it, in any process, is refused until this one and all its
    /// clones are dropped.
    ///
    /// # Errors
    /// [`OpenError::AlreadyOpen`] naming the holder; [`OpenError::Io`] if the directory or its
    /// lock file cannot be made or locked.
    pub(crate) fn directory(dir: &Path) -> Result<Storage, OpenError> {
        fs::create_dir_durable(dir).map_err(|source| OpenError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock = DirLock::acquire(dir)?;
        Ok(Storage::Directory {
            dir: dir.to_path_buf(),
            _lock: Arc::new(lock),
        })
    }

    /// Opens the redb database, creating it (and the store's directory) first if absent.
    ///
    /// A new file is built under a temporary name and renamed into place once redb has
    /// initialized it, so the final name only ever names a complete database; the directory is
    /// synced after the rename, and every directory level `open` created is synced into its
    /// parent, so none of it can vanish in a power cut after a write is acknowledged.
    ///
    /// `cache_bytes` is redb's page cache (the memory budget's share): redb's own default is
    /// 1 GiB. Every sync of the file is reported to `watch` (see [`SyncWatch`]).
    pub(crate) fn database(
        &self,
        cache_bytes: usize,
        watch: &std::sync::Arc<SyncWatch>,
    ) -> Result<Database, OpenError> {
        match self {
            Storage::Directory { dir, .. } => {
                let io = |path: &Path| {
                    let path = path.to_path_buf();
                    move |source| OpenError::Io { path, source }
                };
                fs::create_dir_durable(dir).map_err(io(dir))?;
                let path = dir.join(DB_FILE);
                let rewriting = dir.join(DB_REWRITING);
                rewrite::remove_if_present(&rewriting).map_err(io(&rewriting))?;
                if !path.exists() {
                    let creating = dir.join(DB_CREATING);
                    match std::fs::remove_file(&creating) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(io(&creating)(e));
                        }
                        _ => {}
                    }
                    // Made here with mode 0600: redb initializes an empty file it is given.
                    drop(fs::create_private(&creating).map_err(io(&creating))?);
                    drop(
                        Database::builder()
                            .create(&creating)
                            .map_err(|e| database_error(&creating, e))?,
                    );
                    std::fs::rename(&creating, &path).map_err(io(&path))?;
                    fs::sync_dir(dir).map_err(io(dir))?;
                }
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(io(&path))?;
                let backend =
                    redb::backends::FileBackend::new(file).map_err(|e| database_error(&path, e))?;
                Database::builder()
                    .set_cache_size(cache_bytes)
                    .create_with_backend(watched::Watched::new(backend, watch.clone()))
                    .map_err(|e| database_error(&path, e))
            }
            #[cfg(feature = "testing")]
            Storage::Simulated(disk) => {
                let io = |source| OpenError::Io {
                    path: PathBuf::from(DB_FILE),
                    source,
                };
                if !disk.exists(DB_FILE) {
                    // The store's directory: made, and its entry synced into its parent.
                    disk.create_root().map_err(io)?;
                    disk.remove(DB_CREATING);
                    drop(
                        Database::builder()
                            .create_with_backend(disk.backend(DB_CREATING))
                            .map_err(|e| database_error(Path::new(DB_CREATING), e))?,
                    );
                    disk.rename(DB_CREATING, DB_FILE).map_err(io)?;
                    disk.sync_dir("").map_err(io)?;
                }
                disk.remove(DB_REWRITING);
                Database::builder()
                    .set_cache_size(cache_bytes)
                    .create_with_backend(watched::Watched::new(
                        disk.backend(DB_FILE),
                        watch.clone(),
                    ))
                    .map_err(|e| database_error(Path::new(DB_FILE), e))
            }
        }
    }

    /// The store's files and directories that users other than the owner may read: its
    /// directory, the database file, the lock file, the log directory and its segments. Empty
    /// for a simulated disk.
    pub(crate) fn loose_permissions(&self) -> io::Result<Vec<LooseFile>> {
        #[cfg_attr(
            not(feature = "testing"),
            expect(
                irrefutable_let_patterns,
                reason = "Simulated exists with `testing` only"
            )
        )]
        let Storage::Directory { dir, .. } = self else {
            return Ok(Vec::new());
        };
        let mut paths = vec![
            dir.clone(),
            dir.join(DB_FILE),
            dir.join(LOCK_FILE),
            dir.join(LOG_DIR),
        ];
        if let Ok(entries) = std::fs::read_dir(dir.join(LOG_DIR)) {
            for entry in entries {
                paths.push(entry?.path());
            }
        }
        let mut loose = Vec::new();
        for path in paths {
            match fs::loose_mode(&path) {
                Ok(Some(mode)) => loose.push(LooseFile { path, mode }),
                Ok(None) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(loose)
    }

    /// The log directory, created if absent.
    pub(crate) fn log_dir(&self) -> Result<Box<dyn LogDir>, OpenError> {
        match self {
            Storage::Directory { dir, .. } => {
                let path = dir.join(LOG_DIR);
                Ok(Box::new(
                    FsLogDir::open(&path).map_err(|source| OpenError::Io { path, source })?,
                ))
            }
            #[cfg(feature = "testing")]
            Storage::Simulated(disk) => {
                let io = |source| OpenError::Io {
                    path: PathBuf::from(LOG_DIR),
                    source,
                };
                if disk.create_dir(LOG_DIR).map_err(io)? == Created::Yes {
                    disk.sync_dir("").map_err(io)?;
                }
                Ok(Box::new(disk.log_dir(LOG_DIR)))
            }
        }
    }

    /// The log directory if it exists (a store never opened with the log has none).
    pub(crate) fn existing_log_dir(&self) -> Result<Option<Box<dyn LogDir>>, OpenError> {
        match self {
            Storage::Directory { dir, .. } if !dir.join(LOG_DIR).is_dir() => Ok(None),
            #[cfg(feature = "testing")]
            Storage::Simulated(disk) if !disk.dir_exists(LOG_DIR) => Ok(None),
            _ => self.log_dir().map(Some),
        }
    }

    /// The size of the database file in bytes.
    pub(crate) fn db_len(&self) -> io::Result<u64> {
        match self {
            Storage::Directory { dir, .. } => Ok(std::fs::metadata(dir.join(DB_FILE))?.len()),
            #[cfg(feature = "testing")]
            Storage::Simulated(disk) => Ok(disk.file(DB_FILE).map_or(0, |f| f.len() as u64)),
        }
    }

    /// The database file, to name in messages.
    pub(crate) fn db_path(&self) -> PathBuf {
        match self {
            Storage::Directory { dir, .. } => dir.join(DB_FILE),
            #[cfg(feature = "testing")]
            Storage::Simulated(_) => PathBuf::from(DB_FILE),
        }
    }

    /// The store's directory on the real filesystem; `None` for a simulated disk.
    pub(crate) fn dir(&self) -> Option<&Path> {
        match self {
            Storage::Directory { dir, .. } => Some(dir),
            #[cfg(feature = "testing")]
            Storage::Simulated(_) => None,
        }
    }

    /// A path to name in messages about the log directory.
    pub(crate) fn log_path(&self) -> PathBuf {
        match self {
            Storage::Directory { dir, .. } => dir.join(LOG_DIR),
            #[cfg(feature = "testing")]
            Storage::Simulated(_) => PathBuf::from(LOG_DIR),
        }
    }
}

fn database_error(path: &Path, e: DatabaseError) -> OpenError {
    match e {
        // The directory lock is ours, so whoever has the file open does not take that lock.
        DatabaseError::DatabaseAlreadyOpen => OpenError::AlreadyOpen {
            path: path.parent().unwrap_or(path).to_path_buf(),
            holder: crate::error::Holder::Unknown,
        },
        source => OpenError::Database {
            path: path.to_path_buf(),
            source,
        },
    }
}
