//! The service the layer wraps around a handler: one covered request from its key to its
//! stored response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{Request, Response};
use http_body_util::{BodyExt, Limited};
use tower::Service;

use super::convert::{self, Delivery};
use super::extract::{AfterHandler, IdempotentRequest, LeaveInProgress};
use super::key::{KeyHeader, read_key};
use super::layer::{Handling, KeyPolicy, Settings};
use super::problem;
use super::request::{self, BodyProblem};
use crate::claim::{Begin, Claim};
use crate::error::{BoxError, CommitError};
use crate::scope::{Scope, ScopePart};
use crate::store::Store;

/// The [`IdempotencyLayer`](super::IdempotencyLayer)'s service around an inner service.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    store: Store,
    settings: Arc<Settings>,
}

impl<S> fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S> IdempotencyService<S> {
    pub(crate) fn new(inner: S, store: Store, settings: Arc<Settings>) -> Self {
        IdempotencyService {
            inner,
            store,
            settings,
        }
    }
}

/// The boxed future of one request.
type Answer<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

impl<S, B> Service<Request<Body>> for IdempotencyService<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Answer<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The instance that was polled ready serves this request; a clone takes its place.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(serve(
            inner,
            self.store.clone(),
            self.settings.clone(),
            request,
        ))
    }
}

/// What the request's headers and extensions make of it.
enum Admission {
    /// Not covered, or no key where a key is optional: straight to the handler.
    PassThrough,
    /// Refused before the store is asked.
    Refused(Response<Body>),
    /// Covered: this is its scope.
    Covered(Scope),
}

fn admit(settings: &Settings, parts: &axum::http::request::Parts) -> Admission {
    if !settings.covers(&parts.method) {
        return Admission::PassThrough;
    }
    let key = match read_key(&parts.headers) {
        Ok(KeyHeader::Present(key)) => key,
        Ok(KeyHeader::Absent) => {
            return match settings.key {
                KeyPolicy::Optional => Admission::PassThrough,
                KeyPolicy::Required => Admission::Refused(problem::bad_key(
                    "this operation requires an Idempotency-Key header; send a unique key (a UUID works) and reuse it on retries",
                )),
            };
        }
        Err(why) => return Admission::Refused(problem::bad_key(&why.detail())),
    };
    let Some(tenant) = (settings.tenant)(parts) else {
        return Admission::Refused(problem::no_tenant());
    };
    let operation = (settings.operation)(parts);
    match Scope::new(tenant, operation, key) {
        Ok(scope) => Admission::Covered(scope),
        Err(e) => Admission::Refused(match e.part() {
            Some(ScopePart::Tenant) => {
                // What the authentication layer produced: the service's fault, not the client's.
                tracing::error!(error = %e, "the tenant read from the request is not a valid scope part");
                problem::invalid_tenant()
            }
            Some(ScopePart::Operation) => problem::invalid_operation(&e.to_string()),
            Some(ScopePart::Key) | None => problem::bad_key(&e.to_string()),
        }),
    }
}

async fn serve<S, B>(
    mut inner: S,
    store: Store,
    settings: Arc<Settings>,
    request: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<B>>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let scope = match admit(&settings, &parts) {
        Admission::PassThrough => {
            let response = inner.call(Request::from_parts(parts, body)).await?;
            return Ok(response.map(Body::new));
        }
        Admission::Refused(answer) => return Ok(answer),
        Admission::Covered(scope) => scope,
    };
    let bytes = match request::read_body(body, &parts.headers, settings.max_body).await {
        Ok(bytes) => bytes,
        Err(BodyProblem::TooLarge) => return Ok(problem::body_too_large(settings.max_body)),
        Err(BodyProblem::Unreadable(why)) => return Ok(problem::unreadable_body(&why)),
    };
    let fingerprint = request::fingerprint(&parts, &bytes);
    let begun = if settings.wait.is_zero() {
        store.begin_async(&scope, fingerprint).await
    } else {
        store
            .begin_or_wait_async(&scope, fingerprint, settings.wait)
            .await
    };
    let claim = match begun {
        Ok(Begin::Claimed(claim) | Begin::Recovered(claim)) => claim,
        Ok(Begin::Replay(stored)) => return Ok(convert::to_http(&stored, Delivery::Replay)),
        Ok(Begin::InProgress { retry_after }) => return Ok(problem::in_progress(retry_after)),
        Ok(Begin::Mismatch) => return Ok(problem::mismatch()),
        Ok(Begin::Expired { completed_at }) => return Ok(problem::expired(completed_at)),
        Err(e) => return Ok(problem::store_unavailable(&e)),
    };

    let handle = IdempotentRequest::new(claim);
    let mut request = Request::from_parts(parts, Body::from(bytes));
    request.extensions_mut().insert(handle.clone());
    // If this await never finishes (a panic, a dropped future), `handle` and the claim in it
    // are dropped unfinished: the claim stays in progress until its lease ends.
    let response = inner.call(request).await?;
    match handle.after_handler() {
        AfterHandler::Finished => Ok(response.map(Body::new)),
        AfterHandler::Unfinished(claim)
            if response.extensions().get::<LeaveInProgress>().is_some() =>
        {
            // The handler returned a `HandlerError`: its outcome is unknown, so the claim is
            // neither stored nor released; the next attempt after the lease is a recovery.
            tracing::warn!(scope = %claim.scope(), status = %response.status(), "the handler failed with its outcome unknown; the claim is left in progress");
            drop(claim);
            Ok(response.map(Body::new))
        }
        AfterHandler::Unfinished(claim) => Ok(finish(&store, &settings, claim, response).await),
    }
}

/// Stores (or releases, by the failures policy) the response of a handler that did not finish
/// its claim, and answers it.
async fn finish<B>(
    store: &Store,
    settings: &Settings,
    claim: Claim,
    response: Response<B>,
) -> Response<Body>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if settings.failures.handling(response.status()) == Handling::Release {
        if let Err(e) = claim.release_async().await {
            tracing::warn!(error = %e, "could not release the claim after an error response");
        }
        return response.map(Body::new);
    }
    let limit = store.engine().config().max_response_bytes;
    let (parts, body) = response.into_parts();
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            tracing::error!(scope = %claim.scope(), error = %e, limit, "the handler's response cannot be stored; a fixed 500 is stored in its place");
            return store_in_place(claim, problem::response_not_stored(limit)).await;
        }
    };
    let stored = convert::to_stored(
        parts.status,
        &parts.headers,
        &settings.replay_headers,
        &bytes,
    );
    let scope = claim.scope().clone();
    match claim.commit_async(move |_tx| Ok(stored)).await {
        Ok(_) => {}
        Err(CommitError::InvalidResponse { source, claim }) => {
            // Within the body limit, but its headers make it too large (or too many).
            tracing::error!(%scope, error = %source, "the handler's response cannot be stored; a fixed 500 is stored in its place");
            return store_in_place(*claim, problem::response_not_stored(limit)).await;
        }
        Err(e) => {
            // The handler's work is done but its response is not recorded: the claim is left
            // in progress (or another attempt holds it), and a retry after the lease is a
            // recovery. The client still gets the answer the handler gave.
            tracing::error!(error = %e, %scope, "the handler's response was not stored");
            drop(e.into_claim());
        }
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// Stores `answer` in place of a handler's response that cannot be stored, and answers it: the
/// handler ran, so retries get this fixed answer instead of running it again. If even that
/// fails, the claim is left in progress (a retry after the lease is a recovery).
async fn store_in_place(claim: Claim, answer: crate::response::Response) -> Response<Body> {
    let first = convert::to_http(&answer, Delivery::First);
    if let Err(e) = claim.commit_async(move |_tx| Ok(answer)).await {
        tracing::error!(error = %e, "the answer in place of the handler's response was not stored either");
        drop(e.into_claim());
    }
    first
}
