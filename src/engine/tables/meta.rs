//! The store's metadata: format version, fence counter, log checkpoint, filter key, and the
//! restore a rebuilt store came from.
//!
//! A new file gets every entry at creation; an existing store must have every entry, well
//! formed. A missing or damaged entry is a corrupt file, never a default: a fence counter that
//! silently restarted at 1 would hand out fences (and downstream keys) that were used before.

use std::path::Path;

use redb::{Database, ReadableTable, Table, TableDefinition, TableHandle, WriteTransaction};

use crate::error::OpenError;

use super::layout::{
    FORMAT_VERSION, META, META_FILTER_KEY, META_FORMAT, META_LOG_APPLIED, META_LOG_CHECKPOINT,
    META_LOG_SEGMENT, META_NEXT_FENCE, META_RESTORE_PENDING, META_RESTORED, format_supported,
};
use super::partitions::hash::random_key;
use super::registry::Registry;
use crate::model::restore::RestoreMark;
use crate::wal::Checkpoint;

const META_TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new(META);

/// What the metadata says when the store opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    /// The next fence to hand out.
    pub(crate) next_fence: u64,
    /// The last log frame that is durable in redb, and where the log goes on after it.
    pub(crate) log_checkpoint: Checkpoint,
    /// The file's format: below [`FORMAT_VERSION`] until the store is moved to it.
    pub(crate) format: u64,
    /// The key of the partitions' filter hash; `None` before format 3.
    pub(crate) filter_key: Option<[u8; 16]>,
}

fn setup(e: impl Into<redb::Error>) -> OpenError {
    OpenError::Setup(e.into())
}

/// Creates every registered table (a new file gets its metadata too) and checks the format.
pub(crate) fn set_up(db: &Database, registry: &Registry, path: &Path) -> Result<Meta, OpenError> {
    let mut txn = db.begin_write().map_err(setup)?;
    // With quick-repair, a crash before the first checkpoint does not force redb to rebuild
    // its allocator state by walking the whole file at the next open.
    txn.set_quick_repair(true);
    let existing: Vec<String> = txn
        .list_tables()
        .map_err(setup)?
        .map(|t| t.name().to_owned())
        .collect();
    let fresh = existing.is_empty();
    if !fresh && !existing.iter().any(|name| name == META) {
        return Err(OpenError::NotAStore {
            path: path.to_path_buf(),
        });
    }
    for table in registry.tables() {
        table.create(&txn).map_err(setup)?;
    }
    if fresh {
        let mut meta = txn.open_table(META_TABLE).map_err(setup)?;
        put_u64(&mut meta, META_FORMAT, u64::from(FORMAT_VERSION))?;
        put_u64(&mut meta, META_NEXT_FENCE, 1)?;
        put_u64(&mut meta, META_LOG_CHECKPOINT, 0)?;
        meta.insert(META_FILTER_KEY, random_key().as_slice())
            .map_err(setup)?;
    } else {
        let format = read(&txn, META_FORMAT, "format_version")?;
        if !format_supported(format) {
            return Err(OpenError::UnsupportedFormat {
                found: u32::try_from(format).unwrap_or(u32::MAX),
                supported: FORMAT_VERSION,
            });
        }
        // An older store keeps its format until its log is replayed and it is moved
        // (`recovery::migrate`), which raises the mark in the same commit.
    }
    txn.commit().map_err(setup)?;
    load(db)
}

/// Records, inside the migration's commit, that the store is of this build's format, with
/// the filter key its partitions were built with.
pub(crate) fn set_current_format(txn: &WriteTransaction, key: [u8; 16]) -> Result<(), redb::Error> {
    let mut meta = txn.open_table(META_TABLE)?;
    meta.insert(
        META_FORMAT,
        u64::from(FORMAT_VERSION).to_le_bytes().as_slice(),
    )?;
    meta.insert(META_FILTER_KEY, key.as_slice())?;
    Ok(())
}

/// Reads the metadata (after a replay, which may have advanced the fence counter).
pub(crate) fn load(db: &Database) -> Result<Meta, OpenError> {
    let txn = db.begin_write().map_err(setup)?;
    let format = read(&txn, META_FORMAT, "format_version")?;
    let filter_key = read_key(&txn)?;
    if format >= 3 && filter_key.is_none() {
        return Err(OpenError::CorruptMeta {
            key: "filter_key",
            detail: "missing".into(),
        });
    }
    let meta = Meta {
        next_fence: read(&txn, META_NEXT_FENCE, "next_fence")?,
        log_checkpoint: Checkpoint {
            seq: read(&txn, META_LOG_CHECKPOINT, "log_checkpoint")?,
            segment: read_optional(&txn, META_LOG_SEGMENT, "log_segment")?,
        },
        format,
        filter_key,
    };
    txn.abort().map_err(setup)?;
    Ok(meta)
}

/// Records the log checkpoint inside `txn` (the checkpoint's own durable commit): frames up to
/// `seq` are in redb, and the log goes on in segment `segment` or a later one.
pub(crate) fn set_log_checkpoint(
    txn: &WriteTransaction,
    seq: u64,
    segment: u64,
) -> Result<(), redb::Error> {
    let mut meta = txn.open_table(META_TABLE)?;
    meta.insert(META_LOG_CHECKPOINT, seq.to_le_bytes().as_slice())?;
    meta.insert(META_LOG_SEGMENT, segment.to_le_bytes().as_slice())?;
    Ok(())
}

/// Makes a backup's metadata, inside the transaction that writes the copy, that of a store
/// without a log. The snapshot's checkpoint names the segment its log goes on in, which the
/// copy does not have; a log the copy starts numbers its segments from 1, and a recovery told
/// to read from that segment on would skip them, and with them writes the copy acknowledged.
/// Absent, as in a new store, it reads every segment. The checkpoint's sequence number stays:
/// the copy's log goes on after it.
pub(crate) fn without_log(txn: &WriteTransaction) -> Result<(), redb::Error> {
    txn.open_table(META_TABLE)?.remove(META_LOG_SEGMENT)?;
    Ok(())
}

/// The filter key, 16 bytes if present.
fn read_key(txn: &WriteTransaction) -> Result<Option<[u8; 16]>, OpenError> {
    let meta = txn.open_table(META_TABLE).map_err(setup)?;
    let Some(value) = meta.get(META_FILTER_KEY).map_err(setup)? else {
        return Ok(None);
    };
    let key: [u8; 16] = value
        .value()
        .try_into()
        .map_err(|_| OpenError::CorruptMeta {
            key: "filter_key",
            detail: format!("{} bytes where 16 are expected", value.value().len()),
        })?;
    Ok(Some(key))
}

fn put_u64(table: &mut Table<'_, &[u8], &[u8]>, key: &[u8], value: u64) -> Result<(), OpenError> {
    table
        .insert(key, value.to_le_bytes().as_slice())
        .map_err(setup)?;
    Ok(())
}

fn read(txn: &WriteTransaction, key: &[u8], name: &'static str) -> Result<u64, OpenError> {
    read_optional(txn, key, name)?.ok_or(OpenError::CorruptMeta {
        key: name,
        detail: "missing".into(),
    })
}

/// An entry that may be absent (one a later version added), well formed if present.
fn read_optional(
    txn: &WriteTransaction,
    key: &[u8],
    name: &'static str,
) -> Result<Option<u64>, OpenError> {
    let meta = txn.open_table(META_TABLE).map_err(setup)?;
    let Some(value) = meta.get(key).map_err(setup)? else {
        return Ok(None);
    };
    let bytes: [u8; 8] = value
        .value()
        .try_into()
        .map_err(|_| OpenError::CorruptMeta {
            key: name,
            detail: format!("{} bytes where 8 are expected", value.value().len()),
        })?;
    Ok(Some(u64::from_le_bytes(bytes)))
}

/// Records, inside an epoch's transaction, that it holds every frame up to `seq`.
pub(crate) fn set_applied(txn: &WriteTransaction, seq: u64) -> Result<(), redb::Error> {
    txn.open_table(META_TABLE)?
        .insert(META_LOG_APPLIED, seq.to_le_bytes().as_slice())?;
    Ok(())
}

/// The last log frame a snapshot of the file holds for certain: the larger of the last
/// epoch's mark and the last checkpoint (0 for a store that never logged).
pub(crate) fn applied(snapshot: &redb::ReadTransaction) -> Result<u64, redb::Error> {
    let meta = snapshot.open_table(META_TABLE)?;
    let read = |key: &[u8]| -> Result<u64, redb::Error> {
        Ok(meta
            .get(key)?
            .and_then(|v| <[u8; 8]>::try_from(v.value()).ok())
            .map_or(0, u64::from_le_bytes))
    };
    Ok(read(META_LOG_APPLIED)?.max(read(META_LOG_CHECKPOINT)?))
}

// Restores: the mark a rebuilt store's file gets before its first open, and the stamp that
// open turns it into (layouts in `layout.rs` and `docs/design.md`, "Meta").

/// The version byte that starts both restore marks.
const RESTORE_MARK_VERSION: u8 = 1;

/// Marks, inside `txn` (one that builds a restored store's file, before its first open), that
/// the store is rebuilt from a copy of another: what the copy may assume about what the old
/// store acknowledged, and the last frame of the old store's log it holds. The first open
/// stamps its time ([`start_restore_window`]), and the restore window runs from there. A
/// mark already pending is replaced: the last restore counts.
pub(crate) fn set_restore_pending(
    txn: &WriteTransaction,
    guarantee: crate::model::replica::Guarantee,
    last_frame: u64,
) -> Result<(), redb::Error> {
    let value = encode_restore(guarantee, last_frame, None);
    txn.open_table(META_TABLE)?
        .insert(META_RESTORE_PENDING, value.as_slice())?;
    Ok(())
}

/// At open, before the store serves anything: a pending restore mark becomes the store's
/// restore, stamped `now`, in one durable commit (a crash before it leaves the mark pending
/// for the next open). Returns the store's restore, stamped now or by an earlier open; `None`
/// for a store never restored (older stores have neither entry).
pub(crate) fn start_restore_window(
    db: &Database,
    now: crate::model::clock::Timestamp,
) -> Result<Option<RestoreMark>, OpenError> {
    let mut txn = db.begin_write().map_err(setup)?;
    txn.set_quick_repair(true);
    let (pending, restored) = {
        let meta = txn.open_table(META_TABLE).map_err(setup)?;
        let pending = read_restore(&meta, META_RESTORE_PENDING, "restore_pending")?;
        (pending, read_restore(&meta, META_RESTORED, "restored")?)
    };
    let Some((guarantee, last_frame, _)) = pending else {
        txn.abort().map_err(setup)?;
        return Ok(restored.and_then(|(guarantee, last_frame, at)| {
            at.map(|at| RestoreMark {
                guarantee,
                last_frame,
                at,
            })
        }));
    };
    let mark = RestoreMark {
        guarantee,
        last_frame,
        at: now,
    };
    {
        let mut meta = txn.open_table(META_TABLE).map_err(setup)?;
        let value = encode_restore(guarantee, last_frame, Some(now));
        meta.insert(META_RESTORED, value.as_slice())
            .map_err(setup)?;
        meta.remove(META_RESTORE_PENDING).map_err(setup)?;
    }
    txn.commit().map_err(setup)?;
    tracing::warn!(
        guarantee = guarantee.as_str(),
        last_frame,
        restored_at_ms = now.as_millis(),
        "first open of a restored store: the restore window starts now"
    );
    Ok(Some(mark))
}

fn encode_restore(
    guarantee: crate::model::replica::Guarantee,
    last_frame: u64,
    at: Option<crate::model::clock::Timestamp>,
) -> Vec<u8> {
    use crate::model::replica::Guarantee;
    let mut value = Vec::with_capacity(18);
    value.push(RESTORE_MARK_VERSION);
    value.push(match guarantee {
        Guarantee::Complete => 1,
        Guarantee::MayLag => 2,
    });
    value.extend_from_slice(&last_frame.to_le_bytes());
    if let Some(at) = at {
        value.extend_from_slice(&at.as_millis().to_le_bytes());
    }
    value
}

/// A restore mark: the pending one (10 bytes, no time) or the stamped one (18 bytes).
type RestoreEntry = (
    crate::model::replica::Guarantee,
    u64,
    Option<crate::model::clock::Timestamp>,
);

fn read_restore(
    meta: &Table<'_, &[u8], &[u8]>,
    key: &[u8],
    name: &'static str,
) -> Result<Option<RestoreEntry>, OpenError> {
    use crate::model::replica::Guarantee;
    let Some(value) = meta.get(key).map_err(setup)? else {
        return Ok(None);
    };
    let bytes = value.value();
    let corrupt = |detail: String| OpenError::CorruptMeta { key: name, detail };
    let stamped = key == META_RESTORED;
    let expected = if stamped { 18 } else { 10 };
    if bytes.len() != expected {
        return Err(corrupt(format!(
            "{} bytes where {expected} are expected",
            bytes.len()
        )));
    }
    if bytes[0] != RESTORE_MARK_VERSION {
        return Err(corrupt(format!("version {} is unknown", bytes[0])));
    }
    let guarantee = match bytes[1] {
        1 => Guarantee::Complete,
        2 => Guarantee::MayLag,
        other => return Err(corrupt(format!("guarantee {other} is unknown"))),
    };
    let u64_at = |at: usize| {
        let mut le = [0u8; 8];
        le.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(le)
    };
    let at = stamped.then(|| crate::model::clock::Timestamp::from_millis(u64_at(10)));
    Ok(Some((guarantee, u64_at(2), at)))
}

#[cfg(test)]
mod restore_tests {
    use super::*;
    use crate::model::clock::Timestamp;
    use crate::model::replica::Guarantee;

    fn database() -> Result<Database, redb::Error> {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let txn = db.begin_write()?;
        txn.open_table(META_TABLE)?;
        txn.commit()?;
        Ok(db)
    }

    fn entry(db: &Database, key: &[u8]) -> Result<Option<Vec<u8>>, redb::Error> {
        let txn = db.begin_write()?;
        let value = txn
            .open_table(META_TABLE)?
            .get(key)?
            .map(|v| v.value().to_vec());
        txn.abort()?;
        Ok(value)
    }

    #[test]
    fn the_first_open_stamps_a_pending_restore_and_later_ones_read_it() -> Result<(), OpenError> {
        let db = database().map_err(setup)?;
        assert_eq!(start_restore_window(&db, Timestamp::from_millis(5))?, None);
        let txn = db.begin_write().map_err(setup)?;
        set_restore_pending(&txn, Guarantee::MayLag, 0x0102).map_err(setup)?;
        txn.commit().map_err(setup)?;
        assert_eq!(
            entry(&db, META_RESTORE_PENDING).map_err(setup)?,
            Some(vec![1, 2, 2, 1, 0, 0, 0, 0, 0, 0]),
            "the layout in docs/design.md"
        );
        let stamped = RestoreMark {
            guarantee: Guarantee::MayLag,
            last_frame: 0x0102,
            at: Timestamp::from_millis(0x0304),
        };
        assert_eq!(
            start_restore_window(&db, Timestamp::from_millis(0x0304))?,
            Some(stamped)
        );
        assert_eq!(entry(&db, META_RESTORE_PENDING).map_err(setup)?, None);
        assert_eq!(
            entry(&db, META_RESTORED).map_err(setup)?,
            Some(vec![1, 2, 2, 1, 0, 0, 0, 0, 0, 0, 4, 3, 0, 0, 0, 0, 0, 0])
        );
        assert_eq!(
            start_restore_window(&db, Timestamp::from_millis(99_999))?,
            Some(stamped),
            "a reopen does not move the window"
        );
        Ok(())
    }

    #[test]
    fn a_damaged_restore_mark_is_corrupt_metadata() -> Result<(), redb::Error> {
        for (key, value) in [
            (META_RESTORE_PENDING, vec![1, 2, 0]),
            (META_RESTORE_PENDING, vec![2, 2, 0, 0, 0, 0, 0, 0, 0, 0]),
            (
                META_RESTORED,
                vec![1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
        ] {
            let db = database()?;
            let txn = db.begin_write()?;
            txn.open_table(META_TABLE)?.insert(key, value.as_slice())?;
            txn.commit()?;
            assert!(
                matches!(
                    start_restore_window(&db, Timestamp::from_millis(1)),
                    Err(OpenError::CorruptMeta { .. })
                ),
                "{value:?}"
            );
        }
        Ok(())
    }
}
