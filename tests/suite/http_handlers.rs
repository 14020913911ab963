//! How a handler finishes its claim behind the middleware: commits with its rows, releases,
//! leaves it in progress, fails, panics, or answers something too large to store. Time is the
//! store's manual clock; nothing sleeps.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::http::*;
use common::{LEASE, ORDERS, TestResult, builder, clock, order_count};
use idemstore::http::{Failures, IdempotencyLayer, IdempotentRequest};
use tower::ServiceExt;

#[tokio::test]
async fn error_responses_are_stored_by_default_and_released_when_configured() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let failing = |runs: &Arc<AtomicU32>| {
        let runs = runs.clone();
        post(move |request: Request| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let status = match request.uri().query() {
                Some("status=402") => StatusCode::PAYMENT_REQUIRED,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, "failed")
        })
    };
    let stripe = Router::new()
        .route("/orders", failing(&runs))
        .route_layer(IdempotencyLayer::new(store.clone()));
    let r = || request(Method::POST, "/orders", Some("request-s"), BODY);
    assert_eq!(
        send(&stripe, r()).await?.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    let again = send(&stripe, r()).await?;
    assert!(again.replayed(), "Stripe's rule: a 500 is replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let lenient = Router::new()
        .route("/orders", failing(&runs))
        .route_layer(IdempotencyLayer::new(store.clone()).failures(Failures::ReleaseServerErrors));
    let r =
        |key: &str, query: &str| request(Method::POST, &format!("/orders{query}"), Some(key), BODY);
    runs.store(0, Ordering::SeqCst);
    for _ in 0..2 {
        let answer = send(&lenient, r("request-l", "")).await?;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!answer.replayed(), "released: the retry runs the handler");
    }
    assert_eq!(
        send(&lenient, r("request-p", "?status=402")).await?.status,
        StatusCode::PAYMENT_REQUIRED
    );
    assert!(
        send(&lenient, r("request-p", "?status=402"))
            .await?
            .replayed(),
        "4xx still stored"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    let release_all = Router::new()
        .route("/orders", failing(&runs))
        .route_layer(IdempotencyLayer::new(store.clone()).failures(Failures::ReleaseAll));
    for _ in 0..2 {
        let answer = send(&release_all, r("request-a", "?status=402")).await?;
        assert_eq!(answer.status, StatusCode::PAYMENT_REQUIRED);
        assert!(!answer.replayed(), "4xx released too: the retry runs again");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    Ok(())
}

#[tokio::test]
async fn a_handler_commits_its_rows_and_response_in_one_transaction() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let handler = post(|idem: IdempotentRequest| async move {
        let id = format!("order-{}", &idem.downstream_key()[..8]);
        idem.commit(move |tx| {
            tx.insert(&ORDERS, id.as_str(), "widget x3")?;
            Ok(idemstore::Response::new(201, id.into_bytes())
                .with_header("content-type", "text/plain"))
        })
        .await
        .into_response()
    });
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()));

    let first = send(&app, post_req("request-k", BODY)).await?;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(first.body.starts_with("order-"));
    assert!(!first.replayed(), "the first answer is not a replay");
    let writes_after_first = store.stats()?.writer_requests;
    assert_eq!(
        writes_after_first, 2,
        "one claim and one commit: the middleware stored nothing more"
    );
    let retry = send(&app, post_req("request-k", BODY)).await?;
    assert!(retry.replayed());
    assert_eq!(
        (retry.body.as_str(), &retry.headers[header::CONTENT_TYPE]),
        (first.body.as_str(), &HeaderValue::from_static("text/plain"))
    );
    assert_eq!(order_count(&store)?, 1);
    Ok(())
}

#[tokio::test]
async fn a_failed_commit_closure_writes_nothing_and_gives_the_claim_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let handler = post(|idem: IdempotentRequest| async move {
        let failed = idem
            .commit(|tx| {
                tx.insert(&ORDERS, "half", "written")?;
                Err("the inventory is short".into())
            })
            .await;
        let error = failed.expect_err("the closure failed");
        // The claim is back: this handler gives it up, so a retry runs again.
        idem.release().await.expect("the claim is still held");
        (StatusCode::CONFLICT, error.to_string())
    });
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()));
    for _ in 0..2 {
        let answer = send(&app, post_req("request-k", BODY)).await?;
        assert_eq!(answer.status, StatusCode::CONFLICT);
        assert!(
            !answer.replayed() && answer.body.contains("inventory"),
            "{}",
            answer.body
        );
    }
    assert_eq!(
        order_count(&store)?,
        0,
        "the closure's write was rolled back"
    );
    assert_eq!(
        store.stats()?.claims,
        2,
        "released: each request claimed afresh"
    );
    Ok(())
}

/// A handler that panics, or whose future is dropped, leaves the claim in progress: retries get
/// 409 until the lease ends, then the next attempt is a recovery (attempt 2).
#[tokio::test]
async fn a_panicking_or_cancelled_handler_leaves_the_claim_for_a_recovery() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = store(&dir, &clock)?;
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel::<()>();
    let handler = post(move |idem: IdempotentRequest, request: Request| {
        let entered_tx = entered_tx.clone();
        async move {
            match (idem.attempt(), request.uri().query()) {
                (1, Some("panic")) => panic!("the handler crashed"),
                (1, _) => {
                    let _ = entered_tx.send(());
                    std::future::pending::<()>().await; // cancelled from outside
                    unreachable!()
                }
                (attempt, _) => format!("attempt {attempt}"),
            }
        }
    });
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()));

    for (key, query) in [("request-p", "?panic"), ("request-c", "?cancel")] {
        let uri = format!("/orders{query}");
        let first = tokio::spawn({
            let app = app.clone();
            let request = request(Method::POST, &uri, Some(key), BODY);
            async move { app.oneshot(request).await }
        });
        if query == "?panic" {
            assert!(first.await.expect_err("the handler panicked").is_panic());
        } else {
            entered.recv().await.expect("the handler started");
            first.abort();
            assert!(first.await.expect_err("aborted").is_cancelled());
        }
        let retry = send(&app, request(Method::POST, &uri, Some(key), BODY)).await?;
        assert_eq!(
            retry.status,
            StatusCode::CONFLICT,
            "{key}: still in progress"
        );
        // The clock did not move: just claimed, no history, so the shortest wait.
        assert_eq!(retry.headers[header::RETRY_AFTER], "1");
        assert_eq!(
            retry.problem_type(),
            "urn:idemstore:problem:request-in-progress"
        );
    }
    clock.advance(LEASE + Duration::from_secs(1));
    for (key, query) in [("request-p", "?panic"), ("request-c", "?cancel")] {
        let recovered = send(
            &app,
            request(Method::POST, &format!("/orders{query}"), Some(key), BODY),
        )
        .await?;
        assert_eq!(
            (recovered.status, recovered.body.as_str()),
            (StatusCode::OK, "attempt 2")
        );
    }
    assert_eq!(store.stats()?.recoveries, 2);
    Ok(())
}

#[tokio::test]
async fn leave_in_progress_answers_without_storing_and_the_recovery_keeps_the_checkpoint()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = store(&dir, &clock)?;
    let handler = post(|idem: IdempotentRequest| async move {
        if idem.attempt() == 1 {
            idem.checkpoint(b"charged py_1".to_vec())
                .await
                .expect("checkpointed");
            idem.leave_in_progress().expect("held");
            return (
                StatusCode::GATEWAY_TIMEOUT,
                "processor timed out".to_owned(),
            );
        }
        let seen = String::from_utf8(idem.last_checkpoint().expect("a checkpoint")).expect("UTF-8");
        (
            StatusCode::CREATED,
            format!("attempt {} saw {seen}", idem.attempt()),
        )
    });
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()));

    assert_eq!(
        send(&app, post_req("request-k", BODY)).await?.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    clock.advance(LEASE / 2);
    let early = send(&app, post_req("request-k", BODY)).await?;
    assert_eq!(early.status, StatusCode::CONFLICT);
    assert_eq!(
        early.headers[header::RETRY_AFTER],
        (LEASE / 2).as_secs().to_string().as_str()
    );
    clock.advance(LEASE);
    let recovered = send(&app, post_req("request-k", BODY)).await?;
    assert_eq!(
        (recovered.status, recovered.body.as_str()),
        (StatusCode::CREATED, "attempt 2 saw charged py_1")
    );
    assert!(send(&app, post_req("request-k", BODY)).await?.replayed());
    Ok(())
}

/// A handler whose commit fails (its closure errs or panics) after a side effect, and which
/// returns the `HandlerError`: the claim is left in progress whatever the failures policy,
/// never stored as a final 500 nor released. The recovery (attempt 2) finds the side effect
/// by its downstream key and does not repeat it.
#[tokio::test]
async fn a_handler_error_leaves_the_claim_in_progress_for_a_recovery() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = store(&dir, &clock)?;
    // A downstream API that deduplicates by key, counting its side effects.
    let charged = Arc::new(parking_lot::Mutex::new(std::collections::HashSet::new()));
    let handler = {
        let charged = charged.clone();
        post(move |idem: IdempotentRequest, request: Request| {
            let charged = charged.clone();
            async move {
                charged.lock().insert(idem.downstream_key().to_owned());
                let (attempt, fail) = (idem.attempt(), request.uri().query().map(str::to_owned));
                let row = idem.scope().key().to_owned();
                idem.commit(move |tx| {
                    tx.insert(&ORDERS, row.as_str(), "charged")?;
                    match (attempt, fail.as_deref()) {
                        (1, Some("err")) => Err("the ledger refused the row".into()),
                        (1, Some("panic")) => panic!("the commit closure crashed"),
                        _ => Ok(idemstore::Response::new(201, format!("attempt {attempt}"))),
                    }
                })
                .await
                .into_response()
            }
        })
    };
    let cases = [
        ("request-e", "?err", Failures::Store),
        ("request-p", "?panic", Failures::Store),
        ("request-r", "?err", Failures::ReleaseAll),
    ];
    let app = |failures| {
        Router::new()
            .route("/orders", handler.clone())
            .route_layer(IdempotencyLayer::new(store.clone()).failures(failures))
    };
    let send_case = |key: &'static str, query: &'static str, failures| {
        let app = app(failures);
        async move {
            let uri = format!("/orders{query}");
            send(&app, request(Method::POST, &uri, Some(key), BODY)).await
        }
    };

    for (key, query, failures) in cases {
        let failed = send_case(key, query, failures).await?;
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR, "{key}");
        assert_eq!(
            failed.problem_type(),
            "urn:idemstore:problem:idempotent-handler-failed"
        );
        assert!(
            failed.body.contains("outcome is unknown"),
            "{}",
            failed.body
        );
        let retry = send_case(key, query, failures).await?;
        assert_eq!(
            (retry.status, retry.replayed()),
            (StatusCode::CONFLICT, false),
            "{key}: in progress, not stored and not released: {}",
            retry.body
        );
    }
    assert_eq!(order_count(&store)?, 0, "the failed commits wrote nothing");

    clock.advance(LEASE + Duration::from_secs(1));
    for (key, query, failures) in cases {
        let recovered = send_case(key, query, failures).await?;
        assert_eq!(
            (
                recovered.status,
                recovered.body.as_str(),
                recovered.replayed()
            ),
            (StatusCode::CREATED, "attempt 2", false),
            "{key}"
        );
        assert!(send_case(key, query, failures).await?.replayed());
    }
    assert_eq!(charged.lock().len(), 3, "one side effect per key");
    assert_eq!(order_count(&store)?, 3);
    let stats = store.stats()?;
    assert_eq!((stats.claims, stats.recoveries), (3, 3));
    Ok(())
}

/// A response the store cannot hold (a body over `max_response_bytes`, or headers that take it
/// over) is replaced by a stored 500 problem: the handler ran, so retries, even after the
/// lease, get that answer and never run it again. The first client still gets the handler's
/// whole response, streamed through as it was produced.
#[tokio::test]
async fn a_response_too_large_to_store_is_replaced_by_a_stored_500() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock)
        .max_response_bytes(1024)
        .open(dir.path().join("idem"))?;
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let runs = runs.clone();
        post(move |request: Request| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut response = Response::new(Body::from("x".repeat(2000)));
            if request.uri().query() == Some("headers") {
                response = Response::new(Body::from("small"));
                for i in 0..20 {
                    let value = format!("{i:0>100}");
                    response
                        .headers_mut()
                        .append("x-tag", HeaderValue::from_str(&value).expect("a value"));
                }
            }
            *response.status_mut() = StatusCode::CREATED;
            response
        })
    };
    let app = Router::new().route("/orders", handler).route_layer(
        IdempotencyLayer::new(store.clone()).replay_headers([HeaderName::from_static("x-tag")]),
    );
    for (key, uri) in [
        ("request-body", "/orders"),
        ("request-headers", "/orders?headers"),
    ] {
        let r = || request(Method::POST, uri, Some(key), BODY);
        let first = send(&app, r()).await?;
        assert_eq!(first.status, StatusCode::CREATED, "{key}");
        assert!(
            first.body == "x".repeat(2000) || first.body == "small",
            "{key}"
        );
        assert!(!first.replayed());
        let retry = send(&app, r()).await?;
        assert_eq!(
            (retry.status, retry.replayed()),
            (StatusCode::INTERNAL_SERVER_ERROR, true),
            "{key}"
        );
        assert_eq!(
            retry.problem_type(),
            "urn:idemstore:problem:response-not-stored"
        );
    }
    clock.advance(LEASE * 2);
    assert!(send(&app, post_req("request-body", BODY)).await?.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each handler ran once");
    let stats = store.stats()?;
    assert_eq!((stats.claims, stats.replays), (2, 3));
    Ok(())
}
