//! Telling a request refused before the handler's body began (an extractor's rejection) from
//! the handler's own answer.
//!
//! Stripe stores no result for a request that failed validation before the endpoint began:
//! nothing ran, and a client that fixes its request must be able to reuse the key. axum's
//! extractors refuse with fixed plain-text bodies (`Failed to parse the request body as
//! JSON: ...`); a response with one of those is taken as a rejection, and so is any response
//! a custom extractor marks with [`NotStarted`]. The handler's own 4xx and 5xx are stored as
//! usual.

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{Response, StatusCode, header};
use http_body_util::BodyExt;

use crate::error::BoxError;

/// Marks a response as refused before the handler's work began: the middleware then releases
/// the key instead of storing the response, so a corrected retry with the same key runs.
///
/// axum's own extractor rejections are recognized without it; insert it into the response
/// extensions of a custom extractor's rejection (`response.extensions_mut().insert(NotStarted)`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NotStarted;

/// The bodies axum's extractors refuse with: `Json`, `Form`, `Query`, `Path`, `String`,
/// `Bytes` and `Extension`.
const AXUM_REJECTIONS: &[&str] = &[
    "Failed to parse the request body as JSON",
    "Failed to deserialize the JSON body into the target type",
    "Expected request with `Content-Type: application/json`",
    "Failed to buffer the request body",
    "Request body didn't contain valid UTF-8",
    "Form requests must have `Content-Type: application/x-www-form-urlencoded`",
    "Failed to deserialize form",
    "Failed to deserialize query string",
    "Invalid URL: ",
    "Invalid UTF-8 in `",
    "Missing request extension",
];

/// The largest body read to recognize a rejection (axum's are short and sized).
const MAX_REJECTION_BODY: u64 = 4096;

/// Whether a response was refused before the handler began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Began {
    /// An extractor refused the request: nothing ran.
    No,
    /// The handler answered.
    Yes,
}

/// Looks at a response the handler's service produced; reads the body only of a short
/// plain-text 4xx, and gives it back whole.
pub(crate) async fn began<B>(response: Response<B>) -> Result<(Response<Body>, Began), BoxError>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if response.extensions().get::<NotStarted>().is_some() {
        return Ok((response.map(Body::new), Began::No));
    }
    let candidate = matches!(
        response.status(),
        StatusCode::BAD_REQUEST
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::UNSUPPORTED_MEDIA_TYPE
            | StatusCode::UNPROCESSABLE_ENTITY
    ) && response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"))
        && response
            .body()
            .size_hint()
            .exact()
            .is_some_and(|n| n <= MAX_REJECTION_BODY);
    if !candidate {
        return Ok((response.map(Body::new), Began::Yes));
    }
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.map_err(Into::into)?.to_bytes();
    let refused = std::str::from_utf8(&bytes)
        .is_ok_and(|text| AXUM_REJECTIONS.iter().any(|p| text.starts_with(p)));
    let began = if refused { Began::No } else { Began::Yes };
    Ok((Response::from_parts(parts, Body::from(bytes)), began))
}
