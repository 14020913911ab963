//! The end of an epoch: publishing what is durable to readers, or rebuilding without what failed.

use std::panic::AssertUnwindSafe;
use std::panic::catch_unwind;

use super::epoch_end::{EpochEnd, Writes, epoch_end};
use super::{
    Counters, Epoch, FailedOutcome, Job, LogFailure, LogThread, Mode, Needs, Reopen, StoreError,
    WriteTransaction, Writer, finish_counted, panic_message, replay,
};
use crate::engine::tables::meta;

impl Writer {
    /// Makes the epoch visible: waits for the log, commits what is durable (rebuilding or
    /// restoring when the transaction holds what must not be published), then serves the
    /// requests that asked for a publish, a checkpoint or the database to itself.
    pub(super) fn publish(&mut self, txn: WriteTransaction, mut epoch: Epoch) {
        let durable = self.mode.log().map(LogThread::wait_durable);
        let failure: Option<LogFailure> = durable.as_ref().and_then(|d| d.as_ref().err().cloned());
        // The last frame every group of a clean epoch is in (see `meta::set_applied`).
        let applied = durable.and_then(Result::ok);
        // The jobs of the groups that failed, answered once this is over.
        let unanswered: Vec<Box<dyn Job>> = self
            .mode
            .log()
            .map(LogThread::take_unanswered)
            .unwrap_or_default()
            .into_iter()
            .flat_map(|group| group.jobs)
            .collect();
        if let Some(f) = failure
            .as_ref()
            .filter(|f| f.outcome == FailedOutcome::Unknown)
        {
            self.shared.poison.set(&f.error);
            // A restore consumes the copy before the log takes frames again, so there is never
            // a second one: losing track of it could lose the frame.
            assert!(
                self.unsynced.is_none(),
                "a second frame failed its sync while the first was still unrecovered"
            );
            self.unsynced.clone_from(&f.unsynced);
        }
        let tainted = epoch.tainted.take();
        let writes = match tainted {
            Some(_) => Writes::Tainted,
            None => Writes::Clean,
        };
        let end = epoch_end(failure.as_ref().map(|f| (f.outcome, f.first)), writes);
        let published = match end {
            EpochEnd::Commit => match mark_applied(&txn, &epoch, applied) {
                Ok(()) => self.commit(txn, &epoch),
                Err(e) => {
                    drop(txn);
                    tracing::warn!(error = %e, "marking an epoch's last frame failed; recovering from the log");
                    self.restore_for_epoch(Reopen::IfNeeded)
                }
            },
            EpochEnd::Restore => {
                drop(txn);
                self.restore_for_epoch(Reopen::IfNeeded)
            }
            EpochEnd::Rebuild { keep_below } => {
                drop(txn);
                let rebuilt = self.rebuild(&epoch, keep_below);
                if let Some(log) = self.mode.log() {
                    log.resume();
                }
                match rebuilt {
                    Ok(txn) => self.commit(txn, &epoch),
                    Err(e) => {
                        tracing::warn!(error = %e, "rebuilding an epoch failed; recovering from the log");
                        self.restore_for_epoch(Reopen::Always)
                    }
                }
            }
        };
        self.count_log();
        if let Some(f) = &failure {
            // Told only now: they read the recovered state, and a retry finds the log open.
            self.answer(unanswered, &Err(f.error.clone()));
        }
        if let Some(e) = tainted {
            self.answer(std::mem::take(&mut epoch.refused), &Err(e));
        }
        let result = published.and_then(|()| self.after_publish(&mut epoch));
        let cut = failure.map(|f| (f.first, f.error));
        let jobs = epoch
            .after_publish
            .drain(..)
            .map(|(number, job)| match &cut {
                // Its group was never durable: the log's failure is its answer.
                Some((first, error)) if number >= *first => (job, Err(error.clone())),
                _ => (job, result.clone()),
            });
        finish_counted(&self.shared.counters, jobs);
    }

    /// Commits an epoch's transaction: without a sync in `Wal` mode (the log has every group),
    /// durably in `Redb` mode (the commit is what makes the group durable at all).
    pub(super) fn commit(
        &mut self,
        txn: WriteTransaction,
        epoch: &Epoch,
    ) -> Result<(), StoreError> {
        let committed = if epoch.changed {
            txn.commit()
        } else {
            txn.abort().map_err(redb::CommitError::from)
        };
        match committed {
            Ok(()) => {
                // The shared snapshot first: a reader that misses the overlay must find it.
                self.shared.db.published();
                self.shared.overlay.published();
                Counters::add(&self.shared.counters.epochs, 1);
                Ok(())
            }
            Err(e) => match self.mode {
                Mode::Wal(_) => {
                    tracing::warn!(error = %e, "publishing an epoch failed; recovering from the log");
                    self.restore_for_epoch(Reopen::IfNeeded)
                }
                Mode::Redb | Mode::Stopped => {
                    // The group's durable commit failed part way.
                    let e = StoreError::unknown("the redb commit failed", &e);
                    self.shared.poison.set(&e);
                    self.heal(Reopen::IfNeeded);
                    Err(e)
                }
            },
        }
    }

    /// A fresh transaction holding the groups of `epoch` numbered below `keep_below` (the ones
    /// the log made durable). A panic is caught: redb may be left unusable, and the caller
    /// then restores.
    pub(super) fn rebuild(
        &self,
        epoch: &Epoch,
        keep_below: u64,
    ) -> Result<WriteTransaction, StoreError> {
        let rebuilt = catch_unwind(AssertUnwindSafe(|| {
            let txn = self.begin_txn()?;
            for (_, payload) in epoch.logged.iter().filter(|(n, _)| *n < keep_below) {
                replay::apply_group(&self.shared.registry, &txn, payload).map_err(|e| {
                    StoreError::Internal {
                        message: format!("re-applying a logged group failed: {e}"),
                    }
                })?;
            }
            Ok(txn)
        }));
        rebuilt.unwrap_or_else(|panic| {
            Err(StoreError::Internal {
                message: format!(
                    "rebuilding an epoch panicked: {}",
                    panic_message(panic.as_ref())
                ),
            })
        })
    }

    /// What follows a publish: a checkpoint, then work that needs the database to itself.
    pub(super) fn after_publish(&mut self, epoch: &mut Epoch) -> Result<(), StoreError> {
        if epoch.needs >= Needs::Checkpointed
            && let Err(e) = self.checkpoint()
        {
            return Err(self.checkpoint_failed(e));
        }
        if epoch.needs == Needs::Exclusive {
            let mut slot = self.shared.db.write();
            if let Some(db) = slot.as_mut() {
                for (_, job) in &mut epoch.after_publish {
                    job.exclusive(db);
                }
            }
        }
        Ok(())
    }
}

/// Records in a clean epoch's transaction the last frame it holds, so that a snapshot of the
/// file knows which frames it has (log shipping's snapshots; see `meta::set_applied`).
fn mark_applied(
    txn: &WriteTransaction,
    epoch: &Epoch,
    applied: Option<u64>,
) -> Result<(), redb::Error> {
    match applied.filter(|_| epoch.changed) {
        Some(seq) => meta::set_applied(txn, seq),
        None => Ok(()),
    }
}
