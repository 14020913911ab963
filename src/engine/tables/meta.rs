//! The store's metadata: format version, fence counter, log checkpoint, filter key, and the
//! writer epoch it ships at (the restore a rebuilt store came from is `restore_mark.rs`).
//!
//! A new file gets every entry at creation; an existing store must have every entry, well
//! formed. A missing or damaged entry is a corrupt file, never a default: a fence counter that
//! silently restarted at 1 would hand out fences (and downstream keys) that were used before.

use std::path::Path;

use redb::{Database, ReadableTable, Table, TableDefinition, TableHandle, WriteTransaction};

use crate::error::OpenError;

use super::layout::{
    FORMAT_VERSION, META, META_FILTER_KEY, META_FORMAT, META_LOG_APPLIED, META_LOG_CHECKPOINT,
    META_LOG_SEGMENT, META_NEXT_FENCE, META_WRITER_EPOCH, format_supported,
};
use super::partitions::hash::random_key;
use super::registry::Registry;
use crate::wal::Checkpoint;

pub(super) const META_TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new(META);

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

pub(super) fn setup(e: impl Into<redb::Error>) -> OpenError {
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

/// The writer epoch this store ships at (`model::writer_epoch`): raised only by a take-over of
/// its stream, which writes it before the store first opens; 0 for a store that never took a
/// stream over.
pub(crate) fn writer_epoch(db: &Database) -> Result<u64, OpenError> {
    let txn = db.begin_write().map_err(setup)?;
    let epoch = read_optional(&txn, META_WRITER_EPOCH, "writer_epoch")?;
    txn.abort().map_err(setup)?;
    Ok(epoch.unwrap_or(0))
}

/// Records the writer epoch inside `txn`, which must be durable (a take-over's).
pub(crate) fn set_writer_epoch(txn: &WriteTransaction, epoch: u64) -> Result<(), redb::Error> {
    txn.open_table(META_TABLE)?
        .insert(META_WRITER_EPOCH, epoch.to_le_bytes().as_slice())?;
    Ok(())
}
