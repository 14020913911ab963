//! Duplicates of a request in flight behind the middleware: answered 409, or waiting for the
//! first request's outcome; many at once run the handler once.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::post;
use common::http::*;
use common::{TestResult, clock};
use idemstore::http::IdempotencyLayer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_gets_the_first_requests_outcome_instead_of_409() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let go = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let (go, runs) = (go.clone(), runs.clone());
        post(move || async move {
            // Only the first run waits to be let go: a second run (a bug) answers at once.
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                go.notified().await;
            }
            (StatusCode::CREATED, "done")
        })
    };
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()).wait(Duration::from_secs(60)));

    let first = tokio::spawn(send_owned(app.clone(), post_req("request-k", BODY)));
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let second = tokio::spawn(send_owned(app.clone(), post_req("request-k", BODY)));
    while store.stats()?.waiting == 0 {
        tokio::task::yield_now().await;
    }
    go.notify_one();
    let (first, second) = (first.await??, second.await??);
    assert_eq!(
        (first.status, first.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(
        (second.status, second.replayed(), second.body.as_str()),
        (StatusCode::CREATED, true, "done")
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_concurrent_duplicates_run_the_handler_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (app, runs) = orders_app(IdempotencyLayer::new(store.clone()));
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (app, barrier) = (app.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            send_owned(app, post_req("request-same", BODY)).await
        }));
    }
    let (mut created, mut replayed, mut conflicts) = (0, 0, 0);
    for task in tasks {
        let answer = task.await??;
        match (answer.status, answer.replayed()) {
            (StatusCode::CREATED, false) => created += 1,
            (StatusCode::CREATED, true) => replayed += 1,
            (StatusCode::CONFLICT, false) => conflicts += 1,
            other => panic!("unexpected answer {other:?}: {}", answer.body),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(replayed + conflicts, 31);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one side effect");
    Ok(())
}

/// A duplicate that waits for the first request gives up after `wait` and is answered 409 with
/// the rest of the lease; `Duration::MAX` waits without overflowing. Time is paused.
#[tokio::test(start_paused = true)]
async fn a_waiting_duplicate_gives_up_after_its_wait_with_409() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let go = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let (go, runs) = (go.clone(), runs.clone());
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            go.notified().await;
            (StatusCode::CREATED, "done")
        })
    };
    let app = Router::new().route("/orders", handler.clone()).route_layer(
        // The runtime's clock is paused: no store timeout, which would fire as soon as the
        // runtime waits for the store's writer thread.
        IdempotencyLayer::new(store.clone())
            .wait(Duration::from_secs(5))
            .store_timeout(Duration::MAX),
    );

    let first = tokio::spawn(send_owned(app.clone(), post_req("request-k", BODY)));
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    let second = send(&app, post_req("request-k", BODY)).await?;
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "it waited first"
    );
    assert_eq!(second.status, StatusCode::CONFLICT);
    assert_eq!(
        second.headers[header::RETRY_AFTER],
        "1",
        "the store's clock did not move: the holder just started, so the shortest wait"
    );
    go.notify_one();
    assert_eq!(first.await??.status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let forever = Router::new().route("/orders", handler).route_layer(
        IdempotencyLayer::new(store.clone())
            .wait(Duration::MAX)
            .store_timeout(Duration::MAX),
    );
    assert!(
        send(&forever, post_req("request-k", BODY))
            .await?
            .replayed()
    );
    Ok(())
}
