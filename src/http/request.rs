//! A covered request's body, buffered within a limit, and its fingerprint.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, header};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::jcs;
use crate::model::fingerprint::Fingerprint;

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

/// A user function from a request's parts and body to the bytes that identify it.
pub(crate) type FingerprintFn = Arc<dyn Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync>;

/// Whether the query string counts in a request's fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QueryPart {
    /// It counts, its parameters sorted by name (values of one name keep their order), so
    /// `?src=web&v=2` and `?v=2&src=web` are the same request. The default.
    #[default]
    Canonical,
    /// It does not count: a retry may change it (a tracking parameter) and is still the same
    /// request. The stored response is replayed whatever the retry's query.
    Ignored,
}

/// What a request's fingerprint is made of (the layer's settings).
#[derive(Clone, Default)]
pub(crate) struct Fingerprinting {
    pub(crate) query: QueryPart,
    /// Headers that count, by name, in this order.
    pub(crate) headers: Vec<HeaderName>,
    /// JSON pointers left out of a JSON body.
    pub(crate) ignore: Vec<String>,
    /// Replaces all of the above.
    pub(crate) custom: Option<FingerprintFn>,
}

/// The fingerprint of a request: its method, its path and (canonical) query, the headers that
/// count, and its body: a JSON body (by content type) in its RFC 8785 canonical form with the
/// ignored members left out, any other body as bytes. Or whatever a custom function makes of
/// the request.
///
/// The parts are separated by newlines, which neither a method nor a request target nor a
/// header value can hold, and the body is tagged with how it was read, so no two different
/// requests hash the same bytes. With no headers configured and an already sorted query, the
/// input is the same as before these settings existed: a retry across an upgrade matches.
pub(crate) fn fingerprint(parts: &Parts, body: &[u8], how: &Fingerprinting) -> Fingerprint {
    if let Some(custom) = &how.custom {
        let mut input = b"custom\n".to_vec();
        input.extend_from_slice(&custom(parts, body));
        return Fingerprint::of_bytes(&input);
    }
    let target = match (how.query, parts.uri.query()) {
        (QueryPart::Canonical, Some(query)) => format!("{}?{}", parts.uri.path(), sorted(query)),
        (QueryPart::Ignored, _) | (_, None) => parts.uri.path().to_owned(),
    };
    let canonical = if is_json(&parts.headers) {
        jcs::canonical_without(body, &how.ignore)
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
    ] {
        input.extend_from_slice(piece);
    }
    for name in &how.headers {
        for value in parts.headers.get_all(name) {
            input.extend_from_slice(name.as_str().as_bytes());
            input.extend_from_slice(b": ");
            input.extend_from_slice(value.as_bytes());
            input.push(b'\n');
        }
    }
    for piece in [tag, b"\n", content] {
        input.extend_from_slice(piece);
    }
    Fingerprint::of_bytes(&input)
}

/// A query string with its parameters sorted by name; the values of one name keep their order
/// (`a=2&a=1` is a list, and its order may matter).
fn sorted(query: &str) -> String {
    let mut pairs: Vec<&str> = query.split('&').filter(|p| !p.is_empty()).collect();
    pairs.sort_by_key(|pair| pair.split_once('=').map_or(*pair, |(name, _)| name));
    pairs.join("&")
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
        fingerprint(&parts, body.as_bytes(), &Fingerprinting::default())
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
