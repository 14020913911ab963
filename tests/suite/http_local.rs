//! Routes declared local (`IdempotencyLayer::local_work`): no claim before the handler; its
//! `LocalRequest::execute` claims and commits in one step, or answers the duplicate.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use common::http::*;
use common::{ORDERS, TestResult, clock, order_count};
use idemstore::http::{HandlerError, IdempotencyLayer, LocalRequest};
use idemstore::{Response, Store};

/// An app whose POST /orders places one order row through `execute`, counting closure runs.
fn local_app(store: &Store, runs: &Arc<AtomicU32>) -> Router {
    let runs = runs.clone();
    let handler = post(move |local: LocalRequest| async move {
        let runs = runs.clone();
        let id = format!("order-{}", local.scope().key());
        local
            .execute(move |tx| {
                runs.fetch_add(1, Ordering::SeqCst);
                tx.insert(&ORDERS, id.as_str(), "placed")?;
                Ok(Response::new(201, id.into_bytes()).with_header("content-type", "text/plain"))
            })
            .await
    });
    Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()).local_work())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_copies_run_the_work_once_and_the_rest_replay() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let app = local_app(&store, &runs);
    assert_eq!(
        post_copies(&app, 64, "local-key-1", "order-local-key-1").await?,
        (1, 63)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "closure runs");
    assert_eq!(order_count(&store)?, 1, "side effects");
    Ok(())
}

#[tokio::test]
async fn another_request_under_the_key_is_refused_without_running() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let app = local_app(&store, &runs);
    let first = send(&app, post_req("local-key-1", BODY)).await?;
    assert_eq!(first.status, StatusCode::CREATED);
    let other = send(&app, post_req("local-key-1", r#"{"item": "gadget"}"#)).await?;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        other.body
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn a_failed_execution_stores_nothing_and_the_retry_runs() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let fail = Arc::new(AtomicU32::new(1));
    let handler = {
        let fail = fail.clone();
        post(move |local: LocalRequest| async move {
            let fail = fail.fetch_sub(1, Ordering::SeqCst) > 0;
            local
                .execute(move |tx| {
                    tx.insert(&ORDERS, "order", "placed")?;
                    if fail {
                        return Err("the stock ran out".into());
                    }
                    Ok(Response::new(201, b"placed".to_vec()))
                })
                .await
        })
    };
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()).local_work());
    let failed = send(&app, post_req("local-key-1", BODY)).await?;
    assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(order_count(&store)?, 0);
    let retry = send(&app, post_req("local-key-1", BODY)).await?;
    assert_eq!(retry.status, StatusCode::CREATED, "{}", retry.body);
    assert!(!retry.replayed(), "the retry ran");
    assert_eq!(order_count(&store)?, 1);
    Ok(())
}

#[tokio::test]
async fn a_local_handler_that_never_executes_is_a_500_not_a_silent_pass() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let app = Router::new()
        .route(
            "/orders",
            post(|_local: LocalRequest| async { (StatusCode::CREATED, "not stored") }),
        )
        .route_layer(IdempotencyLayer::new(store.clone()).local_work());
    let answer = send(&app, post_req("local-key-1", BODY)).await?;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:idempotent-handler-failed"
    );
    // A route not declared local cannot hand out a LocalRequest.
    let app = Router::new()
        .route(
            "/orders",
            post(|local: LocalRequest| async move {
                local
                    .execute(|_| Ok(Response::new(201, Vec::new())))
                    .await
                    .map_err(|e: HandlerError| e)
            }),
        )
        .route_layer(IdempotencyLayer::new(store.clone()));
    let answer = send(&app, post_req("local-key-2", BODY)).await?;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:missing-idempotency-layer"
    );
    Ok(())
}
