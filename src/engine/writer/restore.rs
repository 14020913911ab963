//! Recovering the store in place after a failure, as a reopen of its directory would, without
//! restarting the process (see "When something fails" in `docs/design.md`).
//!
//! A restore stops the log, gives the writer a database it can trust (reopened if redb latched
//! an error; rewritten first if a sync of the file failed, see `storage::SyncWatch`), replays the
//! log past the checkpoint, and starts a new log. It never reads back a frame whose sync failed:
//! that frame is applied from the copy kept in memory and checkpointed durably before anything
//! else happens, so the log never has to be right about it. Until a restore succeeds the store
//! stays poisoned; a crash at any point of one leaves the last durable checkpoint and the log,
//! which a reopen replays.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use redb::Database;

use super::ship_gate;
use crate::error::{OpenError, RecoveryError, StoreError};
use crate::wal::{Log, RecoveryReport};

use crate::engine::recovery::catch_up::{self, CaughtUp};
use crate::engine::recovery::{guarded, partitions};
use crate::engine::writer::{Appends, Mode, Writer, start_log};

/// Whether recovering in place reopens the redb file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reopen {
    /// Only if redb latched an error (it then refuses everything until reopened), or a sync
    /// of the file failed (it is then rewritten first).
    IfNeeded,
    /// Always: `Store::reopen`, and after a panic inside redb.
    Always,
}

impl Writer {
    /// Restores in place for an epoch that cannot be published as it stands: `Ok` once
    /// everything durable is in redb again.
    pub(in crate::engine) fn restore_for_epoch(
        &mut self,
        reopen: Reopen,
    ) -> Result<(), StoreError> {
        match self.restore(reopen) {
            Ok(_) => Ok(()),
            Err(e) => {
                self.shared.poison.set(&e);
                self.heal_retry.failed();
                Err(e)
            }
        }
    }

    /// Recovers in place now, as the first attempt after a failure; on failure the store stays
    /// poisoned and the next attempt waits (see `Builder::self_heal`).
    pub(in crate::engine) fn heal(&mut self, reopen: Reopen) {
        match self.restore(reopen) {
            Ok(_) => self.heal_retry.reset(),
            Err(e) => {
                tracing::error!(error = %e, "recovering in place failed; writes are refused until it succeeds");
                self.shared.poison.set(&e);
                self.heal_retry.failed();
            }
        }
    }

    /// Recovers the store in place (see the module doc). Clears the poison when it succeeds.
    /// Requests queued meanwhile wait; readers of records wait only while the file is reopened.
    pub(crate) fn restore(&mut self, reopen: Reopen) -> Result<RecoveryReport, StoreError> {
        let started = Instant::now();
        // A frame the replica has not acknowledged must not become visible before it does;
        // every frame before it was acknowledged, and readers see those meanwhile.
        if let Err(e) = ship_gate::ship_caught_up(self.shared.shipper.as_ref()) {
            self.publish_before_unshipped(reopen)?;
            return Err(e);
        }
        // Joins the log thread; every group it had is settled (answered) by then.
        self.mode.stop_log();
        let CaughtUp {
            mut report,
            log,
            next_fence,
        } = {
            let db_slot = self.shared.db.clone();
            let mut slot = db_slot.write();
            self.trusted_database(&mut slot, reopen)?;
            let db = slot.as_ref().ok_or(StoreError::Closed)?;
            let caught_up = self.catch_up(db)?;
            self.reload_partitions(db)?;
            caught_up
        };
        if let Some((dir, start)) = log {
            let thread = start_log(&self.shared, Log::start(dir, start))
                .map_err(|e| restore_failed(OpenError::Thread(e)))?;
            self.mode = Mode::Wal(thread);
        }
        self.count_log();
        self.next_fence = self.next_fence.max(next_fence);
        self.shared.overlay.published();
        self.shared.poison.clear();
        self.checkpoint_soon_if_replayed();
        report.duration = started.elapsed();
        self.shared.counters.restored();
        tracing::info!(
            frames_replayed = report.frames_replayed,
            reopened = reopen == Reopen::Always,
            ms = report.duration.as_millis() as u64,
            "idemstore recovered in place"
        );
        *self.shared.recovery.lock() = report.clone();
        Ok(report)
    }

    /// While the replica lacks a frame it did not acknowledge: replays the log up to the frame
    /// before it into redb and publishes that, without starting a log. The store stays
    /// poisoned (no write may rest on the frame), but `Store::read` sees every acknowledged
    /// write; the restore that follows once the replica holds the frame replays the same
    /// frames again (replay is idempotent) and applies the frame. Done once per wait: a log
    /// already stopped with nothing left unpublished has nothing more to show.
    fn publish_before_unshipped(&mut self, reopen: Reopen) -> Result<(), StoreError> {
        if matches!(self.mode, Mode::Stopped) && !self.shared.overlay.is_unpublished() {
            return Ok(());
        }
        self.mode.stop_log();
        let db_slot = self.shared.db.clone();
        let mut slot = db_slot.write();
        self.trusted_database(&mut slot, reopen)?;
        let db = slot.as_ref().ok_or(StoreError::Closed)?;
        let (_, through) = self.replay_synced(db)?;
        self.reload_partitions(db)?;
        drop(slot);
        // The shared snapshot first: a reader that misses the overlay must find the records.
        self.shared.db.published();
        self.shared.overlay.published();
        tracing::info!(
            through = ?through,
            "published every acknowledged write; the frame the replica did not acknowledge waits for it"
        );
        Ok(())
    }

    /// Leaves a database in the slot that the writer can build on: the one there if it still
    /// takes writes and `reopen` allows keeping it; else the file reopened, and rewritten first
    /// if one of its syncs failed (its cached pages may never reach the disk).
    fn trusted_database(
        &self,
        slot: &mut Option<Database>,
        reopen: Reopen,
    ) -> Result<(), StoreError> {
        let watch = &self.shared.db_watch;
        let healthy = !watch.failed()
            && reopen == Reopen::IfNeeded
            && slot.as_ref().is_some_and(|db| {
                catch_unwind(AssertUnwindSafe(|| {
                    db.begin_write()
                        .map(|txn| txn.abort().is_ok())
                        .unwrap_or(false)
                }))
                .unwrap_or(false)
            });
        if healthy {
            return Ok(());
        }
        // redb refuses everything after an I/O error until the file is closed.
        drop(slot.take());
        if watch.failed() {
            self.storage.rewrite_database().map_err(restore_failed)?;
            watch.reset();
            tracing::info!("rewrote the database file after a failed sync");
        }
        let cache = self.shared.config.memory().redb_cache;
        *slot = Some(
            guarded(&self.storage, || self.storage.database(cache, watch))
                .map_err(restore_failed)?,
        );
        Ok(())
    }

    /// Replays the log into `db` up to the last frame whose sync is not in doubt (the one
    /// before the unsynced frame, if any, which the caller handles); returns what it found
    /// and that bound.
    fn replay_synced(&self, db: &Database) -> Result<(CaughtUp, Option<u64>), StoreError> {
        let (registry, storage, config) =
            (&self.shared.registry, &self.storage, &self.shared.config);
        let through = self.unsynced.as_ref().map(|u| u.seq.saturating_sub(1));
        let caught_up = guarded(storage, || {
            catch_up::catch_up(db, registry, storage, config, through)
        })
        .map_err(restore_failed)?;
        Ok((caught_up, through))
    }

    /// What the writer noted of partitions is a superset of what the file holds; the file is
    /// the truth after a replay.
    fn reload_partitions(&self, db: &Database) -> Result<(), StoreError> {
        guarded(&self.storage, || {
            partitions::reload(db, &self.shared.partitions).map_err(OpenError::Setup)
        })
        .map_err(restore_failed)
    }

    /// Replays the log into `db`. A frame whose sync failed is not read back from its segment:
    /// the replay stops before it, and the copy in memory is applied and checkpointed in one
    /// durable commit (readers see it only once it is durable), after which every segment is
    /// free and the log goes on in a new one.
    fn catch_up(&mut self, db: &Database) -> Result<CaughtUp, StoreError> {
        let (mut caught_up, _) = self.replay_synced(db)?;
        let (registry, storage) = (&self.shared.registry, &self.storage);
        let Some(unsynced) = self.unsynced.as_ref() else {
            return Ok(caught_up);
        };
        let Some((dir, start)) = caught_up.log.take() else {
            return Err(restore_failed(OpenError::Recovery(RecoveryError::Apply(
                redb::Error::Io(std::io::Error::other(
                    "a frame's sync failed, but the store has no log to recover it into",
                )),
            ))));
        };
        let checkpointed = crate::engine::tables::meta::load(db)
            .map_err(restore_failed)?
            .log_checkpoint
            .seq;
        if checkpointed >= unsynced.seq {
            // An earlier attempt's commit of it landed (its sync failed, and the file was
            // rewritten from what this process wrote): the frame is in, durably.
            self.unsynced = None;
            self.appends = Appends::Open;
            caught_up.log = Some((dir, start.after_checkpoint(checkpointed)));
            return Ok(caught_up);
        }
        if start.next_seq != unsynced.seq {
            // Every frame before the one whose sync failed was synced: the log must end right
            // before it. Anything else is damage that a checkpoint must not paper over.
            return Err(restore_failed(OpenError::Recovery(
                RecoveryError::Corrupt {
                    segment: storage.log_path(),
                    offset: 0,
                    detail: format!(
                        "frame {} was synced, but the log ends at frame {}",
                        unsynced.seq - 1,
                        start.next_seq.saturating_sub(1)
                    ),
                },
            )));
        }
        let segment = start.next_number;
        guarded(storage, || {
            catch_up::checkpoint_unsynced(db, registry, storage, unsynced, segment)
        })
        .map_err(restore_failed)?;
        tracing::info!(
            seq = unsynced.seq,
            "the frame whose sync failed is checkpointed from memory; the log goes on in a new segment"
        );
        caught_up.report.frames_replayed += 1;
        caught_up.report.bytes_replayed += unsynced.payload.len() as u64;
        caught_up.next_fence = crate::engine::tables::meta::load(db)
            .map_err(restore_failed)?
            .next_fence;
        caught_up.log = Some((dir, start.after_checkpoint(unsynced.seq)));
        self.unsynced = None;
        self.appends = Appends::Open;
        Ok(caught_up)
    }
}

/// A failed restore leaves the store poisoned with this cause.
fn restore_failed(e: OpenError) -> StoreError {
    let kind = match &e {
        OpenError::Io { source, .. } => Some(source.kind()),
        _ => None,
    };
    StoreError::Poisoned {
        kind,
        cause: format!("recovering in place failed: {e}").into(),
    }
}
