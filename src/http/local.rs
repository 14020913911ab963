//! Routes whose work is entirely local: the request is claimed and committed in one step by
//! the handler's call to [`LocalRequest::execute`], not claimed by the layer beforehand. On
//! the local store the step is one writer step; on PostgreSQL (`LocalRequest<PgStore>`), one
//! transaction.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::IntoResponse;

use super::convert::{self, Delivery};
use super::extract::HandlerError;
use super::problem::{self, problem};
use crate::Tx;
use crate::api::store::Store;
use crate::error::{BoxError, ExecuteError};
use crate::model::execution::Execution;
use crate::model::fingerprint::Fingerprint;
use crate::model::response::Response;
use crate::model::scope::Scope;

/// A covered request on a route declared local ([`IdempotencyLayer::local_work`]), for its
/// handler: the key has not been claimed; [`execute`](Self::execute) claims it, runs the work
/// and stores the response in one step, or answers as a duplicate.
///
/// `S` is the layer's store: [`Store`] (the default), or with feature `postgres`
/// [`PgStore`](crate::PgStore), whose `execute` runs the work with a [`PgTx`](crate::PgTx).
///
/// [`IdempotencyLayer::local_work`]: super::IdempotencyLayer::local_work
#[derive(Clone)]
pub struct LocalRequest<S = Store> {
    pub(super) store: S,
    pub(super) scope: Scope,
    pub(super) fingerprint: Fingerprint,
    /// Set by `execute`: a local handler that returns without it is a bug the layer reports.
    pub(super) executed: Arc<AtomicBool>,
}

impl<S> fmt::Debug for LocalRequest<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalRequest")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl<S> LocalRequest<S> {
    pub(crate) fn new(store: S, scope: Scope, fingerprint: Fingerprint) -> Self {
        LocalRequest {
            store,
            scope,
            fingerprint,
            executed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether the handler called [`execute`](Self::execute).
    pub(crate) fn executed(&self) -> bool {
        self.executed.load(Ordering::SeqCst)
    }

    /// The request's scope: tenant, operation and key.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The answer to an execution, as HTTP: the response stored, or what the layer answers
    /// a duplicate.
    pub(crate) fn answer(
        &self,
        execution: Result<Execution, ExecuteError>,
    ) -> Result<axum::http::Response<Body>, HandlerError> {
        Ok(match execution.map_err(HandlerError::NotExecuted)? {
            Execution::Executed(response) => convert::to_http(&response, Delivery::First),
            Execution::Replay(stored) => convert::to_http(&stored, Delivery::Replay),
            Execution::InProgress { retry_after } => problem::in_progress(retry_after),
            Execution::Mismatch => problem::mismatch(),
            Execution::Expired { completed_at } => problem::expired(completed_at),
        })
    }
}

impl LocalRequest<Store> {
    /// Runs `work` with [`Store::execute`]: only if the key is new (or a two-phase claim on it
    /// expired), in the transaction that stores its response. Answers that response as HTTP,
    /// or what the layer answers a duplicate: the stored response with
    /// `Idempotent-Replayed: true`, 409 with `Retry-After`, 422, or 410.
    ///
    /// `work` runs on the store's writer thread and must not call out of the process: there is
    /// no claim while it runs, so a crash would forget an external effect and the retry would
    /// repeat it.
    ///
    /// # Errors
    /// [`HandlerError::NotExecuted`]: the closure failed, panicked, or its response was
    /// refused (500), or storage failed (503). Nothing was written and the key is not held.
    pub async fn execute<F>(&self, work: F) -> Result<axum::http::Response<Body>, HandlerError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static,
    {
        self.executed.store(true, Ordering::SeqCst);
        let execution = self
            .store
            .execute_async(&self.scope, self.fingerprint, work)
            .await;
        self.answer(execution)
    }
}

/// The handler asked for a [`LocalRequest`] but its route is not declared local.
#[derive(Debug, Clone, Copy)]
pub struct NotLocal;

impl IntoResponse for NotLocal {
    fn into_response(self) -> axum::response::Response {
        problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "missing-idempotency-layer",
            "The handler expects a local idempotent request",
            "this route's handler takes a LocalRequest but the request did not come through an IdempotencyLayer declared local_work: add one to the route and cover its method",
        )
    }
}

impl<S, State> FromRequestParts<State> for LocalRequest<S>
where
    S: Clone + Send + Sync + 'static,
    State: Send + Sync,
{
    type Rejection = NotLocal;

    async fn from_request_parts(parts: &mut Parts, _: &State) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<LocalRequest<S>>()
            .cloned()
            .ok_or(NotLocal)
    }
}

/// What a local route's handler answers when it returned without calling `execute`: its
/// response is not passed on, because a retry would run it again.
pub(crate) fn not_executed() -> axum::http::Response<Body> {
    tracing::error!(
        "a handler on a route declared local_work returned without calling LocalRequest::execute; its response was replaced by a 500"
    );
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "idempotent-handler-failed",
        "The request could not be completed",
        "the service did not record this request (a bug in the service); retrying may run it again",
    )
}
