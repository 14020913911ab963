//! Keeping the store in shape: eviction, compaction, and the store's health.

use std::sync::Arc;

use crate::error::{CompactError, StoreError};
use crate::model::maintenance::{Compacted, Evicted};
use crate::wal::RecoveryReport;

use super::Engine;
use crate::engine::requests;

/// redb compacts in passes; more than this many passes that all moved something is unusual.
const COMPACTION_PASSES: usize = 16;

impl Engine {
    /// Evicts up to `limit` records that are gone (the store's `evict_expired`, and the
    /// sweeper's pass).
    pub(crate) fn evict(&self, limit: usize) -> Result<Evicted, StoreError> {
        let evicted = self.run(requests::evict(limit))??;
        Ok(self.evicted(evicted))
    }

    /// [`Engine::evict`] for async callers.
    #[cfg(feature = "tokio")]
    pub(crate) async fn evict_async(&self, limit: usize) -> Result<Evicted, StoreError> {
        let evicted = self.run_async(requests::evict(limit)).await??;
        Ok(self.evicted(evicted))
    }

    /// Counts and traces what an eviction pass removed.
    fn evicted(&self, evicted: Evicted) -> Evicted {
        let counters = &self.shared.counters;
        counters.evicted(evicted.removed as u64, evicted.tombstones_removed as u64);
        tracing::debug!(
            removed = evicted.removed,
            tombstones_removed = evicted.tombstones_removed,
            backlog = ?evicted.backlog,
            "evicted expired records"
        );
        evicted
    }

    /// Rewrites the database file to give back the space of deleted and overwritten data, on
    /// the writer between groups, after a checkpoint.
    pub(crate) fn compact(&self) -> Result<Compacted, CompactError> {
        let bytes_before = self.db_len()?;
        self.exclusive(|db| {
            for _ in 0..COMPACTION_PASSES {
                if !db.compact()? {
                    break;
                }
            }
            Ok::<(), redb::CompactionError>(())
        })?
        .map_err(|e| match e {
            redb::CompactionError::TransactionInProgress => CompactError::SnapshotOpen,
            e => CompactError::Storage(Arc::new(e)),
        })?;
        let compacted = Compacted {
            bytes_before,
            bytes_after: self.db_len()?,
        };
        tracing::info!(
            bytes_before = compacted.bytes_before,
            bytes_after = compacted.bytes_after,
            "compacted the database file"
        );
        Ok(compacted)
    }

    /// The size of the database file, in bytes.
    fn db_len(&self) -> Result<u64, StoreError> {
        self.storage
            .db_len()
            .map_err(|e| StoreError::Redb(Arc::new(redb::StorageError::Io(e).into())))
    }

    /// Whether writes are refused now, and why: the poison, if any.
    pub(crate) fn writable(&self) -> Result<(), StoreError> {
        self.shared.poison.check()
    }

    /// What the last recovery (at open, or in place) found in the log.
    pub(crate) fn recovery(&self) -> RecoveryReport {
        self.shared.recovery.lock().clone()
    }

    /// Poisons the store as a failure of unknown outcome would, for tests of what a poisoned
    /// store still answers.
    #[cfg(test)]
    pub(crate) fn poison_for_test(&self, cause: &StoreError) {
        self.shared.poison.set(cause);
    }

    /// Holds the file as a compaction does, for tests of what waits on it.
    #[cfg(all(test, feature = "tokio"))]
    pub(crate) fn hold_exclusively(
        &self,
    ) -> parking_lot::RwLockWriteGuard<'_, Option<redb::Database>> {
        self.shared.db.write()
    }
}
