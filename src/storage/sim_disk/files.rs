//! The simulated disk's files as the store opens them: the database file redb reads and
//! writes, and the log's directory and segments.

use std::io;

use super::SimDisk;
use crate::storage::{LogDir, LogFile};

/// The database file on a [`SimDisk`], as redb sees it.
#[derive(Debug)]
pub(crate) struct SimBackend {
    pub(super) disk: SimDisk,
    pub(super) name: String,
}

impl redb::StorageBackend for SimBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.disk.len(&self.name)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.disk.read(&self.name, offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.disk.set_len(&self.name, len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.disk.sync(&self.name)
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.disk.write(&self.name, offset, data)
    }
}

/// The log directory on a [`SimDisk`].
#[derive(Debug)]
pub(crate) struct SimLogDir {
    pub(super) disk: SimDisk,
    pub(super) prefix: String,
}

impl LogDir for SimLogDir {
    fn list(&self) -> io::Result<Vec<String>> {
        self.disk.list(&self.prefix)
    }

    fn open(&self, name: &str) -> io::Result<Box<dyn LogFile>> {
        let path = format!("{}{name}", self.prefix);
        if !self.disk.files().contains(&path) {
            return Err(io::ErrorKind::NotFound.into());
        }
        Ok(Box::new(SimLogFile {
            disk: self.disk.clone(),
            name: path,
        }))
    }

    fn create(&self, name: &str) -> io::Result<Box<dyn LogFile>> {
        let path = format!("{}{name}", self.prefix);
        self.disk.create(&path)?;
        Ok(Box::new(SimLogFile {
            disk: self.disk.clone(),
            name: path,
        }))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.disk.remove(&format!("{}{name}", self.prefix));
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        self.disk.sync_dir(&self.prefix)
    }
}

#[derive(Debug)]
struct SimLogFile {
    disk: SimDisk,
    name: String,
}

impl LogFile for SimLogFile {
    fn len(&self) -> io::Result<u64> {
        self.disk.len(&self.name)
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.disk.read(&self.name, offset, buf)
    }

    fn write_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.disk.write(&self.name, offset, data)
    }

    fn sync_data(&mut self) -> io::Result<()> {
        self.disk.sync(&self.name)
    }
}
