//! Records and their counts, read from the claims and the partitions of the read-only view.

use std::time::Duration;

use crate::engine::layout::{
    CLAIMS, DONE, META_NEXT_FENCE, PARTITIONS, PartitionInfo, split_done_key,
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
    /// Completed records with their response; listed oldest partition first.
    Completed,
    /// Markers left after a response was evicted; listed oldest partition first.
    Tombstone,
}

impl StateFilter {
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
    /// Completed records in partitions whose every TTL has passed, waiting for eviction (from
    /// the sealed partitions' rows: records of the open partition past their TTL are not
    /// counted).
    pub expired: u64,
    /// Tombstones, as the sealed partitions' rows count them (those of the open partition are
    /// not counted).
    pub tombstones: u64,
    /// Partitions of completed records.
    pub partitions: u64,
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
    /// not as a tombstone); `None` if there is none. A store looks in the claims first, then
    /// in the partitions, newest first: so does this.
    ///
    /// # Errors
    /// [`InspectError`] if the database cannot be read or the record is damaged.
    pub fn record(&self, scope: &Scope) -> Result<Option<Record>, InspectError> {
        let txn = self.read_txn()?;
        Ok(self
            .located(&txn, scope.encode())?
            .map(|(_, record)| record))
    }

    /// The record a lookup of `scope` finds, with the partition it is in (`None` for a claim).
    fn located(
        &self,
        txn: &redb::ReadTransaction,
        scope: &[u8],
    ) -> Result<Option<(Option<u32>, Record)>, InspectError> {
        if let Some(bytes) = self.get(txn, CLAIMS, scope)? {
            return Ok(Some((None, decode(scope, &bytes)?)));
        }
        for number in self.partition_numbers(txn)?.into_iter().rev() {
            let key = crate::engine::layout::done_key(number, scope);
            if let Some(bytes) = self.get(txn, DONE, &key)? {
                return Ok(Some((Some(number), decode(scope, &bytes)?)));
            }
        }
        Ok(None)
    }

    /// Records of one state, filtered and at most `filter.limit`: claims by lease end,
    /// completed records and tombstones oldest partition first. A record hidden by a newer
    /// one of the same scope (its key was claimed again once it was gone) is left out.
    ///
    /// # Errors
    /// [`InspectError`] if the database cannot be read or a record is damaged.
    pub fn records(&self, filter: &Filter) -> Result<Vec<Entry>, InspectError> {
        let txn = self.read_txn()?;
        if filter.limit == 0 {
            return Ok(Vec::new());
        }
        if filter.state == StateFilter::InProgress {
            let mut claims = Vec::new();
            self.for_each(&txn, CLAIMS, |scope, bytes| {
                claims.push((scope.to_vec(), bytes.to_vec()));
                Ok(true)
            })?;
            let mut out = Vec::new();
            for (scope_bytes, bytes) in claims {
                if let Some(entry) =
                    self.listed(filter, &scope_bytes, decode(&scope_bytes, &bytes)?)
                {
                    out.push(entry);
                }
            }
            out.sort_by_key(|e| match e.record.state() {
                RecordState::InProgress { lease_until, .. } => *lease_until,
                _ => Timestamp::from_millis(u64::MAX),
            });
            out.truncate(filter.limit);
            return Ok(out);
        }
        let mut out = Vec::new();
        let mut failure = None;
        self.for_each(&txn, DONE, |key, bytes| {
            let Some((number, scope_bytes)) = split_done_key(key) else {
                return Ok(true);
            };
            let record = match decode(scope_bytes, bytes) {
                Ok(record) => record,
                Err(e) => {
                    failure = Some(e);
                    return Ok(false);
                }
            };
            let Some(entry) = self.listed(filter, scope_bytes, record) else {
                return Ok(true);
            };
            // Only the record a lookup finds: not one hidden by a newer claim or partition.
            if matches!(self.located(&txn, scope_bytes)?, Some((Some(at), _)) if at == number) {
                out.push(entry);
            }
            Ok(out.len() < filter.limit)
        })?;
        match failure {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }

    /// The entry for a record if `filter` lists it.
    fn listed(&self, filter: &Filter, scope_bytes: &[u8], record: Record) -> Option<Entry> {
        let scope = Scope::decode(scope_bytes).ok()?;
        if filter
            .tenant
            .as_deref()
            .is_some_and(|t| t != scope.tenant())
        {
            return None;
        }
        if !filter.state.matches(record.state()) {
            return None;
        }
        let age = self.now.saturating_since(record.created_at());
        if filter.older_than.is_some_and(|min| age < min) {
            return None;
        }
        Some(Entry { scope, record })
    }

    /// Records by state, sizes, the checkpoint, and what a replay would find.
    ///
    /// Counts come from the tables' lengths and the sealed partitions' rows; the oldest
    /// in-progress age reads every claim.
    ///
    /// # Errors
    /// [`InspectError`] if the database or the log directory cannot be read.
    pub fn summary(&self) -> Result<Summary, InspectError> {
        let txn = self.read_txn()?;
        let mut oldest: Option<Timestamp> = None;
        self.for_each(&txn, CLAIMS, |scope, bytes| {
            if let Ok(record) = decode(scope, bytes) {
                let created = record.created_at();
                oldest = Some(oldest.map_or(created, |o| o.min(created)));
            }
            Ok(true)
        })?;
        let (mut expired, mut tombstones) = (0u64, 0u64);
        let partitions = self.partition_numbers(&txn)?;
        for &number in &partitions {
            let Some(row) = self.get(&txn, PARTITIONS, &number.to_be_bytes())? else {
                continue;
            };
            let Ok((info, _, _)) = PartitionInfo::decode(&row) else {
                continue;
            };
            tombstones += info.tombstones;
            if info.stage == crate::engine::layout::PartitionStage::Sealed
                && info.max_expires <= self.now
            {
                expired += info.records.saturating_sub(info.tombstones);
            }
        }
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
        let (in_progress, completed) = (self.len(&txn, CLAIMS)?, self.len(&txn, DONE)?);
        Ok(Summary {
            records: in_progress + completed,
            in_progress,
            completed,
            expired,
            tombstones,
            partitions: partitions.len() as u64,
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
