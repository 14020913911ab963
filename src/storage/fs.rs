//! File-system steps that must be durable and private: directories created with their entries
//! synced into their parents, and files and directories only this user may read.
//!
//! A store holds every response it replays (charge ids, amounts, customer references), so
//! what it creates is `0700` (directories) and `0600` (files), set explicitly after creation so
//! that no umask widens or narrows it. A directory entry is durable only once its parent
//! directory is synced: a new store whose `wal/` entry is lost to a power cut loses every
//! acknowledged write with it.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

/// The mode of directories the store creates.
pub(crate) const DIR_MODE: u32 = 0o700;
/// The mode of files the store creates.
pub(crate) const FILE_MODE: u32 = 0o600;

/// Creates `dir` and every missing parent, each `0700`, each made durable in its parent
/// before the next level is created. Returns whether `dir` was created.
pub(crate) fn create_dir_durable(dir: &Path) -> io::Result<Created> {
    if dir.is_dir() {
        return Ok(Created::No);
    }
    let mut missing: Vec<PathBuf> = Vec::new();
    let mut at = Some(dir);
    while let Some(path) = at {
        if path.as_os_str().is_empty() || path.is_dir() {
            break;
        }
        missing.push(path.to_path_buf());
        at = path.parent();
    }
    for path in missing.iter().rev() {
        match make_dir(path) {
            Ok(()) => {}
            // Another process made it meanwhile: it is theirs to have made durable.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => continue,
            Err(e) => return Err(e),
        }
        set_mode(path, DIR_MODE)?;
        sync_dir(parent_of(path))?;
    }
    Ok(Created::Yes)
}

/// Whether a call created what it was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Created {
    Yes,
    No,
}

pub(crate) fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

#[cfg(unix)]
fn make_dir(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(DIR_MODE).create(path)
}

#[cfg(not(unix))]
fn make_dir(path: &Path) -> io::Result<()> {
    std::fs::create_dir(path)
}

/// Creates the directory `path` (an error if it exists), `0700`. Its entry is not synced into
/// the parent: callers that need it durable sync the parent themselves.
pub(crate) fn create_private_dir(path: &Path) -> io::Result<()> {
    make_dir(path)?;
    set_mode(path, DIR_MODE)
}

/// Creates a new file (an error if it exists), readable and writable by this user only.
pub(crate) fn create_private(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, FILE_MODE);
    let file = options.open(path)?;
    set_mode(path, FILE_MODE)?;
    Ok(file)
}

/// Sets a path's permission bits (a no-op where there are none).
pub(crate) fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }
    #[cfg(not(unix))]
    {
        let _ = (path, mode);
        Ok(())
    }
}

/// Makes a directory's entries durable.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The permission bits of `path` if group or others may access it.
pub(crate) fn loose_mode(path: &Path) -> io::Result<Option<u32>> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
        Ok((mode & 0o077 != 0).then_some(mode))
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(None)
    }
}

/// Puts the directory `fresh` at `dest` (a directory), and returns where the old `dest` went.
/// On Linux the two are exchanged in one step (`renameat2(RENAME_EXCHANGE)`), so `dest` is
/// never absent and the old one ends at `fresh`. Elsewhere, or on a file system that cannot
/// exchange, the old one is renamed to `aside` first and `fresh` to `dest` after: for that
/// moment `dest` is absent. The parent is synced either way.
pub(crate) fn swap_in_dir(dest: &Path, fresh: &Path, aside: &Path) -> io::Result<PathBuf> {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{CWD, RenameFlags, renameat_with};
        use rustix::io::Errno;
        match renameat_with(CWD, fresh, CWD, dest, RenameFlags::EXCHANGE) {
            Ok(()) => {
                sync_dir(parent_of(dest))?;
                return Ok(fresh.to_path_buf());
            }
            // Not this file system, or an old kernel: the two-step way below.
            Err(Errno::INVAL | Errno::NOSYS | Errno::NOTSUP) => {}
            Err(e) => return Err(e.into()),
        }
    }
    std::fs::rename(dest, aside)?;
    std::fs::rename(fresh, dest)?;
    sync_dir(parent_of(dest))?;
    Ok(aside.to_path_buf())
}
