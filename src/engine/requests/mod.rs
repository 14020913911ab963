//! The writes the engine runs, one constructor per operation: what a facade builds and hands to
//! [`Engine::run`](crate::engine::Engine::run). A request is opaque outside the engine; its
//! answer is a domain result (a response, a refusal), never a job or a table.
//!
//! What each does on the writer is in `claims` (the claim lifecycle), `records` (a record and
//! its index entry, `forget`), `evict` and `outbox`; `answers` holds what the facades get back.

pub(super) mod answers;
mod claims;
mod evict;
pub(super) mod outbox;
mod queue;
mod records;
mod reply;

use std::time::{Duration, Instant};

use crate::error::{ExecuteError, StoreError};
use crate::model::begin::Begin;
use crate::model::claim::Extension;
use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::maintenance::{Evicted, Forget};
use crate::model::record::Record;
use crate::model::response::Response;
use crate::model::scope::Scope;

use self::answers::{CommitRefusal, ForgetRefusal, Held, Refusal, UserFailure, UserWork};
use crate::engine::Shared;
use crate::engine::tables::tx::Tx;
use crate::engine::writer::context::{Context, Needs};
use crate::engine::writer::job::{JobKind, Keep, Work};

/// One write for the writer's next group, answered with an `R` once the group is durable.
#[must_use = "a request does nothing until the engine runs it"]
pub(crate) struct Request<R> {
    work: Box<dyn Work<R>>,
    kind: JobKind,
    tally: Option<Tally<R>>,
}

/// What the engine counts of a request's answer, once it has one: the facades never count.
pub(in crate::engine) type Tally<R> = Box<dyn FnOnce(&Shared, &R) + Send>;

impl<R> Request<R> {
    pub(in crate::engine) fn new(work: impl Work<R>) -> Self {
        Request {
            work: Box::new(work),
            kind: JobKind::Request,
            tally: None,
        }
    }

    /// Counts the answer with `tally` once there is one.
    fn counted(self, tally: impl FnOnce(&Shared, &R) + Send + 'static) -> Self {
        Request {
            tally: Some(Box::new(tally)),
            ..self
        }
    }

    /// The work, what the writer does with it, and what is counted of its answer.
    pub(in crate::engine) fn into_parts(self) -> (Box<dyn Work<R>>, JobKind, Option<Tally<R>>) {
        (self.work, self.kind, self.tally)
    }
}

/// Counts a stale refusal of a claim's request.
fn stale(shared: &Shared, refusal: &Refusal) {
    if let Refusal::Stale(_) = refusal {
        shared.counters.stale();
    }
}

/// Counts the answer of a fenced request that has nothing else to count.
fn stale_if_refused<T>(shared: &Shared, answer: &Result<T, Refusal>) {
    if let Err(refusal) = answer {
        stale(shared, refusal);
    }
}

/// `begin`, decided again inside the writer's transaction, where racing claims are
/// serialised: a claim or a take-over, or the answer that the race made of it.
pub(in crate::engine) fn begin(
    scope: Scope,
    fingerprint: Fingerprint,
) -> Request<Result<Begin<Held>, StoreError>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        claims::begin(tx, ctx, &scope, fingerprint)
    })
}

/// Stores `work`'s response as the scope's completed record, with `work`'s business writes, if
/// `fence` (granted at `claimed_at`) still holds the scope. Counted as a commit, with the time
/// from this call, and in the operation's pace.
pub(crate) fn commit(
    scope: Scope,
    fence: u64,
    claimed_at: Timestamp,
    work: UserWork<Response>,
) -> Request<Result<Response, CommitRefusal>> {
    let started = Instant::now();
    let operation: Box<str> = scope.operation().into();
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        claims::commit(tx, ctx, &scope, fence, work)
    })
    .counted(move |shared, answer| match answer {
        Ok(_) => {
            shared.counters.committed(started.elapsed());
            let now = shared.config.clock.now();
            shared
                .pace
                .completed(&operation, now.saturating_since(claimed_at));
        }
        Err(CommitRefusal::Refused(refusal)) => stale(shared, refusal),
        Err(CommitRefusal::User(_) | CommitRefusal::InvalidResponse(_)) => {}
    })
}

/// Claims and commits in one step: `work` runs only if the scope could be claimed, and its
/// writes and the completed record are kept together. The answer's claim is the response.
pub(in crate::engine) fn execute(
    scope: Scope,
    fingerprint: Fingerprint,
    work: UserWork<Response>,
) -> Request<Result<Begin<Response>, ExecuteError>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        claims::execute(tx, ctx, &scope, fingerprint, work)
    })
}

/// Gives the scope up if `fence` still holds it.
pub(crate) fn release(scope: Scope, fence: u64) -> Request<Result<(), Refusal>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        claims::release(tx, ctx, &scope, fence)
    })
    .counted(|shared, answer| match answer {
        Ok(()) => shared.counters.released(),
        Err(refusal) => stale(shared, refusal),
    })
}

/// Moves the end of the lease of `fence`'s claim to `lease` from now, as its holder asked.
/// Answers the new end.
pub(crate) fn extend(
    scope: Scope,
    fence: u64,
    lease: Duration,
) -> Request<Result<Timestamp, Refusal>> {
    lease_end(scope, fence, lease, Extension::Exactly).counted(stale_if_refused)
}

/// The keep-alive's renewal: the end of the lease of `fence`'s claim at least `lease` from
/// now. Not counted: a renewal that finds the claim over is how the keep-alive stops.
pub(crate) fn renew(
    scope: Scope,
    fence: u64,
    lease: Duration,
) -> Request<Result<Timestamp, Refusal>> {
    lease_end(scope, fence, lease, Extension::AtLeast)
}

/// `extend` and `renew`: the lease's new end, as `extension` says.
fn lease_end(
    scope: Scope,
    fence: u64,
    lease: Duration,
    extension: Extension,
) -> Request<Result<Timestamp, Refusal>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        claims::extend(tx, ctx, &scope, fence, lease, extension)
    })
}

/// Stores progress for a later attempt, if `fence` still holds the scope.
pub(crate) fn checkpoint(scope: Scope, fence: u64, bytes: Vec<u8>) -> Request<Result<(), Refusal>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        claims::checkpoint(tx, ctx, &scope, fence, bytes)
    })
    .counted(stale_if_refused)
}

/// Removes a scope's record, for an operator.
pub(crate) fn forget(scope: Scope, how: Forget) -> Request<Result<Record, ForgetRefusal>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        records::forget(tx, ctx, &scope, how)
    })
}

/// A business transaction with no idempotency key.
pub(crate) fn write<T: Send + 'static>(work: UserWork<T>) -> Request<Result<T, UserFailure>> {
    Request::new(move |tx: &mut Tx<'_>, _ctx: &mut Context<'_>| claims::write(tx, work))
}

/// Up to `limit` records that are gone removed (a partition at a time), or expired ones turned
/// into tombstones.
pub(in crate::engine) fn evict(limit: usize) -> Request<Result<Evicted, StoreError>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| evict::evict_expired(tx, ctx, limit))
}

/// The open partition sealed with its row, for a store about to close.
pub(in crate::engine) fn seal_open() -> Request<()> {
    Request::new(records::seal_open)
}

/// Everything acknowledged made durable in redb itself (a checkpoint of the log).
pub(crate) fn checkpoint_log() -> Request<()> {
    Request {
        kind: JobKind::Checkpoint,
        ..needs(Needs::Checkpointed)
    }
}

/// Everything acknowledged made visible to redb read transactions.
pub(in crate::engine) fn publish() -> Request<()> {
    needs(Needs::Published)
}

fn needs(needs: Needs) -> Request<()> {
    Request::new(move |_tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        ctx.need(needs);
        (Keep::Nothing, ())
    })
}
