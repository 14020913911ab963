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

use crate::engine::tables::meta;
use crate::error::{ReplicaError, RestoreError};
use crate::model::maintenance::{Restored, Takeover};
use crate::model::replica::{Guarantee, WriterIdentity};
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
    /// What the last frame (or the snapshot) was shipped with.
    pub(crate) guarantee: Guarantee,
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
    let (position, ()) = build(source, dest, |_| Ok(()))?;
    // A refused take-over leaves nothing at `dest`: a restore is all or nothing.
    finish(source, dest, position, takeover, started).inspect_err(|_| {
        let _ = std::fs::remove_dir_all(dest);
    })
}

/// Makes the rebuilt store at `dest` the stream's writer if asked, and says what it holds.
/// A refused take-over leaves `dest` as it is (a standby goes on following it).
pub(crate) fn finish(
    source: &dyn ReplicaSource,
    dest: &Path,
    position: Position,
    takeover: Takeover,
    started: Instant,
) -> Result<Restored, RestoreError> {
    let took_over = match takeover {
        Takeover::Yes => {
            source.take_over(&WriterIdentity::this_process(dest), position.last)?;
            true
        }
        Takeover::No => false,
    };
    let restored = Restored {
        snapshot: position.snapshot,
        frames: position.frames,
        last_frame: position.last,
        guarantee: position.guarantee,
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
    Ok(restored)
}

/// Builds the store at `dest` (absent, or an empty directory) beside it and renames it into
/// place; says where its log ends. `before_place` runs on the finished directory just before
/// it is renamed (a standby takes the directory's lock there, so that it holds it from the
/// moment the store is at `dest`). [`finish`] completes a restore.
pub(crate) fn build<T>(
    source: &dyn ReplicaSource,
    dest: &Path,
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
        guarantee: snapshot.guarantee,
        frames: 0,
        end: 0,
    };
    append(source, &segment, tail, &mut position)?;
    sync_dir(&wal).map_err(io(&wal))?;
    mark(&db, position)?;
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
    let (position, lock) = build(source, &fresh, lock)?;
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
        tail.append(frame.seq, &frame.payload).map_err(|e| {
            let detail = e.to_string();
            written = Err(e);
            ReplicaError::Refused { detail }
        })?;
        position.guarantee = shipped_with;
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
/// restored segment, and the store was restored up to `position.last` with its guarantee.
fn mark(db: &Database, position: Position) -> Result<(), RestoreError> {
    let mut txn = db.begin_write()?;
    txn.set_durability(redb::Durability::Immediate)?;
    meta::set_log_checkpoint(&txn, position.snapshot, TAIL_SEGMENT)?;
    meta::set_restore_pending(&txn, position.guarantee, position.last)?;
    txn.commit()?;
    Ok(())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RestoreError {
    let path = path.to_path_buf();
    move |source| RestoreError::Io { path, source }
}
