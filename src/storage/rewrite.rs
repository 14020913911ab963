//! Rewriting the database file after one of its syncs failed.
//!
//! A failed sync may leave pages that reads return and the disk will never hold (see
//! `watched.rs`). The only way to make the file trustworthy again is to write every byte once
//! more: the file is copied, as this process reads it, to a new file, which is synced and then
//! renamed over the old one (and the directory synced). A crash before the rename keeps the old
//! file, whose last durable commit is intact, and the log still holds everything after it; a
//! crash after it keeps the new one. Either way nothing acknowledged rests on a page the disk
//! may not have.
//!
//! The copy needs as much free space as the file takes: on a full disk it fails, and the store
//! stays poisoned and tries again later. The database must be closed while it runs.

use std::io;
use std::path::{Path, PathBuf};

use crate::error::OpenError;

use super::{DB_FILE, DB_REWRITING, Storage, fs};

impl Storage {
    /// Rewrites the database file from what reads of it return, durably (see the module doc).
    /// Only while the database is closed.
    pub(crate) fn rewrite_database(&self) -> Result<(), OpenError> {
        match self {
            Storage::Directory { dir, .. } => {
                rewrite_file(dir).map_err(|(path, source)| OpenError::Io { path, source })
            }
            #[cfg(feature = "testing")]
            Storage::Simulated(disk) => {
                disk.rewrite(DB_FILE, DB_REWRITING)
                    .map_err(|source| OpenError::Io {
                        path: PathBuf::from(DB_FILE),
                        source,
                    })
            }
        }
    }
}

/// Copies `dir/DB_FILE` to `dir/DB_REWRITING`, syncs it, renames it over `DB_FILE` and syncs
/// the directory. On failure the copy is removed and the original is untouched.
fn rewrite_file(dir: &Path) -> Result<(), (PathBuf, io::Error)> {
    let (from, to) = (dir.join(DB_FILE), dir.join(DB_REWRITING));
    let at = |path: &Path| {
        let path = path.to_path_buf();
        move |e| (path, e)
    };
    remove_if_present(&to).map_err(at(&to))?;
    let mut source = std::fs::File::open(&from).map_err(at(&from))?;
    let copied = (|| {
        let mut copy = fs::create_private(&to)?;
        std::io::copy(&mut source, &mut copy)?;
        copy.sync_all()
    })();
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&to);
        return Err((to, e));
    }
    std::fs::rename(&to, &from).map_err(at(&from))?;
    fs::sync_dir(dir).map_err(at(dir))
}

/// Removes a leftover file; absent is fine.
pub(super) fn remove_if_present(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
