//! Reads outside the writer: a scope's record, business snapshots, and the scans through the
//! indexes (stats, abandoned work). None of them waits for a sync; only a read that must see
//! every acknowledged write asks the writer to publish first.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition};

use crate::error::StoreError;
use crate::model::clock::Timestamp;
use crate::model::config::Durability;
use crate::model::maintenance::Abandoned;
use crate::model::record::{Record, RecordState, Visibility};
use crate::model::scope::Scope;
use crate::model::stats::Stats;

use super::overlay::Overlaid;
use crate::engine::Engine;
use crate::engine::requests;
use crate::engine::tables::database::DbSlot;
use crate::engine::tables::layout::{
    LEASES, RECORDS, decode_stored, index_bound_after, split_index_key,
};
use crate::engine::tables::read_tx::ReadTx;

/// The store's own tables, read as bytes.
fn raw(name: &str) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
    TableDefinition::new(name)
}

/// How many entries the store's tables hold: the part of [`Stats`] read from redb.
#[derive(Debug, Default)]
struct Counted {
    records: u64,
    in_progress: u64,
    completed: u64,
    tombstones: u64,
    /// `created_at` of the in-progress record whose lease ends first.
    first_in_progress: Option<Timestamp>,
    outbox: crate::engine::requests::outbox::OutboxCounts,
}

impl Engine {
    /// The record of `scope` as `begin` sees it now: `None` if absent or gone past its TTL
    /// (and its tombstone), a `Tombstone` if past its TTL but within the tombstone TTL,
    /// whether or not eviction has run yet.
    pub(crate) fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let now = self.shared.config.clock.now();
        let Some(record) = self.read_record(scope)? else {
            return Ok(None);
        };
        Ok(
            match record.visibility(now, self.shared.config.tombstone_ttl) {
                Visibility::Live => Some(record),
                Visibility::Tombstone {
                    completed_at,
                    until,
                } => Some(Record {
                    state: RecordState::Tombstone {
                        completed_at,
                        until,
                    },
                    ..record
                }),
                Visibility::Gone => None,
            },
        )
    }

    /// A read-only snapshot of the business tables that includes every acknowledged write.
    pub(crate) fn read(&self) -> Result<ReadTx, StoreError> {
        self.publish_acknowledged()?;
        let txn = self.shared.db.read(&self.shared.poison)?.begin_read()?;
        Ok(ReadTx::new(txn, self.shared.registry.clone()))
    }

    /// Bytes in redb's page cache now (counted only when redb is built with its
    /// `cache_metrics` feature, which feature `testing` turns on; else 0).
    #[cfg(feature = "testing")]
    pub(crate) fn redb_cache_used(&self) -> Result<usize, StoreError> {
        use redb::ReadableDatabase as _;
        Ok(self
            .shared
            .db
            .read(&self.shared.poison)?
            .cache_stats()
            .used_bytes())
    }

    /// The store's state and activity. Records by state are as of the last publish (at most
    /// one epoch behind), so that monitoring never waits for a busy writer; they are zero only
    /// while the file itself cannot be read.
    pub(crate) fn stats(&self) -> Result<Stats, StoreError> {
        let counted = match self.with_published(|txn| self.counted(txn)) {
            Ok(counted) => counted,
            Err(e @ StoreError::CorruptRecord { .. }) => return Err(e),
            Err(_) => Counted::default(),
        };
        Ok(self.stats_with(counted))
    }

    /// [`Engine::stats`] with the records by state exact: the writer publishes first.
    pub(crate) fn exact_stats(&self) -> Result<Stats, StoreError> {
        self.publish_acknowledged()?;
        let counted = self.with_published(|txn| self.counted(txn))?;
        Ok(self.stats_with(counted))
    }

    fn stats_with(&self, counted: Counted) -> Stats {
        let now = self.shared.config.clock.now();
        let c = &self.shared.counters;
        let since_checkpoint = (self.shared.config.durability == Durability::Wal).then(|| {
            let last = c.last_checkpoint_ms.load(Ordering::Relaxed);
            c.opened
                .elapsed()
                .saturating_sub(Duration::from_millis(last))
        });
        let mut stats = Stats {
            records: counted.records,
            in_progress: counted.in_progress,
            completed: counted.completed,
            tombstones: counted.tombstones,
            oldest_in_progress: counted
                .first_in_progress
                .map(|created_at| now.saturating_since(created_at)),
            log_bytes_since_checkpoint: c.log_since_checkpoint.load(Ordering::Relaxed),
            since_checkpoint,
            waiting: self.shared.watchers.waiting(),
            poisoned: self.shared.poison.check().err().map(|e| e.to_string()),
            loose_permissions: self.storage.loose_permissions().unwrap_or_default(),
            outbox_pending: counted.outbox.pending,
            oldest_pending_message: counted
                .outbox
                .oldest
                .map(|committed_at| now.saturating_since(committed_at)),
            dead_letters: counted.outbox.dead_letters,
            memory_budget: self.shared.config.memory_budget,
            redb_cache_bytes: self.shared.config.memory().redb_cache,
            ..Stats::default()
        };
        c.fill(&mut stats);
        // The gauges are set here, where they are computed: an exporter's scrape that calls
        // `Store::stats` first (the edge service's /metrics does) reads them fresh.
        crate::metrics::records(
            stats.in_progress,
            stats.completed,
            stats.tombstones,
            stats.oldest_in_progress,
        );
        if let Ok(bytes) = self.storage.db_len() {
            crate::metrics::gauge(crate::metrics::FILE_BYTES, bytes as f64);
        }
        stats
    }

    /// Entries per table (constant time in redb), and the first lease's record.
    fn counted(&self, txn: &ReadTransaction) -> Result<Counted, StoreError> {
        let tables = self.shared.tables;
        let len = |id| self.shared.registry.table(id).len(txn);
        Ok(Counted {
            records: len(tables.records)?,
            in_progress: len(tables.leases)?,
            completed: len(tables.expiry)?,
            tombstones: len(tables.tombstones)?,
            first_in_progress: first_in_progress(txn)?,
            outbox: crate::engine::requests::outbox::counts_in(txn)?,
        })
    }

    /// In-progress records whose lease has expired, oldest lease first, at most `limit`: work
    /// that a crashed or stuck attempt left unfinished. Read through the lease index (never a
    /// scan of the records), from a snapshot that includes every acknowledged write.
    pub(crate) fn abandoned(&self, limit: usize) -> Result<Vec<Abandoned>, StoreError> {
        let now = self.shared.config.clock.now();
        self.publish_acknowledged()?;
        self.with_published(|txn| abandoned_in(txn, now, limit))
    }

    /// Asks the writer to publish durable groups that redb readers cannot see yet, if any.
    pub(in crate::engine) fn publish_acknowledged(&self) -> Result<(), StoreError> {
        if self.shared.overlay.is_unpublished() {
            self.run(requests::publish())?;
        }
        Ok(())
    }

    /// Runs `read` on a redb snapshot of what is published, without asking the writer for
    /// anything. The file stays locked for reading meanwhile, so a compaction waits for it to
    /// finish rather than fail on its snapshot.
    fn with_published<T>(
        &self,
        read: impl FnOnce(&ReadTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let db = self.shared.db.read(&self.shared.poison)?;
        unpanicked(|| read(&db.begin_read()?))
    }

    /// The stored record of a scope (expired records included): from the overlay if a durable
    /// group not yet published wrote it, else from a redb read transaction. Answered while the
    /// store is poisoned too: reads never depend on the writer.
    pub(in crate::engine) fn read_record(
        &self,
        scope: &Scope,
    ) -> Result<Option<Record>, StoreError> {
        // The overlay first, then redb: the writer publishes (commits) before it clears the
        // overlay, so a record missing here is in any snapshot begun after this lookup.
        if let Some(found) = self.overlaid(scope) {
            return found;
        }
        let db = self.shared.db.read(&self.shared.poison)?;
        record_in(&self.shared.db, &db, scope)
    }

    /// [`Engine::read_record`] if it can run without waiting: `None` while the file is held
    /// exclusively (by a compaction or a reopen). For async callers, whose runtime worker must
    /// not wait that long; a read of cached pages takes microseconds.
    #[cfg(feature = "tokio")]
    pub(in crate::engine) fn try_read_record(
        &self,
        scope: &Scope,
    ) -> Option<Result<Option<Record>, StoreError>> {
        if let Some(found) = self.overlaid(scope) {
            return Some(found);
        }
        Some(match self.shared.db.try_read(&self.shared.poison)? {
            Ok(db) => record_in(&self.shared.db, &db, scope),
            Err(e) => Err(e),
        })
    }

    /// The scope's record as a durable group not yet published left it, if one did.
    fn overlaid(&self, scope: &Scope) -> Option<Result<Option<Record>, StoreError>> {
        match self.shared.overlay.lookup(scope.encode()) {
            Overlaid::Put(bytes) => Some(decode_stored(scope.encode(), &bytes).map(Some)),
            Overlaid::Deleted => Some(Ok(None)),
            Overlaid::Absent => None,
        }
    }
}

/// The scope's record in redb's published state, from the snapshot readers share.
fn record_in(slot: &DbSlot, db: &Database, scope: &Scope) -> Result<Option<Record>, StoreError> {
    unpanicked(|| {
        let table = slot.records(db)?;
        table
            .get(scope.encode())?
            .map(|bytes| decode_stored(scope.encode(), bytes.value()))
            .transpose()
    })
}

/// Runs a read of the file, turning a panic inside redb (which some damaged files cause) into
/// an error that says the file is damaged: a read must never take the caller's thread down.
fn unpanicked<T>(read: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|panic| {
        Err(StoreError::Damaged {
            detail: crate::model::panic::panic_message(panic.as_ref()),
        })
    })
}

/// `created_at` of the in-progress record whose lease ends first.
fn first_in_progress(txn: &ReadTransaction) -> Result<Option<Timestamp>, StoreError> {
    let leases = txn.open_table(raw(LEASES))?;
    let Some((first, _)) = leases.first()? else {
        return Ok(None);
    };
    let Some((_, scope)) = split_index_key(first.value()) else {
        return Ok(None);
    };
    let records = txn.open_table(raw(RECORDS))?;
    records
        .get(scope)?
        .map(|bytes| decode_stored(scope, bytes.value()).map(|record| record.created_at))
        .transpose()
}

/// The lease index's entries due at `now`, with their records, while the record still has the
/// lease the entry indexes.
fn abandoned_in(
    txn: &ReadTransaction,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<Abandoned>, StoreError> {
    let leases = txn.open_table(raw(LEASES))?;
    let records = txn.open_table(raw(RECORDS))?;
    let end = index_bound_after(now);
    let mut out = Vec::new();
    for entry in leases.range::<&[u8]>(..end.as_slice())? {
        if out.len() >= limit {
            break;
        }
        let (key, _) = entry?;
        let Some((lease_until, scope_bytes)) = split_index_key(key.value()) else {
            continue;
        };
        let Some(bytes) = records.get(scope_bytes)? else {
            continue;
        };
        let record = decode_stored(scope_bytes, bytes.value())?;
        let scope = Scope::decode(scope_bytes).map_err(|e| StoreError::Internal {
            message: format!("the lease index holds a malformed scope: {e}"),
        })?;
        if let RecordState::InProgress {
            lease_until: current,
            checkpoint,
        } = record.state
            && current == lease_until
        {
            out.push(Abandoned {
                scope,
                fingerprint: record.fingerprint,
                fence: record.fence,
                attempt: record.attempt,
                created_at: record.created_at,
                lease_until,
                checkpoint,
            });
        }
    }
    Ok(out)
}
