//! Where a store keeps its bytes: a directory on the real file system, or (feature `testing`) a
//! simulated disk that can crash and fail on purpose.
//!
//! The engine sees two things through here: the redb database and the log directory. Nothing
//! else in the crate touches files, which is what lets the crash tests swap the disk out.

mod dir;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use redb::{Database, DatabaseError};

use crate::error::OpenError;

pub(crate) use dir::FsLogDir;

/// The database file inside the store's directory.
pub(crate) const DB_FILE: &str = "idemstore.redb";
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
    /// A directory on the real file system: `idemstore.redb` and `wal/`.
    Directory(PathBuf),
    /// A simulated disk for crash and fault tests.
    #[cfg(feature = "testing")]
    Simulated(crate::testing::SimDisk),
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::Directory(path) => f.debug_tuple("Directory").field(path).finish(),
            #[cfg(feature = "testing")]
            Storage::Simulated(_) => f.write_str("Simulated"),
        }
    }
}

impl Storage {
    /// Opens (creating if absent) the redb database.
    pub(crate) fn database(&self) -> Result<Database, OpenError> {
        match self {
            Storage::Directory(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| OpenError::Io {
                    path: dir.clone(),
                    source,
                })?;
                let path = dir.join(DB_FILE);
                Database::builder()
                    .create(&path)
                    .map_err(|e| database_error(&path, e))
            }
            #[cfg(feature = "testing")]
            Storage::Simulated(disk) => Database::builder()
                .create_with_backend(disk.backend(DB_FILE))
                .map_err(|e| database_error(Path::new(DB_FILE), e)),
        }
    }

    /// The log directory, created if absent.
    pub(crate) fn log_dir(&self) -> Result<Box<dyn LogDir>, OpenError> {
        match self {
            Storage::Directory(dir) => {
                let path = dir.join(LOG_DIR);
                Ok(Box::new(
                    FsLogDir::open(&path).map_err(|source| OpenError::Io { path, source })?,
                ))
            }
            #[cfg(feature = "testing")]
            Storage::Simulated(disk) => Ok(Box::new(disk.log_dir(LOG_DIR))),
        }
    }

    /// The log directory if it exists (a store never opened with the log has none).
    pub(crate) fn existing_log_dir(&self) -> Result<Option<Box<dyn LogDir>>, OpenError> {
        match self {
            Storage::Directory(dir) if !dir.join(LOG_DIR).is_dir() => Ok(None),
            _ => self.log_dir().map(Some),
        }
    }

    /// The database file, to name in messages.
    pub(crate) fn db_path(&self) -> PathBuf {
        match self {
            Storage::Directory(dir) => dir.join(DB_FILE),
            #[cfg(feature = "testing")]
            Storage::Simulated(_) => PathBuf::from(DB_FILE),
        }
    }

    /// A path to name in messages about the log directory.
    pub(crate) fn log_path(&self) -> PathBuf {
        match self {
            Storage::Directory(dir) => dir.join(LOG_DIR),
            #[cfg(feature = "testing")]
            Storage::Simulated(_) => PathBuf::from(LOG_DIR),
        }
    }
}

fn database_error(path: &Path, e: DatabaseError) -> OpenError {
    match e {
        DatabaseError::DatabaseAlreadyOpen => OpenError::AlreadyOpen {
            path: path.to_path_buf(),
        },
        source => OpenError::Database {
            path: path.to_path_buf(),
            source,
        },
    }
}
