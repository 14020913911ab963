//! The service the layer wraps around a handler: one covered request from its key to its
//! stored response.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{Request, Response};
use tower::Service;

use tokio::sync::{OwnedSemaphorePermit, TryAcquireError, oneshot};

use super::claimed;
use super::convert::{self, Delivery};
use super::drain::Admitted;
use super::key::{KeyHeader, read_key};
use super::layer::{KeyPolicy, LocalStore, Settings, Work};
use super::local::{self, LocalRequest};
use super::problem;
use super::request::{self, BodyProblem};
use crate::api::claim::Begin;
use crate::api::store::Store;
use crate::error::BoxError;
use crate::model::fingerprint::Fingerprint;
use crate::model::scope::{Scope, ScopePart};
use crate::protocol::{Protocol, ProtocolClaim};

/// The [`IdempotencyLayer`](super::IdempotencyLayer)'s service around an inner service.
#[derive(Clone)]
pub struct IdempotencyService<S, P = Store> {
    inner: S,
    store: P,
    settings: Arc<Settings>,
}

impl<S, P> fmt::Debug for IdempotencyService<S, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyService").finish_non_exhaustive()
    }
}

impl<S, P> IdempotencyService<S, P> {
    pub(crate) fn new(inner: S, store: P, settings: Arc<Settings>) -> Self {
        IdempotencyService {
            inner,
            store,
            settings,
        }
    }
}

/// The boxed future of one request.
type Answer<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>;

impl<S, B, P> Service<Request<Body>> for IdempotencyService<S, P>
where
    P: Protocol,
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
    let chars = key.chars().count();
    if chars < settings.min_key_len {
        return Admission::Refused(problem::bad_key(&format!(
            "the Idempotency-Key has {chars} characters and this service needs at least {}, so that keys do not collide; send a unique key (a UUID works)",
            settings.min_key_len
        )));
    }
    let Some(tenant) = (settings.tenant)(parts) else {
        return Admission::Refused(problem::no_tenant(&settings.challenge));
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

/// One request through the layer: admitted (or passed through, or refused), its body read and
/// fingerprinted, then served by local work or by a claim the store answers.
async fn serve<S, B, P>(
    mut inner: S,
    store: P,
    settings: Arc<Settings>,
    request: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    P: Protocol,
{
    let (parts, body) = request.into_parts();
    let scope = match admit(&settings, &parts) {
        Admission::PassThrough => {
            let response = inner.call(Request::from_parts(parts, body)).await?;
            return Ok(response.map(Body::new));
        }
        Admission::Refused(answer) => return Ok(problem::closing(answer)),
        Admission::Covered(scope) => scope,
    };
    // Counted by the layer's drain until the response is stored; refused once a stop has begun.
    let Some(admitted) = settings.drain.admit(&scope) else {
        return Ok(problem::closing(problem::stopping()));
    };
    // Held until the response is stored (it goes with the claimed request's task).
    let Ok(permit) = reserve(&settings) else {
        return Ok(problem::closing(problem::overloaded()));
    };
    let bytes = match receive(body, &parts, &settings).await {
        Ok(bytes) => bytes,
        Err(answer) => return Ok(answer),
    };
    let fingerprint = request::fingerprint(&parts, &bytes, &settings.fingerprinting);
    if let Work::Local(local) = &settings.work {
        let request = Request::from_parts(parts, Body::from(bytes));
        let held = (permit, admitted);
        return match local {
            LocalStore::Embedded(store) => {
                let local = LocalRequest::new(store.clone(), scope, fingerprint);
                serve_local(inner, local, request, held).await
            }
            #[cfg(feature = "postgres")]
            LocalStore::Postgres(store) => {
                let local = LocalRequest::new(store.clone(), scope, fingerprint);
                serve_local(inner, local, request, held).await
            }
        };
    }
    let claim = match claim(&store, &settings, &scope, fingerprint).await {
        Ok(claim) => claim,
        Err(answer) => return Ok(answer),
    };

    // Claimed as the stop began, and nothing has run yet: a first attempt gives its key back,
    // so the client's retry runs at once wherever it lands instead of waiting for the lease. A
    // take-over runs: an earlier attempt may have done the work downstream, and a release would
    // forget it (the next claim would be a first attempt, told nothing of it). A first attempt
    // in a restore window gives its key back too: the store knows nothing of the earlier
    // attempt either way, and the retry's claim is a recovery again while the window lasts.
    if settings.drain.is_draining() && claim.attempt() == 1 {
        if let Err(e) = claim.release().await {
            tracing::warn!(%scope, error = %e, "a claim made during the stop could not be released; it stays in progress until its lease ends");
        }
        return Ok(problem::closing(problem::stopping()));
    }

    admitted.claimed();
    let request = Request::from_parts(parts, Body::from(bytes));
    hand_over(inner, store, settings, claim, request, (permit, admitted)).await
}

/// What a covered request holds until its response is stored: its place in the layer's
/// `max_in_flight` (if there is one) and its count in the drain. Dropped together, permit first.
type Held = (Option<OwnedSemaphorePermit>, Admitted);

/// A slot of `max_in_flight` (`None` without a limit), or the refusal when none is free.
fn reserve(settings: &Settings) -> Result<Option<OwnedSemaphorePermit>, TryAcquireError> {
    match &settings.in_flight {
        None => Ok(None),
        Some(slots) => slots.clone().try_acquire_owned().map(Some),
    }
}

/// The request's body, whole and within `max_body`, or the refusal that says why not.
async fn receive(
    body: Body,
    parts: &axum::http::request::Parts,
    settings: &Settings,
) -> Result<Bytes, Response<Body>> {
    match request::read_body(body, &parts.headers, settings.max_body).await {
        Ok(bytes) => Ok(bytes),
        Err(BodyProblem::TooLarge) => {
            Err(problem::closing(problem::body_too_large(settings.max_body)))
        }
        Err(BodyProblem::Unreadable(why)) => Err(problem::closing(problem::unreadable_body(&why))),
    }
}

/// Local work: the handler's `execute` claims, works and stores in one step, so the request
/// goes straight to it with the [`LocalRequest`] it executes through.
async fn serve_local<S, B, L>(
    mut inner: S,
    local: LocalRequest<L>,
    mut request: Request<Body>,
    held: Held,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<B>>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    L: Clone + Send + Sync + 'static,
{
    request.extensions_mut().insert(local.clone());
    held.1.claimed();
    let response = inner.call(request).await?;
    drop(held);
    Ok(if local.executed() {
        response.map(Body::new)
    } else {
        local::not_executed()
    })
}

/// Asks the store for the scope (waiting for a live holder if the layer waits, within the
/// store timeout): the claim when this request is to run, else the answer it gets instead.
async fn claim<P: Protocol>(
    store: &P,
    settings: &Settings,
    scope: &Scope,
    fingerprint: Fingerprint,
) -> Result<P::Claim, Response<Body>> {
    let begin = async {
        if settings.wait.is_zero() {
            store.begin(scope, fingerprint).await
        } else {
            store.begin_or_wait(scope, fingerprint, settings.wait).await
        }
    };
    // Past the timeout the store may still claim the key; that claim stays in progress (its
    // request never ran), and a retry after the lease is a recovery.
    let begun = if settings.store_timeout == Duration::MAX {
        begin.await
    } else {
        let limit = settings.store_timeout.saturating_add(settings.wait);
        let Ok(begun) = tokio::time::timeout(limit, begin).await else {
            tracing::error!(%scope, timeout = ?settings.store_timeout, "the idempotency store did not answer in time");
            return Err(problem::store_timeout(settings.outage.failed()));
        };
        begun
    };
    match begun {
        Ok(Begin::Claimed(claim) | Begin::Recovered(claim)) => {
            settings.outage.answered();
            Ok(claim)
        }
        Ok(other) => {
            settings.outage.answered();
            Err(match other {
                Begin::Replay(stored) => convert::to_http(&stored, Delivery::Replay),
                Begin::InProgress { retry_after } => problem::in_progress(retry_after),
                Begin::Mismatch => problem::mismatch(),
                Begin::Expired { completed_at } => problem::expired(completed_at),
                Begin::Claimed(_) | Begin::Recovered(_) => unreachable_claim(),
            })
        }
        Err(e) => {
            tracing::error!(%scope, error = %e, "the idempotency store could not answer");
            Err(problem::store_unavailable(&e, settings.outage.failed()))
        }
    }
}

/// From here the request is the store's: it runs to the end on its own task, even if this
/// future is dropped because the client went away. Answers with the response head the task
/// sends back.
async fn hand_over<S, B, P>(
    inner: S,
    store: P,
    settings: Arc<Settings>,
    claim: P::Claim,
    request: Request<Body>,
    held: Held,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    P: Protocol,
{
    let (reply, answer) = oneshot::channel();
    let task = tokio::spawn(async move {
        claimed::run(inner, store, settings, claim, request, reply).await;
        drop(held);
    });
    match answer.await {
        Ok(result) => result,
        Err(_) => match task.await {
            // The handler panicked: as if it had run here, the panic goes on up (to a
            // catch-panic layer, or to the server, which drops the connection).
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            _ => Ok(problem::handler_lost()),
        },
    }
}

/// `Claimed` and `Recovered` are handled before: this arm is never taken.
fn unreachable_claim() -> Response<Body> {
    problem::handler_lost()
}
