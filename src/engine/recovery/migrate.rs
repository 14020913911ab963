//! Moving a store of format 1 or 2 to format 3, once, when it is opened.
//!
//! Formats 1 and 2 kept every record in one table keyed by scope, with three indexes
//! (expiry, lease, tombstone). Format 3 keeps claims in `idemstore.claims` and completed
//! records in partitions by time (`tables::partitions`). The move runs after the old log is
//! replayed into the old tables, in one durable redb transaction that also records that log as
//! checkpointed and raises the format: a crash before its commit leaves the old store as it
//! was (the next open replays and moves it again), a crash after leaves the new one. Completed
//! records are read through the expiry index, so they land in partitions in time order, as if
//! they had been written by this build. Records are re-encoded in the current version.

use std::time::{Duration, Instant};

use redb::{Database, ReadableTable, ReadableTableMetadata, Table, TableDefinition};

use crate::error::OpenError;
use crate::model::config::Config;
use crate::model::record::{Record, RecordState};

use super::catch_up::CaughtUp;
use crate::engine::tables::layout::{
    CLAIMS, DONE, EXPIRY_V2, FORMAT_VERSION, LEASES_V2, PARTITIONS, RECORDS_V2, TOMBSTONES_V2,
    split_index_key,
};
use crate::engine::tables::meta;
use crate::engine::tables::partitions::hash::{KeyHasher, random_key};
use crate::engine::tables::partitions::{Partitions, done_key};

type Raw = TableDefinition<'static, &'static [u8], &'static [u8]>;
type RawTable<'t> = Table<'t, &'static [u8], &'static [u8]>;

/// Moves the store to this build's format if it is older; answers what catching up found,
/// with the log (if any) now starting after the frames the move made durable.
pub(crate) fn if_needed(
    db: &Database,
    config: &Config,
    mut caught_up: CaughtUp,
) -> Result<CaughtUp, OpenError> {
    let found = meta::load(db)?;
    if found.format >= u64::from(FORMAT_VERSION) {
        return Ok(caught_up);
    }
    let started = Instant::now();
    let checkpoint = caught_up
        .log
        .as_ref()
        .map(|(_, start)| (start.next_seq.saturating_sub(1), start.next_number));
    let moved = migrate(db, config, checkpoint).map_err(|detail| OpenError::Migrate {
        from: u32::try_from(found.format).unwrap_or(u32::MAX),
        detail,
    })?;
    if let (Some((dir, start)), Some((seq, _))) = (caught_up.log.take(), checkpoint) {
        caught_up.log = Some((dir, start.after_checkpoint(seq)));
    }
    tracing::info!(
        from = found.format,
        to = FORMAT_VERSION,
        in_progress = moved.in_progress,
        completed = moved.completed,
        partitions = moved.partitions,
        ms = started.elapsed().as_millis() as u64,
        "moved the store to the current format"
    );
    Ok(caught_up)
}

/// What the move moved.
#[derive(Debug, Default)]
struct Moved {
    in_progress: u64,
    completed: u64,
    partitions: u64,
}

/// The move itself, in one durable transaction; an error says what stopped it.
fn migrate(
    db: &Database,
    config: &Config,
    checkpoint: Option<(u64, u64)>,
) -> Result<Moved, String> {
    let redb = |e: redb::Error| e.to_string();
    let mut txn = db.begin_write().map_err(|e| redb(e.into()))?;
    txn.set_durability(redb::Durability::Immediate)
        .map_err(|e| redb(e.into()))?;
    txn.set_quick_repair(true);
    let key = random_key();
    let partitions = Partitions::new(KeyHasher::new(key), config.memory().partition_records);
    let mut moved = Moved::default();
    {
        let open = |name| txn.open_table(Raw::new(name)).map_err(|e| redb(e.into()));
        let mut tables = Tables {
            records: open(RECORDS_V2)?,
            claims: open(CLAIMS)?,
            done: open(DONE)?,
            rows: open(PARTITIONS)?,
        };
        let window = config.partition_window();
        for index in [LEASES_V2, EXPIRY_V2, TOMBSTONES_V2] {
            let entries = index_entries(&open(index)?).map_err(redb)?;
            for (at, scope) in entries {
                tables
                    .move_indexed(&partitions, window, &scope, at, &mut moved)
                    .map_err(|e| format!("{}: {e}", shown(&scope)))?;
            }
        }
        tables
            .move_leftovers(&partitions, window, &mut moved)
            .map_err(redb)?;
        moved.partitions = partitions.all().partitions().len() as u64;
    }
    for name in [RECORDS_V2, EXPIRY_V2, LEASES_V2, TOMBSTONES_V2] {
        txn.delete_table(Raw::new(name))
            .map_err(|e| redb(e.into()))?;
    }
    meta::set_current_format(&txn, key).map_err(redb)?;
    if let Some((seq, segment)) = checkpoint {
        meta::set_log_checkpoint(&txn, seq, segment).map_err(redb)?;
    }
    txn.commit().map_err(|e| redb(e.into()))?;
    Ok(moved)
}

/// A scope for a message: its text if it decodes, else its bytes.
fn shown(scope: &[u8]) -> String {
    crate::model::scope::Scope::decode(scope)
        .map_or_else(|_| format!("{scope:?}"), |s| s.to_string())
}

/// An index's entries, oldest first: the time and the scope.
fn index_entries(index: &RawTable<'_>) -> Result<Vec<(u64, Vec<u8>)>, redb::Error> {
    let mut out = Vec::with_capacity(index.len()? as usize);
    for entry in index.iter()? {
        let (key, _) = entry?;
        if let Some((at, scope)) = split_index_key(key.value()) {
            out.push((at.as_millis(), scope.to_vec()));
        }
    }
    Ok(out)
}

/// The tables the move reads from and writes to.
struct Tables<'t> {
    records: RawTable<'t>,
    claims: RawTable<'t>,
    done: RawTable<'t>,
    rows: RawTable<'t>,
}

impl Tables<'_> {
    /// Moves the record an index entry points at, if the entry is current.
    fn move_indexed(
        &mut self,
        partitions: &Partitions,
        window: Duration,
        scope: &[u8],
        at: u64,
        moved: &mut Moved,
    ) -> Result<(), String> {
        let Some(bytes) = self.records.get(scope).map_err(|e| e.to_string())? else {
            return Ok(()); // a stale entry: its record moved on, or was removed
        };
        let record = Record::decode(bytes.value()).map_err(|e| e.to_string())?;
        drop(bytes);
        let current = match &record.state {
            RecordState::InProgress { lease_until, .. } => lease_until.as_millis() == at,
            RecordState::Completed { expires_at, .. } => expires_at.as_millis() == at,
            RecordState::Tombstone { until, .. } => until.as_millis() == at,
        };
        if current {
            self.put(partitions, window, scope, &record, moved)
                .map_err(|e| e.to_string())?;
            self.records.remove(scope).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Records no index pointed at (none, in a store whose indexes are whole).
    fn move_leftovers(
        &mut self,
        partitions: &Partitions,
        window: Duration,
        moved: &mut Moved,
    ) -> Result<(), redb::Error> {
        let mut left = Vec::new();
        for entry in self.records.iter()? {
            let (scope, bytes) = entry?;
            left.push((scope.value().to_vec(), bytes.value().to_vec()));
        }
        if !left.is_empty() {
            tracing::warn!(
                records = left.len(),
                "records that no index listed are moved too"
            );
        }
        for (scope, bytes) in left {
            let record = Record::decode(&bytes).map_err(|e| {
                redb::Error::Corrupted(format!("the record of {}: {e}", shown(&scope)))
            })?;
            self.put(partitions, window, &scope, &record, moved)?;
        }
        Ok(())
    }

    /// Writes a record where format 3 keeps it.
    fn put(
        &mut self,
        partitions: &Partitions,
        window: Duration,
        scope: &[u8],
        record: &Record,
        moved: &mut Moved,
    ) -> Result<(), redb::Error> {
        let completed_at = match record.state {
            RecordState::InProgress { .. } => {
                self.claims.insert(scope, record.encode().as_slice())?;
                moved.in_progress += 1;
                return Ok(());
            }
            RecordState::Completed { completed_at, .. }
            | RecordState::Tombstone { completed_at, .. } => completed_at,
        };
        let chosen = partitions.choose(completed_at, window);
        if let Some(sealed) = chosen.sealed {
            self.rows.insert(
                sealed.number().to_be_bytes().as_slice(),
                Partitions::sealed_row(&sealed).as_slice(),
            )?;
        }
        partitions.note(chosen.number, partitions.hash(scope), record);
        self.done.insert(
            done_key(chosen.number, scope).as_slice(),
            record.encode().as_slice(),
        )?;
        moved.completed += 1;
        Ok(())
    }
}
