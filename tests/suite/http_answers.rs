//! The Idempotency-Key middleware's answers, in process: each row of the table in
//! `idemstore::http` (replays, refusals of bad keys and bodies, 422, 410, tenants), and what
//! is stored and replayed. Time is the store's manual clock; nothing sleeps.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use common::http::*;
use common::{TestResult, builder, clock};
use idemstore::http::{IdempotencyLayer, IdempotentRequest, KeyPolicy, Tenant};

#[tokio::test]
async fn a_retry_is_replayed_with_allowed_headers_and_the_handler_runs_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let runs = runs.clone();
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let headers = [
                (header::CONTENT_TYPE, "application/json"),
                (header::LOCATION, "/orders/1"),
                (header::SET_COOKIE, "session=abc"),
                (HeaderName::from_static("x-order-version"), "7"),
            ];
            (StatusCode::CREATED, headers, r#"{"id":1}"#)
        })
    };
    let app = Router::new().route("/orders", handler).route_layer(
        IdempotencyLayer::new(store.clone())
            .replay_headers([HeaderName::from_static("x-order-version")]),
    );

    let first = send(&app, post_req("request-k1", BODY)).await?;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(
        first.headers[header::SET_COOKIE],
        "session=abc",
        "the first answer is the handler's own"
    );

    // Same request, keys in another order and other whitespace: the same canonical JSON.
    let retry = send(
        &app,
        post_req("request-k1", r#"{"quantity":3,"item":"widget"}"#),
    )
    .await?;
    assert_eq!(retry.status, StatusCode::CREATED);
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.headers[header::CONTENT_TYPE], "application/json");
    assert_eq!(retry.headers[header::LOCATION], "/orders/1");
    assert_eq!(retry.headers["x-order-version"], "7");
    assert!(
        retry.headers.get(header::SET_COOKIE).is_none(),
        "not on the allow-list"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn a_changed_body_or_path_under_the_same_key_is_refused_422() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/orders", counted(&runs))
        .route("/orders/{id}/refund", counted(&runs))
        .route_layer(IdempotencyLayer::new(store));

    assert_eq!(
        send(&app, post_req("request-k1", BODY)).await?.status,
        StatusCode::CREATED
    );
    let changed = send(
        &app,
        post_req("request-k1", r#"{"item":"widget","quantity":4}"#),
    )
    .await?;
    assert_eq!(changed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        changed.problem_type(),
        "urn:idemstore:problem:idempotency-key-reused"
    );

    // One operation (the matched route), two paths: the path is part of the fingerprint.
    let refund = |id: &str| {
        request(
            Method::POST,
            &format!("/orders/{id}/refund"),
            Some("request-r1"),
            "{}",
        )
    };
    assert_eq!(send(&app, refund("1")).await?.status, StatusCode::CREATED);
    assert_eq!(
        send(&app, refund("2")).await?.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    Ok(())
}

#[tokio::test]
async fn bad_keys_missing_keys_and_large_bodies_are_refused_before_the_store() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (app, runs) = orders_app(IdempotencyLayer::new(store.clone()).max_body(64));

    let missing = send(&app, request(Method::POST, "/orders", None, BODY)).await?;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.problem_type(),
        "urn:idemstore:problem:invalid-idempotency-key"
    );

    let mut twice = post_req("request-a", BODY);
    twice
        .headers_mut()
        .append("idempotency-key", HeaderValue::from_static("b"));
    let long = "k".repeat(256);
    let tab = HeaderValue::from_static("a\tb"); // a valid header value, not a valid key
    let mut with_tab = post_req("request-x", BODY);
    with_tab.headers_mut().insert("idempotency-key", tab);
    for bad in [
        twice,
        post_req("", BODY),
        post_req(&long, BODY),
        post_req("\"open", BODY),
        with_tab,
    ] {
        let answer = send(&app, bad).await?;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
        answer.problem_type();
    }

    let large = send(
        &app,
        post_req("request-big", &format!("\"{}\"", "x".repeat(100))),
    )
    .await?;
    assert_eq!(large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(large.problem_type(), "urn:idemstore:problem:body-too-large");
    // Refused with the body unread (or part read): the connection is closed, and said so,
    // so that a client pooling connections does not send its next request on it.
    for refused in [&missing, &large] {
        assert_eq!(
            refused.headers.get("connection").map(|v| v.as_bytes()),
            Some(&b"close"[..]),
            "{:?}",
            refused.headers
        );
    }

    let mut anonymous = post_req("request-k", BODY);
    anonymous.extensions_mut().remove::<Tenant>();
    assert_eq!(
        send(&app, anonymous).await?.status,
        StatusCode::UNAUTHORIZED
    );

    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let stats = store.stats()?;
    assert_eq!(
        (stats.claims, stats.writer_requests, stats.completed),
        (0, 0, 0)
    );

    // Quoted (RFC 8941) and bare keys name the same key.
    assert_eq!(
        send(&app, post_req("\"request-q-1\"", BODY)).await?.status,
        StatusCode::CREATED
    );
    assert!(send(&app, post_req("request-q-1", BODY)).await?.replayed());
    Ok(())
}

#[tokio::test]
async fn requests_refused_by_an_outer_layer_or_not_covered_never_touch_the_store() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let auth = middleware::from_fn(|request: Request, next: Next| async move {
        if request.headers().contains_key(header::AUTHORIZATION) {
            next.run(request).await
        } else {
            StatusCode::UNAUTHORIZED.into_response()
        }
    });
    let gets = Arc::new(AtomicU32::new(0));
    let get_handler = {
        let gets = gets.clone();
        get(move || async move { gets.fetch_add(1, Ordering::SeqCst).to_string() })
    };
    let app = Router::new()
        .route("/orders", counted(&runs).merge(get_handler))
        .route_layer(IdempotencyLayer::new(store.clone()))
        .layer(auth);

    assert_eq!(
        send(&app, post_req("request-k", BODY)).await?.status,
        StatusCode::UNAUTHORIZED
    );
    let get_twice = || {
        let mut r = request(Method::GET, "/orders", Some("request-k"), "");
        r.headers_mut()
            .insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        r
    };
    assert_eq!(send(&app, get_twice()).await?.body, "0");
    assert_eq!(
        send(&app, get_twice()).await?.body,
        "1",
        "GET is not covered: it runs each time"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let stats = store.stats()?;
    assert_eq!(
        (stats.claims, stats.replays, stats.writer_requests),
        (0, 0, 0)
    );
    Ok(())
}

#[tokio::test]
async fn an_optional_key_lets_keyless_requests_through_unprotected() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let seen = Arc::new(AtomicU32::new(0));
    let handler = {
        let seen = seen.clone();
        post(move |idem: Option<IdempotentRequest>| async move {
            seen.fetch_add(1, Ordering::SeqCst);
            if idem.is_some() {
                "claimed"
            } else {
                "unprotected"
            }
        })
    };
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()).key(KeyPolicy::Optional));
    for _ in 0..2 {
        let answer = send(&app, request(Method::POST, "/orders", None, BODY)).await?;
        assert_eq!(answer.body, "unprotected");
    }
    assert_eq!(
        send(&app, post_req("request-k", BODY)).await?.body,
        "claimed"
    );
    assert!(send(&app, post_req("request-k", BODY)).await?.replayed());
    assert_eq!(seen.load(Ordering::SeqCst), 3);
    Ok(())
}

#[tokio::test]
async fn a_handler_without_the_layer_gets_a_clear_500_from_the_extractor() -> TestResult {
    let app = Router::new().route(
        "/orders",
        post(|_idem: IdempotentRequest| async { "never" }),
    );
    let answer = send(&app, post_req("request-k", BODY)).await?;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:missing-idempotency-layer"
    );
    Ok(())
}

#[tokio::test]
async fn a_key_whose_response_expired_behind_a_tombstone_is_answered_410() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock)
        .ttl(Duration::from_secs(60))
        .tombstone_ttl(Duration::from_secs(3600))
        .open(dir.path().join("idem"))?;
    let (app, runs) = orders_app(IdempotencyLayer::new(store.clone()));
    assert_eq!(
        send(&app, post_req("request-k", BODY)).await?.status,
        StatusCode::CREATED
    );
    clock.advance(Duration::from_secs(120));
    let gone = send(&app, post_req("request-k", BODY)).await?;
    assert_eq!(gone.status, StatusCode::GONE);
    assert_eq!(
        gone.problem_type(),
        "urn:idemstore:problem:idempotency-key-expired"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn tenants_and_operations_scope_the_same_key_apart() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/orders", counted(&runs))
        .route("/refunds", counted(&runs))
        .route_layer(IdempotencyLayer::new(store.clone()));
    let mut other_tenant = post_req("request-k", BODY);
    other_tenant
        .extensions_mut()
        .insert(Tenant("acct_b".into()));
    let answers = [
        send(&app, post_req("request-k", BODY)).await?,
        send(&app, other_tenant).await?,
        send(
            &app,
            request(Method::POST, "/refunds", Some("request-k"), BODY),
        )
        .await?,
    ];
    for answer in &answers {
        assert_eq!(
            (answer.status, answer.replayed()),
            (StatusCode::CREATED, false)
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    Ok(())
}

/// A response the middleware stores keeps its status and every value of a repeated
/// allow-listed header, in order.
#[tokio::test]
async fn stored_responses_keep_their_status_and_repeated_headers() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let handler = post(|| async {
        let mut response = Response::new(Body::from("accepted"));
        *response.status_mut() = StatusCode::ACCEPTED;
        let headers = response.headers_mut();
        headers.append(header::LINK, HeaderValue::from_static("</a>; rel=a"));
        headers.append(header::LINK, HeaderValue::from_static("</b>; rel=b"));
        response
    });
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()).replay_headers([header::LINK]));
    let first = send(&app, post_req("request-k", BODY)).await?;
    assert!(!first.replayed());
    let replay = send(&app, post_req("request-k", BODY)).await?;
    assert_eq!(
        (replay.status, replay.body.as_str(), replay.replayed()),
        (StatusCode::ACCEPTED, "accepted", true)
    );
    let links: Vec<_> = replay.headers.get_all(header::LINK).iter().collect();
    assert_eq!(links, ["</a>; rel=a", "</b>; rel=b"]);
    Ok(())
}

/// A `Content-Length` over the limit is refused before a byte of the body is read (this body
/// would never end) and before the store is asked.
#[tokio::test]
async fn a_declared_length_over_the_limit_is_refused_without_reading() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (app, runs) = orders_app(IdempotencyLayer::new(store.clone()).max_body(1024));
    let (_sender, endless) = http_body_util::channel::Channel::<axum::body::Bytes>::new(1);
    let mut request = request_with(
        Method::POST,
        "/orders",
        Some("request-k"),
        Body::new(endless),
    );
    request
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("1025"));
    let answer = tokio::time::timeout(Duration::from_secs(60), send(&app, request)).await??;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:body-too-large"
    );
    assert_eq!((runs.load(Ordering::SeqCst), store.stats()?.claims), (0, 0));
    Ok(())
}

/// A bare key with a comma is a list of two keys (RFC 9110), refused like two headers; a
/// quoted key may hold a comma. An operation too long to scope a key is the request's fault
/// (400), a tenant the store refuses is the service's (500); neither touches the store.
#[tokio::test]
async fn lists_of_keys_and_invalid_scope_parts_are_refused_by_whose_fault_they_are() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .fallback(counted(&runs))
        .layer(IdempotencyLayer::new(store.clone()));
    for list in ["a, b", "\"a\", \"b\""] {
        let answer = send(&app, post_req(list, BODY)).await?;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{list}");
        assert!(answer.body.contains("more than one"), "{}", answer.body);
    }
    let long_path = format!("/orders/{}", "p".repeat(200));
    let answer = send(
        &app,
        request(Method::POST, &long_path, Some("request-k"), BODY),
    )
    .await?;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:invalid-operation"
    );
    let mut bad_tenant = post_req("request-k", BODY);
    bad_tenant.extensions_mut().insert(Tenant(String::new()));
    let answer = send(&app, bad_tenant).await?;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:invalid-tenant"
    );
    assert_eq!((runs.load(Ordering::SeqCst), store.stats()?.claims), (0, 0));

    let quoted = send(&app, post_req("\"request-a, b\"", BODY)).await?;
    assert_eq!(quoted.status, StatusCode::CREATED);
    Ok(())
}
