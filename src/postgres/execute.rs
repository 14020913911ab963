//! [`PgStore::execute`]: claim, business writes and completion in one PostgreSQL transaction,
//! for work that touches nothing outside the database.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::task::Poll;

use super::driver::timed;
use super::store::PgStore;
use super::tx::PgTx;
use crate::error::{BoxError, CommitError, ExecuteError, StoreError};
use crate::model::begin::Begin;
use crate::model::execution::Execution;
use crate::model::fingerprint::Fingerprint;
use crate::model::panic::panic_message;
use crate::model::response::Response;
use crate::model::scope::Scope;

impl PgStore {
    /// Claims, runs `work` and stores its response in **one** transaction, for work that
    /// touches nothing outside this database: the pair costs one commit (one WAL flush)
    /// instead of the two of [`begin`](crate::Protocol::begin) and [`PgTx::commit`].
    ///
    /// `BEGIN`, then the same claiming statement as `begin` (uncommitted: no other session
    /// sees the claim; it also holds the key's advisory lock until this transaction ends, so a
    /// `begin` of the key meanwhile answers in progress at once instead of waiting on the
    /// row), then `work` with the transaction, then the completion and `COMMIT`.
    /// A duplicate gets [`Execution::Replay`], [`Execution::InProgress`] (a two-phase claim
    /// holds the key), [`Execution::Mismatch`] or [`Execution::Expired`], as `begin` would
    /// answer, and `work` does not run. A two-phase claim whose lease ended is taken over
    /// and `work` runs ([`Execution::Executed`]), as on the local store.
    ///
    /// No in-progress record is ever committed: if the process dies, the connection goes, or
    /// `work` fails, nothing of the request was written, and the retry runs it again.
    /// **Not for work with an external side effect** (a payment call, an email): there is no
    /// committed claim while it runs. Use `begin` and [`PgTx::commit`] for that.
    ///
    /// `work` runs on the caller's task with the transaction: business SQL through
    /// [`PgTx::conn`], messages through [`PgTx::publish`]. A duplicate `execute` that arrives
    /// meanwhile waits for it, bounded by the statement timeout ([`PgBuilder::timeout`]), then gets the
    /// answer the commit left; so keep `work` short, as any transaction that holds a lock.
    ///
    /// [`PgBuilder::timeout`]: crate::PgBuilder::timeout
    ///
    /// # Errors
    /// [`ExecuteError`]: `work` failed or panicked, its response was refused, or the database
    /// failed. In every case nothing of the request was written and the key is not held,
    /// except [`StoreError::OutcomeUnknown`]: the `COMMIT`'s answer was lost, and `begin` for
    /// the key tells whether it committed (a `Replay`) or not.
    pub async fn execute<F>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Execution, ExecuteError>
    where
        F: AsyncFnOnce(&mut PgTx) -> Result<Response, BoxError>,
    {
        let limit = self.call_limit();
        let mut tx = timed(limit, "begin a transaction", self.pool().begin()).await?;
        // A claim runs the work; any other answer wrote nothing, and the rollback only gives
        // the connection back.
        let unrun = match self.begin_on(&mut tx, scope, fingerprint).await? {
            Begin::Claimed(claim) | Begin::Recovered(claim) => Ok(claim),
            Begin::Replay(response) => Err(Execution::Replay(response)),
            Begin::InProgress { retry_after } => Err(Execution::InProgress { retry_after }),
            Begin::Mismatch => Err(Execution::Mismatch),
            Begin::Expired { completed_at } => Err(Execution::Expired { completed_at }),
        };
        let claim = match unrun {
            Ok(claim) => claim,
            Err(answer) => {
                if let Ok(Err(e)) = tokio::time::timeout(limit, tx.rollback()).await {
                    tracing::debug!(error = %e, "rollback failed; the server drops the transaction");
                }
                return Ok(answer);
            }
        };
        let mut tx = PgTx::new(tx, claim);
        let ran = caught(work(&mut tx)).await;
        let response = match ran {
            Ok(Ok(response)) => response,
            Ok(Err(source)) => {
                drop(tx.rollback().await);
                return Err(ExecuteError::Aborted(source));
            }
            Err(message) => {
                drop(tx.rollback().await);
                return Err(ExecuteError::Panicked(message));
            }
        };
        match tx.commit(response).await {
            Ok(response) => Ok(Execution::Executed(response)),
            Err(CommitError::InvalidResponse { source, .. }) => {
                Err(ExecuteError::InvalidResponse(source))
            }
            Err(CommitError::Store(e)) => Err(ExecuteError::Store(e)),
            // The claim was made in this very transaction, which holds its row: no other
            // attempt can have taken it over. Rolled back all the same.
            Err(CommitError::Stale(stale)) => Err(ExecuteError::Store(StoreError::Internal {
                message: format!(
                    "execute: the claim made in this transaction was not there to complete ({stale}); nothing was written"
                ),
            })),
            // `PgTx::commit` runs no closure, so it neither aborts nor panics.
            Err(other) => Err(ExecuteError::Store(StoreError::Internal {
                message: format!("execute: an unexpected commit error ({other})"),
            })),
        }
    }
}

/// Awaits `work`, turning a panic in it into its message: the transaction it borrowed is
/// then rolled back like one whose work failed.
async fn caught<T>(work: impl Future<Output = T>) -> Result<T, String> {
    let mut work = pin!(work);
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic_message(panic.as_ref()))),
        }
    })
    .await
}
