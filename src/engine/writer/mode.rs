//! How the writer makes a group durable, and so how long an epoch lasts: the writer's mode.

use super::{Job, Log, LogDir, LogStart, LogThread, Shared, finish_counted};
use crate::engine::tables::overlay::RecordWrite;

/// How a group becomes durable (`Durability` in the settings), which decides what an epoch is.
pub(in crate::engine) enum Mode {
    /// A group is durable when its epoch's redb commit is (`Durability::Immediate`): an epoch
    /// is one group, committed durably before its requests are answered.
    Redb,
    /// A group is durable when its log frame is synced: the log thread syncs frames while the
    /// writer runs the next groups, and several groups share an epoch, published without a
    /// sync and made durable in redb by a checkpoint.
    Wal(LogThread<Group>),
    /// `Wal` mode while its log thread is stopped: a restore stopped it and failed before it
    /// could start a new one. The store is poisoned, so no epoch runs until a restore succeeds;
    /// every decision that looks at the mode takes it as a mode with no log, as `Redb` is.
    Stopped,
}

/// What an epoch may do after a group, by mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterGroup {
    /// The epoch ends: in `Redb` mode its commit is what makes the group durable.
    End,
    /// The epoch ends and is checkpointed: the log holds a checkpoint's worth of frames.
    Checkpoint,
    /// The epoch may take another group, if one comes while its bounds allow.
    Continue,
}

impl Mode {
    /// The mode a writer starts in: `Wal`, with a log thread appending at `log`'s start, if the
    /// store keeps a log; else `Redb`.
    pub(super) fn start(
        shared: &Shared,
        log: Option<(Box<dyn LogDir>, LogStart)>,
    ) -> std::io::Result<Mode> {
        Ok(match log {
            Some((dir, start)) => Mode::Wal(start_log(shared, Log::start(dir, start))?),
            None => Mode::Redb,
        })
    }

    /// The log thread, in `Wal` mode while it runs.
    pub(in crate::engine) fn log(&self) -> Option<&LogThread<Group>> {
        match self {
            Mode::Wal(log) => Some(log),
            Mode::Redb | Mode::Stopped => None,
        }
    }

    /// Stops the log thread for a restore (joining it: every group it had is settled by then).
    /// `Redb` mode has none and stays as it is.
    pub(in crate::engine) fn stop_log(&mut self) {
        if let Mode::Wal(_) = self {
            *self = Mode::Stopped;
        }
    }

    /// After a group: `Redb` ends the epoch (one group per epoch); `Wal` goes on unless
    /// `checkpoint_due` says the log needs a checkpoint, which then ends the epoch.
    pub(super) fn after_group(
        &self,
        checkpoint_due: impl FnOnce(&LogThread<Group>) -> bool,
    ) -> AfterGroup {
        match self {
            Mode::Redb | Mode::Stopped => AfterGroup::End,
            Mode::Wal(log) if checkpoint_due(log) => AfterGroup::Checkpoint,
            Mode::Wal(_) => AfterGroup::Continue,
        }
    }

    /// The log's frame bytes since the last checkpoint; 0 with no log.
    pub(in crate::engine) fn since_checkpoint(&self) -> u64 {
        self.log().map_or(0, LogThread::since_checkpoint)
    }
}

/// What the engine hands the log with each group: settled once the group is durable.
pub(crate) struct Group {
    /// The group's writes to the record tables, for the overlay.
    records: Vec<RecordWrite>,
    /// Its requests, answered once it is durable.
    pub(super) jobs: Vec<Box<dyn Job>>,
}

impl Group {
    pub(super) fn new(records: Vec<RecordWrite>, jobs: Vec<Box<dyn Job>>) -> Self {
        Group { records, jobs }
    }
}

/// Starts a log thread that, for each durable group, adds its records to the overlay and then
/// answers its requests (so a caller that was answered reads what it wrote).
pub(in crate::engine) fn start_log(shared: &Shared, log: Log) -> std::io::Result<LogThread<Group>> {
    let (overlay, counters) = (shared.overlay.clone(), shared.counters.clone());
    LogThread::start(
        log,
        Box::new(move |mut groups: Vec<Group>| {
            overlay.add(
                groups
                    .iter_mut()
                    .flat_map(|g| std::mem::take(&mut g.records)),
            );
            let jobs = groups.into_iter().flat_map(|g| g.jobs);
            finish_counted(&counters, jobs.map(|job| (job, Ok(()))));
        }),
        shared.counters.log_bytes.clone(),
        shared.config.memory().frame,
        shared.shipper.clone(),
    )
}
