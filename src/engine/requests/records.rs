//! A scope's record as the writer reads and writes it, wherever it is stored, and `forget`,
//! which removes one.
//!
//! An in-progress record lives in `idemstore.claims`; a completed one (or a tombstone) in the
//! partition it was written to (`tables::partitions`). A lookup reads the claims first, then
//! the partitions newest first; a record stored in an older partition under a key that was
//! claimed again (after it was gone) is hidden by the newer one and is removed with its
//! partition.

use crate::error::StoreError;
use crate::model::decision;
use crate::model::maintenance::Forget;
use crate::model::record::{Record, RecordState};
use crate::model::scope::Scope;

use super::answers::ForgetRefusal;
use crate::engine::tables::layout::decode_stored;
use crate::engine::tables::partitions::{PartitionNo, Partitions, done_key};
use crate::engine::tables::tx::Tx;
use crate::engine::writer::context::Context;
use crate::engine::writer::job::Keep;

/// Where a record is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Location {
    /// `idemstore.claims`: in progress.
    Claims,
    /// `idemstore.done`, in this partition: completed, or a tombstone.
    Done(PartitionNo),
}

/// A record as read, and where it was.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) record: Record,
    pub(crate) at: Location,
}

/// The scope's record as the group's transaction sees it (its own writes included).
pub(super) fn read_record(
    tx: &Tx<'_>,
    ctx: &Context<'_>,
    scope: &Scope,
) -> Result<Option<Stored>, StoreError> {
    let key = scope.encode();
    if let Some(bytes) = tx.get_raw(ctx.tables.claims, key)? {
        return Ok(Some(Stored {
            record: decode_stored(key, &bytes)?,
            at: Location::Claims,
        }));
    }
    let hash = ctx.partitions.hash(key);
    let found = ctx
        .partitions
        .find(hash, ctx.now, ctx.config.tombstone_ttl, |number| {
            tx.get_raw(ctx.tables.done, &done_key(number, key))
        })?;
    found
        .map(|(number, bytes)| {
            Ok(Stored {
                record: decode_stored(key, &bytes)?,
                at: Location::Done(number),
            })
        })
        .transpose()
}

/// Writes a scope's new record where its state belongs, and removes the old one where it is
/// no longer the one a lookup must find. `None` deletes the record.
pub(super) fn write_record(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    scope: &Scope,
    old: Option<&Stored>,
    new: Option<&Record>,
) {
    let key = scope.encode();
    let Some(new) = new else {
        match old {
            Some(Stored {
                at: Location::Claims,
                ..
            }) => tx.delete_raw(ctx.tables.claims, key),
            Some(Stored {
                at: Location::Done(number),
                record,
            }) => {
                tx.delete_raw(ctx.tables.done, &done_key(*number, key));
                if let (RecordState::Tombstone { .. }, Some(partition)) =
                    (&record.state, ctx.partitions.get(*number))
                {
                    partition.forgot_tombstone();
                }
            }
            None => {}
        }
        return;
    };
    match new.state {
        RecordState::InProgress { .. } => {
            // A completed record it replaces (one that is gone) stays where it is: the claim
            // hides it, and it goes with its partition.
            tx.put_raw(ctx.tables.claims, key, new.encode());
        }
        RecordState::Completed { .. } | RecordState::Tombstone { .. } => {
            let chosen = ctx
                .partitions
                .choose(ctx.now, ctx.config.partition_window());
            if let Some(sealed) = chosen.sealed {
                tx.put_raw(
                    ctx.tables.partitions,
                    &sealed.number().to_be_bytes(),
                    Partitions::sealed_row(&sealed),
                );
            }
            ctx.partitions
                .note(chosen.number, ctx.partitions.hash(key), new);
            tx.put_raw(ctx.tables.done, &done_key(chosen.number, key), new.encode());
            if old.is_some_and(|o| o.at == Location::Claims) {
                tx.delete_raw(ctx.tables.claims, key);
            }
        }
    }
}

/// Seals the open partition and writes its row, as the record that opens the next one would:
/// a store that closes leaves every partition with a row, so its next open reads none of them
/// record by record. The next record after that opens a new partition.
pub(crate) fn seal_open(tx: &mut Tx<'_>, ctx: &mut Context<'_>) -> (Keep, ()) {
    let Some(open) = ctx.partitions.open_one() else {
        return (Keep::Nothing, ());
    };
    open.seal();
    tx.put_raw(
        ctx.tables.partitions,
        &open.number().to_be_bytes(),
        Partitions::sealed_row(&open),
    );
    (Keep::Writes, ())
}

/// `forget`: removes a record, by fence or, for a completed one, by force.
pub(crate) fn forget(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    scope: &Scope,
    how: Forget,
) -> (Keep, Result<Record, ForgetRefusal>) {
    let existing = match read_record(tx, ctx, scope) {
        Ok(Some(stored)) => stored,
        Ok(None) => return (Keep::Nothing, Err(ForgetRefusal::Absent)),
        Err(e) => return (Keep::Nothing, Err(ForgetRefusal::Store(e))),
    };
    let record = &existing.record;
    let refused = match (how, &record.state) {
        (Forget::Fence(fence), _) => decision::check_fence(Some(record), fence)
            .err()
            .map(ForgetRefusal::Stale),
        (Forget::Completed, RecordState::InProgress { .. }) => Some(ForgetRefusal::InProgress {
            fence: record.fence,
        }),
        (Forget::Completed, RecordState::Completed { .. } | RecordState::Tombstone { .. }) => None,
    };
    if let Some(refused) = refused {
        return (Keep::Nothing, Err(refused));
    }
    write_record(tx, ctx, scope, Some(&existing), None);
    (Keep::Writes, Ok(existing.record))
}
