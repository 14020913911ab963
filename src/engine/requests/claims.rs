//! The claim lifecycle as the writer carries it out: read the record, decide, write the new
//! record and its index entries into the request's write set.
//!
//! Every function here runs on the writer thread inside a group's transaction and returns
//! whether its writes are kept. None of them may write when it refuses a request.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use crate::error::{ExecuteError, StoreError};
use crate::model::begin::Begin;
use crate::model::claim::{Extension, Recovery};
use crate::model::clock::Timestamp;
use crate::model::decision::{self, Decision};
use crate::model::fingerprint::Fingerprint;
use crate::model::record::{Record, RecordState};
use crate::model::response::Response;
use crate::model::scope::Scope;

use super::answers::{CommitRefusal, Held, Refusal, UserFailure, UserWork};
use super::outbox;
use super::records::{Stored, read_record, write_record};
use crate::engine::tables::tx::Tx;
use crate::engine::watchers::HoldToken;
use crate::engine::writer::context::Context;
use crate::engine::writer::job::Keep;
use crate::model::panic::panic_message;

/// `begin`, decided against the group's transaction.
pub(crate) fn begin(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    scope: &Scope,
    fingerprint: Fingerprint,
) -> (Keep, Result<Begin<Held>, StoreError>) {
    let granted = match grant(tx, ctx, scope, fingerprint) {
        Ok(Ok(granted)) => granted,
        Ok(Err(answer)) => return (Keep::Nothing, Ok(answer)),
        Err(e) => return (Keep::Nothing, Err(e)),
    };
    write_record(
        tx,
        ctx,
        scope,
        granted.previous.as_ref(),
        Some(&granted.record),
    );
    let held = Held::of(
        &granted.record,
        ctx.now,
        granted.kind.recovery(),
        HoldToken::new(ctx.watchers, scope.encode()),
    );
    (Keep::Writes, Ok(granted.kind.answer(held)))
}

/// `execute`: claim and commit in one step, for work that never leaves the process. The
/// in-progress record is never written: if the closure fails, nothing of the request is, and
/// the key stays as it was.
pub(crate) fn execute(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    scope: &Scope,
    fingerprint: Fingerprint,
    work: UserWork<Response>,
) -> (Keep, Result<Begin<Response>, ExecuteError>) {
    let granted = match grant(tx, ctx, scope, fingerprint) {
        Ok(Ok(granted)) => granted,
        Ok(Err(answer)) => return (Keep::Nothing, Ok(answer)),
        Err(e) => return (Keep::Nothing, Err(e.into())),
    };
    tx.allow_publish(scope, &granted.record);
    let response = match run_user(tx, work) {
        Ok(response) => response,
        Err(UserFailure::Aborted(e)) => return (Keep::Nothing, Err(ExecuteError::Aborted(e))),
        Err(UserFailure::Panicked(m)) => return (Keep::Nothing, Err(ExecuteError::Panicked(m))),
    };
    if let Err(e) = response.validate(ctx.config.max_response_bytes) {
        return (Keep::Nothing, Err(ExecuteError::InvalidResponse(e)));
    }
    let published = tx.take_published();
    if let Err(e) = outbox::record(tx, ctx, published) {
        return (Keep::Nothing, Err(e.into()));
    }
    let done = decision::completed(&granted.record, response.clone(), ctx.now, ctx.config.ttl);
    write_record(tx, ctx, scope, granted.previous.as_ref(), Some(&done));
    (Keep::Writes, Ok(granted.kind.answer(response)))
}

/// A claim the writer decided to grant, not yet written.
struct Granted {
    /// The record it replaces (a take-over's expired claim, a completed record past its TTL).
    previous: Option<Stored>,
    /// The in-progress record of the new claim, with its fence allocated.
    record: Record,
    kind: AttemptKind,
}

/// Whether a granted claim is a first attempt or a recovery, and why.
#[derive(Debug, Clone, Copy)]
enum AttemptKind {
    First,
    TakeOver,
    /// A first attempt here, in a restore window: the old store may have run it.
    Restored,
}

impl AttemptKind {
    /// A claim of the scope found absent at `now`: a recovery while a restore that may lack
    /// acknowledged writes is recent (`model::restore`), else a first attempt.
    fn of_absent(ctx: &Context<'_>) -> Self {
        if ctx.config.restore.covers(ctx.now) {
            AttemptKind::Restored
        } else {
            AttemptKind::First
        }
    }

    fn recovery(self) -> Option<Recovery> {
        match self {
            AttemptKind::First => None,
            AttemptKind::TakeOver => Some(Recovery::LeaseExpired),
            AttemptKind::Restored => Some(Recovery::Restored),
        }
    }

    fn answer<C>(self, claim: C) -> Begin<C> {
        match self.recovery() {
            None => Begin::Claimed(claim),
            Some(_) => Begin::Recovered(claim),
        }
    }
}

/// Reads the scope's record and decides: a claim to grant, or the answer of a decision that
/// writes nothing.
fn grant<C>(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    scope: &Scope,
    fingerprint: Fingerprint,
) -> Result<Result<Granted, Begin<C>>, StoreError> {
    let existing = read_record(tx, ctx, scope)?;
    let decided = decision::decide(
        existing.as_ref().map(|s| &s.record),
        &fingerprint,
        ctx.now,
        ctx.config.tombstone_ttl,
    );
    let (record, kind) = match decided {
        Decision::Claim => {
            let fence = ctx.allocate_fence(tx);
            let record = decision::claimed(fingerprint, fence, ctx.now, ctx.config.lease);
            (record, AttemptKind::of_absent(ctx))
        }
        Decision::TakeOver(previous) => {
            let fence = ctx.allocate_fence(tx);
            let record = decision::taken_over(previous, fence, ctx.now, ctx.config.lease);
            (record, AttemptKind::TakeOver)
        }
        other => {
            return Begin::without_writing(other, ctx.pace, scope.operation())
                .map(Err)
                .ok_or_else(|| StoreError::Internal {
                    message: "begin decided to write without a claim".into(),
                });
        }
    };
    Ok(Ok(Granted {
        previous: existing,
        record,
        kind,
    }))
}

/// Reads the record and checks the fence, for every operation on a held claim.
fn held_record(
    tx: &Tx<'_>,
    ctx: &Context<'_>,
    scope: &Scope,
    fence: u64,
) -> Result<Stored, Refusal> {
    let existing = read_record(tx, ctx, scope)?;
    decision::check_fence(existing.as_ref().map(|s| &s.record), fence).map_err(Refusal::Stale)?;
    existing.ok_or_else(|| {
        Refusal::Store(StoreError::Internal {
            message: "a fence check passed without a record".into(),
        })
    })
}

/// `commit`: fence check, the user's closure, the response check, the completed record.
pub(crate) fn commit(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    scope: &Scope,
    fence: u64,
    work: UserWork<Response>,
) -> (Keep, Result<Response, CommitRefusal>) {
    let held = match held_record(tx, ctx, scope, fence) {
        Ok(held) => held,
        Err(refusal) => return (Keep::Nothing, Err(CommitRefusal::Refused(refusal))),
    };
    tx.allow_publish(scope, &held.record);
    let response = match run_user(tx, work) {
        Ok(response) => response,
        Err(failure) => return (Keep::Nothing, Err(CommitRefusal::User(failure))),
    };
    if let Err(e) = response.validate(ctx.config.max_response_bytes) {
        return (Keep::Nothing, Err(CommitRefusal::InvalidResponse(e)));
    }
    let published = tx.take_published();
    if let Err(e) = outbox::record(tx, ctx, published) {
        return (
            Keep::Nothing,
            Err(CommitRefusal::Refused(Refusal::Store(e))),
        );
    }
    let done = decision::completed(&held.record, response.clone(), ctx.now, ctx.config.ttl);
    write_record(tx, ctx, scope, Some(&held), Some(&done));
    (Keep::Writes, Ok(response))
}

/// A keyless business transaction.
pub(crate) fn write<T>(tx: &mut Tx<'_>, work: UserWork<T>) -> (Keep, Result<T, UserFailure>) {
    match run_user(tx, work) {
        Ok(value) => (Keep::Writes, Ok(value)),
        Err(failure) => (Keep::Nothing, Err(failure)),
    }
}

/// Runs a user closure, turning its error or panic into a [`UserFailure`]. The closure only
/// buffers writes and opens no redb table across user code, so a panic leaves the group's
/// transaction untouched.
fn run_user<T>(tx: &mut Tx<'_>, work: UserWork<T>) -> Result<T, UserFailure> {
    match catch_unwind(AssertUnwindSafe(|| work(tx))) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(UserFailure::Aborted(e)),
        Err(panic) => Err(UserFailure::Panicked(panic_message(panic.as_ref()))),
    }
}

/// `release`: the work did not happen; the scope becomes absent.
pub(crate) fn release(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    scope: &Scope,
    fence: u64,
) -> (Keep, Result<(), Refusal>) {
    match held_record(tx, ctx, scope, fence) {
        Ok(held) => {
            write_record(tx, ctx, scope, Some(&held), None);
            (Keep::Writes, Ok(()))
        }
        Err(refusal) => (Keep::Nothing, Err(refusal)),
    }
}

/// `extend`: the lease now ends `lease` after now.
pub(crate) fn extend(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    scope: &Scope,
    fence: u64,
    lease: Duration,
    extension: Extension,
) -> (Keep, Result<Timestamp, Refusal>) {
    let now = ctx.now;
    let mut until = now;
    update_in_progress(tx, ctx, scope, fence, |lease_until, _| {
        until = extension.lease_end(*lease_until, now, lease);
        *lease_until = until;
    })
    .map_or_else(|r| (Keep::Nothing, Err(r)), |()| (Keep::Writes, Ok(until)))
}

/// `checkpoint`: store progress for a later attempt to read.
pub(crate) fn checkpoint(
    tx: &mut Tx<'_>,
    ctx: &mut Context<'_>,
    scope: &Scope,
    fence: u64,
    bytes: Vec<u8>,
) -> (Keep, Result<(), Refusal>) {
    update_in_progress(tx, ctx, scope, fence, |_, checkpoint| {
        *checkpoint = Some(bytes);
    })
    .map_or_else(|r| (Keep::Nothing, Err(r)), |()| (Keep::Writes, Ok(())))
}

fn update_in_progress(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    scope: &Scope,
    fence: u64,
    change: impl FnOnce(&mut Timestamp, &mut Option<Vec<u8>>),
) -> Result<(), Refusal> {
    let held = held_record(tx, ctx, scope, fence)?;
    let mut updated = held.record.clone();
    if let RecordState::InProgress {
        lease_until,
        checkpoint,
    } = &mut updated.state
    {
        change(lease_until, checkpoint);
    }
    write_record(tx, ctx, scope, Some(&held), Some(&updated));
    Ok(())
}
