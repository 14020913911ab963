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
//! # The epoch invariant
//!
//! Once a group is handed to the log, its writes reach redb, or the store is poisoned and
//! recovers them from the log. Nothing may break it, because a group is acknowledged as soon as
//! its frame is synced, before the epoch is published. So a failure part way through an epoch
//! never simply drops the transaction:
//!
//! - a request that fails or panics inside its own work keeps nothing (its write set is
//!   dropped) and touches nothing else;
//! - a clock that fails before a group fails only that group's requests, before any of them
//!   ran, and the epoch is published as it stands;
//! - a group whose writes fail to apply (a redb error, a panicking key type), or that the log
//!   refuses before its sync (a full disk), leaves the transaction holding writes that must not
//!   be published: the writer **rebuilds** the epoch in a fresh transaction from the payloads
//!   of the groups that are durable, and fails the rest with [`StoreError::NotWritten`] (or the
//!   error that stopped them);
//! - a failed log sync (outcome unknown), a failed redb commit or a failed rebuild **restores**
//!   the store in place: the redb file is reopened if redb latched the error, and the log is
//!   replayed into it, exactly as a reopen of the directory would. Until that succeeds the store
//!   is poisoned: writes are refused, reads are still answered.
//!
//! A failed checkpoint wrote nothing the log does not also hold: the store restores redb in
//! place and tries the checkpoint again later, with backoff.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use redb::WriteTransaction;

use crate::engine::tables::tx::Tx;
use crate::error::StoreError;
use crate::model::clock::Timestamp;
use crate::model::config::{Durability, SelfHeal};
use crate::storage::LogDir;
use crate::storage::Storage;
use crate::wal::{
    self, FailedOutcome, Handoff, Log, LogFailure, LogStart, LogThread, Submission, Unsynced,
};

use self::context::{Context, Needs};
use self::job::{Job, JobKind, Keep};
use super::Shared;
use crate::engine::counters::Counters;
use crate::engine::poison::PanicGuard;
use crate::engine::recovery::catch_up;
use crate::engine::recovery::replay;
use crate::engine::tables::open_tables::OpenTables;
use crate::engine::tables::write_set::WriteSet;
use crate::engine::writer::restore::Reopen;
use crate::model::backoff::Backoff;
use crate::model::panic::panic_message;

/// How long an epoch waits for more work before publishing: long enough for clients that were
/// just answered to send their next request, short enough that an idle store publishes at once.
const LINGER: Duration = Duration::from_micros(300);
/// The longest an epoch stays open under load.
const EPOCH_TIME: Duration = Duration::from_millis(20);
/// The first wait before a failed checkpoint is tried again; it doubles up to the last.
const CHECKPOINT_RETRY: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_secs(30));

/// Whether the writer may append to the log now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Appends {
    /// Every frame in the log was synced by this process, or a durable checkpoint covers it.
    Open,
    /// The log holds frames this process found at open and did not sync itself; after a failed
    /// `fsync` the page cache can show a frame the disk never got, so a durable checkpoint must
    /// cover them before a new frame rests on them.
    AfterCheckpoint,
}

pub(crate) struct Writer {
    pub(super) shared: Shared,
    pub(super) storage: Storage,
    pub(super) next_fence: u64,
    queue: Receiver<Box<dyn Job>>,
    /// How a group becomes durable: by its redb commit, or by the log thread's sync.
    pub(super) mode: Mode,
    /// The frame whose sync failed, until a restore has checkpointed it from this copy.
    pub(super) unsynced: Option<Unsynced>,
    pub(super) appends: Appends,
    /// When the timed checkpoint is due (if the log holds anything to checkpoint).
    timed_checkpoint: Instant,
    /// After a failed checkpoint, when to try again.
    checkpoint_retry: Backoff,
    /// While poisoned, when to try recovering in place again.
    pub(super) heal_retry: Backoff,
}

mod checkpoint;
pub(super) mod context;
mod epoch;
mod epoch_end;
mod group;
pub(super) mod job;
mod mode;
mod publish;
pub(super) mod restore;
mod ship_gate;

use self::epoch::{Epoch, GroupOutcome};
use self::mode::AfterGroup;
pub(super) use self::mode::{Group, Mode, start_log};

impl Writer {
    pub(crate) fn new(
        shared: Shared,
        storage: Storage,
        next_fence: u64,
        queue: Receiver<Box<dyn Job>>,
        log: Option<(Box<dyn LogDir>, LogStart)>,
    ) -> std::io::Result<Self> {
        let heal = match shared.config.self_heal {
            SelfHeal::Backoff { first, max } => (first, max),
            SelfHeal::Off => (Duration::MAX, Duration::MAX),
        };
        let mode = Mode::start(&shared, log)?;
        let appends = match mode.log() {
            Some(log) if log.since_checkpoint() > 0 => Appends::AfterCheckpoint,
            _ => Appends::Open,
        };
        // The interval is at most an hour (the builder checks): no overflow.
        let timed_checkpoint = Instant::now() + shared.config.checkpoint_interval;
        let mut writer = Writer {
            shared,
            storage,
            next_fence,
            queue,
            mode,
            unsynced: None,
            appends,
            timed_checkpoint,
            checkpoint_retry: Backoff::new(CHECKPOINT_RETRY.0, CHECKPOINT_RETRY.1),
            heal_retry: Backoff::new(heal.0, heal.1),
        };
        writer.checkpoint_soon_if_replayed();
        Ok(writer)
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
                let first = match self.next_timer() {
                    None => match self.queue.recv() {
                        Ok(job) => job,
                        Err(_) => break,
                    },
                    Some(wait) => match self.queue.recv_timeout(wait) {
                        Ok(job) => job,
                        Err(RecvTimeoutError::Timeout) => {
                            self.timers();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => break,
                    },
                };
                self.received(1);
                group.push_back(first);
            }
            self.drain(&mut group);
            self.reopen_if_asked(&mut group);
            if group.is_empty() {
                self.timers();
                continue;
            }
            // A panic here is a bug in the store or in code it calls outside a request (a key
            // type's ordering while a group is applied is caught closer). The jobs it held are
            // dropped, and their callers see the poison; the writer recovers and goes on.
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| self.epoch(&mut group))) {
                let e = StoreError::Internal {
                    message: format!("the writer panicked: {}", panic_message(panic.as_ref())),
                };
                self.shared.poison.set(&e);
                self.heal(Reopen::Always);
            }
            self.timers();
        }
        if self.shared.poison.check().is_ok() && self.mode.since_checkpoint() > 0 {
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

    /// Recovers in place if `Store::reopen` asked for it (such jobs are taken out of the
    /// group), and answers those requests.
    fn reopen_if_asked(&mut self, group: &mut VecDeque<Box<dyn Job>>) {
        if !group.iter().any(|job| job.kind() == JobKind::Reopen) {
            return;
        }
        let (mut reopens, rest): (Vec<_>, Vec<_>) = group
            .drain(..)
            .partition(|job| job.kind() == JobKind::Reopen);
        group.extend(rest);
        let result = match self.restore(Reopen::Always) {
            Ok(report) => {
                self.heal_retry.reset();
                for job in &mut reopens {
                    job.restored(&report);
                }
                Ok(())
            }
            Err(e) => {
                self.shared.poison.set(&e);
                self.heal_retry.failed();
                Err(e)
            }
        };
        self.answer(reopens, &result);
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
        let jobs = jobs.into_iter().map(|job| (job, result.clone()));
        finish_counted(&self.shared.counters, jobs);
    }

    /// Publishes the log's bytes since the checkpoint to the stats.
    pub(super) fn count_log(&self) {
        if let Some(log) = self.mode.log() {
            self.shared.counters.log_since(log.since_checkpoint());
        }
    }

    /// The clock, read once per group before any of its requests runs; a panicking clock fails
    /// the group, not the writer.
    fn now(&self) -> Result<Timestamp, StoreError> {
        let clock = self.shared.config.clock.clone();
        catch_unwind(AssertUnwindSafe(|| clock.now())).map_err(|panic| StoreError::Internal {
            message: format!(
                "the store's clock panicked: {}",
                panic_message(panic.as_ref())
            ),
        })
    }

    /// How long until the writer has something to do without a request: a checkpoint, or an
    /// attempt to heal.
    fn next_timer(&self) -> Option<Duration> {
        if self.shared.poison.check().is_err() {
            return self.heal_retry.wait();
        }
        self.checkpoint_due_in()
    }

    fn timers(&mut self) {
        if self.shared.poison.check().is_err() {
            if self.heal_due() {
                self.heal(Reopen::IfNeeded);
            }
            return;
        }
        self.checkpoint_if_due();
    }

    /// Whether self-heal is on and its next attempt is due.
    fn heal_due(&self) -> bool {
        self.heal_retry.wait().is_some() && self.heal_retry.due()
    }
}

/// Counts jobs, then answers each with its result: counted first, so that a caller that was
/// just answered sees itself in the stats. The one place the writer and the log thread
/// answer requests.
pub(super) fn finish_counted(
    counters: &Counters,
    jobs: impl IntoIterator<Item = (Box<dyn Job>, Result<(), StoreError>)>,
) {
    let jobs: Vec<_> = jobs.into_iter().collect();
    Counters::add(&counters.requests, jobs.len() as u64);
    for (job, result) in jobs {
        job.finish(result);
    }
}

/// The requests at the front of `group`, up to the first reopen (which the writer runs between
/// epochs, never inside one).
fn requests_before_reopen(group: &mut VecDeque<Box<dyn Job>>) -> Vec<Box<dyn Job>> {
    let n = group
        .iter()
        .position(|job| job.kind() == JobKind::Reopen)
        .unwrap_or(group.len());
    group.drain(..n).collect()
}
