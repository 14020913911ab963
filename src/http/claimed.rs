//! A claimed request, from its handler to its stored response, on a task of its own.
//!
//! Once the key is claimed the request belongs to the store: it runs to the end even if the
//! client goes away. A client that timed out retries with the same key and must find the
//! outcome (or a request in progress), never a lease to wait out and a second run after it.
//! While the task runs, the claim's lease is renewed (a [`KeepAlive`]), so a slow handler or a
//! long stream is never taken over; if the process dies, the lease ends on its own.

use std::sync::Arc;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{Request, Response};
use tokio::sync::oneshot;
use tower::Service;

use super::convert::{self, Delivery};
use super::extract::{AfterHandler, IdempotentRequest, LeaveInProgress};
use super::layer::{Handling, Settings};
use super::problem;
use super::rejection::{self, Began};
use super::stream::{self, Recorded};
use crate::error::{BoxError, CommitError};
use crate::protocol::{Protocol, ProtocolClaim};

/// What the task hands back to the request's future: the response head (its body streams on).
pub(crate) type Reply<E> = oneshot::Sender<Result<Response<Body>, E>>;

/// Runs the handler for a claimed request and stores its response; sends the response to
/// `reply` as soon as its head is known.
pub(crate) async fn run<S, B, P>(
    mut inner: S,
    store: P,
    settings: Arc<Settings>,
    claim: P::Claim,
    request: Request<Body>,
    reply: Reply<S::Error>,
) where
    S: Service<Request<Body>, Response = Response<B>>,
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    P: Protocol,
{
    let _alive = claim.keep_alive();
    let handle = IdempotentRequest::<P>::new(claim);
    let mut request = request;
    request.extensions_mut().insert(handle.clone());
    // If this await never finishes (a panic), `handle` and the claim in it are dropped
    // unfinished: the claim stays in progress until its lease ends.
    let response = match inner.call(request).await {
        Ok(response) => response,
        Err(e) => {
            let _ = reply.send(Err(e));
            return;
        }
    };
    let claim = match handle.after_handler() {
        AfterHandler::Finished => {
            let _ = reply.send(Ok(response.map(Body::new)));
            return;
        }
        AfterHandler::Unfinished(claim) => claim,
    };
    if response.extensions().get::<LeaveInProgress>().is_some() {
        // The handler returned a `HandlerError`: its outcome is unknown, so the claim is
        // neither stored nor released; the next attempt after the lease is a recovery.
        tracing::warn!(scope = %claim.scope(), status = %response.status(), "the handler failed with its outcome unknown; the claim is left in progress");
        drop(claim);
        let _ = reply.send(Ok(response.map(Body::new)));
        return;
    }
    let (response, began) = match rejection::began(response).await {
        Ok(seen) => seen,
        Err(e) => {
            tracing::error!(scope = %claim.scope(), error = %e, "the handler's response body failed before it could be looked at");
            let answer = store_in_place(claim, problem::response_not_stored(limit(&store))).await;
            let _ = reply.send(Ok(answer));
            return;
        }
    };
    if began == Began::No || settings.failures.handling(response.status()) == Handling::Release {
        // Refused before the handler began (nothing ran), or a failure the policy releases:
        // a retry with the same key runs again.
        if let Err(e) = claim.release().await {
            tracing::warn!(error = %e, "could not release the claim");
        }
        let _ = reply.send(Ok(response));
        return;
    }
    store_streamed(&store, &settings, claim, response, reply).await;
}

fn limit(store: &impl Protocol) -> usize {
    store.limits().max_response_bytes
}

/// Sends the response to the client as it streams, records it, and stores the record.
async fn store_streamed<E, C: ProtocolClaim>(
    store: &impl Protocol,
    settings: &Settings,
    claim: C,
    response: Response<Body>,
    reply: Reply<E>,
) {
    let limit = limit(store);
    let (parts, body) = response.into_parts();
    let status = parts.status;
    let headers = parts.headers.clone();
    // `tee` lives until this returns, after the record is stored: only then does the client's
    // body end.
    let (mut tee, client_body) = stream::tee();
    let _ = reply.send(Ok(Response::from_parts(parts, Body::new(client_body))));
    let recorded = tee
        .record(body, limit, settings.detached_stream_timeout)
        .await;
    let bytes = match recorded {
        Recorded::Whole(bytes) => bytes,
        Recorded::TooLarge => {
            tracing::error!(scope = %claim.scope(), limit, "the handler's response is too large to store; a fixed 500 is stored in its place");
            drop(store_in_place(claim, problem::response_not_stored(limit)).await);
            return;
        }
        Recorded::Failed(error) => {
            tracing::error!(scope = %claim.scope(), %error, "the handler's response body failed part way; a fixed 500 is stored in its place");
            drop(store_in_place(claim, problem::response_not_stored(limit)).await);
            // Only now: a client that retries at once finds the fixed answer.
            tee.fail(error).await;
            return;
        }
        Recorded::Abandoned => {
            tracing::error!(scope = %claim.scope(), "the client went away and the response did not end in time; a fixed 500 is stored in its place");
            drop(store_in_place(claim, problem::response_not_stored(limit)).await);
            return;
        }
    };
    let stored = convert::to_stored(status, &headers, &settings.replay_headers, &bytes);
    let scope = claim.scope().clone();
    match claim.complete(stored).await {
        Ok(_) => {}
        Err(CommitError::InvalidResponse { source, claim }) => {
            // Within the body limit, but its headers make it too large (or too many).
            tracing::error!(%scope, error = %source, "the handler's response cannot be stored; a fixed 500 is stored in its place");
            drop(store_in_place(*claim, problem::response_not_stored(limit)).await);
        }
        Err(e) => {
            // The handler's work is done but its response is not recorded: the claim is left
            // in progress (or another attempt holds it), and a retry after the lease is a
            // recovery. The client got the answer the handler gave.
            tracing::error!(error = %e, %scope, "the handler's response was not stored");
            drop(e.into_claim());
        }
    }
}

/// Stores `answer` in place of a handler's response that cannot be stored, and answers it: the
/// handler ran, so retries get this fixed answer instead of running it again. If even that
/// fails, the claim is left in progress (a retry after the lease is a recovery).
pub(crate) async fn store_in_place(
    claim: impl ProtocolClaim,
    answer: crate::model::response::Response,
) -> Response<Body> {
    let first = convert::to_http(&answer, Delivery::First);
    if let Err(e) = claim.complete(answer).await {
        tracing::error!(error = %e, "the answer in place of the handler's response was not stored either");
        drop(e.into_claim());
    }
    first
}
