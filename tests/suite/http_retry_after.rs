//! The `Retry-After` of a 409 for a duplicate of a request in flight: what the first request
//! probably still needs, from the operation's recent completion times, not the whole lease.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::post;
use common::http::*;
use common::{LEASE, TestResult, clock};
use idemstore::ManualClock;
use idemstore::http::IdempotencyLayer;

/// Holds the handler of a `held-` request until opened.
#[derive(Default)]
struct Gate {
    entered: AtomicU32,
    open: tokio::sync::Notify,
}

/// A route whose handler "takes" `took` on the store's clock, then waits to be let go if the
/// request's key starts with `held`.
fn app(store: idemstore::Store, clock: &ManualClock, took: Duration, go: &Arc<Gate>) -> Router {
    let (clock, go) = (clock.clone(), go.clone());
    let handler = post(move |headers: axum::http::HeaderMap| {
        let (clock, go) = (clock.clone(), go.clone());
        async move {
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if key.starts_with("held") {
                go.entered.fetch_add(1, Ordering::SeqCst);
                go.open.notified().await;
            } else {
                clock.advance(took);
            }
            (StatusCode::CREATED, "done")
        }
    });
    Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store).store_timeout(Duration::MAX))
}

/// Sends a request with key `held-...` that stays in flight until the handler is entered, lets `running` pass, and returns
/// the `Retry-After` of its duplicate; then lets the first finish.
async fn retry_after_of_a_duplicate(
    app: &Router,
    clock: &ManualClock,
    go: &Arc<Gate>,
    running: Duration,
) -> Result<String, Box<dyn std::error::Error>> {
    let first = tokio::spawn(send_owned(app.clone(), post_req("held-request-1", BODY)));
    while go.entered.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    clock.advance(running);
    let duplicate = send(app, post_req("held-request-1", BODY)).await?;
    assert_eq!(duplicate.status, StatusCode::CONFLICT, "{}", duplicate.body);
    go.open.notify_one();
    assert_eq!(first.await??.status, StatusCode::CREATED);
    Ok(duplicate.headers[header::RETRY_AFTER].to_str()?.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_50_ms_request_is_told_to_retry_after_one_second() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let go = Arc::new(Gate::default());
    let app = app(store(&dir, &clock)?, &clock, Duration::from_millis(50), &go);
    for n in 0..3 {
        let done = send(&app, post_req(&format!("fast-request-{n}"), BODY)).await?;
        assert_eq!(done.status, StatusCode::CREATED);
    }
    let advised = retry_after_of_a_duplicate(&app, &clock, &go, Duration::from_millis(10)).await?;
    assert_eq!(advised, "1", "not the {LEASE:?} lease");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_request_longer_than_the_lease_is_told_the_rest_of_the_lease() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let go = Arc::new(Gate::default());
    let app = app(
        store(&dir, &clock)?,
        &clock,
        LEASE + Duration::from_secs(15),
        &go,
    );
    // It completes past its lease: nobody took it over, so it still may.
    let done = send(&app, post_req("slow-request-1", BODY)).await?;
    assert_eq!(done.status, StatusCode::CREATED);
    let running = Duration::from_secs(10);
    let advised = retry_after_of_a_duplicate(&app, &clock, &go, running).await?;
    assert_eq!(advised, (LEASE - running).as_secs().to_string());
    Ok(())
}
