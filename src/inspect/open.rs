//! Opening a store directory read-only, and the view it gives: redb's tables as last made
//! durable, with the log's frames past the checkpoint laid over them in memory, as a replay at
//! open would apply them, but without writing anything.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use redb::{
    Database, DatabaseError, ReadOnlyDatabase, ReadOnlyTable, ReadTransaction, ReadableDatabase,
    ReadableTable, ReadableTableMetadata, StorageError, TableDefinition, TableError, TableHandle,
};

use crate::engine::layout::{
    DONE, FORMAT_VERSION, META, META_FORMAT, META_LOG_CHECKPOINT, META_LOG_SEGMENT,
    format_supported, partition_bounds, split_done_key,
};
use crate::error::{Holder, RecoveryError};
use crate::model::clock::{Clock, SystemClock, Timestamp};
use crate::storage::{CopyOnWrite, ReadOnlyLogDir, SharedLock, SharedLockError, db_file};
use crate::wal::{Checkpoint, RecoveryReport, listing, recover};

use super::error::InspectError;

/// What to do when the log past the checkpoint cannot be read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogDamage {
    /// Fail with [`InspectError::Log`]: every answer would be missing acknowledged writes.
    Refuse,
    /// Open anyway, reading redb alone, and report the damage through
    /// [`Inspector::log_damage`]: for `verify`, which must go on to check the rest.
    Report,
}

/// How the store's database file was left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Closed {
    /// Closed by the store: redb opened it read-only.
    Cleanly,
    /// Not closed (a crash, a kill, an exit without dropping the store): redb had to repair
    /// its allocator state, which was done in memory; the log replays past the checkpoint.
    Uncleanly,
}

/// Puts (`Some`) and deletes (`None`) per table, from the log frames past the checkpoint.
type Overlay = HashMap<String, BTreeMap<Vec<u8>, Option<Vec<u8>>>>;

/// Where a frame past the checkpoint is, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameAt {
    /// The segment file's name.
    pub segment: String,
    /// The frame's offset in it.
    pub offset: u64,
    /// Its sequence number.
    pub seq: u64,
}

/// What replaying the log would do now.
#[derive(Debug, Default)]
pub(super) struct Pending {
    pub(super) report: RecoveryReport,
    pub(super) overlay: Overlay,
    /// Business tables the frames write, each with the first frame that does.
    pub(super) tables: BTreeMap<String, FrameAt>,
}

/// A store directory opened for reading only: nothing is created, written, replayed or
/// truncated, and the directory is locked shared while the inspector lives, so no store opens
/// it meanwhile. The database is opened with [`redb::ReadOnlyDatabase`]; a file that was not
/// closed cleanly, which redb would have to repair first, is repaired in memory over a file
/// opened for reading (its writes never reach the disk).
///
/// Answers include every write the log holds past the last checkpoint (what a crash left for
/// the next open to replay): they are applied to an in-memory view, never to the files.
pub struct Inspector {
    pub(super) dir: PathBuf,
    pub(super) db: Db,
    pub(super) log: Option<ReadOnlyLogDir>,
    pub(super) checkpoint: u64,
    pub(super) pending: Result<Pending, RecoveryError>,
    pub(super) now: Timestamp,
    /// The directory's shared lock (`None` for a store never opened by a build that locks
    /// it). Declared last: it is let go after the database is closed.
    _lock: Option<SharedLock>,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector")
            .field("dir", &self.dir)
            .field("checkpoint", &self.checkpoint)
            .finish_non_exhaustive()
    }
}

/// One of the store's own tables, opened for reading.
pub(super) type RawTable = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The store's own tables, as bytes.
pub(super) fn raw(name: &str) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
    TableDefinition::new(name)
}

impl Inspector {
    /// Opens the store in `dir` for reading.
    ///
    /// # Errors
    /// [`InspectError`]: no such directory, not a store, in use by a running process (the
    /// store's lock admits no reader beside its writer), a database that needs a repair, or
    /// (with [`LogDamage::Refuse`]) a log that cannot be read back.
    pub fn open(dir: impl AsRef<Path>, on_damage: LogDamage) -> Result<Inspector, InspectError> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(InspectError::NoSuchDirectory { path: dir });
        }
        let path = db_file(&dir);
        if !path.is_file() {
            return Err(InspectError::no_database(dir));
        }
        let lock = SharedLock::acquire(&dir).map_err(|e| match e {
            SharedLockError::Held(holder) => InspectError::InUse {
                path: dir.clone(),
                holder,
            },
            SharedLockError::Io { path, source } => InspectError::Io { path, source },
        })?;
        let db = open_db(&dir, &path)?;
        let txn = db
            .begin_read()
            .map_err(|e| InspectError::database(path.clone(), e))?;
        let has_meta = txn
            .list_tables()
            .map_err(|e| InspectError::database(path.clone(), e))?
            .any(|t| t.name() == META);
        if !has_meta {
            return Err(InspectError::NotAStore {
                path: dir,
                reason: "idemstore.redb has no idemstore.meta table".into(),
                stores_below: Vec::new(),
            });
        }
        let format = meta_u64(&txn, &Overlay::new(), META_FORMAT, "format_version", &path)?;
        if !format_supported(format) {
            return Err(InspectError::UnsupportedFormat {
                found: format,
                supported: FORMAT_VERSION,
            });
        }
        if format < u64::from(FORMAT_VERSION) {
            return Err(InspectError::OlderFormat {
                found: format,
                current: FORMAT_VERSION,
            });
        }
        let checkpoint = meta_u64(
            &txn,
            &Overlay::new(),
            META_LOG_CHECKPOINT,
            "log_checkpoint",
            &path,
        )?;
        let segment = meta_opt_u64(
            &txn,
            &Overlay::new(),
            META_LOG_SEGMENT,
            "log_segment",
            &path,
        )?;
        drop(txn);
        let log = ReadOnlyLogDir::of_store(&dir);
        let pending = match &log {
            Some(log) => read_pending(
                log,
                Checkpoint {
                    seq: checkpoint,
                    segment,
                },
            ),
            None => Ok(Pending::default()),
        };
        let pending = match (pending, on_damage) {
            (Err(e), LogDamage::Refuse) => return Err(InspectError::Log(e)),
            (pending, _) => pending,
        };
        Ok(Inspector {
            dir,
            db,
            log,
            checkpoint,
            pending,
            now: SystemClock.now(),
            _lock: lock,
        })
    }

    /// Why the log past the checkpoint cannot be read back, if it cannot (opened with
    /// [`LogDamage::Report`]): answers then come from redb alone.
    pub fn log_damage(&self) -> Option<&RecoveryError> {
        self.pending.as_ref().err()
    }

    /// How the database file was found: closed cleanly, or needing the repair a crash leaves
    /// (made in memory).
    pub fn closed(&self) -> Closed {
        match self.db {
            Db::ReadOnly(_) => Closed::Cleanly,
            Db::RepairedInMemory(_) => Closed::Uncleanly,
        }
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The time answers are computed at (ages, expiry): when the inspector was opened.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    pub(super) fn overlay(&self) -> Option<&Overlay> {
        self.pending.as_ref().ok().map(|p| &p.overlay)
    }

    pub(super) fn read_txn(&self) -> Result<ReadTransaction, InspectError> {
        self.db
            .begin_read()
            .map_err(|e| InspectError::database(db_file(&self.dir), e))
    }

    pub(super) fn db_error(&self, e: impl std::fmt::Display) -> InspectError {
        InspectError::database(db_file(&self.dir), e)
    }

    /// A store table, `None` if the file does not have it.
    pub(super) fn table(
        &self,
        txn: &ReadTransaction,
        name: &str,
    ) -> Result<Option<RawTable>, InspectError> {
        match txn.open_table(raw(name)) {
            Ok(table) => Ok(Some(table)),
            Err(TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(self.db_error(e)),
        }
    }

    /// The value of `key` in `table`, the log's frames past the checkpoint included.
    pub(super) fn get(
        &self,
        txn: &ReadTransaction,
        table: &str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, InspectError> {
        if let Some(value) = self.overlay().and_then(|o| o.get(table)?.get(key)) {
            return Ok(value.clone());
        }
        let Some(t) = self.table(txn, table)? else {
            return Ok(None);
        };
        let value = t.get(key).map_err(|e| self.db_error(e))?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    /// Entries of `table` (the log's frames past the checkpoint included).
    pub(super) fn len(&self, txn: &ReadTransaction, table: &str) -> Result<u64, InspectError> {
        let t = self.table(txn, table)?;
        let mut len = match &t {
            Some(t) => t.len().map_err(|e| self.db_error(e))?,
            None => 0,
        };
        for (key, value) in self
            .overlay()
            .and_then(|o| o.get(table))
            .into_iter()
            .flatten()
        {
            let existed = match &t {
                Some(t) => t
                    .get(key.as_slice())
                    .map_err(|e| self.db_error(e))?
                    .is_some(),
                None => false,
            };
            match (existed, value.is_some()) {
                (false, true) => len += 1,
                (true, false) => len = len.saturating_sub(1),
                _ => {}
            }
        }
        Ok(len)
    }

    /// Calls `f` with every entry of `table` in key order, the log's frames past the
    /// checkpoint included, until it returns `Ok(false)`.
    pub(super) fn for_each(
        &self,
        txn: &ReadTransaction,
        table: &str,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<bool, InspectError>,
    ) -> Result<(), InspectError> {
        let empty = BTreeMap::new();
        let overlay = self.overlay().and_then(|o| o.get(table)).unwrap_or(&empty);
        let mut pending = overlay.iter().peekable();
        if let Some(t) = self.table(txn, table)? {
            for entry in t.iter().map_err(|e| self.db_error(e))? {
                let (key, value) = entry.map_err(|e| self.db_error(e))?;
                let key = key.value();
                while let Some((k, v)) = pending.next_if(|(k, _)| k.as_slice() < key) {
                    if let Some(v) = v
                        && !f(k, v)?
                    {
                        return Ok(());
                    }
                }
                if let Some((_, v)) = pending.next_if(|(k, _)| k.as_slice() == key) {
                    if let Some(v) = v
                        && !f(key, v)?
                    {
                        return Ok(());
                    }
                    continue;
                }
                if !f(key, value.value())? {
                    return Ok(());
                }
            }
        }
        for (k, v) in pending {
            if let Some(v) = v
                && !f(k, v)?
            {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The partitions that hold records, ascending (the log's frames past the checkpoint
    /// included): one seek a partition in the file.
    pub(super) fn partition_numbers(
        &self,
        txn: &ReadTransaction,
    ) -> Result<Vec<u32>, InspectError> {
        let mut numbers = std::collections::BTreeSet::new();
        if let Some(done) = self.table(txn, DONE)? {
            let mut from: Vec<u8> = Vec::new();
            loop {
                let first = done
                    .range::<&[u8]>(from.as_slice()..)
                    .map_err(|e| self.db_error(e))?
                    .next();
                let Some(first) = first else { break };
                let (key, _) = first.map_err(|e| self.db_error(e))?;
                let Some((number, _)) = split_done_key(key.value()) else {
                    break;
                };
                numbers.insert(number);
                match partition_bounds(number).1 {
                    Some(next) => from = next,
                    None => break,
                }
            }
        }
        let logged = self.overlay().and_then(|o| o.get(DONE));
        for (key, value) in logged.into_iter().flatten() {
            if let (Some((number, _)), Some(_)) = (split_done_key(key), value) {
                numbers.insert(number);
            }
        }
        Ok(numbers.into_iter().collect())
    }

    /// A meta entry's bytes, the log past the checkpoint included.
    pub(super) fn meta_bytes(
        &self,
        txn: &ReadTransaction,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, InspectError> {
        self.get(txn, META, key)
    }

    /// A meta entry, the log past the checkpoint included.
    pub(super) fn meta(
        &self,
        txn: &ReadTransaction,
        key: &[u8],
        name: &'static str,
    ) -> Result<u64, InspectError> {
        let empty = Overlay::new();
        meta_u64(
            txn,
            self.overlay().unwrap_or(&empty),
            key,
            name,
            &db_file(&self.dir),
        )
    }
}

/// The database, read-only; or, for a file that was not closed cleanly (redb refuses a
/// read-only open of one), repaired in memory over a file opened for reading only.
pub(super) enum Db {
    ReadOnly(ReadOnlyDatabase),
    RepairedInMemory(Database),
}

impl Db {
    pub(super) fn begin_read(&self) -> Result<ReadTransaction, redb::TransactionError> {
        match self {
            Db::ReadOnly(db) => db.begin_read(),
            Db::RepairedInMemory(db) => db.begin_read(),
        }
    }
}

fn open_db(dir: &Path, path: &Path) -> Result<Db, InspectError> {
    let not_redb = |detail: String| InspectError::NotAStore {
        path: dir.to_path_buf(),
        reason: format!("idemstore.redb is not a readable redb database ({detail})"),
        stores_below: Vec::new(),
    };
    match ReadOnlyDatabase::open(path) {
        Ok(db) => Ok(Db::ReadOnly(db)),
        // Held without the directory's lock: by an idemstore build older than the lock file.
        Err(DatabaseError::DatabaseAlreadyOpen) => Err(InspectError::InUse {
            holder: Holder::Unknown,
            path: dir.to_path_buf(),
        }),
        // A crash (or a process that exited without closing the store) leaves the allocator
        // state to rebuild: do it in memory, never in the file.
        Err(DatabaseError::RepairAborted) => {
            let backend = CopyOnWrite::open(path).map_err(|source| InspectError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            Database::builder()
                .create_with_backend(backend)
                .map(Db::RepairedInMemory)
                .map_err(|e| InspectError::database(path.to_path_buf(), e))
        }
        Err(DatabaseError::Storage(StorageError::Io(e)))
            if e.kind() == std::io::ErrorKind::InvalidData =>
        {
            Err(not_redb(e.to_string()))
        }
        Err(DatabaseError::Storage(StorageError::Io(source))) => Err(InspectError::Io {
            path: path.to_path_buf(),
            source,
        }),
        Err(other) => Err(not_redb(other.to_string())),
    }
}

fn meta_u64(
    txn: &ReadTransaction,
    overlay: &Overlay,
    key: &[u8],
    name: &'static str,
    path: &Path,
) -> Result<u64, InspectError> {
    meta_opt_u64(txn, overlay, key, name, path)?.ok_or_else(|| InspectError::CorruptMeta {
        key: name,
        detail: "missing".into(),
    })
}

/// A meta entry that may be absent (one a later version added), well formed if present.
fn meta_opt_u64(
    txn: &ReadTransaction,
    overlay: &Overlay,
    key: &[u8],
    name: &'static str,
    path: &Path,
) -> Result<Option<u64>, InspectError> {
    let corrupt = |detail: String| InspectError::CorruptMeta { key: name, detail };
    let bytes = match overlay.get(META).and_then(|o| o.get(key)) {
        Some(value) => value.clone(),
        None => {
            let table = txn
                .open_table(raw(META))
                .map_err(|e| InspectError::database(path.to_path_buf(), e))?;
            let value = table
                .get(key)
                .map_err(|e| InspectError::database(path.to_path_buf(), e))?;
            value.map(|v| v.value().to_vec())
        }
    };
    let Some(bytes) = bytes else {
        return Ok(None);
    };
    let array: [u8; 8] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| corrupt(format!("{} bytes where 8 are expected", bytes.len())))?;
    Ok(Some(u64::from_le_bytes(array)))
}

/// Reads the log past `checkpoint` as recovery at open would, into an overlay.
fn read_pending(log: &ReadOnlyLogDir, checkpoint: Checkpoint) -> Result<Pending, RecoveryError> {
    let mut overlay = Overlay::new();
    let mut tables = BTreeMap::new();
    let dir_path = log.path().to_path_buf();
    let recovered = recover(log, &dir_path, checkpoint, None, 0, &mut |frame| {
        let ops =
            listing::frame_ops(frame.payload).map_err(|detail| RecoveryError::BadPayload {
                seq: frame.seq,
                segment: dir_path.join(frame.segment),
                offset: frame.offset,
                detail,
            })?;
        for (table, key, value) in ops {
            // Business tables are not read here, only named: `verify` checks they exist.
            if table.starts_with("idemstore.") {
                overlay
                    .entry(table.to_owned())
                    .or_default()
                    .insert(key.to_vec(), value.map(<[u8]>::to_vec));
            } else {
                tables.entry(table.to_owned()).or_insert_with(|| FrameAt {
                    segment: frame.segment.to_owned(),
                    offset: frame.offset,
                    seq: frame.seq,
                });
            }
        }
        Ok(())
    })?;
    Ok(Pending {
        report: recovered.report,
        overlay,
        tables,
    })
}
