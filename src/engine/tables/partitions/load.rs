//! The partitions of a store's file, as an open or a recovery in place finds them.
//!
//! A sealed partition's row holds its figures, its filter and its keys' hashes; a partition
//! without a usable row (the open one, one sealed by a write that a crash lost, or one whose
//! row is damaged) is read whole, record by record. A generation's filter is built from the
//! hashes of its partitions' keys. Rows are a cache of what the records say, so a damaged one
//! is rebuilt, never a reason to refuse the store.

use std::collections::BTreeMap;
use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use crate::model::clock::Timestamp;
use crate::model::record::{Record, RecordState};

use super::generation::{Generation, GenerationNo, generation_of};
use super::info::Info;
use super::{Partition, PartitionNo, Partitions, partition_bounds, split_done_key};
use crate::engine::tables::layout::{DONE, PARTITIONS};

type Raw = TableDefinition<'static, &'static [u8], &'static [u8]>;

/// What an open finds: the partitions and their generations, each ascending.
pub(crate) type Found = (Vec<Arc<Partition>>, Vec<Arc<Generation>>);

/// Reads every partition of `db` (after its log is replayed): sealed ones from their rows,
/// the rest from their records; and builds each generation's filter from the hashes of its
/// partitions' keys. The newest partition stays open unless it has a row.
pub(crate) fn load(db: &redb::Database, partitions: &Partitions) -> Result<Found, redb::Error> {
    let txn = db.begin_read()?;
    let done = txn.open_table(Raw::new(DONE))?;
    let rows = txn.open_table(Raw::new(PARTITIONS))?;
    let numbers = numbers(&done)?;
    let newest = numbers.last().copied();
    let mut found: Vec<Arc<Partition>> = Vec::with_capacity(numbers.len());
    let mut generations: BTreeMap<GenerationNo, Generation> = BTreeMap::new();
    for number in numbers {
        let row = rows.get(number.to_be_bytes().as_slice())?;
        let decoded = row.as_ref().map(|row| Info::decode(row.value()));
        drop(row);
        let (partition, hashes) = match decoded {
            Some(Ok((info, filter, hashes))) => (Partition::sealed(number, &info, filter), hashes),
            other => {
                if let Some(Err(detail)) = other {
                    tracing::warn!(
                        partition = number,
                        detail,
                        "a partition's row is damaged; reading the partition whole instead"
                    );
                }
                let (partition, hashes) = read_whole(&done, partitions, number)?;
                // The newest stays open, holding its keys' hashes (noted as it was read) for
                // its row; an older one is sealed, and memory keeps no hashes of it.
                if Some(number) != newest {
                    partition.seal();
                    drop(partition.take_hashes());
                }
                (partition, hashes)
            }
        };
        let g = generation_of(number);
        let generation = generations
            .entry(g)
            .or_insert_with(|| Generation::new(g, partitions.capacity()));
        for hash in hashes {
            generation.insert(hash);
        }
        found.push(Arc::new(partition));
    }
    Ok((found, generations.into_values().map(Arc::new).collect()))
}

/// The partition numbers that have records, ascending: one seek a partition.
fn numbers(
    done: &impl ReadableTable<&'static [u8], &'static [u8]>,
) -> Result<Vec<PartitionNo>, redb::Error> {
    let mut out = Vec::new();
    let mut from: Vec<u8> = Vec::new();
    loop {
        let Some(first) = done.range::<&[u8]>(from.as_slice()..)?.next() else {
            break;
        };
        let (key, _) = first?;
        let Some((number, _)) = split_done_key(key.value()) else {
            return Err(redb::Error::Corrupted(format!(
                "a key of {DONE} is shorter than a partition number"
            )));
        };
        out.push(number);
        match partition_bounds(number).1 {
            Some(next) => from = next,
            None => break,
        }
    }
    Ok(out)
}

/// A partition rebuilt from its records, with the hashes of its keys. A record that cannot
/// be read keeps the partition from ever counting as gone (nothing says when it would be): it
/// is skipped by no lookup and dropped by no eviction, and the lookup that reaches it reports
/// it.
fn read_whole(
    done: &impl ReadableTable<&'static [u8], &'static [u8]>,
    partitions: &Partitions,
    number: PartitionNo,
) -> Result<(Partition, Vec<u64>), redb::Error> {
    let (start, end) = partition_bounds(number);
    let range = match &end {
        Some(end) => done.range::<&[u8]>(start.as_slice()..end.as_slice())?,
        None => done.range::<&[u8]>(start.as_slice()..)?,
    };
    let mut entries = Vec::new();
    for entry in range {
        let (key, value) = entry?;
        entries.push((key.value().to_vec(), value.value().to_vec()));
    }
    let first_at = Timestamp::from_millis(u64::MAX);
    let partition = Partition::open(
        number,
        partitions.capacity().max(entries.len() as u64),
        first_at,
    );
    let mut hashes = Vec::with_capacity(entries.len());
    for (key, value) in &entries {
        let Some((_, scope)) = split_done_key(key) else {
            continue;
        };
        let hash = partitions.hash(scope);
        hashes.push(hash);
        match Record::decode(value) {
            Ok(
                record @ Record {
                    state: RecordState::Completed { .. } | RecordState::Tombstone { .. },
                    ..
                },
            ) => {
                partition.note(hash, &record);
                partition.note_first(completed_at(&record));
            }
            Ok(_) | Err(_) => {
                tracing::warn!(
                    partition = number,
                    "a record in a partition cannot be read as a completed one; the partition is kept until it is removed by hand"
                );
                partition.note_unreadable(hash);
            }
        }
    }
    Ok((partition, hashes))
}

fn completed_at(record: &Record) -> Timestamp {
    match record.state {
        RecordState::Completed { completed_at, .. }
        | RecordState::Tombstone { completed_at, .. } => completed_at,
        RecordState::InProgress { .. } => record.created_at,
    }
}
