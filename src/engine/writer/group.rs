//! One group of requests: run in the epoch's transaction, then handed to the log.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::panic::catch_unwind;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{
    Context, Counters, Epoch, Group, GroupOutcome, Handoff, Job, JobKind, Keep, Needs, OpenTables,
    StoreError, Submission, Timestamp, Tx, WriteSet, WriteTransaction, Writer, panic_message, wal,
};
use crate::engine::tables::overlay::{RecordTable, RecordWrite};

impl Writer {
    /// Runs jobs from the front of `group` (moving each to `done`) until the group is empty,
    /// its writes pass the memory budget's group share, or a job needs more than durability; in `Wal` mode,
    /// encodes their writes as one payload for the log and collects their records for the
    /// overlay.
    ///
    /// An error means the group's writes are partly applied to `txn`: the caller must not
    /// publish it.
    pub(super) fn run_group<'txn>(
        &mut self,
        txn: &'txn WriteTransaction,
        open: &mut OpenTables<'txn>,
        group: &mut VecDeque<Box<dyn Job>>,
        done: &mut Vec<Box<dyn Job>>,
        now: Timestamp,
    ) -> Result<GroupOutcome, StoreError> {
        let mut outcome = GroupOutcome {
            changed: false,
            bytes: 0,
            needs: Needs::Durable,
            payload: None,
            records: Vec::new(),
        };
        let mut kept: Vec<WriteSet> = Vec::new();
        while group
            .front()
            .is_some_and(|job| job.kind() != JobKind::Reopen)
        {
            let Some(mut job) = group.pop_front() else {
                break;
            };
            let (keep, writes) = self.run_job(txn, open, job.as_mut(), now, &mut outcome.needs);
            done.push(job);
            if keep == Keep::Writes && !writes.is_empty() {
                self.apply(txn, open, &writes)?;
                outcome.changed = true;
                outcome.bytes += writes.bytes();
                kept.push(writes);
            }
            if outcome.bytes >= self.shared.config.memory().group || outcome.needs > Needs::Durable
            {
                break;
            }
        }
        if outcome.changed {
            if self.mode.log().is_some() {
                let (payload, records) = self.frame(kept)?;
                outcome.payload = Some(payload);
                outcome.records = records;
            }
            Counters::add(&self.shared.counters.groups_committed, 1);
        }
        Ok(outcome)
    }

    /// Runs one job against the group's transaction, into a write set of its own; raises
    /// `needs` to what the job asked for.
    fn run_job(
        &mut self,
        txn: &WriteTransaction,
        open: &mut OpenTables<'_>,
        job: &mut dyn Job,
        now: Timestamp,
        needs: &mut Needs,
    ) -> (Keep, WriteSet) {
        let mut writes = WriteSet::default();
        let mut tx = Tx::new(txn, open, &self.shared.registry, &mut writes);
        let mut ctx = Context::new(
            now,
            &self.shared.config,
            &self.shared.pace,
            self.shared.tables,
            &self.shared.watchers,
            &self.shared.partitions,
            &mut self.next_fence,
        );
        let keep = job.run(&mut tx, &mut ctx);
        *needs = (*needs).max(ctx.needs());
        drop(tx);
        (keep, writes)
    }

    /// Applies a kept write set to the transaction. A table's key type orders the keys as they
    /// are inserted: user code, which may panic. Caught here, it fails this group instead of
    /// the writer.
    fn apply<'txn>(
        &self,
        txn: &'txn WriteTransaction,
        open: &mut OpenTables<'txn>,
        writes: &WriteSet,
    ) -> Result<(), StoreError> {
        let registry = &self.shared.registry;
        match catch_unwind(AssertUnwindSafe(|| registry.apply(txn, open, writes.ops()))) {
            Ok(applied) => applied.map_err(StoreError::from),
            Err(panic) => Err(StoreError::Internal {
                message: format!(
                    "applying a request's writes panicked (a table's key or value type?): {}",
                    panic_message(panic.as_ref())
                ),
            }),
        }
    }

    /// The group's log payload, and its writes to the record tables for the overlay.
    fn frame(&self, kept: Vec<WriteSet>) -> Result<(Arc<Vec<u8>>, Vec<RecordWrite>), StoreError> {
        let mut encoded = Vec::new();
        let registry = &self.shared.registry;
        let ops = kept.iter().flat_map(WriteSet::ops).map(|op| wal::Op {
            table: registry.table(op.table).name(),
            key: &op.key,
            value: op.value.as_deref(),
        });
        wal::encode_group(ops, &mut encoded).map_err(|e| StoreError::Internal {
            message: format!("encoding a log frame failed: {e}"),
        })?;
        let (claims, done) = (self.shared.tables.claims, self.shared.tables.done);
        let records = kept
            .into_iter()
            .flat_map(WriteSet::into_ops)
            .filter_map(|op| {
                let table = match op.table {
                    t if t == claims => RecordTable::Claims,
                    t if t == done => RecordTable::Done,
                    _ => return None,
                };
                Some((table, op.key, op.value))
            })
            .collect();
        Ok((Arc::new(encoded), records))
    }

    /// Gives a group to the log (`Wal`) or keeps its jobs for the publish (`Redb`).
    pub(super) fn hand_off(
        &self,
        outcome: GroupOutcome,
        done: Vec<Box<dyn Job>>,
        group: &VecDeque<Box<dyn Job>>,
        epoch: &mut Epoch,
    ) {
        let Some(log) = self.mode.log() else {
            // `Redb` mode: the epoch's commit makes the group durable.
            epoch
                .after_publish
                .extend(done.into_iter().map(|job| (0, job)));
            return;
        };
        let number = log.next_number();
        if let Some(payload) = &outcome.payload {
            epoch.logged.push((number, payload.clone()));
        }
        // Answered once it (and everything before it) is durable and its records are in the
        // overlay; or, for a request that needs more, once the epoch is published.
        let jobs = if outcome.needs == Needs::Durable {
            done
        } else {
            epoch
                .after_publish
                .extend(done.into_iter().map(|job| (number, job)));
            Vec::new()
        };
        // With more requests waiting, the log thread syncs while the writer goes on; with
        // none, the writer appends itself rather than add a thread hop.
        let handoff =
            if group.is_empty() && self.shared.counters.queued.load(Ordering::Relaxed) == 0 {
                Handoff::Inline
            } else {
                Handoff::Overlap
            };
        log.submit(
            Submission {
                payload: outcome.payload,
                ticket: Group::new(outcome.records, jobs),
            },
            handoff,
        );
    }
}
