//! A scope's record as the writer reads and writes it, with its index entry kept in step, and
//! `forget`, which removes one.

use crate::error::StoreError;
use crate::model::decision;
use crate::model::maintenance::Forget;
use crate::model::record::{Record, RecordState};
use crate::model::scope::Scope;

use super::answers::ForgetRefusal;
use crate::engine::tables::layout::{decode_stored, index_key};
use crate::engine::tables::tx::Tx;
use crate::engine::writer::context::Context;
use crate::engine::writer::job::Keep;

/// The scope's record as the group's transaction sees it (its own writes included).
pub(super) fn read_record(
    tx: &Tx<'_>,
    ctx: &Context<'_>,
    scope: &Scope,
) -> Result<Option<Record>, StoreError> {
    tx.get_raw(ctx.tables.records, scope.encode())?
        .map(|bytes| decode_stored(scope.encode(), &bytes))
        .transpose()
}

/// Writes (or deletes) a scope's record and moves its index entry to match.
pub(super) fn write_record(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    scope: &Scope,
    old: Option<&Record>,
    new: Option<&Record>,
) {
    write_record_bytes(tx, ctx, scope.encode(), old, new);
}

/// [`write_record`] for a scope as it is stored (its encoded bytes).
pub(super) fn write_record_bytes(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    scope: &[u8],
    old: Option<&Record>,
    new: Option<&Record>,
) {
    let entry = |record: &Record| match &record.state {
        RecordState::InProgress { lease_until, .. } => {
            (ctx.tables.leases, index_key(*lease_until, scope))
        }
        RecordState::Completed { expires_at, .. } => {
            (ctx.tables.expiry, index_key(*expires_at, scope))
        }
        RecordState::Tombstone { until, .. } => (ctx.tables.tombstones, index_key(*until, scope)),
    };
    let old_entry = old.map(entry);
    let new_entry = new.map(entry);
    if old_entry != new_entry {
        if let Some((table, key)) = &old_entry {
            tx.delete_raw(*table, key);
        }
        if let Some((table, key)) = &new_entry {
            tx.put_raw(*table, key, Vec::new());
        }
    }
    match new {
        Some(record) => tx.put_raw(ctx.tables.records, scope, record.encode()),
        None => tx.delete_raw(ctx.tables.records, scope),
    }
}

/// `forget`: removes a record and its index entry, by fence or, for a completed one, by force.
pub(crate) fn forget(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    scope: &Scope,
    how: Forget,
) -> (Keep, Result<Record, ForgetRefusal>) {
    let existing = match read_record(tx, ctx, scope) {
        Ok(Some(record)) => record,
        Ok(None) => return (Keep::Nothing, Err(ForgetRefusal::Absent)),
        Err(e) => return (Keep::Nothing, Err(ForgetRefusal::Store(e))),
    };
    let refused = match (how, &existing.state) {
        (Forget::Fence(fence), _) => decision::check_fence(Some(&existing), fence)
            .err()
            .map(ForgetRefusal::Stale),
        (Forget::Completed, RecordState::InProgress { .. }) => Some(ForgetRefusal::InProgress {
            fence: existing.fence,
        }),
        (Forget::Completed, RecordState::Completed { .. } | RecordState::Tombstone { .. }) => None,
    };
    if let Some(refused) = refused {
        return (Keep::Nothing, Err(refused));
    }
    write_record(tx, ctx, scope, Some(&existing), None);
    (Keep::Writes, Ok(existing))
}
