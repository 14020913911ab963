//! A clean stop: refuse new covered requests, let the claimed ones in flight finish within a
//! limit, and name those still running at the limit.
//!
//! A process that dies with requests in flight leaves their keys in progress: each client's
//! retry on the next process gets 409 until the lease ends, then runs as a recovery. A stop
//! through [`Drain`] causes neither for a request that finishes within the limit, nor for one
//! not claimed yet ([`Drain::start`] says how it is answered). Only a handler still running at
//! the limit leaves its key in progress, and [`Drained::LimitPassed`] names it: its outcome is
//! unknown.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::model::scope::Scope;

/// The stop of one [`IdempotencyLayer`](super::IdempotencyLayer) (and of every clone of it):
/// from [`IdempotencyLayer::drain`](super::IdempotencyLayer::drain). Cheap to clone.
///
/// ```no_run
/// # async fn stop(drain: idemstore::http::Drain) {
/// use std::time::Duration;
/// use idemstore::http::Drained;
///
/// drain.start(); // on SIGTERM: new covered requests get 503 from here on
/// match drain.finish(Duration::from_secs(20)).await {
///     Drained::AllFinished => {}
///     Drained::LimitPassed { in_progress } => {
///         for scope in in_progress {
///             eprintln!("left in progress, outcome unknown: {scope}");
///         }
///     }
/// }
/// # }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Drain {
    state: Arc<State>,
}

/// What [`Drain::finish`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drained {
    /// Every covered request that was admitted has finished: its response is stored, or its
    /// claim was released.
    AllFinished,
    /// The limit passed with these requests' handlers still running. Their keys stay in
    /// progress if the process stops now: a retry gets 409 until the lease ends, and the first
    /// after it runs as a recovery.
    LimitPassed {
        /// The scopes (tenant, operation, key) of the claimed requests still running. A
        /// request admitted but not claimed yet (its body still arriving, its `begin` not
        /// answered) is waited for but not named: it changed nothing so far.
        in_progress: Vec<Scope>,
    },
}

/// Whether the layer takes new covered requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    #[default]
    Serving,
    Draining,
}

#[derive(Debug, Default)]
struct State {
    inner: Mutex<Inner>,
    /// Woken each time an admitted request finishes.
    finished: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    phase: Phase,
    /// Admitted requests not finished yet, by admission number.
    running: HashMap<u64, Running>,
    next: u64,
}

/// An admitted request, and how far it got.
#[derive(Debug)]
struct Running {
    scope: Scope,
    stage: Stage,
}

/// Whether an admitted request holds a claim (or, for local work, may be executing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Admitted,
    Claimed,
}

/// One admitted covered request; it counts as running until this is dropped.
#[derive(Debug)]
pub(crate) struct Admitted {
    state: Arc<State>,
    id: u64,
}

impl Admitted {
    /// The request holds its claim now: if it is still running at the limit, its key stays in
    /// progress.
    pub(crate) fn claimed(&self) {
        if let Some(running) = self.state.inner.lock().running.get_mut(&self.id) {
            running.stage = Stage::Claimed;
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let removed = self.state.inner.lock().running.remove(&self.id);
        debug_assert!(removed.is_some(), "an admitted request is counted once");
        self.state.finished.notify_waiters();
    }
}

impl Drain {
    /// Stops taking new covered requests: from now on each is answered 503 with
    /// `Retry-After: 1` before the store is asked (nothing ran, the key stays free, so the
    /// client's retry lands on another instance, or on this one after its restart, and runs
    /// at once). A request admitted before this call whose first claim is made after it gives
    /// the key back before its handler starts, with the same answer; a recovery (a later
    /// attempt) runs, since an earlier attempt may have done the work. Requests that pass
    /// through the layer uncovered are not affected (the server's own graceful shutdown closes
    /// connections).
    pub fn start(&self) {
        self.state.inner.lock().phase = Phase::Draining;
    }

    /// Whether [`start`](Self::start) was called.
    pub fn is_draining(&self) -> bool {
        self.state.inner.lock().phase == Phase::Draining
    }

    /// Covered requests admitted and not finished.
    pub fn in_flight(&self) -> usize {
        self.state.inner.lock().running.len()
    }

    /// Waits until every admitted covered request has finished, or `limit` has passed. Call
    /// after [`start`](Self::start) (before it, new requests keep coming).
    pub async fn finish(&self, limit: Duration) -> Drained {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let finished = self.state.finished.notified();
            tokio::pin!(finished);
            // Registered before the check, so a request finishing in between still wakes us.
            finished.as_mut().enable();
            let in_progress: Vec<Scope> = {
                let inner = self.state.inner.lock();
                if inner.running.is_empty() {
                    return Drained::AllFinished;
                }
                inner
                    .running
                    .values()
                    .filter(|r| r.stage == Stage::Claimed)
                    .map(|r| r.scope.clone())
                    .collect()
            };
            if tokio::time::timeout_at(deadline, finished).await.is_err() {
                return Drained::LimitPassed { in_progress };
            }
        }
    }

    /// Admits a covered request (counted until the guard drops), or `None` while draining.
    pub(crate) fn admit(&self, scope: &Scope) -> Option<Admitted> {
        let mut inner = self.state.inner.lock();
        if inner.phase == Phase::Draining {
            return None;
        }
        let id = inner.next;
        inner.next += 1;
        inner.running.insert(
            id,
            Running {
                scope: scope.clone(),
                stage: Stage::Admitted,
            },
        );
        Some(Admitted {
            state: self.state.clone(),
            id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(key: &str) -> Scope {
        Scope::new("t", "op", key).expect("a valid scope")
    }

    #[tokio::test(start_paused = true)]
    async fn finish_waits_for_admitted_requests_and_names_those_past_the_limit() {
        let drain = Drain::default();
        let quick = drain.admit(&scope("quick-key")).expect("serving");
        let slow = drain.admit(&scope("slow-key")).expect("serving");
        let unclaimed = drain.admit(&scope("unclaimed-key")).expect("serving");
        quick.claimed();
        slow.claimed();
        drain.start();
        assert!(
            drain.admit(&scope("late-key")).is_none(),
            "refused once draining"
        );
        assert_eq!(drain.in_flight(), 3);
        let finishing = tokio::spawn({
            let drain = drain.clone();
            async move { drain.finish(Duration::from_secs(10)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        drop(quick);
        let drained = finishing.await.expect("no panic");
        assert_eq!(
            drained,
            Drained::LimitPassed {
                in_progress: vec![scope("slow-key")]
            },
            "named: the claimed request still running, not the one never claimed"
        );
        drop((slow, unclaimed));
        assert_eq!(
            drain.finish(Duration::from_secs(10)).await,
            Drained::AllFinished
        );
        assert_eq!(drain.in_flight(), 0);
    }
}
