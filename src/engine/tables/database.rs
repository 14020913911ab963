//! The redb database handle, which the writer may close and reopen in place.
//!
//! redb latches any I/O error: after one, every operation on that `Database` fails until it is
//! closed and opened again. The writer does that when it recovers in place (see
//! `writer::restore`), so the handle lives in a slot that is empty while it is reopened.
//! Readers hold the read lock only while they read; the writer takes the write lock to reopen
//! and to compact (which needs the database to itself).

use parking_lot::{MappedRwLockReadGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use redb::Database;

use crate::error::StoreError;

use crate::engine::poison::Poison;

#[derive(Debug)]
pub(crate) struct DbSlot {
    db: RwLock<Option<Database>>,
}

impl DbSlot {
    pub(crate) fn new(db: Database) -> Self {
        DbSlot {
            db: RwLock::new(Some(db)),
        }
    }

    /// The open database, for a read; an error while it is being reopened after a failure.
    pub(crate) fn read<'a>(
        &'a self,
        poison: &Poison,
    ) -> Result<MappedRwLockReadGuard<'a, Database>, StoreError> {
        RwLockReadGuard::try_map(self.db.read(), Option::as_ref).map_err(|_| closed(poison))
    }

    #[cfg(feature = "tokio")]
    /// [`DbSlot::read`] if it can be had without waiting (`None` while the writer holds the
    /// database to itself, to compact or reopen it).
    pub(crate) fn try_read<'a>(
        &'a self,
        poison: &Poison,
    ) -> Option<Result<MappedRwLockReadGuard<'a, Database>, StoreError>> {
        let guard = self.db.try_read()?;
        Some(RwLockReadGuard::try_map(guard, Option::as_ref).map_err(|_| closed(poison)))
    }

    /// The slot itself, for the writer: to compact, or to close and reopen the database.
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, Option<Database>> {
        self.db.write()
    }
}

/// The error for a read while the database is closed: the failure that closed it.
fn closed(poison: &Poison) -> StoreError {
    poison.check().err().unwrap_or(StoreError::Closed)
}
