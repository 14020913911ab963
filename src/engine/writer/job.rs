//! A request to the writer: work to run inside the group's transaction, and a way to answer the
//! caller once the group's fate is known.
//!
//! The work runs first; its answer waits until the whole group is durable (or has failed), so a
//! caller never hears of a write that could still be lost.

use crate::model::panic::panic_message;
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::engine::tables::tx::Tx;
use crate::error::StoreError;
use crate::wal::RecoveryReport;

use super::context::Context;

/// Whether the writer applies a request's buffered writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The request succeeded: apply its write set to the group's transaction.
    Writes,
    /// The request failed or wrote nothing worth keeping: drop its write set.
    Nothing,
}

/// What a request does on the writer: read and write through the group's transaction, and
/// produce an answer of type `R` (plus whether to keep its writes).
pub(crate) trait Work<R>:
    FnOnce(&mut Tx<'_>, &mut Context<'_>) -> (Keep, R) + Send + 'static
{
}

impl<R, F> Work<R> for F where F: FnOnce(&mut Tx<'_>, &mut Context<'_>) -> (Keep, R) + Send + 'static
{}

/// One request, type-erased so the writer's queue holds any kind.
pub(crate) trait Job: Send {
    /// Runs the request against the group's transaction.
    fn run(&mut self, tx: &mut Tx<'_>, ctx: &mut Context<'_>) -> Keep;
    /// Answers the caller: `Ok` once the group is durable, or the group's error.
    fn finish(self: Box<Self>, group: Result<(), StoreError>);
    /// For jobs that asked for `Needs::Exclusive`: runs with the database to itself, after
    /// everything before it is published and checkpointed, before `finish`.
    fn exclusive(&mut self, _db: &mut redb::Database) {}
    /// What the writer does with the job: run it in a group, or recover the store in place.
    fn kind(&self) -> JobKind {
        JobKind::Request
    }
    /// For [`JobKind::Reopen`] jobs: what the recovery found, before `finish`.
    fn restored(&mut self, _report: &RecoveryReport) {}
}

/// What the writer does with a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobKind {
    /// Runs inside a group's transaction.
    Request,
    /// Recovers the store in place (closes and reopens the file, replays the log) between
    /// epochs; accepted while the store is poisoned.
    Reopen,
    /// `Store::checkpoint`: runs in a group like a request, and is an attempt at the
    /// checkpoint the writer owes (see `writer::Appends`) even while that one backs off.
    Checkpoint,
}

/// `Store::reopen`: recover in place, answer what the recovery found.
pub(crate) struct ReopenTask<S> {
    report: Option<RecoveryReport>,
    reply: S,
}

impl<S> ReopenTask<S>
where
    S: FnOnce(Result<RecoveryReport, StoreError>) + Send + 'static,
{
    pub(crate) fn boxed(reply: S) -> Box<dyn Job> {
        Box::new(ReopenTask {
            report: None,
            reply,
        })
    }
}

impl<S> Job for ReopenTask<S>
where
    S: FnOnce(Result<RecoveryReport, StoreError>) + Send,
{
    fn run(&mut self, _tx: &mut Tx<'_>, _ctx: &mut Context<'_>) -> Keep {
        Keep::Nothing
    }

    fn kind(&self) -> JobKind {
        JobKind::Reopen
    }

    fn restored(&mut self, report: &RecoveryReport) {
        self.report = Some(report.clone());
    }

    fn finish(self: Box<Self>, result: Result<(), StoreError>) {
        let ReopenTask { report, reply } = *self;
        reply(result.and_then(|()| {
            report.ok_or(StoreError::Internal {
                message: "a reopen was answered without running".into(),
            })
        }));
    }
}

/// A job that needs the database to itself: `work` runs in `exclusive`.
pub(crate) struct ExclusiveTask<W, R, S> {
    work: Option<W>,
    answer: Option<R>,
    reply: S,
}

impl<W, R, S> ExclusiveTask<W, R, S>
where
    W: FnOnce(&mut redb::Database) -> R + Send + 'static,
    R: Send + 'static,
    S: FnOnce(Result<R, StoreError>) + Send + 'static,
{
    pub(crate) fn boxed(work: W, reply: S) -> Box<dyn Job> {
        Box::new(ExclusiveTask {
            work: Some(work),
            answer: None,
            reply,
        })
    }
}

impl<W, R, S> Job for ExclusiveTask<W, R, S>
where
    W: FnOnce(&mut redb::Database) -> R + Send,
    R: Send,
    S: FnOnce(Result<R, StoreError>) + Send,
{
    fn run(&mut self, _tx: &mut Tx<'_>, ctx: &mut Context<'_>) -> Keep {
        ctx.need(super::context::Needs::Exclusive);
        Keep::Nothing
    }

    fn exclusive(&mut self, db: &mut redb::Database) {
        if let Some(work) = self.work.take() {
            self.answer = Some(work(db));
        }
    }

    fn finish(self: Box<Self>, group: Result<(), StoreError>) {
        let ExclusiveTask { answer, reply, .. } = *self;
        reply(group.and_then(|()| {
            answer.ok_or(StoreError::Internal {
                message: "an exclusive job was answered without running".into(),
            })
        }));
    }
}

/// A job built from two closures: `work` computes the answer, `reply` delivers it.
pub(crate) struct Task<W, R, S> {
    work: Option<W>,
    kind: JobKind,
    /// The work's answer, or the message of a panic inside it.
    answer: Option<Result<R, String>>,
    reply: S,
}

impl<W, R, S> Task<W, R, S>
where
    W: FnOnce(&mut Tx<'_>, &mut Context<'_>) -> (Keep, R) + Send,
    R: Send,
    S: FnOnce(Result<R, StoreError>) + Send,
{
    pub(crate) fn boxed(work: W, kind: JobKind, reply: S) -> Box<dyn Job>
    where
        W: 'static,
        R: 'static,
        S: 'static,
    {
        debug_assert_ne!(kind, JobKind::Reopen, "a reopen is a ReopenTask");
        Box::new(Task {
            work: Some(work),
            kind,
            answer: None,
            reply,
        })
    }
}

impl<W, R, S> Job for Task<W, R, S>
where
    W: FnOnce(&mut Tx<'_>, &mut Context<'_>) -> (Keep, R) + Send,
    R: Send,
    S: FnOnce(Result<R, StoreError>) + Send,
{
    fn kind(&self) -> JobKind {
        self.kind
    }

    fn run(&mut self, tx: &mut Tx<'_>, ctx: &mut Context<'_>) -> Keep {
        let Some(work) = self.work.take() else {
            return Keep::Nothing;
        };
        // User closures catch their own panics (to hand the claim back); this catches bugs in
        // the store's own work so one request cannot take the writer down.
        match catch_unwind(AssertUnwindSafe(|| work(tx, ctx))) {
            Ok((keep, answer)) => {
                self.answer = Some(Ok(answer));
                keep
            }
            Err(panic) => {
                self.answer = Some(Err(panic_message(panic.as_ref())));
                Keep::Nothing
            }
        }
    }

    fn finish(self: Box<Self>, group: Result<(), StoreError>) {
        let Task { answer, reply, .. } = *self;
        let result = match (group, answer) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(Ok(answer))) => Ok(answer),
            (Ok(()), Some(Err(message))) => Err(StoreError::Internal { message }),
            (Ok(()), None) => Err(StoreError::Internal {
                message: "a request was answered without being run".into(),
            }),
        };
        reply(result);
    }
}
