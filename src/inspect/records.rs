//! Records and their counts, read through the indexes of the read-only view.

use std::time::Duration;

use crate::engine::layout::{
    EXPIRY, LEASES, META_NEXT_FENCE, RECORDS, TOMBSTONES, split_index_key,
};
use crate::model::clock::Timestamp;
use crate::model::record::{Record, RecordState};
use crate::model::scope::Scope;
use crate::storage::db_file;
use crate::wal::RecoveryReport;

use super::error::InspectError;
use super::open::{FrameAt, Inspector};

/// A record's state, to list records by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StateFilter {
    /// Claims held, or abandoned by a crashed attempt; listed by lease end.
    InProgress,
    /// Completed records with their response; listed by expiry.
    Completed,
    /// Markers left after a response was evicted; listed by when they go.
    Tombstone,
}

impl StateFilter {
    /// The index that lists records of this state.
    fn index(self) -> &'static str {
        match self {
            StateFilter::InProgress => LEASES,
            StateFilter::Completed => EXPIRY,
            StateFilter::Tombstone => TOMBSTONES,
        }
    }

    fn matches(self, state: &RecordState) -> bool {
        matches!(
            (self, state),
            (StateFilter::InProgress, RecordState::InProgress { .. })
                | (StateFilter::Completed, RecordState::Completed { .. })
                | (StateFilter::Tombstone, RecordState::Tombstone { .. })
        )
    }
}

/// Which records [`Inspector::records`] lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// Their state.
    pub state: StateFilter,
    /// Only this tenant's, if set.
    pub tenant: Option<String>,
    /// Only those first claimed at least this long ago, if set: with
    /// [`StateFilter::InProgress`], the abandoned-work listing.
    pub older_than: Option<Duration>,
    /// At most this many.
    pub limit: usize,
}

/// A record with its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The record's `(tenant, operation, key)`.
    pub scope: Scope,
    /// The record as stored.
    pub record: Record,
}

/// A store's state as its files hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Summary {
    /// Records of every state.
    pub records: u64,
    /// In-progress records.
    pub in_progress: u64,
    /// Completed records (those past their TTL that eviction has not reached included).
    pub completed: u64,
    /// Completed records past their expiry, waiting for eviction.
    pub expired: u64,
    /// Tombstones.
    pub tombstones: u64,
    /// Age of the oldest in-progress record (since its first claim), if any.
    pub oldest_in_progress: Option<Duration>,
    /// Size of the database file.
    pub db_bytes: u64,
    /// Size of the log's segment files together (preallocated, so not what they hold).
    pub log_bytes: u64,
    /// Segment files in the log directory.
    pub segments: usize,
    /// Sequence number of the last log frame the database holds durably.
    pub checkpoint_seq: u64,
    /// The next fence the store will hand out.
    pub next_fence: u64,
    /// What a replay would find now: frames and bytes past the checkpoint, a torn tail. The
    /// store keeps no record of its last recovery; for a store closed cleanly this is empty.
    pub pending: RecoveryReport,
    /// When the database file was last written (its modification time).
    pub db_modified: Option<Timestamp>,
    /// Business tables the log past the checkpoint writes, with the first frame that does.
    pub tables_in_log: Vec<(String, FrameAt)>,
}

impl Inspector {
    /// The record of `scope` as stored (a completed record past its TTL is shown as it is,
    /// not as a tombstone); `None` if there is none.
    ///
    /// # Errors
    /// [`InspectError`] if the database cannot be read or the record is damaged.
    pub fn record(&self, scope: &Scope) -> Result<Option<Record>, InspectError> {
        let txn = self.read_txn()?;
        self.get(&txn, RECORDS, scope.encode())?
            .map(|bytes| decode(scope.encode(), &bytes))
            .transpose()
    }

    /// Records of one state, in index order (oldest lease, expiry or tombstone end first),
    /// filtered and at most `filter.limit`.
    ///
    /// # Errors
    /// [`InspectError`] if the database cannot be read or a record is damaged.
    pub fn records(&self, filter: &Filter) -> Result<Vec<Entry>, InspectError> {
        let txn = self.read_txn()?;
        let mut out = Vec::new();
        if filter.limit == 0 {
            return Ok(out);
        }
        let mut failure = None;
        self.for_each(&txn, filter.state.index(), |key, _| {
            let Some((_, scope_bytes)) = split_index_key(key) else {
                return Ok(true);
            };
            let Ok(scope) = Scope::decode(scope_bytes) else {
                return Ok(true);
            };
            if filter
                .tenant
                .as_deref()
                .is_some_and(|t| t != scope.tenant())
            {
                return Ok(true);
            }
            let Some(bytes) = self.get(&txn, RECORDS, scope_bytes)? else {
                return Ok(true);
            };
            let record = match decode(scope_bytes, &bytes) {
                Ok(record) => record,
                Err(e) => {
                    failure = Some(e);
                    return Ok(false);
                }
            };
            if !filter.state.matches(record.state()) {
                return Ok(true);
            }
            let age = self.now.saturating_since(record.created_at());
            if filter.older_than.is_some_and(|min| age < min) {
                return Ok(true);
            }
            out.push(Entry { scope, record });
            Ok(out.len() < filter.limit)
        })?;
        match failure {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// Records by state, sizes, the checkpoint, and what a replay would find.
    ///
    /// Counts come from the indexes (constant time); the oldest in-progress age reads every
    /// in-progress record.
    ///
    /// # Errors
    /// [`InspectError`] if the database or the log directory cannot be read.
    pub fn summary(&self) -> Result<Summary, InspectError> {
        let txn = self.read_txn()?;
        let mut oldest: Option<Timestamp> = None;
        self.for_each(&txn, LEASES, |key, _| {
            if let Some((_, scope)) = split_index_key(key)
                && let Some(bytes) = self.get(&txn, RECORDS, scope)?
                && let Ok(record) = decode(scope, &bytes)
            {
                let created = record.created_at();
                oldest = Some(oldest.map_or(created, |o| o.min(created)));
            }
            Ok(true)
        })?;
        let mut expired = 0u64;
        self.for_each(&txn, EXPIRY, |key, _| {
            match split_index_key(key) {
                Some((at, _)) if at <= self.now => expired += 1,
                Some(_) => return Ok(false), // index order is time order
                None => {}
            }
            Ok(true)
        })?;
        let (mut log_bytes, mut segments) = (0, 0);
        if let Some(log) = &self.log {
            use crate::storage::LogDir;
            let io = |source| InspectError::Io {
                path: log.path().to_path_buf(),
                source,
            };
            for name in log.list().map_err(io)? {
                if name.starts_with("seg-") {
                    segments += 1;
                    log_bytes += log.len(&name).map_err(io)?;
                }
            }
        }
        let file = std::fs::metadata(db_file(&self.dir)).map_err(|source| InspectError::Io {
            path: db_file(&self.dir),
            source,
        })?;
        let db_modified = file
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| Timestamp::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
        let pending = self.pending.as_ref().ok();
        Ok(Summary {
            records: self.len(&txn, RECORDS)?,
            in_progress: self.len(&txn, LEASES)?,
            completed: self.len(&txn, EXPIRY)?,
            expired,
            tombstones: self.len(&txn, TOMBSTONES)?,
            oldest_in_progress: oldest.map(|created| self.now.saturating_since(created)),
            db_bytes: file.len(),
            log_bytes,
            segments,
            checkpoint_seq: self.checkpoint,
            next_fence: self.meta(&txn, META_NEXT_FENCE, "next_fence")?,
            pending: pending.map(|p| p.report.clone()).unwrap_or_default(),
            db_modified,
            tables_in_log: pending
                .map(|p| {
                    p.tables
                        .iter()
                        .map(|(t, at)| (t.clone(), at.clone()))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

/// Decodes a stored record, naming its scope if it is damaged.
pub(super) fn decode(scope: &[u8], bytes: &[u8]) -> Result<Record, InspectError> {
    Record::decode(bytes).map_err(|source| InspectError::CorruptRecord {
        scope: Scope::decode(scope).map_or_else(|_| format!("{scope:?}"), |s| s.to_string()),
        detail: source.to_string(),
    })
}
