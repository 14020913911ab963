//! The writer thread: the only place a redb write transaction exists.
//!
//! It takes everything queued (up to `max_batch`), runs it in arrival order inside one
//! transaction, makes the group durable once, then answers every request of the group. A group
//! that cannot be made durable fails all its requests and poisons the store. In `Wal` mode it
//! also checkpoints: every so often it makes redb durable and lets the log be reused.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use redb::Database;

use crate::config::{Config, Durability};
use crate::error::StoreError;
use crate::tx::Tx;
use crate::wal::{self, Log};

use super::context::{CheckpointRequest, Context};
use super::counters::Counters;
use super::job::{Job, Keep, panic_message};
use super::meta;
use super::poison::{PanicGuard, Poison};
use super::registry::Registry;
use super::tables::InternalTables;
use super::write_set::WriteSet;

/// Write-set bytes after which a group stops taking requests; the rest wait for the next
/// group. Bounds a log frame (a single request is bounded by `MAX_REQUEST_BYTES`).
const GROUP_BYTES: u64 = 64 * 1024 * 1024;

/// Whether a group wrote anything (a group that did not is aborted, never committed: a durable
/// commit that changes nothing still costs a sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Changed {
    No,
    Yes,
}

pub(crate) struct Writer {
    db: Arc<Database>,
    registry: Arc<Registry>,
    tables: InternalTables,
    config: Arc<Config>,
    poison: Arc<Poison>,
    counters: Arc<Counters>,
    next_fence: u64,
    queue: Receiver<Box<dyn Job>>,
    /// The log, in `Wal` mode.
    log: Option<Log>,
    last_checkpoint: Instant,
    /// Reused buffer for frame payloads.
    frame: Vec<u8>,
}

impl Writer {
    #[expect(
        clippy::too_many_arguments,
        reason = "the writer's whole state, given once"
    )]
    pub(crate) fn new(
        db: Arc<Database>,
        registry: Arc<Registry>,
        tables: InternalTables,
        config: Arc<Config>,
        poison: Arc<Poison>,
        counters: Arc<Counters>,
        next_fence: u64,
        queue: Receiver<Box<dyn Job>>,
        log: Option<Log>,
    ) -> Self {
        Writer {
            db,
            registry,
            tables,
            config,
            poison,
            counters,
            next_fence,
            queue,
            log,
            last_checkpoint: Instant::now(),
            frame: Vec::new(),
        }
    }

    /// Runs until every sender is dropped (the store and all its claims are gone), then
    /// checkpoints so that the next open has nothing to replay.
    pub(crate) fn run(mut self) {
        // Declared before the guard so that, if this thread panics, the guard poisons the store
        // before the queued jobs are dropped and their callers wake up.
        let mut group: VecDeque<Box<dyn Job>> = VecDeque::new();
        let poison = self.poison.clone();
        let _guard = PanicGuard(&poison);
        loop {
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
            group.push_back(first);
            while group.len() < self.config.max_batch {
                match self.queue.try_recv() {
                    Ok(job) => group.push_back(job),
                    Err(_) => break,
                }
            }
            self.counters
                .queued
                .fetch_sub(group.len(), Ordering::Relaxed);
            self.run_group(&mut group);
            self.checkpoint_if_due();
        }
        if self.poison.check().is_ok()
            && self.log.as_ref().is_some_and(|l| l.since_checkpoint() > 0)
        {
            // Best effort: if it fails, the next open replays the log instead.
            let _ = self.checkpoint();
        }
    }

    /// Runs `group` in chunks (one transaction and one sync each) and answers every job.
    fn run_group(&mut self, group: &mut VecDeque<Box<dyn Job>>) {
        while !group.is_empty() {
            let mut done = Vec::with_capacity(group.len());
            let result = self
                .poison
                .check()
                .and_then(|()| self.execute(group, &mut done));
            if let Err(e) = &result {
                if matches!(e, StoreError::Redb(_) | StoreError::OutcomeUnknown { .. }) {
                    self.poison.set(&e.to_string());
                }
                // Nothing more runs in this chunk: every job still waiting shares its fate.
                done.extend(group.drain(..));
            }
            Counters::add(&self.counters.requests, done.len() as u64);
            for job in done {
                job.finish(result.clone());
            }
        }
    }

    /// Runs jobs from the front of `group` (moving each to `done`) in one transaction until the
    /// group is empty, its writes pass `GROUP_BYTES`, or a job asks for a checkpoint; then makes
    /// them durable.
    fn execute(
        &mut self,
        group: &mut VecDeque<Box<dyn Job>>,
        done: &mut Vec<Box<dyn Job>>,
    ) -> Result<(), StoreError> {
        let clock = self.config.clock.clone();
        let now = catch_unwind(AssertUnwindSafe(|| clock.now())).map_err(|panic| {
            StoreError::Internal {
                message: format!(
                    "the store's clock panicked: {}",
                    panic_message(panic.as_ref())
                ),
            }
        })?;
        let mut txn = self.db.begin_write()?;
        if self.log.is_some() {
            txn.set_durability(redb::Durability::None)?;
        }
        let mut changed = Changed::No;
        let mut kept: Vec<WriteSet> = Vec::new();
        let mut bytes = 0u64;
        let mut checkpoint = CheckpointRequest::No;
        while let Some(mut job) = group.pop_front() {
            let mut writes = WriteSet::default();
            let keep = {
                let mut tx = Tx::new(&txn, &self.registry, &mut writes);
                let mut ctx = Context::new(now, &self.config, self.tables, &mut self.next_fence);
                let keep = job.run(&mut tx, &mut ctx);
                checkpoint = checkpoint.or(ctx.checkpoint());
                keep
            };
            done.push(job);
            if keep == Keep::Writes && !writes.is_empty() {
                self.registry.apply(&txn, writes.ops())?;
                changed = Changed::Yes;
                bytes += writes.bytes();
                if self.log.is_some() {
                    kept.push(writes);
                }
            }
            if bytes >= GROUP_BYTES || checkpoint == CheckpointRequest::Yes {
                break;
            }
        }
        match changed {
            Changed::No => txn.abort()?,
            Changed::Yes => {
                self.persist(txn, &kept)?;
                Counters::add(&self.counters.groups_committed, 1);
            }
        }
        if checkpoint == CheckpointRequest::Yes {
            self.checkpoint().map_err(|e| StoreError::OutcomeUnknown {
                cause: format!("checkpoint failed: {e}").into(),
            })?;
        }
        Ok(())
    }

    /// Makes the group durable according to the store's durability mode. Any failure here
    /// leaves the outcome unknown: part of the group may already be on disk.
    fn persist(
        &mut self,
        mut txn: redb::WriteTransaction,
        kept: &[WriteSet],
    ) -> Result<(), StoreError> {
        let unknown = |what: &str, e: &dyn std::fmt::Display| StoreError::OutcomeUnknown {
            cause: format!("{what}: {e}").into(),
        };
        match (self.config.durability, self.log.as_mut()) {
            (Durability::Wal, Some(log)) => {
                self.frame.clear();
                wal::encode_group(&self.registry, kept, &mut self.frame).map_err(|e| {
                    StoreError::Internal {
                        message: format!("encoding a log frame failed: {e}"),
                    }
                })?;
                log.append(&self.frame)
                    .map_err(|e| unknown("writing the log failed", &e))?;
                Counters::add(
                    &self.counters.log_bytes,
                    (self.frame.len() + wal::format::FRAME_HEADER_LEN) as u64,
                );
                // Durable in the log: now visible to readers, without a sync.
                txn.commit()
                    .map_err(|e| unknown("applying a logged group to redb failed", &e))?;
            }
            _ => {
                txn.set_durability(redb::Durability::Immediate)?;
                txn.commit()
                    .map_err(|e| unknown("the durable redb commit failed", &e))?;
            }
        }
        Ok(())
    }

    /// How long until a checkpoint is due, if the log holds frames not yet in durable redb.
    fn checkpoint_due_in(&self) -> Option<Duration> {
        let log = self.log.as_ref()?;
        (log.since_checkpoint() > 0 && self.poison.check().is_ok()).then(|| {
            self.config
                .checkpoint_interval
                .saturating_sub(self.last_checkpoint.elapsed())
        })
    }

    fn checkpoint_if_due(&mut self) {
        let Some(log) = self.log.as_ref() else {
            return;
        };
        let due = log.since_checkpoint() >= self.config.checkpoint_bytes
            || (log.since_checkpoint() > 0
                && self.last_checkpoint.elapsed() >= self.config.checkpoint_interval);
        if due && self.poison.check().is_ok() {
            if let Err(e) = self.checkpoint() {
                self.poison.set(&format!("checkpoint failed: {e}"));
            }
        }
    }

    /// Makes redb durable (with quick-repair, so a crash never forces a full scan), records the
    /// last logged frame as checkpointed, and lets the log reuse the segments before it.
    fn checkpoint(&mut self) -> Result<(), redb::Error> {
        let Some(log) = self.log.as_mut() else {
            return Ok(());
        };
        let seq = log.last_seq();
        let mut txn = self.db.begin_write()?;
        txn.set_durability(redb::Durability::Immediate)?;
        txn.set_quick_repair(true);
        meta::set_log_checkpoint(&txn, seq)?;
        txn.commit()?;
        // Enough spare segments to log one checkpoint interval without creating files.
        let keep_free = usize::try_from(
            self.config
                .checkpoint_bytes
                .div_ceil(self.config.segment_bytes)
                + 1,
        )
        .unwrap_or(usize::MAX);
        log.checkpointed(seq, keep_free);
        self.last_checkpoint = Instant::now();
        Counters::add(&self.counters.checkpoints, 1);
        Ok(())
    }
}
