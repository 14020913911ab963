//! The store directory's lock: one writer per directory, for the store's whole life.
//!
//! redb locks its database file, but the writer closes and reopens that file whenever it
//! recovers in place (`Store::reopen`, a panic, an I/O error redb latched). For that moment
//! redb's lock is gone: a second process could open the store, and the first one's reopen
//! would then fail and leave it poisoned for as long as the second lived. So an open store
//! also holds an exclusive `flock` on the directory's `idemstore.lock`, taken before the
//! database is opened and let go only when the last handle of the store's storage is dropped,
//! after the database.
//!
//! A lock is taken only once the file locked is still the one the path names: a standby swaps
//! a rebuilt directory in, and an opener may hold the old directory's lock file, which the
//! standby lets go of as it removes it.
//!
//! The holder writes its pid and executable name into the file, for the error the next opener
//! gets. The lock is what counts: a file a crash left behind, with no lock held, names nobody.
//! The `idemstore` tool's read commands (feature `cli`) lock the same file shared and record
//! nothing, since they must not write. Who holds a lock is read in one place, `holder`.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{Holder, OpenError};

use super::fs;

/// The lock file inside the store's directory.
pub(crate) const LOCK_FILE: &str = "idemstore.lock";

/// At most this much of a lock file is read: a pid and a name, never a file's worth.
const RECORD_MAX: u64 = 512;

/// The directory's exclusive lock, held by an open store.
#[derive(Debug)]
pub(crate) struct DirLock {
    file: File,
}

impl DirLock {
    /// Locks the store's directory `dir` (which exists) exclusively, creating its lock file
    /// (`0600`) if absent, and records this process in it.
    ///
    /// # Errors
    /// [`OpenError::AlreadyOpen`] naming the holder when the directory is locked;
    /// [`OpenError::Io`] when the lock file cannot be opened or locked.
    pub(crate) fn acquire(dir: &Path) -> Result<DirLock, OpenError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| OpenError::Io {
            path: path.clone(),
            source,
        };
        let mut file = open_or_create(&path).map_err(io)?;
        let mut swaps = 0;
        loop {
            match for_a_moment(|| file.try_lock()) {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(OpenError::AlreadyOpen {
                        path: dir.to_path_buf(),
                        holder: holder(&file),
                    });
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
            // The lock counts only if the file locked is still the one the path names: a
            // standby swaps a rebuilt directory in (`engine::rebuild`), and the file opened a
            // moment before may be the old directory's, let go of as it is removed.
            if still_named(&file, &path) {
                break;
            }
            if swaps == LOCK_WAITS_MS.len() {
                return Err(io(io::Error::other(
                    "the lock file was replaced each time it was locked: something keeps swapping the directory (a standby following into it?)",
                )));
            }
            swaps += 1;
            drop(file);
            file = open_or_create(&path).map_err(io)?;
        }
        // The record only names the holder in messages: a store that cannot write it (a full
        // disk) still opens.
        if let Err(e) = record(&file) {
            tracing::warn!(path = %path.display(), error = %e, "cannot record this process in the store's lock file");
        }
        Ok(DirLock { file })
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Names nobody once closed; closing the file (right after) lets go of the lock.
        let _ = self.file.set_len(0);
    }
}

/// How long a lock held by someone else is tried again before the opener is told who holds
/// it: each wait, in milliseconds (about 120 in all).
const LOCK_WAITS_MS: [u64; 6] = [2, 4, 8, 16, 32, 64];

/// Tries `lock` again for a moment while another holds it. A `flock` belongs to the open file,
/// and a process that forks (to run any command) shares its open files with the child until
/// the child execs: a lock its owner has just let go of can stay held for that long. A store
/// that another store really holds is still refused, a moment later.
fn for_a_moment(lock: impl Fn() -> Result<(), TryLockError>) -> Result<(), TryLockError> {
    for wait in LOCK_WAITS_MS {
        match lock() {
            Err(TryLockError::WouldBlock) => {
                std::thread::sleep(std::time::Duration::from_millis(wait));
            }
            done => return done,
        }
    }
    lock()
}

/// Whether `path` names the open file `file` (the same file, not one put in its place).
#[cfg(unix)]
fn still_named(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(named)) => open.dev() == named.dev() && open.ino() == named.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn still_named(_file: &File, _path: &Path) -> bool {
    true
}

/// Opens the lock file, creating it `0600` if absent. Its directory entry is not synced: a
/// lock file lost to a power cut holds nothing and is made again at the next open.
fn open_or_create(path: &Path) -> io::Result<File> {
    match fs::create_private(path) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            OpenOptions::new().read(true).write(true).open(path)
        }
        created => created,
    }
}

/// Writes this process's pid and executable name into the (locked) file: `PID\nNAME\n`.
fn record(file: &File) -> io::Result<()> {
    let name = std::env::current_exe()
        .ok()
        .or_else(|| std::env::args_os().next().map(PathBuf::from))
        .and_then(|path| path.file_name()?.to_str().map(str::to_owned))
        .unwrap_or_default();
    let mut file = file;
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(format!("{}\n{name}\n", std::process::id()).as_bytes())
}

/// Who holds the lock on `file`, which this process just failed to lock exclusively.
fn holder(file: &File) -> Holder {
    // A writer's exclusive lock refuses a shared one too; readers refuse only an exclusive one.
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            Holder::Readers
        }
        Err(_) => recorded(file),
    }
}

/// The holder the file names (an exclusive lock is held on it).
fn recorded(file: &File) -> Holder {
    let mut text = String::new();
    let mut file = file;
    if file.seek(SeekFrom::Start(0)).is_err()
        || file.take(RECORD_MAX).read_to_string(&mut text).is_err()
    {
        return Holder::Unknown;
    }
    let mut lines = text.lines();
    let Some(pid) = lines.next().and_then(|l| l.trim().parse::<u32>().ok()) else {
        return Holder::Unknown;
    };
    let name = lines
        .next()
        .map(str::trim)
        .filter(|n| !n.is_empty() && !n.chars().any(char::is_control))
        .map(str::to_owned);
    Holder::Process { pid, name }
}

/// A reader's shared lock on a store's directory (feature `cli`): no store opens while it is
/// held, and it waits for nobody.
#[cfg(feature = "cli")]
#[derive(Debug)]
pub(crate) struct SharedLock {
    _file: File,
}

/// Why a reader could not lock a store's directory.
#[cfg(feature = "cli")]
#[derive(Debug)]
pub(crate) enum SharedLockError {
    /// A store has it open.
    Held(Holder),
    /// The lock file could not be opened or locked.
    Io { path: PathBuf, source: io::Error },
}

#[cfg(feature = "cli")]
impl SharedLock {
    /// Locks the store's directory `dir` shared, without creating or writing anything. `None`
    /// when it has no lock file: no build that locks it has opened the store since it was
    /// made, and redb's own lock on the database file still refuses a reader beside a writer.
    pub(crate) fn acquire(dir: &Path) -> Result<Option<SharedLock>, SharedLockError> {
        let path = dir.join(LOCK_FILE);
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(SharedLockError::Io { path, source }),
        };
        match for_a_moment(|| file.try_lock_shared()) {
            Ok(()) => Ok(Some(SharedLock { _file: file })),
            Err(TryLockError::WouldBlock) => Err(SharedLockError::Held(recorded(&file))),
            Err(TryLockError::Error(source)) => Err(SharedLockError::Io { path, source }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second exclusive lock names the first holder (this process, by pid and name); a
    /// shared lock refuses the writer as readers; dropping the lock frees the directory and
    /// leaves a file that names nobody.
    #[test]
    fn the_lock_names_its_holder_and_is_free_once_dropped() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let first = DirLock::acquire(dir.path())?;
        let Err(OpenError::AlreadyOpen { holder, .. }) = DirLock::acquire(dir.path()) else {
            return Err("a second exclusive lock was granted".into());
        };
        let Holder::Process { pid, name } = &holder else {
            return Err(format!("the holder is not named: {holder:?}").into());
        };
        assert_eq!(*pid, std::process::id());
        assert!(name.as_deref().is_some_and(|n| !n.is_empty()), "{holder:?}");
        drop(first);
        assert!(std::fs::read(dir.path().join(LOCK_FILE))?.is_empty());

        let again = DirLock::acquire(dir.path())?;
        drop(again);
        #[cfg(feature = "cli")]
        {
            let reading = SharedLock::acquire(dir.path())
                .map_err(|e| format!("{e:?}"))?
                .ok_or("the lock file exists")?;
            let Err(OpenError::AlreadyOpen { holder, .. }) = DirLock::acquire(dir.path()) else {
                return Err("a writer got in beside a reader".into());
            };
            assert_eq!(holder, Holder::Readers);
            drop(reading);
        }
        Ok(())
    }

    /// What a crash leaves (a file naming a dead process, no lock held) is no lock, and a
    /// file of garbage names nobody.
    #[test]
    fn a_stale_or_garbled_lock_file_holds_nothing() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join(LOCK_FILE), "4294967295\nlong-gone\n")?;
        let lock = DirLock::acquire(dir.path())?;
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE))?;
        assert!(
            text.starts_with(&format!("{}\n", std::process::id())),
            "{text:?}"
        );
        drop(lock);

        let file = File::open(dir.path().join(LOCK_FILE))?;
        std::fs::write(dir.path().join(LOCK_FILE), "not a pid\n\u{7}\n")?;
        assert_eq!(recorded(&file), Holder::Unknown);
        Ok(())
    }

    /// A lock its holder lets go of while the opener tries (what a forked child between fork
    /// and exec does) is taken, not refused.
    #[test]
    fn a_lock_let_go_of_a_moment_later_is_taken() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let held = DirLock::acquire(dir.path())?;
        let (go, went) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _ = went.recv();
            drop(held);
        });
        go.send(())?;
        let taken = DirLock::acquire(dir.path());
        holder.join().map_err(|_| "the holder panicked")?;
        assert!(taken.is_ok(), "{taken:?}");
        Ok(())
    }
}
