//! Keeping a claim's lease alive while its holder works.
//!
//! A lease exists to detect a holder that died, not one that is slow. A holder that may
//! outlive its lease keeps a [`KeepAlive`] while it works: every third of the lease it moves
//! the end of the lease to a whole lease from now (never sooner than it already is, so a lease
//! the holder extended itself is not cut short). A live holder is then never taken over, while
//! a dead one (its process gone, and the renewals with it) is, one lease after the last
//! renewal.
//!
//! The renewal loop is written once, here, for every backend: a backend implements [`Renew`]
//! (how it renews one claim's lease), and gets a [`KeepAlive`] back.

use std::fmt;
#[cfg(feature = "tokio")]
use std::future::Future;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::Duration;

use super::claim::HeldLease;
use crate::error::{ClaimError, StaleReason};
use crate::model::clock::Timestamp;
use crate::model::scope::Scope;

/// How a backend renews a claim's lease: the one part of the keep-alive that is the backend's.
pub(crate) trait Renew: Send + Sync + 'static {
    /// The store's lease: what each renewal extends by.
    fn lease(&self) -> Duration;
    /// Moves the end of the lease of the holder of `fence` to `lease` from now, unless it
    /// already ends later.
    #[cfg(feature = "tokio")]
    fn renew(
        &self,
        scope: &Scope,
        fence: u64,
        lease: Duration,
    ) -> impl Future<Output = Result<Renewed, ClaimError>> + Send;
    /// [`renew`](Self::renew), blocking, for a claim held outside a runtime; `None` for a
    /// backend that renews only on a runtime.
    fn renew_blocking(
        &self,
        scope: &Scope,
        fence: u64,
        lease: Duration,
    ) -> Option<Result<Renewed, ClaimError>>;
}

/// What a renewal came to.
#[derive(Debug)]
pub(crate) enum Renewed {
    /// The lease now ends at this time.
    Until(Timestamp),
    /// The claim is no longer held (committed, released, or taken over): stop renewing. Not
    /// counted as a stale refusal: a heartbeat racing its holder's commit is normal. The
    /// reason, where the backend knows it.
    Over(Option<StaleReason>),
}

/// Renews a claim's lease in the background until it is dropped, or until the claim is
/// finished: committed, released, dropped, or taken over by another attempt.
///
/// ```
/// # use idemstore::{Begin, Fingerprint, Response, Scope, Store};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = Store::open(dir.path().join("idem"))?;
/// # let scope = Scope::new("acct", "export", "report-2026-11")?;
/// if let Begin::Claimed(claim) = store.begin(&scope, Fingerprint::of_bytes(b"req"))? {
///     let _alive = claim.keep_alive(); // renews every lease / 3 from now on
///     // ... work that may take longer than the lease ...
///     claim.commit(|_| Ok(Response::new(200, "done")))?; // renewals stop with the claim
/// }
/// # Ok(())
/// # }
/// ```
///
/// Inside a tokio runtime (feature `tokio`) the renewals run as a task on it; elsewhere on a
/// thread of their own.
#[must_use = "dropping a KeepAlive stops renewing the lease"]
pub struct KeepAlive {
    runner: Runner,
}

enum Runner {
    #[cfg(feature = "tokio")]
    Task(tokio::task::JoinHandle<()>),
    Thread {
        /// Dropping it wakes the thread, which then stops.
        stop: Option<Sender<()>>,
        thread: Option<JoinHandle<()>>,
    },
}

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepAlive")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        match &mut self.runner {
            #[cfg(feature = "tokio")]
            Runner::Task(task) => task.abort(),
            Runner::Thread { stop, thread } => {
                *stop = None;
                // It stops at once (its wait ends when `stop` goes); wait for a renewal in
                // flight, so that none lands after the KeepAlive is gone.
                if let Some(thread) = thread.take() {
                    let _ = thread.join();
                }
            }
        }
    }
}

impl KeepAlive {
    /// Starts renewing the lease of the claim behind `handle`: as a task if a tokio runtime
    /// is running here, else on a thread.
    pub(crate) fn start<B: Renew>(handle: HeldLease<B>) -> Self {
        #[cfg(feature = "tokio")]
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            // The cadence starts now, not when the task is first polled.
            let first = tokio::time::Instant::now() + interval(&handle).1;
            return KeepAlive {
                runner: Runner::Task(runtime.spawn(renew_async(handle, first))),
            };
        }
        let (stop, stopped) = channel();
        let thread = std::thread::Builder::new()
            .name("idemstore-keep-alive".into())
            .spawn(move || renew_blocking(&handle, &stopped));
        match thread {
            Ok(thread) => KeepAlive {
                runner: Runner::Thread {
                    stop: Some(stop),
                    thread: Some(thread),
                },
            },
            Err(e) => {
                tracing::error!(error = %e, "could not start a thread to renew a lease; the lease is not renewed");
                KeepAlive {
                    runner: Runner::Thread {
                        stop: None,
                        thread: None,
                    },
                }
            }
        }
    }

    /// Whether it stopped on its own (the claim is finished) or could not start.
    pub fn is_finished(&self) -> bool {
        match &self.runner {
            #[cfg(feature = "tokio")]
            Runner::Task(task) => task.is_finished(),
            Runner::Thread { thread, .. } => thread.as_ref().is_none_or(JoinHandle::is_finished),
        }
    }
}

/// Every third of the lease: the interval between renewals.
fn interval<B: Renew>(handle: &HeldLease<B>) -> (Duration, Duration) {
    let lease = handle.backend.lease();
    (lease, (lease / 3).max(Duration::from_millis(1)))
}

/// What to do after a renewal: go on, or stop.
fn after<B>(handle: &HeldLease<B>, renewed: Result<Renewed, ClaimError>) -> Next {
    match renewed {
        Ok(Renewed::Until(until)) => {
            tracing::trace!(scope = %handle.scope, %until, "lease renewed");
            Next::Continue
        }
        Ok(Renewed::Over(reason)) => {
            tracing::debug!(scope = %handle.scope, ?reason, "the claim is finished; no more renewals");
            Next::Stop
        }
        // A store that is recovering or a full disk: the next tick tries again, and the lease
        // still holds for two more.
        Err(e) => {
            tracing::warn!(scope = %handle.scope, error = %e, "renewing a lease failed");
            Next::Continue
        }
    }
}

enum Next {
    Continue,
    Stop,
}

#[cfg(feature = "tokio")]
async fn renew_async<B: Renew>(handle: HeldLease<B>, first: tokio::time::Instant) {
    let (lease, every) = interval(&handle);
    let mut ticks = tokio::time::interval_at(first, every);
    // A renewal that took long (a busy writer) is not followed by a burst of catch-up ones.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if handle.claim_dropped() {
            return;
        }
        if let Next::Stop = after(
            &handle,
            handle
                .backend
                .renew(&handle.scope, handle.fence, lease)
                .await,
        ) {
            return;
        }
    }
}

fn renew_blocking<B: Renew>(handle: &HeldLease<B>, stopped: &Receiver<()>) {
    let (lease, every) = interval(handle);
    loop {
        match stopped.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        if handle.claim_dropped() {
            return;
        }
        let Some(renewed) = handle
            .backend
            .renew_blocking(&handle.scope, handle.fence, lease)
        else {
            tracing::error!(scope = %handle.scope, "this backend renews leases only on a tokio runtime; the lease is not renewed");
            return;
        };
        if let Next::Stop = after(handle, renewed) {
            return;
        }
    }
}
