//! `verify`: the log's frames, the database, the indexes against the records, and the tables
//! the log writes, each problem named.

use redb::{ReadTransaction, TableHandle};

use crate::engine::layout::{
    EXPIRY, LEASES, META_NEXT_FENCE, RECORDS, TOMBSTONES, index_key, split_index_key,
};
use crate::error::RecoveryError;
use crate::model::clock::Timestamp;
use crate::model::record::{Record, RecordState};
use crate::model::scope::Scope;

use super::error::InspectError;
use super::open::{FrameAt, Inspector};
use super::records::decode;

/// One problem `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    /// The log cannot be read back past the checkpoint: opening the store would fail.
    #[error("log: {0}")]
    Log(String),
    /// A segment holds a valid frame after a bad one, or is in another format.
    #[error("log segment {segment} at offset {offset}: {detail}")]
    Segment {
        /// The segment file's name.
        segment: String,
        /// Where.
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// A valid frame whose payload does not decode.
    #[error("log segment {segment} at offset {offset}: frame {seq} does not decode ({detail})")]
    BadFrame {
        /// The segment file's name.
        segment: String,
        /// The frame's offset.
        offset: u64,
        /// Its sequence number.
        seq: u64,
        /// The decoder's message.
        detail: String,
    },
    /// A record does not decode.
    #[error("record {scope}: damaged ({detail})")]
    CorruptRecord {
        /// The record's scope (or its bytes).
        scope: String,
        /// What is wrong.
        detail: String,
    },
    /// A record has no entry in the index of its state.
    #[error("record {scope} is {state} but {index} has no entry for it at {at}")]
    MissingIndexEntry {
        /// The record's scope.
        scope: String,
        /// Its state.
        state: &'static str,
        /// The index that should list it.
        index: &'static str,
        /// The time the entry should have (ms since the epoch).
        at: Timestamp,
    },
    /// An index entry whose record is missing or says otherwise.
    #[error("{index} entry for {scope} at {at}: {detail}")]
    OrphanIndexEntry {
        /// The index.
        index: &'static str,
        /// The scope the entry names.
        scope: String,
        /// The entry's time.
        at: Timestamp,
        /// What is wrong.
        detail: String,
    },
    /// A record's fence is not below the store's next fence: a fence could be handed out twice.
    #[error("record {scope} has fence {fence}, but the store's next fence is {next_fence}")]
    Fence {
        /// The record's scope.
        scope: String,
        /// Its fence.
        fence: u64,
        /// The meta entry's value.
        next_fence: u64,
    },
    /// The log writes a business table the database does not have.
    #[error(
        "the log writes table {table:?} (frame {} in {} at offset {}), which the database does not have",
        at.seq, at.segment, at.offset
    )]
    MissingTable {
        /// The table's name.
        table: String,
        /// The first frame that writes it.
        at: FrameAt,
    },
    /// The store's metadata is damaged.
    #[error("{0}")]
    Meta(String),
}

/// What `verify` checked and found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Verification {
    /// Log segment files read.
    pub segments: usize,
    /// Valid frames read, in every segment.
    pub frames: u64,
    /// Frames past the checkpoint (what the next open replays).
    pub pending_frames: u64,
    /// A torn last frame, which the next open drops (it was never acknowledged): not a problem.
    pub torn_tail: Option<(String, u64)>,
    /// Records read.
    pub records: u64,
    /// Index entries read.
    pub index_entries: u64,
    /// Business tables the log past the checkpoint writes.
    pub tables_in_log: usize,
    /// Everything wrong; empty for a sound store.
    pub problems: Vec<Problem>,
}

impl Verification {
    /// `true` if nothing is wrong.
    pub fn is_sound(&self) -> bool {
        self.problems.is_empty()
    }
}

/// The index a record of this state must be in, and at what time.
fn index_of(record: &Record) -> (&'static str, Timestamp) {
    match record.state() {
        RecordState::InProgress { lease_until, .. } => (LEASES, *lease_until),
        RecordState::Completed { expires_at, .. } => (EXPIRY, *expires_at),
        RecordState::Tombstone { until, .. } => (TOMBSTONES, *until),
    }
}

fn scope_text(bytes: &[u8]) -> String {
    Scope::decode(bytes).map_or_else(|_| format!("{bytes:?}"), |s| s.to_string())
}

impl Inspector {
    /// Checks the store: every log frame's checksum and order, that the log past the
    /// checkpoint reads back, that every record decodes and has its index entry and every
    /// index entry its record, that fences are below the next fence, and that the business
    /// tables the log writes exist. Open with [`LogDamage::Report`](super::LogDamage::Report)
    /// so that a damaged log is a problem found, not an error.
    ///
    /// # Errors
    /// [`InspectError`] only if the files cannot be read at all; everything wrong with what
    /// they hold is in [`Verification::problems`].
    pub fn verify(&self) -> Result<Verification, InspectError> {
        let mut v = Verification::default();
        self.verify_log(&mut v)?;
        let txn = self.read_txn()?;
        let next_fence = match self.meta(&txn, META_NEXT_FENCE, "next_fence") {
            Ok(fence) => Some(fence),
            Err(e) => {
                v.problems.push(Problem::Meta(e.to_string()));
                None
            }
        };
        self.verify_records(&txn, next_fence, &mut v)?;
        for index in [LEASES, EXPIRY, TOMBSTONES] {
            self.verify_index(&txn, index, &mut v)?;
        }
        self.verify_tables(&txn, &mut v)?;
        Ok(v)
    }

    /// Every record decodes, has the entry of its state's index, and a fence below
    /// `next_fence` (when that could be read).
    fn verify_records(
        &self,
        txn: &ReadTransaction,
        next_fence: Option<u64>,
        v: &mut Verification,
    ) -> Result<(), InspectError> {
        self.for_each(txn, RECORDS, |scope, bytes| {
            v.records += 1;
            let record = match decode(scope, bytes) {
                Ok(record) => record,
                Err(e) => {
                    v.problems.push(Problem::CorruptRecord {
                        scope: scope_text(scope),
                        detail: e.to_string(),
                    });
                    return Ok(true);
                }
            };
            let (index, at) = index_of(&record);
            if self.get(txn, index, &index_key(at, scope))?.is_none() {
                v.problems.push(Problem::MissingIndexEntry {
                    scope: scope_text(scope),
                    state: record.state().name(),
                    index,
                    at,
                });
            }
            if let Some(next_fence) = next_fence
                && record.fence() >= next_fence
            {
                v.problems.push(Problem::Fence {
                    scope: scope_text(scope),
                    fence: record.fence(),
                    next_fence,
                });
            }
            Ok(true)
        })
    }

    /// Every entry of `index` names a record that belongs there, at that time.
    fn verify_index(
        &self,
        txn: &ReadTransaction,
        index: &'static str,
        v: &mut Verification,
    ) -> Result<(), InspectError> {
        self.for_each(txn, index, |key, _| {
            v.index_entries += 1;
            let Some((at, scope)) = split_index_key(key) else {
                v.problems.push(Problem::OrphanIndexEntry {
                    index,
                    scope: format!("{key:?}"),
                    at: Timestamp::default(),
                    detail: "the key is shorter than a timestamp".into(),
                });
                return Ok(true);
            };
            let orphan = |detail: String| Problem::OrphanIndexEntry {
                index,
                scope: scope_text(scope),
                at,
                detail,
            };
            match self.get(txn, RECORDS, scope)? {
                None => v.problems.push(orphan("there is no record".into())),
                Some(bytes) => {
                    if let Ok(record) = decode(scope, &bytes)
                        && index_of(&record) != (index, at)
                    {
                        let (its_index, its_at) = index_of(&record);
                        v.problems.push(orphan(format!(
                            "the record is {} and belongs in {its_index} at {its_at}",
                            record.state().name()
                        )));
                    }
                }
            }
            Ok(true)
        })
    }

    /// Every business table the log past the checkpoint writes exists in the database.
    fn verify_tables(
        &self,
        txn: &ReadTransaction,
        v: &mut Verification,
    ) -> Result<(), InspectError> {
        let Ok(pending) = &self.pending else {
            return Ok(()); // an unreadable log is a problem `verify_log` reported
        };
        v.tables_in_log = pending.tables.len();
        let existing: Vec<String> = txn
            .list_tables()
            .map_err(|e| self.db_error(e))?
            .map(|t| t.name().to_owned())
            .collect();
        for (table, at) in &pending.tables {
            if !existing.contains(table) {
                v.problems.push(Problem::MissingTable {
                    table: table.clone(),
                    at: at.clone(),
                });
            }
        }
        Ok(())
    }

    fn verify_log(&self, v: &mut Verification) -> Result<(), InspectError> {
        let corrupt_at = match &self.pending {
            Ok(pending) => {
                v.pending_frames = pending.report.frames_replayed;
                v.torn_tail = pending.report.torn_tail.clone();
                None
            }
            Err(e) => {
                v.problems.push(Problem::Log(e.to_string()));
                match e {
                    RecoveryError::Corrupt {
                        segment, offset, ..
                    } => segment
                        .file_name()
                        .map(|n| (n.to_string_lossy().into_owned(), *offset)),
                    _ => None,
                }
            }
        };
        let mut bad = Vec::new();
        let damage = self.frames(0, |frame| {
            v.frames += 1;
            if let Err(detail) = &frame.ops {
                bad.push(Problem::BadFrame {
                    segment: frame.segment.clone(),
                    offset: frame.offset,
                    seq: frame.seq,
                    detail: detail.clone(),
                });
            }
            Ok::<(), InspectError>(())
        })?;
        v.segments = self
            .log
            .as_ref()
            .map(|log| {
                use crate::storage::LogDir;
                log.list()
                    .map(|names| names.iter().filter(|n| n.starts_with("seg-")).count())
            })
            .transpose()
            .map_err(|source| InspectError::Io {
                path: self.dir.join("wal"),
                source,
            })?
            .unwrap_or(0);
        for d in damage {
            // Recovery already named this one.
            if corrupt_at.as_ref() == Some(&(d.segment.clone(), d.offset)) {
                continue;
            }
            v.problems.push(Problem::Segment {
                segment: d.segment,
                offset: d.offset,
                detail: d.detail,
            });
        }
        v.problems.extend(bad);
        Ok(())
    }
}
