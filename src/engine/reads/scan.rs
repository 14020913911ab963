//! Reads outside the writer: a scope's record, business snapshots, and the scans of the
//! claims (stats, abandoned work). None of them waits for a sync; only a read that must see
//! every acknowledged write asks the writer to publish first.

use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::MappedRwLockReadGuard;
use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition};

use crate::error::StoreError;
use crate::model::clock::Timestamp;
use crate::model::config::Durability;
use crate::model::maintenance::Abandoned;
use crate::model::record::{Record, RecordState, Visibility};
use crate::model::scope::Scope;
use crate::model::stats::Stats;

use crate::engine::Engine;
use crate::engine::requests;
use crate::engine::tables::database::DbSlot;
use crate::engine::tables::layout::{CLAIMS, decode_stored};
use crate::engine::tables::overlay::Overlaid;
use crate::engine::tables::partitions::done_key;
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
        let Some(record) = self.read_record(scope, now)? else {
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
            partitions: self.shared.partitions.all().partitions().len() as u64,
            filter_bytes: self.shared.partitions.filter_bytes() as u64,
            restore_window: self.shared.config.restore.restored(),
            shipping: self.shared.shipper.as_ref().map(|s| s.stats()),
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

    /// Entries per table (constant time in redb), and the claim whose lease ends first (a scan
    /// of the claims, which hold only the work in flight and abandoned work).
    fn counted(&self, txn: &ReadTransaction) -> Result<Counted, StoreError> {
        let tables = self.shared.tables;
        let len = |id| self.shared.registry.table(id).len(txn);
        let (in_progress, done) = (len(tables.claims)?, len(tables.done)?);
        let tombstones = self.shared.partitions.tombstones().min(done);
        Ok(Counted {
            records: in_progress + done,
            in_progress,
            completed: done - tombstones,
            tombstones,
            first_in_progress: claims_in(txn)?
                .into_iter()
                .min_by_key(|(_, record)| lease_of(record))
                .map(|(_, record)| record.created_at),
            outbox: crate::engine::requests::outbox::counts_in(txn)?,
        })
    }

    /// In-progress records whose lease has expired, oldest lease first, at most `limit`: work
    /// that a crashed or stuck attempt left unfinished. A scan of the claims (never of the
    /// completed records), from a snapshot that includes every acknowledged write.
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

    /// The stored record of a scope (expired records included), as of `now`: from the overlay
    /// where a durable group not yet published wrote it, else from redb's published state.
    /// Answered while the store is poisoned too: reads never depend on the writer.
    pub(in crate::engine) fn read_record(
        &self,
        scope: &Scope,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        self.lookup(scope, now, |slot| slot.read(&self.shared.poison).map(Some))
            .and_then(|found| found.ok_or(StoreError::Closed))
    }

    /// [`Engine::read_record`] if it can run without waiting: `None` while the file is held
    /// exclusively (by a compaction or a reopen). For async callers, whose runtime worker must
    /// not wait that long; a read of cached pages takes microseconds.
    #[cfg(feature = "tokio")]
    pub(in crate::engine) fn try_read_record(
        &self,
        scope: &Scope,
        now: Timestamp,
    ) -> Option<Result<Option<Record>, StoreError>> {
        self.lookup(scope, now, |slot| {
            slot.try_read(&self.shared.poison).transpose()
        })
        .transpose()
    }

    /// A record lookup: the claims, then the partitions that may hold the key, newest first;
    /// the first record found is the answer. The overlay is read for every candidate key at
    /// once, before any snapshot is taken: the writer publishes (commits) before it clears the
    /// overlay, so a key the overlay does not have is in any snapshot begun after that read.
    /// `db` gives the file, or `Ok(None)` if it cannot be had without waiting (the lookup then
    /// answers `Ok(None)` too).
    fn lookup<'a>(
        &'a self,
        scope: &Scope,
        now: Timestamp,
        db: impl FnOnce(&'a DbSlot) -> Result<Option<MappedRwLockReadGuard<'a, Database>>, StoreError>,
    ) -> Result<Option<Option<Record>>, StoreError> {
        let key = scope.encode();
        let partitions = &self.shared.partitions;
        let candidates =
            partitions.candidates(partitions.hash(key), now, self.shared.config.tombstone_ttl);
        let done_keys: Vec<Vec<u8>> = candidates.iter().map(|&p| done_key(p, key)).collect();
        let (claim, done) = self.shared.overlay.lookup(key, &done_keys);
        let decode = |bytes: &[u8]| decode_stored(key, bytes).map(|r| Some(Some(r)));
        if let Overlaid::Put(bytes) = &claim {
            return decode(bytes);
        }
        let Some(db) = db(&self.shared.db)? else {
            return Ok(None);
        };
        unpanicked(|| {
            let snapshot = self.shared.db.records(&db)?;
            if claim == Overlaid::Absent
                && let Some(bytes) = snapshot.claims.get(key)?
            {
                return decode(bytes.value());
            }
            for (found, done_key) in done.iter().zip(&done_keys) {
                match found {
                    Overlaid::Put(bytes) => return decode(bytes),
                    Overlaid::Deleted => {}
                    Overlaid::Absent => {
                        if let Some(bytes) = snapshot.done.get(done_key.as_slice())? {
                            return decode(bytes.value());
                        }
                    }
                }
            }
            Ok(Some(None))
        })
    }
}

/// Runs a read of the file, turning a panic inside redb (which some damaged files cause) into
/// an error that says the file is damaged: a read must never take the caller's thread down.
pub(in crate::engine) fn unpanicked<T, E: From<StoreError>>(
    read: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|panic| {
        Err(StoreError::Damaged {
            detail: crate::model::panic::panic_message(panic.as_ref()),
        }
        .into())
    })
}

/// Every claim in the snapshot: scope bytes and record.
fn claims_in(txn: &ReadTransaction) -> Result<Vec<(Vec<u8>, Record)>, StoreError> {
    let claims = txn.open_table(raw(CLAIMS))?;
    let mut out = Vec::new();
    for entry in claims.iter()? {
        let (scope, bytes) = entry?;
        out.push((
            scope.value().to_vec(),
            decode_stored(scope.value(), bytes.value())?,
        ));
    }
    Ok(out)
}

/// When a claim's lease ends (the end of time for a record that is not one).
fn lease_of(record: &Record) -> Timestamp {
    match record.state {
        RecordState::InProgress { lease_until, .. } => lease_until,
        _ => Timestamp::from_millis(u64::MAX),
    }
}

/// The claims whose lease ended by `now`, oldest lease first, at most `limit`.
fn abandoned_in(
    txn: &ReadTransaction,
    now: Timestamp,
    limit: usize,
) -> Result<Vec<Abandoned>, StoreError> {
    let mut due: Vec<(Vec<u8>, Record)> = claims_in(txn)?
        .into_iter()
        .filter(|(_, record)| lease_of(record) <= now)
        .collect();
    due.sort_by_key(|(_, record)| lease_of(record));
    due.truncate(limit);
    due.into_iter()
        .map(|(scope_bytes, record)| {
            let scope = Scope::decode(&scope_bytes).map_err(|e| StoreError::Internal {
                message: format!("the claims hold a malformed scope: {e}"),
            })?;
            let RecordState::InProgress {
                lease_until,
                checkpoint,
            } = record.state
            else {
                return Err(StoreError::Internal {
                    message: format!("the claims hold a record of {scope} that is not in progress"),
                });
            };
            Ok(Abandoned {
                scope,
                fingerprint: record.fingerprint,
                fence: record.fence,
                attempt: record.attempt,
                created_at: record.created_at,
                lease_until,
                checkpoint,
            })
        })
        .collect()
}
