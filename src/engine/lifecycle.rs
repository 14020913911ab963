//! The claim lifecycle as the writer carries it out: read the record, decide, write the new
//! record and its index entries into the request's write set.
//!
//! Every function here runs on the writer thread inside a group's transaction and returns
//! whether its writes are kept. None of them may write when it refuses a request.

use std::ops::Bound;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use crate::error::{BoxError, ExecuteError, ResponseError, StaleReason, StoreError};
use crate::model::begin::Begin;
use crate::model::claim::{Extension, Grant};
use crate::model::clock::Timestamp;
use crate::model::decision::{self, Decision};
use crate::model::fingerprint::Fingerprint;
use crate::model::maintenance::{Backlog, Evicted, Forget};
use crate::model::record::{Record, RecordState};
use crate::model::response::Response;
use crate::model::scope::Scope;

use super::context::Context;
use super::job::{Keep, panic_message};
use super::outbox;
use super::registry::TableId;
use super::tables::{decode_stored, index_bound_after, index_key, split_index_key};
use super::tx::Tx;
use super::watchers::HoldToken;

/// What the writer holds for a claim it granted.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) grant: Grant,
    /// Counts the claim as a holder of its scope for `begin_or_wait`, from the writer on;
    /// kept for its drop, which wakes the scope's waiters.
    pub(crate) hold: HoldToken,
}

impl Held {
    fn of(record: &Record, claimed_at: Timestamp, hold: HoldToken) -> Self {
        let RecordState::InProgress {
            lease_until,
            checkpoint,
        } = &record.state
        else {
            unreachable!("a claim is granted on the in-progress record it wrote");
        };
        let grant = Grant {
            fence: record.fence,
            origin_fence: record.origin_fence,
            attempt: record.attempt,
            lease_until: *lease_until,
            claimed_at,
            checkpoint: checkpoint.clone(),
        };
        Held {
            grant: grant.checked(),
            hold,
        }
    }
}

/// Why a fence-checked operation was refused.
#[derive(Debug)]
pub(crate) enum Refusal {
    Stale(StaleReason),
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Self {
        Refusal::Store(e)
    }
}

/// How a user closure failed. Either way none of its writes are kept.
#[derive(Debug)]
pub(crate) enum UserFailure {
    Aborted(BoxError),
    Panicked(String),
}

/// Why a commit stored nothing.
#[derive(Debug)]
pub(crate) enum CommitRefusal {
    User(UserFailure),
    InvalidResponse(ResponseError),
    Refused(Refusal),
}

/// A user closure run inside a commit or write.
pub(crate) type UserWork<T> = Box<dyn FnOnce(&mut Tx<'_>) -> Result<T, BoxError> + Send>;

pub(crate) fn read_record(
    tx: &Tx<'_>,
    ctx: &Context<'_>,
    scope: &Scope,
) -> Result<Option<Record>, StoreError> {
    tx.get_raw(ctx.tables.records, scope.encode())?
        .map(|bytes| decode_stored(scope.encode(), &bytes))
        .transpose()
}

/// Writes (or deletes) a scope's record and moves its index entry to match.
fn write_record(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    scope: &Scope,
    old: Option<&Record>,
    new: Option<&Record>,
) {
    let entry = |record: &Record| match &record.state {
        RecordState::InProgress { lease_until, .. } => {
            (ctx.tables.leases, index_key(*lease_until, scope.encode()))
        }
        RecordState::Completed { expires_at, .. } => {
            (ctx.tables.expiry, index_key(*expires_at, scope.encode()))
        }
        RecordState::Tombstone { until, .. } => {
            (ctx.tables.tombstones, index_key(*until, scope.encode()))
        }
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
        Some(record) => tx.put_raw(ctx.tables.records, scope.encode(), record.encode()),
        None => tx.delete_raw(ctx.tables.records, scope.encode()),
    }
}

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
    tx.allow_publish(scope.downstream_key(granted.record.origin_fence));
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
    previous: Option<Record>,
    /// The in-progress record of the new claim, with its fence allocated.
    record: Record,
    kind: AttemptKind,
}

/// Whether a granted claim is a first attempt or a recovery.
#[derive(Debug, Clone, Copy)]
enum AttemptKind {
    First,
    TakeOver,
}

impl AttemptKind {
    fn answer<C>(self, claim: C) -> Begin<C> {
        match self {
            AttemptKind::First => Begin::Claimed(claim),
            AttemptKind::TakeOver => Begin::Recovered(claim),
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
        existing.as_ref(),
        &fingerprint,
        ctx.now,
        ctx.config.tombstone_ttl,
    );
    let (record, kind) = match decided {
        Decision::Claim => {
            let fence = ctx.allocate_fence(tx);
            let record = decision::claimed(fingerprint, fence, ctx.now, ctx.config.lease);
            (record, AttemptKind::First)
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
) -> Result<Record, Refusal> {
    let existing = read_record(tx, ctx, scope)?;
    decision::check_fence(existing.as_ref(), fence)
        .cloned()
        .map_err(Refusal::Stale)
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
    tx.allow_publish(scope.downstream_key(held.origin_fence));
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
    let done = decision::completed(&held, response.clone(), ctx.now, ctx.config.ttl);
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
    let mut updated = held.clone();
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

/// Why `forget` removed nothing.
#[derive(Debug)]
pub(crate) enum ForgetRefusal {
    Absent,
    Stale(StaleReason),
    InProgress { fence: u64 },
    Store(StoreError),
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
