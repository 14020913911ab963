//! The writer thread: the only place a redb write transaction exists.
//!
//! It takes everything queued (up to `max_batch`) as a **group**, runs it in arrival order,
//! makes the group durable once, then answers every request of the group. In `Wal` mode a group
//! is durable when its log frame is synced, and several groups share one redb transaction, an
//! **epoch**: a redb commit costs about the same for one group as for ten, so the writer keeps
//! the transaction open while work keeps arriving and commits it (publishing to readers) when
//! the writer goes idle, after a time or size bound, or when a request needs a fresh snapshot or
//! a checkpoint. Records written by durable but unpublished groups are served from the overlay.
//! In `Redb` mode an epoch is one group and its durable commit.
//!
//! A failure to make work durable fails every request waiting on it and poisons the store.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use redb::WriteTransaction;

use crate::clock::Timestamp;
use crate::config::Durability;
use crate::error::StoreError;
use crate::tx::Tx;
use crate::wal;

use super::Shared;
use super::context::{Context, Needs};
use super::counters::Counters;
use super::job::{Job, Keep, panic_message};
use super::log_thread::{Handoff, LogThread, Submission};
use super::meta;
use super::open_tables::OpenTables;
use super::poison::PanicGuard;
use super::write_set::WriteSet;

/// Write-set bytes after which a group stops taking requests; the rest wait for the next
/// group. Bounds a log frame (a single request is bounded by `MAX_REQUEST_BYTES`).
const GROUP_BYTES: u64 = 64 * 1024 * 1024;
/// How long an epoch waits for more work before publishing: long enough for clients that were
/// just answered to send their next request, short enough that an idle store publishes at once.
const LINGER: Duration = Duration::from_micros(300);
/// The longest an epoch stays open under load.
const EPOCH_TIME: Duration = Duration::from_millis(20);
/// Write-set bytes after which an epoch is published.
const EPOCH_BYTES: u64 = 32 * 1024 * 1024;

/// What one group did.
#[derive(Debug)]
struct GroupOutcome {
    /// Whether it wrote anything.
    changed: bool,
    bytes: u64,
    needs: Needs,
    /// In `Wal` mode: the encoded payload for the log (if it wrote anything) and its records.
    payload: Option<Vec<u8>>,
    records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

pub(crate) struct Writer {
    shared: Shared,
    next_fence: u64,
    queue: Receiver<Box<dyn Job>>,
    /// The log thread, in `Wal` mode.
    log: Option<LogThread>,
    last_checkpoint: Instant,
}

impl Writer {
    pub(crate) fn new(
        shared: Shared,
        next_fence: u64,
        queue: Receiver<Box<dyn Job>>,
        log: Option<LogThread>,
    ) -> Self {
        Writer {
            shared,
            next_fence,
            queue,
            log,
            last_checkpoint: Instant::now(),
        }
    }

    /// Runs until every sender is dropped (the store and all its claims are gone), then
    /// checkpoints so that the next open has nothing to replay.
    pub(crate) fn run(mut self) {
        // Declared before the guard so that, if this thread panics, the guard poisons the store
        // before the queued jobs are dropped and their callers wake up.
        let mut group: VecDeque<Box<dyn Job>> = VecDeque::new();
        let poison = self.shared.poison.clone();
        let _guard = PanicGuard(&poison);
        loop {
            // An epoch can end with requests still in `group` (one asked for a publish or a
            // checkpoint part way through): those start the next epoch at once, never wait for
            // a new request to arrive.
            if group.is_empty() {
                let first = match self.checkpoint_due_in() {
                    None => match self.queue.recv() {
                        Ok(job) => job,
                        Err(_) => break,
                    },
                    Some(wait) => match self.queue.recv_timeout(wait) {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => {
                            self.checkpoint_if_due();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    },
                };
                self.received(1);
                group.push_back(first);
            }
            self.drain(&mut group);
            self.epoch(&mut group);
            self.checkpoint_if_due();
        }
        if self.shared.poison.check().is_ok()
            && self.log.as_ref().is_some_and(|l| l.since_checkpoint() > 0)
        {
            // Best effort: if it fails, the next open replays the log instead.
            let _ = self.checkpoint();
        }
    }

    /// Moves queued jobs into `group`, up to `max_batch`.
    fn drain(&self, group: &mut VecDeque<Box<dyn Job>>) {
        let before = group.len();
        while group.len() < self.shared.config.max_batch {
            match self.queue.try_recv() {
                Ok(job) => group.push_back(job),
                Err(_) => break,
            }
        }
        self.received(group.len() - before);
    }

    /// Counts jobs taken off the queue.
    fn received(&self, n: usize) {
        self.shared.counters.queued.fetch_sub(n, Ordering::Relaxed);
    }

    /// Counts jobs, then answers them (counted first, so a caller that was just answered sees
    /// itself in the stats).
    fn answer(
        &self,
        jobs: impl IntoIterator<Item = Box<dyn Job>>,
        result: &Result<(), StoreError>,
    ) {
        let jobs: Vec<_> = jobs.into_iter().collect();
        Counters::add(&self.shared.counters.requests, jobs.len() as u64);
        for job in jobs {
            job.finish(result.clone());
        }
    }

    /// Fails the whole epoch: poisons the store for storage failures, and answers every job.
    fn fail(&self, e: StoreError, jobs: impl IntoIterator<Item = Box<dyn Job>>) {
        if matches!(e, StoreError::Redb(_) | StoreError::OutcomeUnknown { .. }) {
            self.shared.poison.set(&e.to_string());
        }
        self.answer(jobs, &Err(e));
    }

    /// Runs groups in one redb transaction until the epoch ends, then publishes it.
    fn epoch(&mut self, group: &mut VecDeque<Box<dyn Job>>) {
        if let Err(e) = self.shared.poison.check() {
            self.fail(e, group.drain(..));
            return;
        }
        let txn = match self.begin_txn() {
            Ok(txn) => txn,
            Err(e) => return self.fail(e, group.drain(..)),
        };
        let mut open = match OpenTables::open(&txn, &self.shared.registry, self.shared.tables) {
            Ok(open) => open,
            Err(e) => return self.fail(e.into(), group.drain(..)),
        };
        let started = Instant::now();
        let mut bytes = 0u64;
        let mut changed = false;
        let mut needs = Needs::Durable;
        // Jobs answered only once the epoch is published (all of them in Redb mode).
        let mut after_publish: Vec<Box<dyn Job>> = Vec::new();
        loop {
            let mut done = Vec::with_capacity(group.len());
            let outcome = match self.run_group(&txn, &mut open, group, &mut done) {
                Ok(outcome) => {
                    self.shared.counters.group(done.len());
                    outcome
                }
                Err(e) => {
                    drop(open);
                    drop(txn);
                    let waiting = after_publish.into_iter().chain(done).chain(group.drain(..));
                    return self.fail(e, waiting);
                }
            };
            changed |= outcome.changed;
            bytes += outcome.bytes;
            needs = needs.max(outcome.needs);
            // With more requests waiting, the log thread syncs while the writer goes on; with
            // none, the writer appends itself rather than add a thread hop.
            let handoff =
                if group.is_empty() && self.shared.counters.queued.load(Ordering::Relaxed) == 0 {
                    Handoff::Inline
                } else {
                    Handoff::Overlap
                };
            match self.log.as_ref() {
                // Answered once it (and everything before it) is durable and its records are
                // in the overlay.
                Some(log) if outcome.needs == Needs::Durable => log.submit(
                    Submission {
                        payload: outcome.payload,
                        records: outcome.records,
                        jobs: done,
                    },
                    handoff,
                ),
                // Logged now, answered once the epoch is published.
                Some(log) => {
                    log.submit(
                        Submission {
                            payload: outcome.payload,
                            records: outcome.records,
                            jobs: Vec::new(),
                        },
                        handoff,
                    );
                    after_publish.extend(done);
                }
                None => after_publish.extend(done),
            }
            let checkpoint_due = self
                .log
                .as_ref()
                .is_none_or(|log| log.since_checkpoint() >= self.shared.config.checkpoint_bytes);
            if checkpoint_due && self.log.is_some() {
                needs = needs.max(Needs::Checkpointed);
            }
            let more = !checkpoint_due
                && needs == Needs::Durable
                && bytes < EPOCH_BYTES
                && started.elapsed() < EPOCH_TIME
                && (!group.is_empty() || self.linger(group));
            if !more {
                break;
            }
        }
        drop(open);
        // Nothing may become visible before it is durable: wait for the log thread.
        if let Some(log) = self.log.as_ref() {
            if let Err(e) = log.wait_durable() {
                drop(txn);
                return self.fail(e, after_publish);
            }
        }
        // Wal: a commit without a sync (the log has every group). Redb: the durable commit that
        // makes the group durable at all.
        let published = if changed {
            txn.commit()
                .map_err(|e| self.unknown("the redb commit failed", &e))
        } else {
            txn.abort().map_err(StoreError::from)
        };
        if let Some(log) = self.log.as_ref() {
            self.shared
                .counters
                .log_since_checkpoint
                .store(log.since_checkpoint(), Ordering::Relaxed);
        }
        let result = published.and_then(|()| {
            self.shared.overlay.published();
            if needs >= Needs::Checkpointed {
                self.checkpoint()
                    .map_err(|e| self.unknown("checkpoint failed", &e))?;
            }
            if needs == Needs::Exclusive {
                let mut db = self.shared.db.write();
                for job in &mut after_publish {
                    job.exclusive(&mut db);
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => self.answer(after_publish, &Ok(())),
            Err(e) => self.fail(e, after_publish),
        }
    }

    /// Waits briefly for more work for the open epoch; true if some arrived.
    fn linger(&self, group: &mut VecDeque<Box<dyn Job>>) -> bool {
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
    fn begin_txn(&self) -> Result<WriteTransaction, StoreError> {
        let mut txn = self.shared.db.read().begin_write()?;
        txn.set_durability(match self.shared.config.durability {
            Durability::Wal => redb::Durability::None,
            Durability::Redb => redb::Durability::Immediate,
        })?;
        Ok(txn)
    }

    fn unknown(&self, what: &str, e: &dyn std::fmt::Display) -> StoreError {
        StoreError::OutcomeUnknown {
            cause: format!("{what}: {e}").into(),
        }
    }

    /// Runs jobs from the front of `group` (moving each to `done`) until the group is empty,
    /// its writes pass `GROUP_BYTES`, or a job needs more than durability; in `Wal` mode, logs
    /// and syncs their writes as one frame and adds their records to the overlay.
    fn run_group(
        &mut self,
        txn: &WriteTransaction,
        open: &mut OpenTables<'_>,
        group: &mut VecDeque<Box<dyn Job>>,
        done: &mut Vec<Box<dyn Job>>,
    ) -> Result<GroupOutcome, StoreError> {
        let now = self.now()?;
        let mut outcome = GroupOutcome {
            changed: false,
            bytes: 0,
            needs: Needs::Durable,
            payload: None,
            records: Vec::new(),
        };
        let mut kept: Vec<WriteSet> = Vec::new();
        let mut payload = None;
        let mut records = Vec::new();
        while let Some(mut job) = group.pop_front() {
            let mut writes = WriteSet::default();
            let keep = {
                let mut tx = Tx::new(txn, open, &self.shared.registry, &mut writes);
                let mut ctx = Context::new(
                    now,
                    &self.shared.config,
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
                self.shared.registry.apply(txn, open, writes.ops())?;
                outcome.changed = true;
                outcome.bytes += writes.bytes();
                kept.push(writes);
            }
            if outcome.bytes >= GROUP_BYTES || outcome.needs > Needs::Durable {
                break;
            }
        }
        if outcome.changed {
            if self.log.is_some() {
                let mut encoded = Vec::new();
                wal::encode_group(&self.shared.registry, &kept, &mut encoded).map_err(|e| {
                    StoreError::Internal {
                        message: format!("encoding a log frame failed: {e}"),
                    }
                })?;
                payload = Some(encoded);
                let table = self.shared.tables.records;
                records = kept
                    .into_iter()
                    .flat_map(WriteSet::into_ops)
                    .filter(|op| op.table == table)
                    .map(|op| (op.key, op.value))
                    .collect();
            }
            Counters::add(&self.shared.counters.groups_committed, 1);
        }
        outcome.payload = payload;
        outcome.records = records;
        Ok(outcome)
    }

    /// The clock, read once per group; a panicking clock fails the group, not the writer.
    fn now(&self) -> Result<Timestamp, StoreError> {
        let clock = self.shared.config.clock.clone();
        catch_unwind(AssertUnwindSafe(|| clock.now())).map_err(|panic| StoreError::Internal {
            message: format!(
                "the store's clock panicked: {}",
                panic_message(panic.as_ref())
            ),
        })
    }

    /// How long until a checkpoint is due, if the log holds frames not yet in durable redb.
    fn checkpoint_due_in(&self) -> Option<Duration> {
        let log = self.log.as_ref()?;
        (log.since_checkpoint() > 0 && self.shared.poison.check().is_ok()).then(|| {
            self.shared
                .config
                .checkpoint_interval
                .saturating_sub(self.last_checkpoint.elapsed())
        })
    }

    fn checkpoint_if_due(&mut self) {
        let Some(log) = self.log.as_ref() else {
            return;
        };
        let due = log.since_checkpoint() >= self.shared.config.checkpoint_bytes
            || (log.since_checkpoint() > 0
                && self.last_checkpoint.elapsed() >= self.shared.config.checkpoint_interval);
        if due && self.shared.poison.check().is_ok() {
            if let Err(e) = self.checkpoint() {
                self.shared.poison.set(&format!("checkpoint failed: {e}"));
            }
        }
    }

    /// Makes redb durable (with quick-repair, so a crash never forces a full scan), records the
    /// last logged frame as checkpointed, and lets the log reuse the segments before it. Runs
    /// between epochs, so everything logged is published.
    fn checkpoint(&mut self) -> Result<(), StoreError> {
        let Some(log) = self.log.as_ref() else {
            return Ok(());
        };
        let seq = log.wait_durable()?;
        let mut txn = self.shared.db.read().begin_write()?;
        txn.set_durability(redb::Durability::Immediate)?;
        txn.set_quick_repair(true);
        meta::set_log_checkpoint(&txn, seq)?;
        txn.commit()?;
        // Enough spare segments to log one checkpoint interval without creating files.
        let keep_free = usize::try_from(
            self.shared
                .config
                .checkpoint_bytes
                .div_ceil(self.shared.config.segment_bytes)
                + 1,
        )
        .unwrap_or(usize::MAX);
        log.checkpointed(seq, keep_free);
        tracing::debug!(seq, "checkpoint");
        self.last_checkpoint = Instant::now();
        Counters::add(&self.shared.counters.checkpoints, 1);
        self.shared
            .counters
            .log_since_checkpoint
            .store(0, Ordering::Relaxed);
        let since_open = self
            .last_checkpoint
            .duration_since(self.shared.counters.opened);
        self.shared.counters.last_checkpoint_ms.store(
            u64::try_from(since_open.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            Ordering::Relaxed,
        );
        Ok(())
    }
}
