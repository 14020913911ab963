//! Eviction: expired records removed (or tombstoned) in bounded batches through the expiry
//! and tombstone indexes.

use std::ops::Bound;

use crate::error::StoreError;
use crate::model::maintenance::{Backlog, Evicted};
use crate::model::record::{Record, RecordState};

use crate::engine::tables::layout::{decode_stored, index_bound_after, index_key, split_index_key};
use crate::engine::tables::registry::TableId;
use crate::engine::tables::tx::Tx;
use crate::engine::writer::context::Context;
use crate::engine::writer::job::Keep;

/// Removes up to `limit` completed records whose TTL has passed, oldest first, through the
/// expiry index. In-progress records are never removed: their outcome is unknown. A limit of 0
/// is taken as 1, so a loop that calls again while [`Backlog::More`] always makes progress.
pub(crate) fn evict_expired(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    limit: usize,
) -> (Keep, Result<Evicted, StoreError>) {
    match evict(tx, ctx, limit.max(1)) {
        Ok(evicted) => (Keep::Writes, Ok(evicted)),
        Err(e) => (Keep::Nothing, Err(e)),
    }
}

fn evict(tx: &mut Tx<'_>, ctx: &Context<'_>, limit: usize) -> Result<Evicted, StoreError> {
    let mut evicted = Evicted {
        removed: 0,
        tombstones_removed: 0,
        backlog: Backlog::Empty,
    };
    let mut budget = limit;
    for index in [ctx.tables.expiry, ctx.tables.tombstones] {
        let (done, more) = evict_from(tx, ctx, index, budget)?;
        if index == ctx.tables.expiry {
            evicted.removed = done;
        } else {
            evicted.tombstones_removed = done;
        }
        budget -= done.min(budget);
        if more == Backlog::More {
            evicted.backlog = Backlog::More;
        }
    }
    Ok(evicted)
}

/// Handles up to `limit` due entries of one index (the expiry index or the tombstone index),
/// oldest first. Returns how many records it removed (or tombstoned), and whether more entries
/// are due.
fn evict_from(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    index: TableId,
    limit: usize,
) -> Result<(usize, Backlog), StoreError> {
    let end = index_bound_after(ctx.now);
    let due = tx.range_raw(
        index,
        Bound::Unbounded,
        Bound::Excluded(&end),
        limit.saturating_add(1),
    )?;
    let backlog = if due.len() > limit {
        Backlog::More
    } else {
        Backlog::Empty
    };
    let mut removed = 0;
    for (entry, _) in due.into_iter().take(limit) {
        tx.delete_raw(index, &entry);
        let Some((at, scope_bytes)) = split_index_key(&entry) else {
            continue;
        };
        let Some(bytes) = tx.get_raw(ctx.tables.records, scope_bytes)? else {
            continue;
        };
        // A record that cannot be read is reported, never silently skipped (nor evicted).
        let record = decode_stored(scope_bytes, &bytes)?;
        // Only the record this entry indexes, in the state it indexes; anything else means the
        // entry was stale and only the entry goes. In-progress records are never touched.
        match record.state {
            RecordState::Completed {
                completed_at,
                expires_at,
                ..
            } if expires_at == at && index == ctx.tables.expiry => {
                if ctx.config.tombstone_ttl.is_zero() {
                    tx.delete_raw(ctx.tables.records, scope_bytes);
                } else {
                    let until = expires_at.saturating_add(ctx.config.tombstone_ttl);
                    let tombstone = Record {
                        state: RecordState::Tombstone {
                            completed_at,
                            until,
                        },
                        ..record
                    };
                    tx.put_raw(ctx.tables.records, scope_bytes, tombstone.encode());
                    tx.put_raw(
                        ctx.tables.tombstones,
                        &index_key(until, scope_bytes),
                        Vec::new(),
                    );
                }
                removed += 1;
            }
            RecordState::Tombstone { until, .. }
                if until == at && index == ctx.tables.tombstones =>
            {
                tx.delete_raw(ctx.tables.records, scope_bytes);
                removed += 1;
            }
            _ => {}
        }
    }
    Ok((removed, backlog))
}
