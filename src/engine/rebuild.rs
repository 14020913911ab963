//! A store rebuilt from a replica: the latest snapshot, and the stream's frames after it
//! written as the new store's log.
//!
//! The rebuild writes files and leaves the replay to the store's first open: the snapshot
//! becomes the database file (its checkpoint moved to the snapshot's frame), the frames after
//! it one log segment, and the open replays them through the tables the application
//! registers, as after a crash. So a rebuild needs no table's types, and `idemstore restore`
//! can rebuild a store with business tables. The store is built in a directory beside the
//! destination and renamed into place once every file is synced: a crash part way leaves
//! nothing at the destination.
//!
//! The metadata also records that the store was restored, with what the old store promised
//! (`meta::set_restore_pending`): when it may have acknowledged more than the stream held,
//! the restored store answers unknown keys as recoveries for a while.

use std::path::Path;
use std::time::Instant;

use redb::Database;

use crate::engine::tables::{meta, restore_mark};
use crate::error::{ReplicaError, RestoreError};
use crate::model::maintenance::{Restored, Takeover};
use crate::model::replica::WriterIdentity;
use crate::model::restore::{Lineage, PendingRestore};
use crate::model::writer_epoch::follows;
use crate::storage::{
    BackupDir, DB_FILE, DirLock, LOG_DIR, create_private, create_private_dir, swap_in_dir, sync_dir,
};
use crate::wal::segment_name;
use crate::wal::ship::{ReplicaSource, TAIL_SEGMENT, TailWriter};

/// Where a rebuilt store's log ends: what a standby keeps between its steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    /// The frame the snapshot covers.
    pub(crate) snapshot: u64,
    /// The last frame written into the log.
    pub(crate) last: u64,
    /// What the snapshot and the frames were shipped with, merged in the stream's order.
    pub(crate) lineage: Lineage,
    /// Frames written after the snapshot.
    pub(crate) frames: u64,
    /// Where the log's end marker is, in the restored segment: the next step writes from
    /// there, over anything a failed step left past it.
    pub(crate) end: u64,
}

/// Rebuilds the store at `dest` (absent, or an empty directory) from `source`; with
/// [`Takeover::Yes`] the new store becomes the stream's writer.
pub(crate) fn rebuild(
    source: &dyn ReplicaSource,
    dest: &Path,
    takeover: Takeover,
) -> Result<Restored, RestoreError> {
    let started = Instant::now();
    crate::storage::remove_dead_leftovers(dest);
    let (position, ()) = build(source, dest, takeover, |_| Ok(()))?;
    Ok(report(dest, position, takeover, started))
}

/// Makes the rebuilt store at `dest` (a standby's, in place and locked) the stream's writer
/// if asked, and says what it holds. A refused take-over leaves `dest` as it is (a standby
/// goes on following it). A crash between the take-over and the epoch's commit leaves a store
/// whose next open is refused as fenced: restore it again.
pub(crate) fn finish(
    source: &dyn ReplicaSource,
    dest: &Path,
    position: Position,
    takeover: Takeover,
    started: Instant,
) -> Result<Restored, RestoreError> {
    if takeover == Takeover::Yes {
        let epoch = take_over(source, dest, position)?;
        let db = Database::builder()
            .open(dest.join(DB_FILE))
            .map_err(|e| RestoreError::Meta(std::sync::Arc::new(e.into())))?;
        write_epoch(&db, epoch)?;
    }
    Ok(report(dest, position, takeover, started))
}

/// Takes the stream over for the store being built at `dir` (whose identity is the
/// destination's), past every epoch the restore saw; returns the new epoch.
fn take_over(
    source: &dyn ReplicaSource,
    dest: &Path,
    position: Position,
) -> Result<u64, RestoreError> {
    let me = WriterIdentity::this_process(dest);
    let epoch = source.take_over(&me, position.last, position.lineage.epoch)?;
    assert!(
        epoch > position.lineage.epoch,
        "a take-over's epoch is past every epoch the restore read"
    );
    Ok(epoch)
}

/// Records the store's writer epoch in its metadata, durably.
fn write_epoch(db: &Database, epoch: u64) -> Result<(), RestoreError> {
    // A store's epoch only grows: a restore writes one past every epoch it read, and the
    // metadata it restored holds one of those.
    if let Ok(held) = meta::writer_epoch(db) {
        assert!(
            held <= epoch,
            "a restore would move the store's writer epoch back from {held} to {epoch}"
        );
    }
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    meta::set_writer_epoch(&txn, epoch)?;
    txn.commit()?;
    if let Ok(held) = meta::writer_epoch(db) {
        assert_eq!(
            held, epoch,
            "the writer epoch read back is not the one written"
        );
    }
    Ok(())
}

/// What a finished restore holds, logged.
fn report(dest: &Path, position: Position, takeover: Takeover, started: Instant) -> Restored {
    let took_over = takeover == Takeover::Yes;
    let restored = Restored {
        snapshot: position.snapshot,
        frames: position.frames,
        last_frame: position.last,
        guarantee: position.lineage.guarantee,
        took_over,
        duration: started.elapsed(),
    };
    tracing::info!(
        dest = %dest.display(),
        snapshot = restored.snapshot,
        frames = restored.frames,
        last_frame = restored.last_frame,
        guarantee = restored.guarantee.as_str(),
        took_over,
        ms = restored.duration.as_millis() as u64,
        "restored the store from its replica"
    );
    restored
}

/// Builds the store at `dest` (absent, or an empty directory) beside it and renames it into
/// place; says where its log ends. With [`Takeover::Yes`] the stream is taken over before
/// the rename, and the new epoch is in the store's metadata when it lands. `before_place`
/// runs on the finished directory just before it is renamed (a standby takes the directory's
/// lock there, so that it holds it from the moment the store is at `dest`).
pub(crate) fn build<T>(
    source: &dyn ReplicaSource,
    dest: &Path,
    takeover: Takeover,
    before_place: impl FnOnce(&Path) -> Result<T, RestoreError>,
) -> Result<(Position, T), RestoreError> {
    let dir = BackupDir::create(dest)?;
    let building = dir.path().to_path_buf();
    let db_path = building.join(DB_FILE);
    // A stream begins with a snapshot (the shipper sends one before any frame): the store's
    // own file carries what no frame does, such as the partitions' filter key.
    let snapshot = source
        .fetch_snapshot(&db_path)?
        .ok_or(RestoreError::NoSnapshot)?;
    let db = Database::builder()
        .open(&db_path)
        .map_err(|e| RestoreError::Snapshot {
            detail: e.to_string(),
        })?;
    // The snapshot must be a store's file: its metadata loads.
    meta::load(&db).map_err(|e| RestoreError::Snapshot {
        detail: e.to_string(),
    })?;
    let wal = building.join(LOG_DIR);
    create_private_dir(&wal).map_err(io(&wal))?;
    let segment = wal.join(segment_name(TAIL_SEGMENT));
    let file = create_private(&segment).map_err(io(&segment))?;
    let tail = TailWriter::create(file, snapshot.seq + 1).map_err(io(&segment))?;
    let mut position = Position {
        snapshot: snapshot.seq,
        last: snapshot.seq,
        lineage: snapshot.lineage,
        frames: 0,
        end: 0,
    };
    append(source, &segment, tail, &mut position)?;
    sync_dir(&wal).map_err(io(&wal))?;
    mark(&db, position)?;
    // A copy that does not take the stream over writes no stream of its own yet: it has no
    // epoch on any (a snapshot carries its old store's).
    let epoch = match takeover {
        Takeover::Yes => take_over(source, dest, position)?,
        Takeover::No => 0,
    };
    write_epoch(&db, epoch)?;
    let held = before_place(&building)?;
    dir.place(db)?;
    Ok((position, held))
}

/// What one step of a standby did.
#[derive(Debug)]
pub(crate) enum Followed {
    /// New frames (perhaps none) were appended to the log.
    Appended,
    /// The stream has a newer snapshot (or was trimmed past this store): the store was built
    /// again from it, and this is the lock of its new directory (the old one's is let go).
    Rebased(DirLock),
}

/// One step of a standby: the frames the stream holds after `position`, appended to the log
/// of the rebuilt store at `dest`; or, when the stream has a newer snapshot, the store built
/// again from it (which keeps the log a take-over replays short).
pub(crate) fn follow(
    source: &dyn ReplicaSource,
    dest: &Path,
    position: &mut Position,
) -> Result<Followed, RestoreError> {
    let newer = source
        .latest_snapshot()?
        .is_some_and(|s| s.seq > position.snapshot);
    if !newer {
        let segment = dest.join(LOG_DIR).join(segment_name(TAIL_SEGMENT));
        let tail =
            TailWriter::reopen(&segment, position.last + 1, position.end).map_err(io(&segment))?;
        let before = position.frames;
        match append(source, &segment, tail, position) {
            Ok(()) => {
                if position.frames > before {
                    let db = Database::builder()
                        .open(dest.join(DB_FILE))
                        .map_err(|e| RestoreError::Meta(std::sync::Arc::new(e.into())))?;
                    mark(&db, *position)?;
                }
                return Ok(Followed::Appended);
            }
            // Trimmed past this store: only a newer snapshot can bring it up to date.
            Err(RestoreError::Replica(ReplicaError::Corrupt { .. })) => {}
            Err(e) => return Err(e),
        }
    }
    let (rebased, lock) = rebase(source, dest)?;
    *position = rebased;
    Ok(Followed::Rebased(lock))
}

/// Builds the store again beside `dest`, locked, then swaps it in (in one step where the
/// system can: `storage::swap_in_dir`), so that `dest` is always a locked store.
fn rebase(source: &dyn ReplicaSource, dest: &Path) -> Result<(Position, DirLock), RestoreError> {
    let parent = crate::storage::parent_of(dest);
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let fresh = parent.join(format!(".{name}.rebase-{}", std::process::id()));
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&fresh);
    let _ = std::fs::remove_dir_all(&old);
    let (position, lock) = build(source, &fresh, Takeover::No, lock)?;
    let replaced = swap_in_dir(dest, &fresh, &old).map_err(io(dest))?;
    let _ = std::fs::remove_dir_all(replaced);
    Ok((position, lock))
}

/// Takes the lock of the store directory `dir`, as a store's open does: while a standby
/// follows into it, an open of the directory is refused, naming the standby's process.
pub(crate) fn lock(dir: &Path) -> Result<DirLock, RestoreError> {
    DirLock::acquire(dir).map_err(|e| RestoreError::Io {
        path: dir.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })
}

/// Appends every frame after `position.last` to the segment, and ends it. On an error,
/// `position` may have counted frames the segment does not end with: the caller drops it.
fn append(
    source: &dyn ReplicaSource,
    segment: &Path,
    mut tail: TailWriter,
    position: &mut Position,
) -> Result<(), RestoreError> {
    let mut written: Result<(), std::io::Error> = Ok(());
    let read = source.frames_after(position.last, &mut |frame, shipped_with| {
        if !follows(position.lineage.epoch, shipped_with.epoch) {
            return Err(ReplicaError::Corrupt {
                detail: format!(
                    "frame {} was shipped at writer epoch {}, after a frame or snapshot of epoch {}: a fenced writer's frame in the stream",
                    frame.seq, shipped_with.epoch, position.lineage.epoch
                ),
            });
        }
        tail.append(frame.seq, &frame.payload).map_err(|e| {
            let detail = e.to_string();
            written = Err(e);
            ReplicaError::Refused { detail }
        })?;
        position.lineage = position.lineage.then(shipped_with);
        position.last = frame.seq;
        position.frames += 1;
        Ok(())
    });
    written.map_err(io(segment))?;
    read?;
    position.end = tail.finish().map_err(io(segment))?;
    Ok(())
}

/// Writes the restored store's metadata: the log goes on from the snapshot's frame, in the
/// restored segment, and the store was restored up to `position.last` with its lineage.
fn mark(db: &Database, position: Position) -> Result<(), RestoreError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    meta::set_log_checkpoint(&txn, position.snapshot, TAIL_SEGMENT)?;
    let lineage = position.lineage;
    restore_mark::set_pending(
        &txn,
        PendingRestore {
            guarantee: lineage.guarantee,
            last_frame: position.last,
            window_end: lineage.window_end,
            not_before: lineage.newest,
        },
    )?;
    txn.commit()?;
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RestoreError {
    let path = path.to_path_buf();
    move |source| RestoreError::Io { path, source }
}
