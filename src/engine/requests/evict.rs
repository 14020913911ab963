//! Eviction: partitions whose records are all gone, removed in bounded batches in key order,
//! and (when the store keeps tombstones) the responses of partitions whose TTLs have all
//! passed, removed by turning their records into tombstones in place.
//!
//! Nothing here searches: a partition is read from its first key on, so a batch reads a run of
//! neighbouring pages and frees them, whatever the store holds. In-progress records are never
//! touched: they are not in partitions.

use std::ops::Bound;
use std::sync::Arc;

use crate::error::StoreError;
use crate::model::maintenance::{Backlog, Evicted};
use crate::model::record::{Record, RecordState, StoredState};

use crate::engine::tables::layout::decode_stored;
use crate::engine::tables::partitions::{Partition, Partitions, partition_bounds, split_done_key};
use crate::engine::tables::registry::RawEntries;
use crate::engine::tables::tx::Tx;
use crate::engine::writer::context::Context;
use crate::engine::writer::job::Keep;

/// Removes up to `limit` records that are gone, oldest partition first, then turns up to the
/// rest of `limit` expired records into tombstones. A limit of 0 is taken as 1, so a loop
/// that calls again while [`Backlog::More`] always makes progress.
pub(crate) fn evict_expired(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    limit: usize,
) -> (Keep, Result<Evicted, StoreError>) {
    let mut evicted = Evicted {
        removed: 0,
        tombstones_removed: 0,
        backlog: Backlog::Empty,
    };
    let mut budget = limit.max(1);
    let result = drop_gone(tx, ctx, &mut budget, &mut evicted)
        .and_then(|()| tombstone_expired(tx, ctx, &mut budget, &mut evicted));
    match result {
        Ok(()) => (Keep::Writes, Ok(evicted)),
        Err(e) => (Keep::Nothing, Err(e)),
    }
}

/// The records of one partition, from `from` (or its start) on, at most `limit`.
fn partition_entries(
    tx: &Tx<'_>,
    ctx: &Context<'_>,
    partition: &Partition,
    from: Option<&[u8]>,
    limit: usize,
) -> Result<RawEntries, StoreError> {
    let (start, end) = partition_bounds(partition.number());
    let start = match from {
        Some(after) => Bound::Excluded(after),
        None => Bound::Included(start.as_slice()),
    };
    let end = match &end {
        Some(end) => Bound::Excluded(end.as_slice()),
        None => Bound::Unbounded,
    };
    Ok(tx.range_raw(ctx.tables.done, start, end, limit)?)
}

/// Deletes the records of the partitions that are all gone, and then their rows.
fn drop_gone(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    budget: &mut usize,
    evicted: &mut Evicted,
) -> Result<(), StoreError> {
    while *budget > 0 {
        let Some(partition) = ctx
            .partitions
            .oldest_gone(ctx.now, ctx.config.tombstone_ttl)
        else {
            return Ok(());
        };
        // The open partition may be all gone too (nothing written for a TTL): it takes no
        // more, and the next record opens a new one.
        partition.seal();
        let entries = partition_entries(tx, ctx, &partition, None, budget.saturating_add(1))?;
        let more = entries.len() > *budget;
        for (key, value) in entries.into_iter().take(*budget) {
            match Record::stored_state(&value) {
                Some(StoredState::Tombstone) => evicted.tombstones_removed += 1,
                _ => evicted.removed += 1,
            }
            tx.delete_raw(ctx.tables.done, &key);
            *budget -= 1;
        }
        if more {
            evicted.backlog = Backlog::More;
            return Ok(());
        }
        tx.delete_raw(ctx.tables.partitions, &partition.number().to_be_bytes());
        ctx.partitions.remove(partition.number());
    }
    if ctx
        .partitions
        .oldest_gone(ctx.now, ctx.config.tombstone_ttl)
        .is_some()
    {
        evicted.backlog = Backlog::More;
    }
    Ok(())
}

/// Turns the completed records of sealed partitions whose TTLs have all passed into
/// tombstones, a batch at a time, in key order; marks each partition when it is done.
fn tombstone_expired(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    budget: &mut usize,
    evicted: &mut Evicted,
) -> Result<(), StoreError> {
    while *budget > 0 {
        let Some(partition) = ctx
            .partitions
            .oldest_expired(ctx.now, ctx.config.tombstone_ttl)
        else {
            return Ok(());
        };
        partition.seal();
        let from = partition.tombstoned_through();
        let entries = partition_entries(
            tx,
            ctx,
            &partition,
            from.as_deref(),
            budget.saturating_add(1),
        )?;
        let more = entries.len() > *budget;
        let (mut last, mut tombstones) = (None, 0);
        for (key, value) in entries.into_iter().take(*budget) {
            *budget -= 1;
            match Record::stored_state(&value) {
                Some(StoredState::Completed) => {
                    let scope = split_done_key(&key).map_or(&key[..], |(_, scope)| scope);
                    let record = decode_stored(scope, &value)?;
                    if let Some(tombstone) = tombstone_of(&record, ctx) {
                        if let RecordState::Tombstone { until, .. } = tombstone.state {
                            partition.raise_until(until);
                        }
                        tx.put_raw(ctx.tables.done, &key, tombstone.encode());
                        evicted.removed += 1;
                        tombstones += 1;
                    }
                }
                Some(StoredState::Tombstone) => tombstones += 1,
                Some(StoredState::InProgress) | None => {}
            }
            last = Some(key);
        }
        if let Some(last) = last {
            partition.tombstoned_batch(last, tombstones, from.is_none());
        }
        if more {
            evicted.backlog = Backlog::More;
            return Ok(());
        }
        finish_tombstoning(tx, ctx, &partition)?;
    }
    if ctx
        .partitions
        .oldest_expired(ctx.now, ctx.config.tombstone_ttl)
        .is_some()
    {
        evicted.backlog = Backlog::More;
    }
    Ok(())
}

/// What a completed record past its TTL leaves: a tombstone until the tombstone time ends.
fn tombstone_of(record: &Record, ctx: &Context<'_>) -> Option<Record> {
    match record.state {
        RecordState::Completed {
            completed_at,
            expires_at,
            ..
        } if ctx.now >= expires_at => Some(Record {
            state: RecordState::Tombstone {
                completed_at,
                until: expires_at.saturating_add(ctx.config.tombstone_ttl),
            },
            ..record.clone()
        }),
        _ => None,
    }
}

/// Marks a partition's tombstoning done, in memory and in its row (if it has one: one
/// without is read whole at open, and counts its tombstones then).
fn finish_tombstoning(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    partition: &Arc<Partition>,
) -> Result<(), StoreError> {
    partition.mark_tombstoned();
    let key = partition.number().to_be_bytes();
    let old = tx.get_raw(ctx.tables.partitions, &key)?;
    if let Some(row) = Partitions::changed_row(partition, old.as_deref()) {
        tx.put_raw(ctx.tables.partitions, &key, row);
    }
    Ok(())
}
