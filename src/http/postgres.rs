//! Business SQL in a claimed request's PostgreSQL transaction (features `http` and
//! `postgres`): the HTTP side of [`PgTx`], for claimed routes and for local ones
//! ([`PgStore::execute`]).

use std::sync::atomic::Ordering;

use axum::body::Body;

use super::extract::{Finish, HandlerError, IdempotentRequest};
use super::local::LocalRequest;
use crate::error::{BoxError, CommitError};
use crate::model::response::Response;
use crate::postgres::{PgStore, PgTx};

impl LocalRequest<PgStore> {
    /// Runs `work` with [`PgStore::execute`]: only if the key is new (or a two-phase claim on
    /// it expired), in the PostgreSQL transaction that stores its response. Answers that
    /// response as HTTP, or what the layer answers a duplicate: the stored response with
    /// `Idempotent-Replayed: true`, 409 with `Retry-After`, 422, or 410.
    ///
    /// `work` runs business SQL through [`PgTx::conn`] and may [`publish`](PgTx::publish)
    /// messages; it must not call out of the process (there is no committed claim while it
    /// runs).
    ///
    /// # Errors
    /// [`HandlerError::NotExecuted`]: the closure failed, panicked, or its response was
    /// refused (500), or the database failed (503). Nothing was written and the key is not
    /// held, except when the commit's answer was lost (`StoreError::OutcomeUnknown`, 503): a
    /// retry then replays or runs it.
    pub async fn execute<F>(&self, work: F) -> Result<axum::http::Response<Body>, HandlerError>
    where
        F: AsyncFnOnce(&mut PgTx) -> Result<Response, BoxError>,
    {
        self.executed.store(true, Ordering::SeqCst);
        let execution = self
            .store
            .execute(&self.scope, self.fingerprint, work)
            .await;
        self.answer(execution)
    }
}

impl IdempotentRequest<PgStore> {
    /// Opens the claim's PostgreSQL transaction for the handler's business SQL; finish it with
    /// [`commit`](IdempotentRequest::<PgStore>::commit) (or
    /// [`rollback`](IdempotentRequest::<PgStore>::rollback)). While it is open the claim is
    /// in it; a transaction dropped unfinished rolls back and leaves the key in progress.
    ///
    /// # Errors
    /// [`HandlerError::Store`] if no transaction could be opened: the key stays in progress.
    pub async fn transaction(&self) -> Result<PgTx, HandlerError> {
        let claim = self.take()?;
        match claim.transaction().await {
            Ok(tx) => Ok(tx),
            Err(e) => {
                self.finish(Finish::LeftInProgress);
                Err(match e {
                    CommitError::Store(e) => HandlerError::Store(e),
                    CommitError::Stale(e) => HandlerError::Stale(e),
                    other => HandlerError::Aborted(other.to_string().into()),
                })
            }
        }
    }

    /// Stores `response` as the key's completed record in `tx` and commits it with the
    /// business SQL run in it (see [`PgTx::commit`]); answers the stored response as HTTP,
    /// exactly as a replay will carry it.
    ///
    /// # Errors
    /// See [`HandlerError`]; a refused response gives the claim back to this request.
    pub async fn commit(
        &self,
        tx: PgTx,
        response: Response,
    ) -> Result<axum::http::Response<Body>, HandlerError> {
        let committed = tx.commit(response).await;
        self.committed(committed)
    }

    /// Rolls `tx` back and gives the claim back to this request, still held: the handler may
    /// release it, or return a response for the middleware to store.
    pub async fn rollback(&self, tx: PgTx) {
        let claim = tx.rollback().await;
        self.put_back(claim);
    }
}
