//! The log directory on the real file system.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use super::fs;
use super::{LogDir, LogFile};

#[derive(Debug)]
pub(crate) struct FsLogDir {
    path: PathBuf,
}

impl FsLogDir {
    /// The log directory at `path`, created (`0700`, its entry synced into the store's
    /// directory) if absent.
    pub(crate) fn open(path: &Path) -> io::Result<FsLogDir> {
        fs::create_dir_durable(path)?;
        Ok(FsLogDir {
            path: path.to_path_buf(),
        })
    }
}

impl LogDir for FsLogDir {
    fn list(&self) -> io::Result<Vec<String>> {
        file_names(&self.path)
    }

    fn open(&self, name: &str) -> io::Result<Box<dyn LogFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path.join(name))?;
        Ok(Box::new(FsLogFile { file }))
    }

    fn create(&self, name: &str) -> io::Result<Box<dyn LogFile>> {
        let file = fs::create_private(&self.path.join(name))?;
        Ok(Box::new(FsLogFile { file }))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        std::fs::remove_file(self.path.join(name))
    }

    fn sync(&self) -> io::Result<()> {
        File::open(&self.path)?.sync_all()
    }
}

#[derive(Debug)]
struct FsLogFile {
    file: File,
}

impl LogFile for FsLogFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    #[cfg(unix)]
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }

    #[cfg(unix)]
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, data, offset)
    }

    #[cfg(not(unix))]
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = &self.file;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
    }

    #[cfg(not(unix))]
    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        use std::io::{Seek, SeekFrom, Write};
        self.file.seek(SeekFrom::Start(offset))?;
        self.file.write_all(data)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// The names of the regular files in `dir` (a log directory's segments and strays).
pub(crate) fn file_names(dir: &Path) -> io::Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file()
            && let Some(name) = entry.file_name().to_str()
        {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}
