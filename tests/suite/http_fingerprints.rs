//! What identifies a request: the fingerprint policy (query order, headers that count, JSON
//! fields left out, a function of the service's own), the shortest key, and the methods
//! covered. A retry that differs only in what does not identify it is replayed; one that
//! differs in what does is refused 422.

use crate::common;

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, Method, StatusCode};
use common::http::*;
use common::{TestResult, clock};
use idemstore::http::{IdempotencyLayer, QueryPart};

fn with(method: Method, uri: &str, key: &str, headers: &[(&str, &str)], body: &str) -> Request {
    let mut request = request_with(method, uri, Some(key), Body::from(body.to_owned()));
    for (name, value) in headers {
        request.headers_mut().insert(
            HeaderName::from_bytes(name.as_bytes()).expect("a header name"),
            value.parse().expect("a header value"),
        );
    }
    request
}

#[tokio::test]
async fn the_query_counts_in_a_canonical_order_or_not_at_all() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (app, runs) = orders_app(IdempotencyLayer::new(store.clone()));
    let first = send(
        &app,
        with(
            Method::POST,
            "/orders?src=web&v=2",
            "query-order",
            &[],
            BODY,
        ),
    )
    .await?;
    assert_eq!(first.status, StatusCode::CREATED);
    let reordered = send(
        &app,
        with(
            Method::POST,
            "/orders?v=2&src=web",
            "query-order",
            &[],
            BODY,
        ),
    )
    .await?;
    assert!(
        reordered.replayed(),
        "parameters in another order: the same request"
    );
    let changed = send(
        &app,
        with(
            Method::POST,
            "/orders?src=web&v=3",
            "query-order",
            &[],
            BODY,
        ),
    )
    .await?;
    assert_eq!(changed.status, StatusCode::UNPROCESSABLE_ENTITY);

    let (ignoring, ignored_runs) =
        orders_app(IdempotencyLayer::new(store).fingerprint_query(QueryPart::Ignored));
    let first = send(
        &ignoring,
        with(Method::POST, "/orders?utm=a", "query-ignored", &[], BODY),
    )
    .await?;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = send(
        &ignoring,
        with(Method::POST, "/orders?utm=b", "query-ignored", &[], BODY),
    )
    .await?;
    assert!(other.replayed(), "the query does not count");
    assert_eq!(
        (
            runs.load(Ordering::SeqCst),
            ignored_runs.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    Ok(())
}

#[tokio::test]
async fn headers_count_only_when_named() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let in_currency = |key: &str, currency: &str| {
        with(
            Method::POST,
            "/orders",
            key,
            &[("x-currency", currency)],
            BODY,
        )
    };
    let (plain, _) = orders_app(IdempotencyLayer::new(store.clone()));
    send(&plain, in_currency("header-plain", "eur")).await?;
    let other = send(&plain, in_currency("header-plain", "usd")).await?;
    assert!(other.replayed(), "by default headers do not count");

    let (named, _) = orders_app(
        IdempotencyLayer::new(store).fingerprint_headers([HeaderName::from_static("x-currency")]),
    );
    send(&named, in_currency("header-named", "eur")).await?;
    assert!(
        send(&named, in_currency("header-named", "eur"))
            .await?
            .replayed()
    );
    let other = send(&named, in_currency("header-named", "usd")).await?;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a named header counts"
    );
    Ok(())
}

/// Volatile JSON fields left out of the fingerprint: a retry that changes only them is the
/// same request (and gets the first run's response, whatever their new value).
#[tokio::test]
async fn json_fields_left_out_do_not_make_a_retry_a_new_request() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (app, runs) = orders_app(
        IdempotencyLayer::new(store)
            .fingerprint_ignore_json(["/metadata/client_timestamp", "/nonce"]),
    );
    let body = |ts: u64, quantity: u32| {
        format!(
            r#"{{"item":"widget","quantity":{quantity},"nonce":"{ts}","metadata":{{"client_timestamp":{ts},"app":"ios"}}}}"#
        )
    };
    send(&app, post_req("volatile-json", &body(1, 3))).await?;
    let retry = send(&app, post_req("volatile-json", &body(2, 3))).await?;
    assert!(retry.replayed(), "{}", retry.body);
    let changed = send(&app, post_req("volatile-json", &body(3, 4))).await?;
    assert_eq!(
        changed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "a field that counts changed"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

/// A function of the service's own says what identifies a request.
#[tokio::test]
async fn a_custom_function_decides_what_identifies_a_request() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (app, runs) = orders_app(
        IdempotencyLayer::new(store).fingerprint_with(|parts, body| {
            // The method and the body's length only: a deliberately loose identity.
            format!("{} {}", parts.method, body.len()).into_bytes()
        }),
    );
    send(&app, post_req("custom-fp", r#"{"a":1}"#)).await?;
    assert!(
        send(&app, post_req("custom-fp", r#"{"b":2}"#))
            .await?
            .replayed()
    );
    let longer = send(&app, post_req("custom-fp", r#"{"a":10}"#)).await?;
    assert_eq!(longer.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn a_key_shorter_than_the_minimum_is_refused_with_400() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (app, runs) = orders_app(IdempotencyLayer::new(store.clone()));
    let short = send(&app, post_req("k", BODY)).await?;
    assert_eq!(short.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        short.problem_type(),
        "urn:idemstore:problem:invalid-idempotency-key"
    );
    assert!(short.body.contains("at least 8"), "{}", short.body);
    assert_eq!(
        send(&app, post_req("12345678", BODY)).await?.status,
        StatusCode::CREATED
    );
    let (lenient, _) = orders_app(IdempotencyLayer::new(store).min_key_len(1));
    assert_eq!(
        send(&lenient, post_req("k", BODY)).await?.status,
        StatusCode::CREATED
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

/// `.methods()` covers PUT and PATCH like POST; a method it does not name passes through.
#[tokio::test]
async fn put_and_patch_are_covered_when_named() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let handler = {
        let runs = runs.clone();
        move || async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            (StatusCode::OK, format!("run {n}"))
        }
    };
    let app = axum::Router::new()
        .route(
            "/orders",
            axum::routing::put(handler.clone())
                .patch(handler.clone())
                .post(handler),
        )
        .route_layer(IdempotencyLayer::new(store).methods([Method::PUT, Method::PATCH]));
    for method in [Method::PUT, Method::PATCH] {
        let key = format!("method-{method}");
        let first = send(&app, with(method.clone(), "/orders", &key, &[], BODY)).await?;
        let again = send(&app, with(method.clone(), "/orders", &key, &[], BODY)).await?;
        assert_eq!(
            (again.replayed(), again.body),
            (true, first.body),
            "{method}"
        );
    }
    send(
        &app,
        with(Method::POST, "/orders", "method-post", &[], BODY),
    )
    .await?;
    let post = send(
        &app,
        with(Method::POST, "/orders", "method-post", &[], BODY),
    )
    .await?;
    assert!(!post.replayed(), "POST is not covered here: it ran again");
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    Ok(())
}
