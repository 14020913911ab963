//! Where a backup is written: a new store directory, built beside its destination under a
//! temporary name and renamed into place once its database file is complete and synced.
//!
//! The destination never holds half a copy. A failure removes the temporary directory; a crash
//! leaves it (`.NAME.backup-PID-N` beside the destination) for an operator to remove, and the
//! destination as it was. The rename makes a new entry or replaces an empty directory, and the
//! parent is synced after it, so a backup that returned survives a power cut. What is created
//! is private, as the store's own files are (`fs`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redb::Database;

use crate::error::BackupError;

use super::{DB_FILE, fs};

/// Tells apart the temporary directories of backups this process builds at the same time.
static BUILDING: AtomicU64 = AtomicU64::new(0);

/// Refuses a destination that exists and is not an empty directory. Checked before anything is
/// read or created, and again, atomically, by the rename that puts the copy in place.
pub(crate) fn check_backup_destination(dest: &Path) -> Result<(), BackupError> {
    // Not followed: a link is not a directory the rename could replace.
    let meta = match std::fs::symlink_metadata(dest) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => return Err(at(dest)(source)),
    };
    if !meta.is_dir() {
        return Err(BackupError::DestinationNotADirectory {
            path: dest.to_path_buf(),
        });
    }
    if std::fs::read_dir(dest).map_err(at(dest))?.next().is_some() {
        return Err(BackupError::DestinationNotEmpty {
            path: dest.to_path_buf(),
        });
    }
    Ok(())
}

/// A backup being built: its temporary directory beside the destination, removed when dropped
/// unless it was put in place.
#[derive(Debug)]
pub(crate) struct BackupDir {
    building: PathBuf,
    dest: PathBuf,
    placed: bool,
}

impl BackupDir {
    /// Checks the destination and makes the temporary directory beside it (`0700`), creating
    /// the destination's missing parents (durably, as a store's open does).
    pub(crate) fn create(dest: &Path) -> Result<BackupDir, BackupError> {
        check_backup_destination(dest)?;
        let name = dest.file_name().ok_or_else(|| {
            at(dest)(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the destination must end in the name of a directory",
            ))
        })?;
        let parent = fs::parent_of(dest);
        fs::create_dir_durable(parent).map_err(at(parent))?;
        let building = parent.join(format!(
            ".{}.backup-{}-{}",
            name.to_string_lossy(),
            std::process::id(),
            BUILDING.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_private_dir(&building).map_err(at(&building))?;
        Ok(BackupDir {
            building,
            dest: dest.to_path_buf(),
            placed: false,
        })
    }

    /// The directory being built (renamed to the destination by [`BackupDir::place`]).
    pub(crate) fn path(&self) -> &Path {
        &self.building
    }

    /// The copy's database: a new file (`0600`, which redb initializes), opened with a page
    /// cache of `cache_bytes`.
    pub(crate) fn database(&self, cache_bytes: usize) -> Result<Database, BackupError> {
        let path = self.building.join(DB_FILE);
        drop(fs::create_private(&path).map_err(at(&path))?);
        Database::builder()
            .set_cache_size(cache_bytes)
            .create(&path)
            .map_err(|e| BackupError::Copy(Arc::new(e.into())))
    }

    /// Closes the copy's database, syncs its file and directory, renames the directory to the
    /// destination and syncs the parent. Returns the database file's size.
    pub(crate) fn place(mut self, db: Database) -> Result<u64, BackupError> {
        drop(db);
        let path = self.building.join(DB_FILE);
        let file = std::fs::File::open(&path).map_err(at(&path))?;
        file.sync_all().map_err(at(&path))?;
        let bytes = file.metadata().map_err(at(&path))?.len();
        fs::sync_dir(&self.building).map_err(at(&self.building))?;
        if let Err(source) = std::fs::rename(&self.building, &self.dest) {
            // Something appeared at the destination since it was checked: say what.
            check_backup_destination(&self.dest)?;
            return Err(at(&self.dest)(source));
        }
        self.placed = true;
        let parent = fs::parent_of(&self.dest);
        if let Err(source) = fs::sync_dir(parent) {
            // The copy is in place but may not survive a power cut: take it back rather than
            // leave a backup that looks finished.
            let _ = std::fs::remove_dir_all(&self.dest);
            return Err(at(parent)(source));
        }
        Ok(bytes)
    }
}

impl Drop for BackupDir {
    fn drop(&mut self) {
        if !self.placed {
            let _ = std::fs::remove_dir_all(&self.building);
        }
    }
}

/// Maps an I/O error on `path`.
fn at(path: &Path) -> impl FnOnce(io::Error) -> BackupError {
    let path = path.to_path_buf();
    move |source| BackupError::Io { path, source }
}
