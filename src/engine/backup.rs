//! Backups: the store copied, while it serves, into a new store directory.
//!
//! The copy is logical: every table read from one redb snapshot and written into a fresh
//! database in one durable transaction. The file's bytes are never copied: the writer changes
//! them underneath, and redb marks a file it has open as needing repair. The snapshot is taken
//! after a barrier through the writer ([`Engine::publish_acknowledged`]): in `Wal` mode a group
//! is acknowledged once its log frame is synced, and reaches redb only when its epoch is
//! committed; the barrier commits it, so the snapshot holds every write acknowledged before
//! the backup began. A snapshot holds whole groups, so the copy is the store as it was between
//! two groups: a pair's record, its business rows and its outbox messages are all in it, or
//! none is.
//!
//! The backup runs on the caller's thread, never the writer's: the writer goes on committing
//! while the tables are copied, and only the snapshot (a redb read transaction) is held.
//!
//! Every copy is marked as a restore that may lag (`restore_mark::set_pending`,
//! [`Guarantee::MayLag`], with the last log frame its snapshot holds): the store it was taken
//! from goes on acknowledging writes the copy lacks. The copy's first open starts its restore
//! window (`model::restore`), in which unknown keys answer `Recovered`.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use redb::{Database, MultimapTableHandle, ReadTransaction, ReadableDatabase, TableHandle};

use crate::error::{BackupError, StoreError};
use crate::model::config::Config;
use crate::model::maintenance::BackedUp;
use crate::model::replica::Guarantee;
use crate::storage::{BackupDir, check_backup_destination};

use super::Engine;
use super::poison::Poison;
use crate::engine::reads::scan::unpanicked;
use crate::engine::tables::database::DbSlot;
use crate::engine::tables::layout::InternalTables;
use crate::engine::tables::meta;
use crate::engine::tables::registry::{Registry, TableOps};
use crate::engine::tables::restore_mark;
use crate::model::restore::PendingRestore;

/// Entries copied, by what they are.
#[derive(Debug, Default)]
struct Copied {
    records: u64,
    messages: u64,
    business_rows: u64,
    /// The last log frame the snapshot holds (`meta::applied`).
    last_frame: u64,
}

/// What a copy reads: the database and what names its tables. Not the engine: the shipper
/// holds one to make snapshots (`engine::shipping`), and must be able to make the last one
/// while the engine closes; it holds nothing that holds the shipper, so no cycle keeps the
/// store open.
#[derive(Debug, Clone)]
pub(in crate::engine) struct Copier {
    db: Arc<DbSlot>,
    poison: Arc<Poison>,
    config: Arc<Config>,
    registry: Arc<Registry>,
    tables: InternalTables,
}

impl Engine {
    /// Copies the store into the new store directory `dest` (see the module doc).
    pub(crate) fn backup(&self, dest: &Path) -> Result<BackedUp, BackupError> {
        let started = Instant::now();
        // Refusals first: a bad destination or an unknown table writes nothing anywhere.
        check_backup_destination(dest)?;
        self.publish_acknowledged()?;
        let copier = self.copier();
        let snapshot = copier.published_snapshot()?;
        copier
            .copy_snapshot(snapshot, dest, started)
            .map(|(backed_up, _)| backed_up)
    }

    /// What a copy of this store reads.
    pub(in crate::engine) fn copier(&self) -> Copier {
        Copier {
            db: self.shared.db.clone(),
            poison: self.shared.poison.clone(),
            config: self.shared.config.clone(),
            registry: self.shared.registry.clone(),
            tables: self.shared.tables,
        }
    }
}

impl Copier {
    /// A redb read transaction on what the writer last published.
    pub(in crate::engine) fn published_snapshot(&self) -> Result<ReadTransaction, StoreError> {
        Ok(self.db.read(&self.poison)?.begin_read()?)
    }

    /// Copies `snapshot` into the new store directory `dest`, which was checked to be empty;
    /// also returns the last log frame the snapshot holds (`meta::applied`), which a shipped
    /// snapshot is tagged with.
    pub(in crate::engine) fn copy_snapshot(
        &self,
        snapshot: ReadTransaction,
        dest: &Path,
        started: Instant,
    ) -> Result<(BackedUp, u64), BackupError> {
        let tables = self.tables_to_copy(&snapshot)?;
        let dir = BackupDir::create(dest)?;
        let db = dir.database(self.config.memory().redb_cache)?;
        let copied = unpanicked(|| self.copy(&snapshot, &db, &tables))?;
        drop(snapshot);
        // Read back as an open would: the copy's metadata loads, and names no log segment.
        let meta = meta::load(&db).map_err(|e| StoreError::Internal {
            message: format!("the backup's metadata does not read back: {e}"),
        })?;
        assert!(
            meta.log_checkpoint.segment.is_none(),
            "a backup has no log, so its metadata must name no log segment"
        );
        let bytes = dir.place(db)?;
        let backed_up = BackedUp {
            records: copied.records,
            messages: copied.messages,
            business_rows: copied.business_rows,
            bytes,
            next_fence: meta.next_fence,
            duration: started.elapsed(),
        };
        tracing::info!(
            dest = %dest.display(),
            records = backed_up.records,
            messages = backed_up.messages,
            business_rows = backed_up.business_rows,
            bytes = backed_up.bytes,
            next_fence = backed_up.next_fence,
            ms = backed_up.duration.as_millis() as u64,
            "backed up the store"
        );
        Ok((backed_up, copied.last_frame))
    }

    /// Every table of this build the store registered; an error naming a table of the
    /// snapshot's file that is not one of them (its types are unknown, so it cannot be copied).
    fn tables_to_copy(
        &self,
        snapshot: &ReadTransaction,
    ) -> Result<Vec<&dyn TableOps>, BackupError> {
        let known: Vec<&dyn TableOps> = self.registry.tables().collect();
        let plain = snapshot.list_tables()?.map(|t| t.name().to_owned());
        let multimap = snapshot
            .list_multimap_tables()?
            .map(|t| t.name().to_owned());
        for name in plain.chain(multimap) {
            if !known.iter().any(|table| table.name() == name) {
                return Err(BackupError::UnregisteredTable { name });
            }
        }
        Ok(known)
    }

    /// Copies `tables` from the snapshot into the new database `db` in one durable
    /// transaction, with the metadata of a store without a log that is a restore which may lag.
    fn copy(
        &self,
        snapshot: &ReadTransaction,
        db: &Database,
        tables: &[&dyn TableOps],
    ) -> Result<Copied, BackupError> {
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate)?;
        let internal = self.tables;
        let mut copied = Copied::default();
        for table in tables {
            let rows = table.copy(snapshot, &txn)?;
            let id = self.registry.id(table.name());
            let count = match id {
                Some(id) if id == internal.claims || id == internal.done => &mut copied.records,
                Some(id) if id == internal.outbox || id == internal.dead_letters => {
                    &mut copied.messages
                }
                Some(id) if internal.ids().contains(&id) => continue,
                _ => &mut copied.business_rows,
            };
            *count += rows;
        }
        meta::without_log(&txn)?;
        // A copy is older than the store it was taken from, which goes on acknowledging
        // writes: opened in its place, it may lack some, so it is marked as a restore that may
        // lag (a restore that knows better, from a replica's frames, marks it again).
        copied.last_frame = meta::applied(snapshot)?;
        let now = self.config.clock.now();
        restore_mark::set_pending(
            &txn,
            PendingRestore {
                guarantee: Guarantee::MayLag,
                last_frame: copied.last_frame,
                // A store inside a window of its own passes it on, as its frames do.
                window_end: self
                    .config
                    .restore
                    .restored()
                    .filter(|w| w.may_have_run_elsewhere(now))
                    .map(|w| w.ends_at),
                not_before: now,
            },
        )?;
        txn.commit()?;
        Ok(copied)
    }
}
