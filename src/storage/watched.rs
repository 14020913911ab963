//! The database file as redb sees it, watched for failed syncs.
//!
//! After a failed `fsync` the kernel may mark the pages it could not write clean: reads keep
//! returning what the process wrote, the disk never gets it, and a later sync that succeeds
//! does not write it either (PostgreSQL's "fsyncgate"). redb reopened over such a file reads
//! the cached bytes and builds its next commits on pages that a power cut takes away. So every
//! sync of the database file goes through here, and a failure is remembered until the writer
//! has rewritten the file (`Storage::rewrite_database`). Everything else is passed through to
//! the backend unchanged, redb's own file locks included.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::{BackendError, StorageBackend};

/// Whether a sync of the open database file has failed: shared by the file's backend, which
/// sets it, and the writer, which rewrites the file before it trusts it again.
#[derive(Debug, Default)]
pub(crate) struct SyncWatch {
    failed: AtomicBool,
}

impl SyncWatch {
    /// Whether a sync failed since the file was last (re)written.
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The file was rewritten and synced from what this process holds: it is trusted again.
    pub(crate) fn reset(&self) {
        self.failed.store(false, Ordering::Release);
    }

    fn saw_failure(&self) {
        if !self.failed.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "a sync of the database file failed: its unsynced pages may never reach the disk, so the file is rewritten before the store trusts it again"
            );
        }
    }
}

/// A redb storage backend whose failed syncs are recorded in a [`SyncWatch`].
#[derive(Debug)]
pub(crate) struct Watched<B> {
    inner: B,
    watch: Arc<SyncWatch>,
}

impl<B> Watched<B> {
    pub(crate) fn new(inner: B, watch: Arc<SyncWatch>) -> Self {
        Watched { inner, watch }
    }
}

type IoResult<T> = Result<T, std::io::Error>;
type LockResult<T> = Result<T, BackendError>;

impl<B: StorageBackend> StorageBackend for Watched<B> {
    fn len(&self) -> IoResult<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> IoResult<()> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> IoResult<()> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> IoResult<()> {
        let synced = self.inner.sync_data();
        if synced.is_err() {
            self.watch.saw_failure();
        }
        synced
    }

    fn write(&self, offset: u64, data: &[u8]) -> IoResult<()> {
        self.inner.write(offset, data)
    }

    fn close(&self) -> IoResult<()> {
        self.inner.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> LockResult<bool> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> LockResult<bool> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> LockResult<()> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> LockResult<()> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> LockResult<()> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> LockResult<bool> {
        self.inner.query_lock_range(start, end)
    }
}
