//! `verify`: the log's frames, the database, each record in the table of its state, the
//! partitions' rows against their records, and the tables the log writes, each problem named.

use std::collections::BTreeMap;

use redb::{ReadTransaction, TableHandle};

use crate::engine::layout::{
    CLAIMS, DONE, KeyHasher, META_FILTER_KEY, META_NEXT_FENCE, PARTITIONS, PartitionInfo,
    split_done_key,
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
    /// A record in the table of another state: a claim that is not in progress, or a
    /// partition's record that is.
    #[error("record {scope} is {state} but is stored in {table}")]
    Misplaced {
        /// The record's scope.
        scope: String,
        /// Its state.
        state: &'static str,
        /// The table it is in.
        table: &'static str,
    },
    /// A key that is not a scope (or, in `idemstore.done`, a partition and a scope).
    #[error("{table} holds a malformed key {key:?}")]
    MalformedKey {
        /// The table.
        table: &'static str,
        /// The key's bytes.
        key: Vec<u8>,
    },
    /// A sealed partition's row does not cover its records: a lookup or an eviction that
    /// trusts it could miss a record, or drop it too early.
    #[error("partition {partition}: {detail}")]
    Partition {
        /// The partition's number.
        partition: u32,
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
    /// Partitions checked against their rows.
    pub partitions: u64,
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

fn scope_text(bytes: &[u8]) -> String {
    Scope::decode(bytes).map_or_else(|_| format!("{bytes:?}"), |s| s.to_string())
}

/// What one partition holds, as `verify` reads it.
#[derive(Debug, Default)]
struct Held {
    records: u64,
    max_expires: Timestamp,
    max_until: Timestamp,
    scopes: Vec<Vec<u8>>,
}

impl Inspector {
    /// Checks the store: every log frame's checksum and order, that the log past the
    /// checkpoint reads back, that every record decodes and is in the table of its state,
    /// that each sealed partition's row covers its records (their count, their times, and
    /// its filter holding their keys), that fences are below the next fence, and that the
    /// business tables the log writes exist. Open with [`LogDamage::Report`](super::LogDamage::Report)
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
        self.verify_claims(&txn, next_fence, &mut v)?;
        let partitions = self.verify_done(&txn, next_fence, &mut v)?;
        self.verify_rows(&txn, &partitions, &mut v)?;
        self.verify_tables(&txn, &mut v)?;
        Ok(v)
    }

    /// A record read: it decodes, and its fence is below `next_fence` (when that could be
    /// read). `None` if it is damaged (a problem then).
    fn check_record(
        &self,
        scope: &[u8],
        bytes: &[u8],
        next_fence: Option<u64>,
        v: &mut Verification,
    ) -> Option<Record> {
        v.records += 1;
        let record = match decode(scope, bytes) {
            Ok(record) => record,
            Err(e) => {
                v.problems.push(Problem::CorruptRecord {
                    scope: scope_text(scope),
                    detail: e.to_string(),
                });
                return None;
            }
        };
        if let Some(next_fence) = next_fence
            && record.fence() >= next_fence
        {
            v.problems.push(Problem::Fence {
                scope: scope_text(scope),
                fence: record.fence(),
                next_fence,
            });
        }
        Some(record)
    }

    /// Every claim decodes and is in progress.
    fn verify_claims(
        &self,
        txn: &ReadTransaction,
        next_fence: Option<u64>,
        v: &mut Verification,
    ) -> Result<(), InspectError> {
        self.for_each(txn, CLAIMS, |scope, bytes| {
            if Scope::decode(scope).is_err() {
                v.problems.push(Problem::MalformedKey {
                    table: CLAIMS,
                    key: scope.to_vec(),
                });
            }
            if let Some(record) = self.check_record(scope, bytes, next_fence, v)
                && !matches!(record.state(), RecordState::InProgress { .. })
            {
                v.problems.push(Problem::Misplaced {
                    scope: scope_text(scope),
                    state: record.state().name(),
                    table: CLAIMS,
                });
            }
            Ok(true)
        })
    }

    /// Every partition's record decodes and is completed or a tombstone; answers what each
    /// partition holds, for its row to be checked against.
    fn verify_done(
        &self,
        txn: &ReadTransaction,
        next_fence: Option<u64>,
        v: &mut Verification,
    ) -> Result<BTreeMap<u32, Held>, InspectError> {
        let mut held: BTreeMap<u32, Held> = BTreeMap::new();
        self.for_each(txn, DONE, |key, bytes| {
            let Some((number, scope)) =
                split_done_key(key).filter(|(_, s)| Scope::decode(s).is_ok())
            else {
                v.problems.push(Problem::MalformedKey {
                    table: DONE,
                    key: key.to_vec(),
                });
                return Ok(true);
            };
            let Some(record) = self.check_record(scope, bytes, next_fence, v) else {
                return Ok(true);
            };
            let partition = held.entry(number).or_default();
            partition.records += 1;
            partition.scopes.push(scope.to_vec());
            match record.state() {
                RecordState::Completed { expires_at, .. } => {
                    partition.max_expires = partition.max_expires.max(*expires_at);
                }
                RecordState::Tombstone { until, .. } => {
                    partition.max_until = partition.max_until.max(*until);
                }
                RecordState::InProgress { .. } => v.problems.push(Problem::Misplaced {
                    scope: scope_text(scope),
                    state: record.state().name(),
                    table: DONE,
                }),
            }
            Ok(true)
        })?;
        Ok(held)
    }

    /// Each sealed partition's row decodes and covers what the partition holds: its count, its
    /// times, its filter and the key hashes its generation's filter is built from. A partition
    /// without a row is read whole when the store opens: not a problem.
    fn verify_rows(
        &self,
        txn: &ReadTransaction,
        held: &BTreeMap<u32, Held>,
        v: &mut Verification,
    ) -> Result<(), InspectError> {
        let hasher = match self.meta_bytes(txn, META_FILTER_KEY)? {
            Some(key) => match <[u8; 16]>::try_from(key.as_slice()) {
                Ok(key) => Some(KeyHasher::new(key)),
                Err(_) => {
                    v.problems.push(Problem::Meta(format!(
                        "the filter key has {} bytes where 16 are expected",
                        key.len()
                    )));
                    None
                }
            },
            None => {
                v.problems
                    .push(Problem::Meta("the filter key is missing".into()));
                None
            }
        };
        for (&number, partition) in held {
            v.partitions += 1;
            let Some(row) = self.get(txn, PARTITIONS, &number.to_be_bytes())? else {
                continue;
            };
            let problem = |detail: String| Problem::Partition {
                partition: number,
                detail,
            };
            let (info, filter, hashes) = match PartitionInfo::decode(&row) {
                Ok(decoded) => decoded,
                Err(detail) => {
                    v.problems
                        .push(problem(format!("its row does not decode ({detail})")));
                    continue;
                }
            };
            if info.records < partition.records {
                v.problems.push(problem(format!(
                    "its row counts {} records, it holds {}",
                    info.records, partition.records
                )));
            }
            if info.max_expires < partition.max_expires || info.max_until < partition.max_until {
                v.problems.push(problem(format!(
                    "its row says its records are gone by {}, a record lasts until {}",
                    info.max_expires.max(info.max_until),
                    partition.max_expires.max(partition.max_until)
                )));
            }
            if let Some(hasher) = &hasher {
                let missing = partition
                    .scopes
                    .iter()
                    .filter(|scope| !filter.may_contain(hasher.hash(scope)))
                    .count();
                if missing > 0 {
                    v.problems.push(problem(format!(
                        "its filter misses {missing} of its keys: lookups would not find them"
                    )));
                }
                let hashes: std::collections::HashSet<u64> = hashes.into_iter().collect();
                let unhashed = partition
                    .scopes
                    .iter()
                    .filter(|scope| !hashes.contains(&hasher.hash(scope)))
                    .count();
                if unhashed > 0 {
                    v.problems.push(problem(format!(
                        "its row lacks the hashes of {unhashed} of its keys: its generation's filter, built from them, would not find them"
                    )));
                }
            }
        }
        Ok(())
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
