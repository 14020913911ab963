//! An epoch: groups run in one redb transaction until it should end, then published.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::ship_gate;
use super::{
    AfterGroup, Durability, EPOCH_TIME, Job, JobKind, LINGER, LogThread, Needs, OpenTables, Reopen,
    StoreError, WriteTransaction, Writer, requests_before_reopen,
};
use crate::engine::tables::overlay::RecordWrite;

/// What one group did.
#[derive(Debug)]
pub(super) struct GroupOutcome {
    /// Whether it wrote anything.
    pub(super) changed: bool,
    pub(super) bytes: u64,
    pub(super) needs: Needs,
    /// In `Wal` mode: the encoded payload for the log (if it wrote anything) and its records.
    pub(super) payload: Option<Arc<Vec<u8>>>,
    pub(super) records: Vec<RecordWrite>,
}

/// One epoch while it runs: what it wrote, and what it must answer once published.
pub(super) struct Epoch {
    pub(super) started: Instant,
    pub(super) bytes: u64,
    pub(super) changed: bool,
    pub(super) needs: Needs,
    /// The payloads of the groups handed to the log, with their numbers: what a rebuild
    /// re-applies.
    pub(super) logged: Vec<(u64, Arc<Vec<u8>>)>,
    /// Jobs answered once the epoch is published, with the number of the group they ran in.
    pub(super) after_publish: Vec<(u64, Box<dyn Job>)>,
    /// Set when a group's writes failed to apply: the transaction holds part of them.
    pub(super) tainted: Option<StoreError>,
    /// The requests of that group, answered with its error once the epoch is rebuilt (or the
    /// store restored): whoever hears of the failure finds the store taking writes again.
    pub(super) refused: Vec<Box<dyn Job>>,
}

impl Epoch {
    pub(super) fn new() -> Self {
        Epoch {
            started: Instant::now(),
            bytes: 0,
            changed: false,
            needs: Needs::Durable,
            logged: Vec::new(),
            after_publish: Vec::new(),
            tainted: None,
            refused: Vec::new(),
        }
    }
}

impl Writer {
    /// Runs groups in one redb transaction until the epoch ends, then publishes it.
    pub(super) fn epoch(&mut self, group: &mut VecDeque<Box<dyn Job>>) {
        if self.shared.poison.check().is_err() && self.heal_due() {
            // Requests are waiting: try recovering now rather than refuse them.
            self.heal(Reopen::IfNeeded);
        }
        if let Err(e) = self.shared.poison.check() {
            return self.answer(group.drain(..), &Err(e));
        }
        if let Err(e) = self.checkpoint_before_appending(group) {
            return self.answer(group.drain(..), &Err(e));
        }
        if let Err(e) = ship_gate::ship_ready(self.shared.shipper.as_ref()) {
            return self.answer(group.drain(..), &Err(e));
        }
        let txn = match self.begin_txn() {
            Ok(txn) => txn,
            Err(e) => {
                // Nothing of these requests ran; redb itself failed and is reopened, before
                // they are answered: whoever hears of the failure reads the reopened file.
                self.heal(Reopen::IfNeeded);
                return self.answer(group.drain(..), &Err(e));
            }
        };
        let mut epoch = Epoch::new();
        self.run_groups(&txn, group, &mut epoch);
        self.publish(txn, epoch);
    }

    /// Runs groups and hands each to the log, until the epoch should end.
    fn run_groups(
        &mut self,
        txn: &WriteTransaction,
        group: &mut VecDeque<Box<dyn Job>>,
        epoch: &mut Epoch,
    ) {
        let mut open = match OpenTables::open(txn, &self.shared.registry, self.shared.tables) {
            Ok(open) => open,
            Err(e) => {
                epoch.refused = requests_before_reopen(group);
                epoch.tainted = Some(StoreError::from(e));
                return;
            }
        };
        loop {
            if group
                .front()
                .is_some_and(|job| job.kind() == JobKind::Reopen)
            {
                // A reopen that arrived while the epoch was open (by its linger or drain) ends
                // the epoch; the loop runs it before the next one.
                break;
            }
            // The clock is read before any request of the group runs: if it fails, nothing of
            // the group happened, and the groups before it stand.
            let now = match self.now() {
                Ok(now) => now,
                Err(e) => {
                    self.answer(requests_before_reopen(group), &Err(e));
                    break;
                }
            };
            let mut done = Vec::with_capacity(group.len());
            let outcome = match self.run_group(txn, &mut open, group, &mut done, now) {
                Ok(outcome) => outcome,
                Err(e) => {
                    // The group's writes are partly in the transaction and in no log: its
                    // requests fail (nothing of them is kept) and the epoch is rebuilt.
                    epoch.refused = done;
                    epoch.tainted = Some(e);
                    break;
                }
            };
            self.shared.counters.group(done.len());
            epoch.changed |= outcome.changed;
            epoch.bytes += outcome.bytes;
            epoch.needs = epoch.needs.max(outcome.needs);
            self.hand_off(outcome, done, group, epoch);
            if self.mode.log().is_some_and(LogThread::failed) {
                // Later groups would rest on one that failed.
                break;
            }
            let after = self.mode.after_group(|log| {
                log.since_checkpoint() >= self.shared.config.checkpoint_bytes
                    && self.checkpoint_retry.due()
            });
            match after {
                AfterGroup::End => break,
                AfterGroup::Checkpoint => {
                    epoch.needs = epoch.needs.max(Needs::Checkpointed);
                    break;
                }
                AfterGroup::Continue => {}
            }
            let more = epoch.needs == Needs::Durable
                && epoch.bytes < self.shared.config.memory().epoch
                && epoch.started.elapsed() < EPOCH_TIME
                && (!group.is_empty() || self.linger(group));
            if !more {
                break;
            }
        }
    }

    /// Waits briefly for more work for the open epoch; true if some arrived.
    pub(super) fn linger(&self, group: &mut VecDeque<Box<dyn Job>>) -> bool {
        match self.queue.recv_timeout(LINGER) {
            Ok(job) => {
                self.received(1);
                group.push_back(job);
                self.drain(group);
                true
            }
            Err(_) => false,
        }
    }

    /// An epoch's transaction: committed without a sync in `Wal` mode (the log has every
    /// group), durably in `Redb` mode (its commit is what makes the group durable).
    pub(super) fn begin_txn(&self) -> Result<WriteTransaction, StoreError> {
        let slot = self.shared.db.read(&self.shared.poison)?;
        let mut txn = slot.begin_write()?;
        txn.set_durability(match self.shared.config.durability {
            Durability::Wal => redb::Durability::None,
            Durability::Redb => redb::Durability::Immediate,
        })?;
        Ok(txn)
    }
}
