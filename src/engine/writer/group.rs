//! One group of requests: run in the epoch's transaction, then handed to the log.

use super::*;

impl Writer {
    /// Runs jobs from the front of `group` (moving each to `done`) until the group is empty,
    /// its writes pass the memory budget's group share, or a job needs more than durability; in `Wal` mode,
    /// encodes their writes as one payload for the log and collects their records for the
    /// overlay.
    ///
    /// An error means the group's writes are partly applied to `txn`: the caller must not
    /// publish it.
    pub(super) fn run_group(
        &mut self,
        txn: &WriteTransaction,
        open: &mut OpenTables<'_>,
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
            let mut writes = WriteSet::default();
            let keep = {
                let mut tx = Tx::new(txn, open, &self.shared.registry, &mut writes);
                let mut ctx = Context::new(
                    now,
                    &self.shared.config,
                    &self.shared.pace,
                    self.shared.tables,
                    &self.shared.watchers,
                    &mut self.next_fence,
                );
                let keep = job.run(&mut tx, &mut ctx);
                outcome.needs = outcome.needs.max(ctx.needs());
                keep
            };
            done.push(job);
            if keep == Keep::Writes && !writes.is_empty() {
                // A table's key type orders the keys as they are inserted: user code, which
                // may panic. Caught here, it fails this group instead of the writer.
                let registry = &self.shared.registry;
                let applied =
                    catch_unwind(AssertUnwindSafe(|| registry.apply(txn, open, writes.ops())));
                match applied {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e.into()),
                    Err(panic) => {
                        return Err(StoreError::Internal {
                            message: format!(
                                "applying a request's writes panicked (a table's key or value type?): {}",
                                panic_message(panic.as_ref())
                            ),
                        });
                    }
                }
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
                outcome.payload = Some(Arc::new(encoded));
                let table = self.shared.tables.records;
                outcome.records = kept
                    .into_iter()
                    .flat_map(WriteSet::into_ops)
                    .filter(|op| op.table == table)
                    .map(|op| (op.key, op.value))
                    .collect();
            }
            Counters::add(&self.shared.counters.groups_committed, 1);
        }
        Ok(outcome)
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
