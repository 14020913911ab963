//! Business SQL in a claimed request's PostgreSQL transaction (features `http` and
//! `postgres`): the HTTP side of [`PgTx`].

use axum::body::Body;

use super::extract::{Finish, HandlerError, IdempotentRequest};
use crate::error::CommitError;
use crate::model::response::Response;
use crate::postgres::{PgStore, PgTx};

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
