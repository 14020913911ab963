//! A covered request's body, buffered within a limit, and its fingerprint.

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::jcs;
use crate::fingerprint::Fingerprint;

/// Why a body could not be buffered.
#[derive(Debug)]
pub(crate) enum BodyProblem {
    /// Over the limit (declared or streamed).
    TooLarge,
    /// The client's stream failed.
    Unreadable(String),
}

/// The whole body, refused early when `Content-Length` already says it is too large.
pub(crate) async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, BodyProblem> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyProblem::TooLarge);
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(BodyProblem::TooLarge),
        Err(e) => Err(BodyProblem::Unreadable(e.to_string())),
    }
}

/// The fingerprint of a request: its method, its path and query, and its body: a JSON body
/// (by content type) in its RFC 8785 canonical form, any other body as bytes.
///
/// The parts are separated by newlines, which neither a method nor a request target can hold,
/// and the body is tagged with how it was read, so no two different requests hash the same
/// bytes.
pub(crate) fn fingerprint(parts: &Parts, body: &[u8]) -> Fingerprint {
    let target = parts
        .uri
        .path_and_query()
        .map_or(parts.uri.path(), |pq| pq.as_str());
    let canonical = if is_json(&parts.headers) {
        jcs::canonical(body)
    } else {
        None
    };
    let (tag, content): (&[u8], &[u8]) = match &canonical {
        Some(json) => (b"json", json),
        None => (b"bytes", body),
    };
    let mut input =
        Vec::with_capacity(parts.method.as_str().len() + target.len() + content.len() + 8);
    for piece in [
        parts.method.as_str().as_bytes(),
        b"\n",
        target.as_bytes(),
        b"\n",
        tag,
        b"\n",
        content,
    ] {
        input.extend_from_slice(piece);
    }
    Fingerprint::of_bytes(&input)
}

/// `application/json` or any `+json` type, parameters ignored.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

#[cfg(test)]
mod tests {
    use axum::http::Request;

    use super::*;

    fn fp(method: &str, uri: &str, content_type: Option<&str>, body: &str) -> Fingerprint {
        let mut builder = Request::builder().method(method).uri(uri);
        if let Some(ct) = content_type {
            builder = builder.header(header::CONTENT_TYPE, ct);
        }
        let (parts, ()) = builder.body(()).expect("valid request").into_parts();
        fingerprint(&parts, body.as_bytes())
    }

    #[test]
    fn json_bodies_are_compared_canonically() {
        let json = Some("application/json; charset=utf-8");
        let a = fp(
            "POST",
            "/charges",
            json,
            r#"{"amount": 100, "currency": "eur"}"#,
        );
        let b = fp(
            "POST",
            "/charges",
            json,
            r#"{"currency":"eur","amount":1e2}"#,
        );
        assert_eq!(a, b);
        assert_ne!(
            a,
            fp(
                "POST",
                "/charges",
                json,
                r#"{"currency":"eur","amount":101}"#
            )
        );
        assert_eq!(
            a,
            fp(
                "POST",
                "/charges",
                Some("application/merge-patch+json"),
                r#"{"amount":100,"currency":"eur"}"#
            )
        );
    }

    #[test]
    fn method_path_query_and_raw_bytes_all_count() {
        let text = Some("text/plain");
        let base = fp("POST", "/charges?x=1", text, "a b");
        assert_ne!(base, fp("PATCH", "/charges?x=1", text, "a b"));
        assert_ne!(base, fp("POST", "/charges?x=2", text, "a b"));
        assert_ne!(base, fp("POST", "/charges", text, "a b"));
        assert_ne!(base, fp("POST", "/charges?x=1", text, "a  b"));
        // Not JSON by content type: whitespace matters; invalid JSON falls back to bytes.
        assert_ne!(
            fp("POST", "/", None, "{\"a\":1}"),
            fp("POST", "/", None, "{ \"a\":1}")
        );
        assert_eq!(
            fp("POST", "/", Some("application/json"), "{x"),
            fp("POST", "/", None, "{x")
        );
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused() {
        let ok = read_body(Body::from("12345"), &HeaderMap::new(), 5).await;
        assert_eq!(ok.expect("within the limit"), Bytes::from_static(b"12345"));
        let over = read_body(Body::from("123456"), &HeaderMap::new(), 5).await;
        assert!(matches!(over, Err(BodyProblem::TooLarge)));
        let mut declared = HeaderMap::new();
        declared.insert(header::CONTENT_LENGTH, 1_000_000.into());
        let early = read_body(Body::from("1"), &declared, 5).await;
        assert!(matches!(early, Err(BodyProblem::TooLarge)));
    }
}
