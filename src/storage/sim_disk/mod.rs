//! A simulated disk that remembers what was synced, so a test can crash it at any operation.
//!
//! Every file keeps a *live* image (what the process reads back) and a *durable* image (what a
//! crash keeps). Writes go to the live image and are remembered as pending; `sync_data` applies
//! a file's pending writes to its durable image. A new file's directory entry is durable only
//! after the directory is synced, and so is a new directory's (the log's `wal/`) and the
//! store's own directory in its parent: a file survives a crash only if every directory above
//! it does. A crash keeps the durable images, plus optionally a prefix, in whole 512-byte
//! sectors, of the most recent unsynced write: the one in flight.
//!
//! Faults can also be a full disk: a write, a length change or a sync that fails with
//! `StorageFull` once, with the disk working normally after it.
//!
//! A failed sync behaves as Linux's page cache does after a failed `fsync` (PostgreSQL's
//! "fsyncgate"): the writes it was to make durable are marked clean and **never** reach the
//! disk, not even with a later sync that succeeds, while reads keep returning them. A store
//! that reads such bytes back and builds on them loses them at the next crash.
//!
//! A plan can chain a second fault to the first ([`FaultPlan::then`]): once the first fires,
//! another (a crash, an I/O error or a full disk) is armed a given number of operations later,
//! to hit the store while it heals, checkpoints or reopens.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::storage::Created;

mod crash;
mod files;
mod plan;

use files::{SimBackend, SimLogDir};
pub use plan::{DiskCounters, FaultPlan, SecondFault, Tear, Then};

#[derive(Debug, Clone)]
enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Clone, Default)]
struct SimFile {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
    /// Whether the file would still exist after a crash.
    entry_durable: bool,
    /// The furthest byte ever written: the blocks the file holds (a length change makes
    /// holes, not blocks).
    allocated: u64,
    /// The durable file this one replaced by a rename whose directory entry is not durable
    /// yet: what a crash keeps under this name.
    replaced: Option<Box<SimFile>>,
}

#[derive(Debug, Default)]
struct DiskState {
    files: BTreeMap<String, SimFile>,
    /// Directories below the store's own (`wal`), and whether each entry is durable.
    dirs: BTreeMap<String, bool>,
    /// Whether the store's directory exists, and whether its entry in its parent is durable.
    root: Option<bool>,
    plan: FaultPlan,
    crashed: bool,
    counters: DiskCounters,
    /// The most recent write whose file has not been synced since: (file, offset, data).
    in_flight: Option<(String, u64, Vec<u8>)>,
    /// While set, a write that needs space a file does not hold yet fails with `StorageFull`
    /// (see [`SimDisk::set_full`]).
    full: bool,
}

/// A simulated disk shared by a store's database and log. Clones are the same disk.
#[derive(Clone, Default)]
pub struct SimDisk {
    state: Arc<Mutex<DiskState>>,
}

impl fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("SimDisk")
            .field("files", &state.files.keys().collect::<Vec<_>>())
            .field("counters", &state.counters)
            .finish()
    }
}

fn crash_error() -> io::Error {
    io::Error::other("simulated crash: the disk is gone")
}

impl SimDisk {
    /// An empty disk with no faults planned.
    pub fn new() -> Self {
        SimDisk::default()
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        // A panic while holding the lock can only come from a bug in this file; the state is
        // still the best record of the disk, so keep using it.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Plans faults, counted from the operations done so far.
    pub fn plan(&self, plan: FaultPlan) {
        self.lock().plan = plan;
    }

    /// Fills the disk (`true`), as a real one fills: from now on a write that needs blocks a
    /// file does not hold yet (past the furthest byte ever written to it: growing it, or
    /// filling a hole a length change left) fails with `StorageFull`, until it is emptied again
    /// (`false`). Overwriting what a file holds (a preallocated log segment, a page of the
    /// database written before) still works, and so do reads, syncs and length changes.
    pub fn set_full(&self, full: bool) {
        self.lock().full = full;
    }

    /// What the disk has done so far.
    pub fn counters(&self) -> DiskCounters {
        self.lock().counters
    }

    /// Whether a planned crash has happened.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    fn read(&self, name: &str, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let state = self.lock();
        if state.crashed {
            return Err(crash_error());
        }
        let file = state.files.get(name).ok_or(io::ErrorKind::NotFound)?;
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let src = file
            .live
            .get(start..start + out.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn len(&self, name: &str) -> io::Result<u64> {
        let state = self.lock();
        if state.crashed {
            return Err(crash_error());
        }
        Ok(state.files.get(name).map_or(0, |f| f.live.len() as u64))
    }

    fn write(&self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.lock();
        Self::mutate(&mut state)?;
        let allocated = state.files.get(name).map_or(0, |f| f.allocated);
        if state.full && offset + data.len() as u64 > allocated {
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                "the simulated disk is full",
            ));
        }
        if name.starts_with("wal/") {
            state.counters.log_bytes += data.len() as u64;
        } else {
            state.counters.db_bytes += data.len() as u64;
        }
        let file = file_mut(&mut state, name);
        apply_write(&mut file.live, offset, data);
        file.allocated = file.allocated.max(offset + data.len() as u64);
        file.pending.push(Pending::Write {
            offset,
            data: data.to_vec(),
        });
        state.in_flight = Some((name.to_owned(), offset, data.to_vec()));
        Ok(())
    }

    fn set_len(&self, name: &str, len: u64) -> io::Result<()> {
        let mut state = self.lock();
        Self::mutate(&mut state)?;
        let file = file_mut(&mut state, name);
        file.live
            .resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
        file.pending.push(Pending::SetLen(len));
        Ok(())
    }

    fn sync(&self, name: &str) -> io::Result<()> {
        let latency = self.lock().plan.log_sync_latency;
        if let Some(latency) = latency.filter(|_| name.starts_with("wal/")) {
            // Outside the lock: other threads keep using the disk meanwhile.
            std::thread::sleep(latency);
        }
        let mut state = self.lock();
        let counted = Self::mutate(&mut state);
        if counted.is_ok() {
            if name.starts_with("wal/") {
                state.counters.log_syncs += 1;
            } else {
                state.counters.db_syncs += 1;
            }
        }
        let failed = match counted {
            Err(e) if state.crashed => return Err(e),
            Err(e) => Some(e),
            Ok(()) if state.plan.fail_sync == Some(state.counters.syncs()) => {
                Self::fired(&mut state);
                Some(io::Error::other(format!(
                    "injected sync failure (sync {})",
                    state.counters.syncs()
                )))
            }
            Ok(()) => None,
        };
        let in_flight_here = state.in_flight.as_ref().is_some_and(|(n, _, _)| n == name);
        if let Some(error) = failed {
            // The page cache marks the writes clean: reads still see them, the disk never will.
            state.counters.failed_syncs += 1;
            if let Some(file) = state.files.get_mut(name) {
                file.pending.clear();
            }
            if in_flight_here {
                state.in_flight = None;
            }
            return Err(error);
        }
        if let Some(file) = state.files.get_mut(name) {
            for op in file.pending.drain(..) {
                match op {
                    Pending::Write { offset, data } => {
                        apply_write(&mut file.durable, offset, &data)
                    }
                    Pending::SetLen(len) => {
                        file.durable
                            .resize(usize::try_from(len).unwrap_or(usize::MAX), 0);
                    }
                }
            }
        }
        if in_flight_here {
            state.in_flight = None;
        }
        Ok(())
    }

    fn create(&self, name: &str) -> io::Result<()> {
        let mut state = self.lock();
        if state.crashed {
            return Err(crash_error());
        }
        if state.files.contains_key(name) {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        state.files.insert(name.to_owned(), SimFile::default());
        Ok(())
    }

    /// Makes the entries of directory `prefix` durable (`""` is the store's directory, whose
    /// entries have no `/`): its files and its directories.
    pub(crate) fn sync_dir(&self, prefix: &str) -> io::Result<()> {
        let mut state = self.lock();
        Self::mutate(&mut state)?;
        let in_dir = |name: &str| match name.strip_prefix(prefix) {
            Some(rest) => !rest.contains('/'),
            None => false,
        };
        for (_, file) in state.files.iter_mut().filter(|(n, _)| in_dir(n)) {
            file.entry_durable = true;
            file.replaced = None;
        }
        for (_, durable) in state.dirs.iter_mut().filter(|(n, _)| in_dir(n)) {
            *durable = true;
        }
        Ok(())
    }

    /// Creates the store's directory if absent, and syncs its parent so that its entry is
    /// durable (two operations, as on a real file system).
    pub(crate) fn create_root(&self) -> io::Result<()> {
        let mut state = self.lock();
        if state.root.is_some() {
            return Ok(());
        }
        Self::mutate(&mut state)?;
        state.root = Some(false);
        Self::mutate(&mut state)?;
        state.root = Some(true);
        Ok(())
    }

    /// Creates directory `name` inside the store's directory if absent. Its entry is durable
    /// only once the store's directory is synced.
    pub(crate) fn create_dir(&self, name: &str) -> io::Result<Created> {
        let mut state = self.lock();
        if state.dirs.contains_key(name) {
            return Ok(Created::No);
        }
        Self::mutate(&mut state)?;
        state.dirs.insert(name.to_owned(), false);
        Ok(Created::Yes)
    }

    /// Whether directory `name` exists (live).
    pub(crate) fn dir_exists(&self, name: &str) -> bool {
        self.lock().dirs.contains_key(name)
    }

    /// Whether a file exists (live).
    pub(crate) fn exists(&self, name: &str) -> bool {
        self.lock().files.contains_key(name)
    }

    /// Removes a file, if present (durable at once: only used for leftovers no one reads).
    pub(crate) fn remove(&self, name: &str) {
        self.lock().files.remove(name);
    }

    /// Renames a file, replacing any file at `to`. The new entry is durable only after the
    /// directory is synced: until then a crash keeps what `to` was before (a durable file it
    /// replaced, or nothing), and the renamed file is lost under both names.
    pub(crate) fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut state = self.lock();
        Self::mutate(&mut state)?;
        let mut file = state.files.remove(from).ok_or(io::ErrorKind::NotFound)?;
        file.entry_durable = false;
        file.replaced = state.files.remove(to).and_then(|old| {
            if old.entry_durable {
                Some(Box::new(old))
            } else {
                old.replaced
            }
        });
        if let Some((name, _, _)) = state.in_flight.as_mut()
            && name == from
        {
            *name = to.to_owned();
        }
        state.files.insert(to.to_owned(), file);
        Ok(())
    }

    fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        let state = self.lock();
        if state.crashed {
            return Err(crash_error());
        }
        Ok(state
            .files
            .keys()
            .filter_map(|n| n.strip_prefix(prefix))
            .map(str::to_owned)
            .collect())
    }

    /// Rewrites file `name` as `Storage::rewrite_database` does on a real disk: its bytes as
    /// reads return them are written to `tmp`, which is synced and renamed over `name`, and the
    /// directory is synced. Each step is a disk operation, so planned faults hit it too.
    pub(crate) fn rewrite(&self, name: &str, tmp: &str) -> io::Result<()> {
        const CHUNK: usize = 1 << 20;
        self.remove(tmp);
        let bytes = self.file(name).ok_or(io::ErrorKind::NotFound)?;
        let copied = (|| {
            for (i, chunk) in bytes.chunks(CHUNK).enumerate() {
                self.write(tmp, (i * CHUNK) as u64, chunk)?;
            }
            if bytes.is_empty() {
                self.set_len(tmp, 0)?;
            }
            self.sync(tmp)?;
            self.rename(tmp, name)
        })();
        if let Err(e) = copied {
            self.remove(tmp);
            return Err(e);
        }
        self.sync_dir("")
    }

    /// The live bytes of a file, for tests that damage a log on purpose.
    pub fn file(&self, name: &str) -> Option<Vec<u8>> {
        self.lock().files.get(name).map(|f| f.live.clone())
    }

    /// Replaces a file's live and durable bytes, for tests that damage a log on purpose.
    pub fn set_file(&self, name: &str, bytes: Vec<u8>) {
        let mut state = self.lock();
        if let Some((dir, _)) = name.rsplit_once('/') {
            state.dirs.insert(dir.to_owned(), true);
        }
        let file = state.files.entry(name.to_owned()).or_default();
        file.allocated = bytes.len() as u64;
        file.live = bytes.clone();
        file.durable = bytes;
        file.pending.clear();
        file.entry_durable = true;
    }

    /// Names of every file on the disk.
    pub fn files(&self) -> Vec<String> {
        self.lock().files.keys().cloned().collect()
    }

    pub(crate) fn backend(&self, name: &str) -> SimBackend {
        SimBackend {
            disk: self.clone(),
            name: name.to_owned(),
        }
    }

    pub(crate) fn log_dir(&self, dir: &str) -> SimLogDir {
        SimLogDir {
            disk: self.clone(),
            prefix: format!("{dir}/"),
        }
    }
}

/// The file called `name`, created if absent. Log files are created through their directory,
/// whose entry needs a directory sync; the database file (opened by redb, which cannot sync a
/// directory) is taken to exist durably from its first write, as a pre-existing file would.
fn file_mut<'a>(state: &'a mut DiskState, name: &str) -> &'a mut SimFile {
    state
        .files
        .entry(name.to_owned())
        .or_insert_with(|| SimFile {
            entry_durable: !name.starts_with("wal/"),
            ..SimFile::default()
        })
}

fn apply_write(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = usize::try_from(offset).unwrap_or(usize::MAX);
    let end = start.saturating_add(data.len());
    if image.len() < end {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

#[cfg(test)]
mod tests;
