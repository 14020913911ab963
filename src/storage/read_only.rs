//! Reading a store's directory without changing it (feature `cli`): the database file opened
//! read-only, and the log's segments read with files opened for reading only.
//!
//! Nothing here may create, write, lock exclusively or remove a file: an operator inspecting a
//! store must leave it exactly as they found it.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use super::{DB_FILE, LOG_DIR, LogDir, LogFile};

/// The log directory of a store, read-only. Opening a segment opens it for reading; every
/// operation that would change the directory fails with `PermissionDenied`.
#[derive(Debug)]
pub(crate) struct ReadOnlyLogDir {
    path: PathBuf,
}

impl ReadOnlyLogDir {
    /// The log directory of the store in `dir`, if it has one (a store never opened with the
    /// log has none).
    pub(crate) fn of_store(dir: &Path) -> Option<ReadOnlyLogDir> {
        let path = dir.join(LOG_DIR);
        path.is_dir().then_some(ReadOnlyLogDir { path })
    }

    /// The directory's path, to name in messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The size of a file of the directory.
    pub(crate) fn len(&self, name: &str) -> io::Result<u64> {
        Ok(std::fs::metadata(self.path.join(name))?.len())
    }
}

fn refused() -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        "the store is opened read-only",
    )
}

impl LogDir for ReadOnlyLogDir {
    fn list(&self) -> io::Result<Vec<String>> {
        super::dir::file_names(&self.path)
    }

    fn open(&self, name: &str) -> io::Result<Box<dyn LogFile>> {
        Ok(Box::new(ReadOnlyFile {
            file: File::open(self.path.join(name))?,
        }))
    }

    fn create(&self, _name: &str) -> io::Result<Box<dyn LogFile>> {
        Err(refused())
    }

    fn remove(&self, _name: &str) -> io::Result<()> {
        Err(refused())
    }

    fn sync(&self) -> io::Result<()> {
        Err(refused())
    }
}

#[derive(Debug)]
struct ReadOnlyFile {
    file: File,
}

impl LogFile for ReadOnlyFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    #[cfg(unix)]
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }

    #[cfg(not(unix))]
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = &self.file;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
    }

    fn write_at(&mut self, _offset: u64, _data: &[u8]) -> io::Result<()> {
        Err(refused())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        Err(refused())
    }
}

/// The database file of the store in `dir`.
pub(crate) fn db_file(dir: &Path) -> PathBuf {
    dir.join(DB_FILE)
}

/// Bytes of one page of [`CopyOnWrite`]'s overlay.
const PAGE: u64 = 4096;

/// A database file read as it is, with every write redb makes kept in memory: what lets a
/// store that was not closed cleanly be read without changing it.
///
/// redb refuses a read-only open of such a file (it would have to repair its allocator state
/// first, which writes). Opened through this backend, redb repairs it in memory; the file is
/// opened for reading only and is never written.
#[derive(Debug)]
pub(crate) struct CopyOnWrite {
    file: File,
    state: std::sync::Mutex<Written>,
}

#[derive(Debug)]
struct Written {
    len: u64,
    pages: std::collections::HashMap<u64, Box<[u8]>>,
}

impl CopyOnWrite {
    /// The database file at `path`, opened for reading.
    pub(crate) fn open(path: &Path) -> io::Result<CopyOnWrite> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(CopyOnWrite {
            file,
            state: std::sync::Mutex::new(Written {
                len,
                pages: std::collections::HashMap::new(),
            }),
        })
    }

    fn state(&self) -> io::Result<std::sync::MutexGuard<'_, Written>> {
        self.state
            .lock()
            .map_err(|_| io::Error::other("a reader panicked"))
    }

    /// Fills `out` from the file at `offset`, zeros past its end.
    fn read_file(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let file_len = self.file.metadata()?.len();
        out.fill(0);
        if offset >= file_len {
            return Ok(());
        }
        let available = usize::try_from(file_len - offset).unwrap_or(usize::MAX);
        let n = out.len().min(available);
        read_exact_at(&self.file, &mut out[..n], offset)
    }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(not(unix))]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = file;
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(buf)
}

impl redb::StorageBackend for CopyOnWrite {
    fn len(&self) -> io::Result<u64> {
        Ok(self.state()?.len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let state = self.state()?;
        self.read_file(offset, out)?;
        let end = offset + out.len() as u64;
        let mut page = offset / PAGE;
        while page * PAGE < end {
            if let Some(bytes) = state.pages.get(&page) {
                let start = (page * PAGE).max(offset);
                let stop = ((page + 1) * PAGE).min(end);
                let from = usize::try_from(start - page * PAGE).unwrap_or(0);
                let to = usize::try_from(start - offset).unwrap_or(0);
                let n = usize::try_from(stop - start).unwrap_or(0);
                out[to..to + n].copy_from_slice(&bytes[from..from + n]);
            }
            page += 1;
        }
        // Bytes past a shrunk length read as zeros, as a truncated file's would.
        if end > state.len {
            let keep = usize::try_from(state.len.saturating_sub(offset)).unwrap_or(0);
            let keep = keep.min(out.len());
            out[keep..].fill(0);
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.state()?.len = len;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.state()?;
        let end = offset + data.len() as u64;
        let mut page = offset / PAGE;
        while page * PAGE < end {
            let start = (page * PAGE).max(offset);
            let stop = ((page + 1) * PAGE).min(end);
            let to = usize::try_from(start - page * PAGE).unwrap_or(0);
            let from = usize::try_from(start - offset).unwrap_or(0);
            let n = usize::try_from(stop - start).unwrap_or(0);
            let bytes = match state.pages.entry(page) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let mut bytes = vec![0u8; PAGE as usize];
                    self.read_file(page * PAGE, &mut bytes)?;
                    e.insert(bytes.into_boxed_slice())
                }
            };
            bytes[to..to + n].copy_from_slice(&data[from..from + n]);
            page += 1;
        }
        state.len = state.len.max(end);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use redb::StorageBackend;

    use super::*;

    /// Writes land in memory across page boundaries, reads merge them over the file, growth
    /// reads as zeros, and the file itself is never changed.
    #[test]
    fn copy_on_write_keeps_writes_in_memory_and_the_file_untouched() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("db");
        let original: Vec<u8> = (0..3 * PAGE).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &original)?;
        let backend = CopyOnWrite::open(&path)?;

        let patch = vec![0xAA; 100];
        backend.write(PAGE - 50, &patch)?; // straddles pages 0 and 1
        backend.set_len(4 * PAGE)?;
        backend.write(3 * PAGE + 10, &[1, 2, 3])?; // past the file's end

        let mut all = vec![0u8; (4 * PAGE) as usize];
        backend.read(0, &mut all)?;
        let mut expected = original.clone();
        expected.resize((4 * PAGE) as usize, 0);
        expected[(PAGE - 50) as usize..(PAGE + 50) as usize].copy_from_slice(&patch);
        expected[(3 * PAGE + 10) as usize..(3 * PAGE + 13) as usize].copy_from_slice(&[1, 2, 3]);
        assert_eq!(all, expected);
        let mut middle = vec![0u8; 10];
        backend.read(PAGE - 5, &mut middle)?;
        assert_eq!(middle, vec![0xAA; 10]);
        assert_eq!(backend.len()?, 4 * PAGE);

        assert_eq!(std::fs::read(&path)?, original, "the file is never written");
        Ok(())
    }
}
