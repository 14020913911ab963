//! Handing requests to the writer and waiting for its answer: one way onto the queue for
//! blocking and async callers alike.
//!
//! A poisoned store's writer refuses a request when it comes to it, not here: a request sent
//! right after a failure is then answered by a store that has already recovered in place,
//! rather than refused in a race with the recovery.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError};

use redb::Database;

use crate::error::StoreError;
use crate::wal::RecoveryReport;

use super::reply::reply;
use crate::engine::Engine;
use crate::engine::requests::{Request, Tally};
use crate::engine::writer::job::{ExclusiveTask, Job, ReopenTask, Task};

/// Where a job went when offered to the queue without waiting.
enum Offered {
    Queued,
    /// The queue is full: the writer is that far behind. Wait for room (back-pressure).
    Full(SyncSender<Box<dyn Job>>, Box<dyn Job>),
}

impl Engine {
    /// Runs `request` in the writer's next group and returns its answer once the group is
    /// durable.
    pub(crate) fn run<R: Send + 'static>(&self, request: Request<R>) -> Result<R, StoreError> {
        let (answer, waiter) = reply();
        let (work, kind, tally) = request.into_parts();
        self.enqueue(Task::boxed(work, kind, move |result| answer.send(result)))?;
        let answer = waiter.recv().ok_or_else(|| self.stopped())??;
        Ok(self.tallied(answer, tally))
    }

    /// [`Engine::run`] for async callers: the writer answers through a oneshot, and a full
    /// queue is waited on from the blocking pool, so a runtime worker never blocks.
    #[cfg(feature = "tokio")]
    pub(crate) async fn run_async<R: Send + 'static>(
        &self,
        request: Request<R>,
    ) -> Result<R, StoreError> {
        let (answer, receiver) = tokio::sync::oneshot::channel();
        let (work, kind, tally) = request.into_parts();
        let job = Task::boxed(work, kind, move |result| {
            let _ = answer.send(result);
        });
        if let Offered::Full(queue, job) = self.offer(job)? {
            let sent = tokio::task::spawn_blocking(move || queue.send(job).is_ok())
                .await
                .unwrap_or(false);
            if !sent {
                return Err(self.unqueued());
            }
        }
        let answer = receiver.await.map_err(|_| self.stopped())??;
        Ok(self.tallied(answer, tally))
    }

    /// The answer, counted as its request asked.
    fn tallied<R>(&self, answer: R, tally: Option<Tally<R>>) -> R {
        if let Some(tally) = tally {
            tally(&self.shared, &answer);
        }
        answer
    }

    /// Runs `work` on the writer with the database to itself, after everything acknowledged
    /// so far is published and checkpointed.
    pub(in crate::engine) fn exclusive<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Database) -> R + Send + 'static,
    ) -> Result<R, StoreError> {
        let (answer, waiter) = reply();
        self.enqueue(ExclusiveTask::boxed(work, move |result| {
            answer.send(result)
        }))?;
        waiter.recv().ok_or_else(|| self.stopped())?
    }

    /// Recovers in place, as a reopen of the directory would (see `writer::restore`): after
    /// any failure, even while poisoned.
    pub(crate) fn reopen(&self) -> Result<RecoveryReport, StoreError> {
        let (answer, waiter) = reply();
        self.enqueue(ReopenTask::boxed(move |result| answer.send(result)))?;
        waiter.recv().ok_or_else(|| self.stopped())?
    }

    /// Queues a job for the writer, waiting for room if the queue is full.
    fn enqueue(&self, job: Box<dyn Job>) -> Result<(), StoreError> {
        match self.offer(job)? {
            Offered::Queued => Ok(()),
            Offered::Full(queue, job) => queue.send(job).map_err(|_| self.unqueued()),
        }
    }

    /// Offers a job to the queue without waiting, counting it as queued.
    fn offer(&self, job: Box<dyn Job>) -> Result<Offered, StoreError> {
        if std::thread::current().id() == self.writer_id {
            // A closure on the writer waiting for the writer would wait forever.
            return Err(StoreError::Reentrant);
        }
        let queue = self.queue.as_ref().ok_or(StoreError::Closed)?;
        self.shared.counters.queued.fetch_add(1, Ordering::Relaxed);
        match queue.try_send(job) {
            Ok(()) => Ok(Offered::Queued),
            Err(TrySendError::Full(job)) => Ok(Offered::Full(queue.clone(), job)),
            Err(TrySendError::Disconnected(_)) => Err(self.unqueued()),
        }
    }

    /// The error for a job counted as queued that never reached the writer.
    fn unqueued(&self) -> StoreError {
        self.shared.counters.queued.fetch_sub(1, Ordering::Relaxed);
        self.stopped()
    }

    /// The error for a writer that is gone: poisoned if it died, closed otherwise.
    pub(in crate::engine) fn stopped(&self) -> StoreError {
        self.shared
            .poison
            .check()
            .err()
            .unwrap_or(StoreError::Closed)
    }
}
