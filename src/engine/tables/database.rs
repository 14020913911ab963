//! The redb database handle, which the writer may close and reopen in place.
//!
//! redb latches any I/O error: after one, every operation on that `Database` fails until it is
//! closed and opened again. The writer does that when it recovers in place (see
//! `writer::restore`), so the handle lives in a slot that is empty while it is reopened.
//! Readers hold the read lock only while they read; the writer takes the write lock to reopen
//! and to compact (which needs the database to itself).
//!
//! The slot also keeps the record tables as last published, open in one read transaction that
//! every `begin` shares until the writer publishes again (why, and what it costs: "Readers
//! share one snapshot between publishes" in `docs/design.md`).

use std::sync::Arc;

use parking_lot::{MappedRwLockReadGuard, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use redb::{Database, ReadOnlyTable, ReadableDatabase, TableDefinition};

use crate::error::StoreError;

use crate::engine::poison::Poison;

use super::layout::{CLAIMS, DONE};

/// A record table, read only, as a snapshot saw it.
pub(crate) type RawSnapshot = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The record tables, as one snapshot saw them.
#[derive(Debug)]
pub(crate) struct RecordsSnapshot {
    pub(crate) claims: RawSnapshot,
    pub(crate) done: RawSnapshot,
}

#[derive(Debug)]
pub(crate) struct DbSlot {
    db: RwLock<Option<Database>>,
    /// The record tables in a snapshot begun after the last publish, shared by readers; `None`
    /// until a reader needs it. Dropped at every publish and whenever the writer takes the
    /// slot, so it never hides a published write and never holds a snapshot open across a
    /// compaction or a reopen (redb refuses to compact with a read transaction open).
    records: Mutex<Option<Arc<RecordsSnapshot>>>,
}

impl DbSlot {
    pub(crate) fn new(db: Database) -> Self {
        DbSlot {
            db: RwLock::new(Some(db)),
            records: Mutex::new(None),
        }
    }

    /// The record tables as last published, for a reader holding `db` (from
    /// [`DbSlot::read`]). Drop it before the guard: the writer drops the shared copy when it
    /// takes the slot, and a copy kept past the guard would keep the snapshot open.
    ///
    /// A snapshot is opened under the lock, so one opened before a publish can never be
    /// stored after [`DbSlot::published`] dropped the last one.
    pub(crate) fn records(&self, db: &Database) -> Result<Arc<RecordsSnapshot>, StoreError> {
        let mut shared = self.records.lock();
        if let Some(table) = &*shared {
            return Ok(table.clone());
        }
        let txn = db.begin_read()?;
        let table = Arc::new(RecordsSnapshot {
            claims: txn.open_table(TableDefinition::new(CLAIMS))?,
            done: txn.open_table(TableDefinition::new(DONE))?,
        });
        *shared = Some(table.clone());
        Ok(table)
    }

    /// Called by the writer after a redb commit and before it clears the overlay: readers
    /// that miss the overlay from then on open a snapshot that has the commit.
    pub(crate) fn published(&self) {
        let dropped = self.records.lock().take();
        drop(dropped);
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
        let slot = self.db.write();
        // No reader holds a copy now (they drop it before the read guard): this closes the
        // shared snapshot.
        self.published();
        slot
    }
}

/// The error for a read while the database is closed: the failure that closed it.
fn closed(poison: &Poison) -> StoreError {
    poison.check().err().unwrap_or(StoreError::Closed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer takes the slot to compact: the snapshot readers share must be closed by
    /// then, or redb refuses the compaction.
    #[test]
    fn taking_the_slot_closes_the_shared_snapshot() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let db = Database::create(dir.path().join("db.redb"))?;
        let txn = db.begin_write()?;
        txn.open_table(TableDefinition::<&[u8], &[u8]>::new(CLAIMS))?;
        txn.open_table(TableDefinition::<&[u8], &[u8]>::new(DONE))?;
        txn.commit()?;
        let slot = DbSlot::new(db);
        {
            let db = slot.read(&Poison::default())?;
            let records = slot.records(&db)?;
            assert!(records.claims.get(b"k".as_slice())?.is_none());
        }
        let mut held = slot.write();
        let db = held.as_mut().ok_or("the slot holds the database")?;
        db.compact()?;
        Ok(())
    }
}
