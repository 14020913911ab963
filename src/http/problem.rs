//! `application/problem+json` answers (RFC 9457) for the requests the middleware refuses.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};

use crate::error::StoreError;
use crate::model::clock::Timestamp;

/// A problem answer: `type` is a URN naming the case, `title` says what it is, `detail` what
/// happened and what to do.
pub(crate) fn problem(status: StatusCode, kind: &str, title: &str, detail: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(problem_body(status, kind, title, detail)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

const PROBLEM_JSON: &str = "application/problem+json";

/// `response` with `Connection: close`: for a refusal answered before the request's body was
/// read (or read whole). The server cannot reuse the connection, whose unread bytes would be
/// taken for the next request, and hyper closes it; saying so lets a client that pools
/// connections open a new one for its next request instead of failing on this one.
pub(crate) fn closing(mut response: Response<Body>) -> Response<Body> {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn problem_body(status: StatusCode, kind: &str, title: &str, detail: &str) -> String {
    serde_json::json!({
        "type": format!("urn:idemstore:problem:{kind}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    })
    .to_string()
}

/// 409 for a key whose first request is still in flight, with `Retry-After` in whole seconds:
/// the store's advice (what the first request probably still needs, within its lease; see
/// `model::pace`), rounded up, at least one.
pub(crate) fn in_progress(retry_after: Duration) -> Response<Body> {
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let mut response = problem(
        StatusCode::CONFLICT,
        "request-in-progress",
        "A request with this Idempotency-Key is still in progress",
        &format!(
            "retry after {} seconds with the same key to get its outcome",
            seconds.max(1)
        ),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}

/// 400: the key header is missing, repeated, empty, too long or malformed, or the scope it
/// makes is invalid.
pub(crate) fn bad_key(detail: &str) -> Response<Body> {
    problem(
        StatusCode::BAD_REQUEST,
        "invalid-idempotency-key",
        "The Idempotency-Key header is missing or invalid",
        detail,
    )
}

/// 400: the request's operation (by default its method and route, or its path when the layer
/// runs outside routing) is not a valid scope part: too long, most likely.
pub(crate) fn invalid_operation(detail: &str) -> Response<Body> {
    problem(
        StatusCode::BAD_REQUEST,
        "invalid-operation",
        "The request cannot be made idempotent",
        &format!("its operation, named from its method and path, is not valid: {detail}"),
    )
}

/// 500: the tenant the authentication layer produced is not a valid scope part.
pub(crate) fn invalid_tenant() -> Response<Body> {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "invalid-tenant",
        "The service could not scope the Idempotency-Key to the caller",
        "the caller's identity is not usable as an idempotency scope (the service logged why); nothing was run, retrying will not help until the service is fixed",
    )
}

/// 401: no tenant to scope the key to, with the challenge RFC 9110 (section 15.5.2) requires.
pub(crate) fn no_tenant(challenge: &HeaderValue) -> Response<Body> {
    let mut response = problem(
        StatusCode::UNAUTHORIZED,
        "no-tenant",
        "The request is not authenticated",
        "idempotency keys are kept per caller and this request has none; authenticate and retry",
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, challenge.clone());
    response
}

/// 413: the body is over the limit buffered for fingerprinting.
pub(crate) fn body_too_large(limit: usize) -> Response<Body> {
    problem(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body-too-large",
        "The request body is too large",
        &format!("a request with an Idempotency-Key may have a body of at most {limit} bytes"),
    )
}

/// 400: the client's body stream failed before it ended.
pub(crate) fn unreadable_body(why: &str) -> Response<Body> {
    problem(
        StatusCode::BAD_REQUEST,
        "unreadable-body",
        "The request body could not be read",
        &format!("reading the body failed ({why}); send the request again with the same key"),
    )
}

/// 422: the key was used before for a different request.
pub(crate) fn mismatch() -> Response<Body> {
    problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency-key-reused",
        "The Idempotency-Key was used for a different request",
        "this key belongs to a request with another method, path or body; use a new key for a new request",
    )
}

/// 410: the request completed so long ago that its response is no longer kept.
pub(crate) fn expired(completed_at: Timestamp) -> Response<Body> {
    problem(
        StatusCode::GONE,
        "idempotency-key-expired",
        "The request with this Idempotency-Key completed and its response expired",
        &format!(
            "it completed at {completed_at} and must not run again; look its result up, or use a new key for a new request"
        ),
    )
}

/// 503: the store could not decide; nothing was claimed. The detail says what the client
/// should do, never what failed inside (the caller logs that); `retry_after` grows with the
/// outage and is spread at random.
pub(crate) fn store_unavailable(error: &StoreError, retry_after: Duration) -> Response<Body> {
    let seconds = retry_after.as_secs().max(1);
    let what = if error.io_kind() == Some(std::io::ErrorKind::StorageFull) {
        "the service's storage is full"
    } else if error.io_kind() == Some(std::io::ErrorKind::NotConnected) {
        // A store that ships its log synchronously, refusing while its replica is away.
        "the service's idempotency store cannot reach the replica it ships its log to"
    } else if matches!(error, StoreError::Backend { .. }) {
        "the service cannot reach its idempotency database"
    } else {
        "the service's idempotency store is recovering"
    };
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "idempotency-store-unavailable",
        "The idempotency store is unavailable",
        &format!("{what}; nothing was run. Retry with the same key after {seconds} seconds"),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// 503: the store did not answer within the layer's timeout. If it claimed the key after
/// that, the claim stays in progress and nothing ran.
pub(crate) fn store_timeout(retry_after: Duration) -> Response<Body> {
    let seconds = retry_after.as_secs().max(1);
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "idempotency-store-timeout",
        "The idempotency store did not answer in time",
        &format!(
            "the service is slow to record requests right now and did not run this one; retry with the same key after {seconds} seconds"
        ),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// 503: more covered requests are in flight than the layer's cap; the store was not touched.
pub(crate) fn overloaded() -> Response<Body> {
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        "The service is busy",
        "too many requests are in flight; nothing was run. Retry with the same key after the Retry-After seconds",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// 503: the service is stopping (its layer's drain has begun) and took no new work.
pub(crate) fn stopping() -> Response<Body> {
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "stopping",
        "The service is stopping",
        "this instance is stopping and took no new work; nothing was run. Retry with the same key after the Retry-After seconds: another instance, or this one once restarted, runs it",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// 500: the task running a claimed request ended without an answer (it was cancelled as the
/// runtime shut down). The claim stays in progress: its outcome is unknown.
pub(crate) fn handler_lost() -> Response<Body> {
    problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "idempotent-handler-failed",
        "The request could not be completed",
        "the request's outcome is unknown: retry with the same key once its lease ends, and the retry finds it out",
    )
}

/// The 500 stored in place of a handler's response that cannot be stored (over the store's
/// size limits, or a body that failed while it was read): the handler ran, so a retry must get
/// a fixed answer rather than run it again.
pub(crate) fn response_not_stored(limit: usize) -> crate::model::response::Response {
    let status = StatusCode::INTERNAL_SERVER_ERROR;
    let body = problem_body(
        status,
        "response-not-stored",
        "The request ran but its response could not be kept",
        &format!(
            "the handler's response is over the {limit} bytes a stored response may hold (body and headers), or its body failed while it was read; this answer is kept in its place, so a retry with the same key gets it and does not run the request again. Look the result up another way; the service's operator can raise the store's max_response_bytes"
        ),
    );
    crate::model::response::Response::new(status.as_u16(), body.into_bytes())
        .with_header(header::CONTENT_TYPE.as_str(), PROBLEM_JSON)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_the_lease_left_rounded_up() {
        let r = in_progress(Duration::from_millis(12_001));
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[header::RETRY_AFTER], "13");
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert_eq!(
            in_progress(Duration::ZERO).headers()[header::RETRY_AFTER],
            "1"
        );
    }
}
