//! Bringing redb up to date with the log: when the store opens, and when the writer recovers in
//! place after a failure.
//!
//! Replay commits without a sync: the log still holds every frame, and the segments that hold
//! frames past the checkpoint stay out of reuse until a checkpoint makes redb durable. So
//! catching up never needs disk space for redb pages, and a store on a full disk still opens
//! and answers reads.
//!
//! Frames found at open were not synced by this process: after a failed `fsync` the page cache
//! can hold a frame the disk never got, and a new process reads it as if it were durable. So the
//! writer takes a durable checkpoint before it appends anything after replayed frames (see
//! `Appends`): the log never builds on a frame it did not sync itself.

use std::time::Instant;

use redb::Database;

use crate::error::{OpenError, RecoveryError};
use crate::model::config::{Config, Durability};
use crate::storage::{LogDir, Storage};
use crate::wal::{self, Checkpoint, LogStart, RecoveryReport, ReplayFrame, Unsynced};

use super::replay;
use crate::engine::tables::meta;
use crate::engine::tables::registry::Registry;

/// Frames replayed per redb transaction.
const REPLAY_FRAMES_PER_TXN: u64 = 4096;

/// What catching up found and left.
#[derive(Debug)]
pub(crate) struct CaughtUp {
    pub(crate) report: RecoveryReport,
    /// In `Wal` mode, where the log goes on (not started yet: a caller may checkpoint first).
    pub(crate) log: Option<(Box<dyn LogDir>, LogStart)>,
    /// The next fence to hand out, as the replayed metadata says.
    pub(crate) next_fence: u64,
}

/// Replays the log past the checkpoint into `db`, but no frame after `through` (the frame
/// before one whose sync failed), and says where the log goes on (in `Wal` mode).
///
/// A store last opened with the log and now opened without it replays too, then checkpoints
/// durably: with no log to keep the frames, redb must hold them before they are forgotten.
pub(crate) fn catch_up(
    db: &Database,
    registry: &Registry,
    storage: &Storage,
    config: &Config,
    through: Option<u64>,
) -> Result<CaughtUp, OpenError> {
    let before = meta::load(db)?;
    let checkpoint = before.log_checkpoint;
    let log_dir = match config.durability {
        Durability::Wal => Some(storage.log_dir()?),
        Durability::Redb => storage.existing_log_dir()?,
    };
    let mut report = RecoveryReport::default();
    let mut log = None;
    if let Some(dir) = log_dir {
        let replayed = replay(
            db,
            registry,
            dir.as_ref(),
            storage,
            config,
            checkpoint,
            through,
        )?;
        report = replayed.report;
        match config.durability {
            Durability::Wal => log = Some((dir, replayed.start)),
            Durability::Redb if replayed.last_seq != checkpoint.seq => {
                checkpoint_now(db, replayed.last_seq, replayed.start.next_number)
                    .map_err(apply_error)?;
            }
            Durability::Redb => {}
        }
    }
    let after = meta::load(db)?;
    // Replay only adds what the log holds past the checkpoint: the fences it hands out and
    // the checkpoint itself never go back.
    assert!(
        after.next_fence >= before.next_fence,
        "replay moved the next fence back from {} to {}",
        before.next_fence,
        after.next_fence
    );
    assert!(
        after.log_checkpoint.seq >= checkpoint.seq,
        "catching up moved the checkpoint back from frame {} to {}",
        checkpoint.seq,
        after.log_checkpoint.seq
    );
    Ok(CaughtUp {
        report,
        log,
        next_fence: after.next_fence,
    })
}

fn apply_error(e: redb::Error) -> OpenError {
    OpenError::Recovery(RecoveryError::Apply(e))
}

/// What a replay did.
struct Replayed {
    report: RecoveryReport,
    start: LogStart,
    /// The last sequence number replayed (the checkpoint if none was).
    last_seq: u64,
}

/// Replays the log past `checkpoint` (up to `through`) into redb without a sync.
fn replay(
    db: &Database,
    registry: &Registry,
    dir: &dyn LogDir,
    storage: &Storage,
    config: &Config,
    checkpoint: Checkpoint,
    through: Option<u64>,
) -> Result<Replayed, OpenError> {
    let path = storage.log_path();
    let started = Instant::now();
    let begin = || -> Result<redb::WriteTransaction, redb::Error> {
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::None)?;
        Ok(txn)
    };
    let mut txn: Option<redb::WriteTransaction> = None;
    let mut in_txn = 0u64;
    let mut previous = checkpoint.seq;
    let recovered = wal::recover(
        dir,
        &path,
        checkpoint,
        through,
        config.segment_bytes,
        &mut |frame| {
            // Frames come past the checkpoint, each once, in order, and none past `through`.
            assert!(
                frame.seq > previous,
                "replay was handed frame {} after frame {previous}",
                frame.seq
            );
            assert!(
                through.is_none_or(|last| frame.seq <= last),
                "replay was handed frame {} past the last one to replay ({through:?})",
                frame.seq
            );
            previous = frame.seq;
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
        },
    )?;
    if let Some(txn) = txn {
        txn.commit().map_err(|e| apply_error(e.into()))?;
    }
    assert!(
        recovered.last_seq == previous,
        "the log says it replayed through frame {}, the replay saw frame {previous} last",
        recovered.last_seq
    );
    let mut report = recovered.report;
    report.duration = started.elapsed();
    Ok(Replayed {
        report,
        start: recovered.start,
        last_seq: recovered.last_seq,
    })
}

/// A durable commit (with quick-repair) that records `seq` as checkpointed, and `segment` as
/// where the log goes on.
pub(crate) fn checkpoint_now(db: &Database, seq: u64, segment: u64) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    txn.set_quick_repair(true);
    meta::set_log_checkpoint(&txn, seq, segment)?;
    txn.commit()?;
    Ok(())
}

/// Applies a frame whose sync failed, from the copy in memory, and checkpoints it in the same
/// durable commit: readers see its writes only once they are durable, and the log's copy on
/// disk (which the page cache may misreport) is never needed again.
pub(crate) fn checkpoint_unsynced(
    db: &Database,
    registry: &Registry,
    storage: &Storage,
    unsynced: &Unsynced,
    segment: u64,
) -> Result<(), OpenError> {
    // The checkpoint never passes what is durable, and this frame never was.
    let checkpointed = meta::load(db)?.log_checkpoint.seq;
    assert!(
        unsynced.seq > checkpointed,
        "the frame whose sync failed ({}) is at or below the checkpoint ({checkpointed})",
        unsynced.seq
    );
    let path = storage.log_path();
    let mut txn = db.begin_write().map_err(|e| apply_error(e.into()))?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(|e| apply_error(e.into()))?;
    txn.set_quick_repair(true);
    let frame = ReplayFrame {
        segment: "(the frame whose sync failed, from memory)",
        offset: 0,
        seq: unsynced.seq,
        payload: &unsynced.payload,
    };
    replay::apply_frame(registry, &txn, frame, &path)?;
    meta::set_log_checkpoint(&txn, unsynced.seq, segment).map_err(apply_error)?;
    txn.commit().map_err(|e| apply_error(e.into()))?;
    Ok(())
}
