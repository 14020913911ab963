//! What a test plans for the simulated disk (faults, and what a crash does to the write in
//! flight), how the disk applies the plan to each operation, and what the disk counted.

use std::io;

use super::{DiskState, SimDisk, crash_error};

/// Faults to inject, counted in mutating operations (writes, length changes and syncs of any
/// file, and directory syncs), numbered from 1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultPlan {
    /// Operation `n` and every one after it fail: the machine lost power.
    pub crash_at: Option<u64>,
    /// Operation `n` fails once with an I/O error; the disk keeps working after it.
    pub fail_at: Option<u64>,
    /// The `n`-th sync since the disk was made (log and database together, as
    /// [`DiskCounters::syncs`] counts them) fails once; its writes stay unsynced.
    pub fail_sync: Option<u64>,
    /// How long every sync of a log file takes: a slow disk, so that work queues up behind a
    /// sync in flight as it does on real hardware (the simulated disk is otherwise instant).
    pub log_sync_latency: Option<std::time::Duration>,
    /// Operation `n` fails once with `StorageFull` (a full disk that someone then frees).
    pub full_at: Option<u64>,
    /// A second fault, armed when one of `fail_at`, `fail_sync` or `full_at` fires.
    pub then: Option<Then>,
}

/// A fault that follows the first one of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Then {
    /// How many mutating operations after the first fault it hits: 1 is the next one.
    pub after: u64,
    /// What happens then.
    pub fault: SecondFault,
}

/// What a chained fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecondFault {
    /// The machine loses power: that operation and every later one fail.
    Crash,
    /// That operation fails once with an I/O error (a sync that fails this way loses its
    /// writes, as any failed sync).
    Fail,
    /// That operation fails once with `StorageFull`.
    Full,
}

/// What a crash does to the write that was in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tear {
    /// The unsynced write is lost entirely.
    Drop,
    /// Its first `n` sectors (cut at 512-byte sector boundaries of the file) reached the disk.
    Sectors(u64),
}

/// What the disk has done since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskCounters {
    /// Mutating operations (the numbering of [`FaultPlan`]).
    pub ops: u64,
    /// Bytes written, by file-name prefix: the log's files (`wal/`) and everything else.
    pub log_bytes: u64,
    /// Bytes written to the database file.
    pub db_bytes: u64,
    /// `sync_data` calls on log files.
    pub log_syncs: u64,
    /// `sync_data` calls on the database file.
    pub db_syncs: u64,
    /// Planned faults that fired (a crash counts once).
    pub faults: u64,
    /// Syncs that failed: their writes are lost to the disk.
    pub failed_syncs: u64,
}

impl DiskCounters {
    /// Syncs of any file (the numbering of [`FaultPlan::fail_sync`]).
    pub fn syncs(&self) -> u64 {
        self.log_syncs + self.db_syncs
    }
}

impl SimDisk {
    /// Counts a mutating operation and applies the fault plan to it.
    pub(super) fn mutate(state: &mut DiskState) -> io::Result<()> {
        if state.crashed {
            return Err(crash_error());
        }
        state.counters.ops += 1;
        let op = state.counters.ops;
        if state.plan.crash_at.is_some_and(|at| op >= at) {
            state.crashed = true;
            state.counters.faults += 1;
            return Err(crash_error());
        }
        if state.plan.fail_at == Some(op) {
            Self::fired(state);
            return Err(io::Error::other(format!(
                "injected I/O error at operation {op}"
            )));
        }
        if state.plan.full_at == Some(op) {
            Self::fired(state);
            return Err(io::Error::new(
                io::ErrorKind::StorageFull,
                format!("injected full disk at operation {op}"),
            ));
        }
        Ok(())
    }

    /// A planned fault fired at the current operation: arms the chained one, if any.
    pub(super) fn fired(state: &mut DiskState) {
        state.counters.faults += 1;
        let Some(then) = state.plan.then.take() else {
            return;
        };
        let at = state.counters.ops + then.after.max(1);
        match then.fault {
            SecondFault::Crash => state.plan.crash_at = Some(at),
            SecondFault::Fail => state.plan.fail_at = Some(at),
            SecondFault::Full => state.plan.full_at = Some(at),
        }
    }
}
