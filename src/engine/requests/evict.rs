//! Eviction: expired records removed (or tombstoned) in bounded batches through the expiry
//! and tombstone indexes, and the records that are gone removed beside a new key's claim.

use std::ops::Bound;

use crate::error::StoreError;
use crate::model::clock::Timestamp;
use crate::model::maintenance::{Backlog, Evicted};
use crate::model::record::{Record, RecordState, Visibility};

use super::records::write_record_bytes;
use crate::engine::tables::layout::{decode_stored, index_bound_after, index_key, split_index_key};
use crate::engine::tables::registry::TableId;
use crate::engine::tables::tx::Tx;
use crate::engine::writer::context::Context;
use crate::engine::writer::job::Keep;

/// How many records after a new key its claim looks at for ones that are gone. Most share the
/// new key's page, which the epoch writes anyway; the last few may be on the next page.
const BESIDE: usize = 8;

/// How far past its time a record must be for a pass to take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Everything due now ([`Store::evict_expired`](crate::Store::evict_expired)).
    Due,
    /// Only what has been due for longer than the sweep grace (the background sweeper): the
    /// rest is left for claims beside it to remove (see [`evict_beside`]).
    PastGrace,
}

/// Removes up to `limit` completed records whose TTL has passed, oldest first, through the
/// expiry index. In-progress records are never removed: their outcome is unknown. A limit of 0
/// is taken as 1, so a loop that calls again while [`Backlog::More`] always makes progress.
pub(crate) fn evict_expired(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    limit: usize,
    reach: Reach,
) -> (Keep, Result<Evicted, StoreError>) {
    match evict(tx, ctx, limit.max(1), reach) {
        Ok(evicted) => (Keep::Writes, Ok(evicted)),
        Err(e) => (Keep::Nothing, Err(e)),
    }
}

/// Removes the records that are gone (past their TTL and any tombstone time) among the
/// [`BESIDE`] stored after a key this request has just claimed for the first time.
///
/// With random keys, a removal by the sweeper rewrites a random page: one page per record.
/// Here the page is the one the claim writes anyway, so the removal is almost free, and a
/// record is looked at about `BESIDE` times per TTL. The sweeper waits a grace (a quarter of
/// the TTL by default) for this before it removes what is left. What it removes is counted
/// in the context, as the sweeper's passes are.
///
/// Nothing here fails the claim: a record it cannot read is skipped, and the sweeper, which
/// reads the same records, reports it.
pub(crate) fn evict_beside(tx: &mut Tx<'_>, ctx: &mut Context<'_>, key: &[u8]) {
    let gone_from = match ctx.gone_from() {
        Some(at) => at,
        None => {
            let at = first_gone(tx, ctx);
            ctx.set_gone_from(at);
            at
        }
    };
    if ctx.now < gone_from {
        return;
    }
    let Ok(next) = tx.range_raw(
        ctx.tables.records,
        Bound::Excluded(key),
        Bound::Unbounded,
        BESIDE,
    ) else {
        return;
    };
    for (scope, bytes) in next {
        let Ok(record) = decode_stored(&scope, &bytes) else {
            continue;
        };
        if record.visibility(ctx.now, ctx.config.tombstone_ttl) == Visibility::Gone {
            write_record_bytes(tx, ctx, &scope, Some(&record), None);
            ctx.count_evicted_beside(&record.state);
        }
    }
}

/// The earliest time a stored record is gone: the oldest expiry entry plus the tombstone
/// time, or the oldest tombstone's end, whichever is first. While a store fills, that is a
/// TTL ahead, and claims read nothing more. An index that cannot be read gives "now", so the
/// records beside are read and the failure, if it lasts, is the sweeper's to report.
fn first_gone(tx: &Tx<'_>, ctx: &Context<'_>) -> Timestamp {
    let oldest = |index| match tx.range_raw(index, Bound::Unbounded, Bound::Unbounded, 1) {
        Ok(first) => first
            .first()
            .and_then(|(key, _)| split_index_key(key))
            .map(|(at, _)| at),
        Err(_) => Some(ctx.now),
    };
    let expiry = oldest(ctx.tables.expiry).map(|at| at.saturating_add(ctx.config.tombstone_ttl));
    let tombstone = oldest(ctx.tables.tombstones);
    expiry
        .into_iter()
        .chain(tombstone)
        .min()
        .unwrap_or(Timestamp::from_millis(u64::MAX))
}

fn evict(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    limit: usize,
    reach: Reach,
) -> Result<Evicted, StoreError> {
    let mut evicted = Evicted {
        removed: 0,
        tombstones_removed: 0,
        backlog: Backlog::Empty,
    };
    let cutoff = match reach {
        Reach::Due => ctx.now,
        Reach::PastGrace => ctx.now.saturating_sub(ctx.config.sweep_grace()),
    };
    let mut budget = limit;
    for index in [ctx.tables.expiry, ctx.tables.tombstones] {
        let (done, more) = evict_from(tx, ctx, index, budget, cutoff)?;
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

/// Handles up to `limit` entries of one index (the expiry index or the tombstone index) due
/// by `cutoff`, oldest first. Returns how many records it removed (or tombstoned), and whether
/// more entries are due.
fn evict_from(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    index: TableId,
    limit: usize,
    cutoff: Timestamp,
) -> Result<(usize, Backlog), StoreError> {
    let end = index_bound_after(cutoff);
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
