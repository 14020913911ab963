//! Keeping a claim's lease alive while its holder works (feature `tokio`).
//!
//! A lease exists to detect a holder that died, not one that is slow. A holder that may
//! outlive its lease keeps a [`KeepAlive`] while it works: every third of the lease it moves
//! the end of the lease to a whole lease from now, so a live holder is never taken over, while
//! a dead one (its process gone, and the task with it) is, one lease after its last renewal.

use std::fmt;
use std::time::Duration;

use crate::claim::{Claim, LeaseHandle, Renewed};

/// Renews a claim's lease in the background until dropped, or until the claim is finished
/// (committed, released, or taken over by another attempt).
///
/// ```
/// # use idemstore::{Begin, Fingerprint, Response, Scope, Store};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// # let store = Store::open(dir.path().join("idem"))?;
/// # let scope = Scope::new("acct", "export", "k1")?;
/// if let Begin::Claimed(claim) = store.begin_async(&scope, Fingerprint::of_bytes(b"req")).await? {
///     let alive = claim.keep_alive(); // renews every lease / 3 from now on
///     // ... work that may take longer than the lease ...
///     drop(alive); // or keep it until the commit returns
///     claim.commit_async(|_| Ok(Response::new(200, "done"))).await?;
/// }
/// # Ok(())
/// # }
/// ```
///
/// Needs a tokio runtime (it is a task on it).
#[must_use = "dropping a KeepAlive stops renewing the lease"]
pub struct KeepAlive {
    task: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeepAlive")
            .field("running", &!self.task.is_finished())
            .finish()
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KeepAlive {
    /// Starts renewing the lease of the claim behind `handle`.
    pub(crate) fn start(handle: LeaseHandle) -> Self {
        KeepAlive {
            task: tokio::spawn(renew_until_over(handle)),
        }
    }

    /// Whether it stopped on its own (the claim is finished).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Claim {
    /// Keeps this claim's lease from running out while the holder works: see [`KeepAlive`].
    /// The claim stays the caller's to commit or release.
    pub fn keep_alive(&self) -> KeepAlive {
        KeepAlive::start(self.lease_handle())
    }
}

/// The renewal loop: every third of the lease, a whole lease from now.
async fn renew_until_over(handle: LeaseHandle) {
    let lease = handle.lease();
    let every = (lease / 3).max(Duration::from_millis(1));
    loop {
        tokio::time::sleep(every).await;
        match handle.renew(lease).await {
            Ok(Renewed::Until(until)) => {
                tracing::trace!(scope = %handle.scope(), %until, "lease renewed");
            }
            Ok(Renewed::Over(reason)) => {
                tracing::debug!(scope = %handle.scope(), %reason, "the claim is finished; no more renewals");
                return;
            }
            // A store that is recovering or a full disk: the next tick tries again, and the
            // lease still holds for two more.
            Err(e) => {
                tracing::warn!(scope = %handle.scope(), error = %e, "renewing a lease failed")
            }
        }
    }
}
