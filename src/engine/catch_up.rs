//! Bringing redb up to date with the log: when the store opens, and when the writer recovers in
//! place after a failure.
//!
//! Replay commits without a sync: the log still holds every frame, and the segments that hold
//! frames past the checkpoint stay out of reuse until a checkpoint makes redb durable (the
//! writer takes one as soon as it starts). So catching up never needs disk space for redb
//! pages, and a store on a full disk still opens and answers reads.

use std::time::Instant;

use redb::Database;

use crate::error::{OpenError, RecoveryError};
use crate::model::config::{Config, Durability};
use crate::storage::{LogDir, Storage};
use crate::wal::{self, Log, LogStart, RecoveryReport};

use super::meta;
use super::registry::Registry;
use super::replay;

/// Frames replayed per redb transaction.
const REPLAY_FRAMES_PER_TXN: u64 = 4096;

/// What catching up found and left.
#[derive(Debug)]
pub(crate) struct CaughtUp {
    pub(crate) report: RecoveryReport,
    /// The log to append to, in `Wal` mode.
    pub(crate) log: Option<Log>,
    /// The next fence to hand out, as the replayed metadata says.
    pub(crate) next_fence: u64,
}

/// Replays the log past the checkpoint into `db` and starts the log (in `Wal` mode).
///
/// A store last opened with the log and now opened without it replays too, then checkpoints
/// durably: with no log to keep the frames, redb must hold them before they are forgotten.
pub(crate) fn catch_up(
    db: &Database,
    registry: &Registry,
    storage: &Storage,
    config: &Config,
) -> Result<CaughtUp, OpenError> {
    let checkpoint = meta::load(db)?.log_checkpoint;
    let log_dir = match config.durability {
        Durability::Wal => Some(storage.log_dir()?),
        Durability::Redb => storage.existing_log_dir()?,
    };
    let mut report = RecoveryReport::default();
    let mut log = None;
    if let Some(dir) = log_dir {
        let (replayed, start, last_seq) =
            replay(db, registry, dir.as_ref(), storage, config, checkpoint)?;
        report = replayed;
        match config.durability {
            Durability::Wal => log = Some(Log::start(dir, start)),
            Durability::Redb if last_seq != checkpoint => {
                checkpoint_now(db, last_seq).map_err(apply_error)?;
            }
            Durability::Redb => {}
        }
    }
    Ok(CaughtUp {
        report,
        log,
        next_fence: meta::load(db)?.next_fence,
    })
}

fn apply_error(e: redb::Error) -> OpenError {
    OpenError::Recovery(RecoveryError::Apply(e))
}

/// Replays the log past `checkpoint` into redb without a sync. Returns the report, where the
/// next log starts, and the last sequence number replayed (the checkpoint if none was).
fn replay(
    db: &Database,
    registry: &Registry,
    dir: &dyn LogDir,
    storage: &Storage,
    config: &Config,
    checkpoint: u64,
) -> Result<(RecoveryReport, LogStart, u64), OpenError> {
    let path = storage.log_path();
    let started = Instant::now();
    let begin = || -> Result<redb::WriteTransaction, redb::Error> {
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::None)?;
        Ok(txn)
    };
    let mut txn: Option<redb::WriteTransaction> = None;
    let mut in_txn = 0u64;
    let recovered = wal::recover(dir, &path, checkpoint, config.segment_bytes, &mut |frame| {
        let current = match txn.as_ref() {
            Some(current) => current,
            None => txn.insert(begin().map_err(RecoveryError::Apply)?),
        };
        replay::apply_frame(registry, current, frame, &path)?;
        in_txn += 1;
        if in_txn == REPLAY_FRAMES_PER_TXN {
            if let Some(full) = txn.take() {
                full.commit().map_err(|e| RecoveryError::Apply(e.into()))?;
            }
            in_txn = 0;
        }
        Ok(())
    })?;
    if let Some(txn) = txn {
        txn.commit().map_err(|e| apply_error(e.into()))?;
    }
    let mut report = recovered.report;
    report.duration = started.elapsed();
    Ok((report, recovered.start, recovered.last_seq))
}

/// A durable commit (with quick-repair) that records `seq` as checkpointed.
pub(crate) fn checkpoint_now(db: &Database, seq: u64) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    txn.set_quick_repair(true);
    meta::set_log_checkpoint(&txn, seq)?;
    txn.commit()?;
    Ok(())
}
