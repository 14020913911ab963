//! The replica's own tokio runtime, on a thread of its own, and the bounded wait of each call.
//!
//! The replica traits are blocking: the store calls them from its own threads, and possibly
//! from a thread that is inside a tokio runtime (a store opened from async code), where
//! `Runtime::block_on` would panic. So no async code ever runs on a caller's thread: a call's
//! future is spawned onto this runtime (one thread, `current_thread`) and the caller waits for
//! its answer on a std channel, for at most the time limit. A call that has not answered by
//! then is aborted and reported unreachable.
//!
//! A long call (an upload, a read of a long stream, a large batch) reports [`Progress`]; its
//! wait then ends only after a whole time limit *without* progress, so it is bounded by the
//! link going silent, not by the size of what it moves.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::ReplicaError;

/// How long the runtime's blocking work (file reads and writes) may take to stop when the
/// replica is dropped.
const SHUTDOWN: Duration = Duration::from_secs(1);

/// The runtime thread. Dropping it stops the runtime and joins the thread.
pub(super) struct Bridge {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// A counter a long call advances as it goes (a message acknowledged, a chunk moved).
#[derive(Debug, Clone, Default)]
pub(super) struct Progress(Arc<AtomicU64>);

impl Progress {
    /// Something moved.
    pub(super) fn tick(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn seen(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A task on the runtime, aborted when this is dropped (a caller that stops waiting).
pub(super) struct Spawned(tokio::task::JoinHandle<()>);

impl Drop for Spawned {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why a wait ended without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Silence {
    /// A whole time limit passed without an answer (or progress).
    TimedOut,
    /// The runtime is gone (it panicked, or is stopping).
    Stopped,
}

impl Bridge {
    /// Starts the runtime on its own thread.
    pub(super) fn start() -> Result<Bridge, ReplicaError> {
        let (handle_tx, handle_rx) = mpsc::sync_channel(1);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("idemstore-replica".to_owned())
            .spawn(move || {
                // Built on its own thread, so that it is also dropped there: dropping a runtime
                // on a thread inside another runtime panics.
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(runtime.handle().clone()));
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                runtime.shutdown_timeout(SHUTDOWN);
            })
            .map_err(|e| ReplicaError::Refused {
                detail: format!("could not start the replica's thread: {e}"),
            })?;
        let handle = match handle_rx.recv() {
            Ok(Ok(handle)) => handle,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(ReplicaError::Refused {
                    detail: format!("could not start the replica's runtime: {e}"),
                });
            }
            Err(_) => {
                let _ = thread.join();
                return Err(ReplicaError::Refused {
                    detail: "the replica's runtime thread stopped as it started".to_owned(),
                });
            }
        };
        Ok(Bridge {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Runs `future` on the runtime; aborted when the returned guard is dropped.
    pub(super) fn spawn(&self, future: impl Future<Output = ()> + Send + 'static) -> Spawned {
        Spawned(self.handle.spawn(future))
    }

    /// Runs `future` on the runtime and waits for its answer: at most `limit`, or, with
    /// `progress`, until a whole `limit` passes without progress. The future is aborted when
    /// the wait gives up.
    pub(super) fn call<T, F>(
        &self,
        limit: Duration,
        progress: Option<&Progress>,
        future: F,
    ) -> Result<T, Silence>
    where
        T: Send + 'static,
        F: Future<Output = T> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        let _task = self.spawn(async move {
            let _ = tx.send(future.await);
        });
        wait(&rx, limit, progress)
    }
}

/// The next item on `rx`: at most `limit`, or, with `progress`, until a whole `limit` passes
/// without progress.
pub(super) fn wait<T>(
    rx: &mpsc::Receiver<T>,
    limit: Duration,
    progress: Option<&Progress>,
) -> Result<T, Silence> {
    let mut seen = progress.map(Progress::seen);
    loop {
        match rx.recv_timeout(limit) {
            Ok(item) => return Ok(item),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Err(Silence::Stopped),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = progress.map(Progress::seen);
                if now == seen {
                    return Err(Silence::TimedOut);
                }
                seen = now;
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // The runtime never runs the caller's code, so joining cannot wait on this thread.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_answers_from_inside_another_runtime() -> Result<(), Box<dyn std::error::Error>> {
        let bridge = Bridge::start()?;
        let outer = tokio::runtime::Builder::new_current_thread().build()?;
        let answer =
            outer.block_on(async { bridge.call(Duration::from_secs(5), None, async { 42 }) });
        assert_eq!(answer, Ok(42));
        Ok(())
    }

    #[test]
    fn a_silent_call_gives_up_after_the_limit() -> Result<(), Box<dyn std::error::Error>> {
        let bridge = Bridge::start()?;
        let started = std::time::Instant::now();
        let answer = bridge.call(
            Duration::from_millis(200),
            None,
            std::future::pending::<()>(),
        );
        assert_eq!(answer, Err(Silence::TimedOut));
        assert!(started.elapsed() < Duration::from_secs(2));
        Ok(())
    }

    #[test]
    fn progress_extends_the_wait_and_silence_ends_it() -> Result<(), Box<dyn std::error::Error>> {
        let bridge = Bridge::start()?;
        let progress = Progress::default();
        let ticks = progress.clone();
        let answer = bridge.call(Duration::from_millis(300), Some(&progress), async move {
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                ticks.tick();
            }
            "done"
        });
        assert_eq!(answer, Ok("done"));
        Ok(())
    }
}
