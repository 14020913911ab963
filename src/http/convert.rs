//! Between the core's stored [`Response`] and HTTP responses.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::model::response::Response;

/// The header that marks a replayed response (Stripe's name).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Whether an answer is the first one or a replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    First,
    Replay,
}

/// The HTTP form of a stored response; a replay is marked `Idempotent-Replayed: true`.
///
/// Stored headers came from valid HTTP headers (or from a handler's explicit `Response`); one
/// that is not a valid header is skipped rather than failing the replay.
pub(crate) fn to_http(stored: &Response, delivery: Delivery) -> axum::http::Response<Body> {
    let mut response = axum::http::Response::new(Body::from(stored.body().to_vec()));
    *response.status_mut() =
        StatusCode::from_u16(stored.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    for (name, value) in stored.headers() {
        let parsed = (
            HeaderName::try_from(name.as_str()),
            HeaderValue::from_bytes(value),
        );
        if let (Ok(name), Ok(value)) = parsed {
            headers.append(name, value);
        }
    }
    if delivery == Delivery::Replay {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

/// What the middleware stores of a handler's response: status, the allow-listed headers, body.
pub(crate) fn to_stored(
    status: StatusCode,
    headers: &HeaderMap,
    allowed: &[HeaderName],
    body: &Bytes,
) -> Response {
    let mut stored = Response::new(status.as_u16(), body.to_vec());
    for name in allowed {
        for value in headers.get_all(name) {
            stored = stored.with_header(name.as_str(), value.as_bytes());
        }
    }
    stored
}

#[cfg(test)]
mod tests {
    use axum::http::header;

    use super::*;

    #[test]
    fn only_allowed_headers_are_stored_and_replays_are_marked() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("session=1"));
        headers.append(header::LINK, HeaderValue::from_static("</a>"));
        headers.append(header::LINK, HeaderValue::from_static("</b>"));
        let body = Bytes::from_static(b"{}");
        let allowed = [header::CONTENT_TYPE, header::LINK];
        let stored = to_stored(StatusCode::CREATED, &headers, &allowed, &body);
        assert_eq!(stored.status(), 201);
        assert_eq!(stored.headers().len(), 3);
        assert_eq!(stored.header("set-cookie"), None);

        let replay = to_http(&stored, Delivery::Replay);
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()[IDEMPOTENT_REPLAYED], "true");
        assert_eq!(replay.headers().get_all(header::LINK).iter().count(), 2);
        assert!(
            to_http(&stored, Delivery::First)
                .headers()
                .get(IDEMPOTENT_REPLAYED)
                .is_none()
        );
    }
}
