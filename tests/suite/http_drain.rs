//! The layer's stop (`IdempotencyLayer::drain`): new covered requests refused with 503 and a
//! free key, requests in flight waited for and named at the limit, and a claim made as the
//! stop began given back before its handler runs. Handlers are gated by the test; nothing
//! sleeps to wait for a lease.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::routing::post;
use common::http::*;
use common::{TestResult, clock};
use idemstore::http::{Drained, Failures, IdempotencyLayer};
use idemstore::{Scope, Store};
use tokio::sync::Semaphore;

/// `POST /orders` whose handler counts its runs, tells `entered`, then waits for a permit of
/// `gate` and answers `status`.
fn gated(
    layer: IdempotencyLayer,
    entered: Arc<Semaphore>,
    gate: Arc<Semaphore>,
    status: StatusCode,
) -> (Router, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let counted = runs.clone();
    let app = Router::new()
        .route(
            "/orders",
            post(move || async move {
                counted.fetch_add(1, Ordering::SeqCst);
                entered.add_permits(1);
                let _ = gate.acquire().await;
                (status, "done")
            }),
        )
        .route_layer(layer);
    (app, runs)
}

/// The key is free: a fresh layer over the same store runs the request.
async fn runs_on_a_fresh_layer(store: &Store, key: &str) -> TestResult {
    let (app, runs) = orders_app(IdempotencyLayer::new(store.clone()));
    let answer = send(&app, post_req(key, BODY)).await?;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

#[tokio::test]
async fn after_the_stop_begins_covered_requests_get_503_and_their_keys_stay_free() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let layer = IdempotencyLayer::new(store.clone());
    let drain = layer.drain();
    let (app, runs) = orders_app(layer);
    drain.start();
    assert!(drain.is_draining());
    let answer = send(&app, post_req("order-after-stop", BODY)).await?;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(answer.problem_type(), "urn:idemstore:problem:stopping");
    assert_eq!(answer.headers[header::RETRY_AFTER], "1");
    assert_eq!(answer.headers[header::CONNECTION], "close");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    assert_eq!(
        drain.finish(Duration::from_secs(1)).await,
        Drained::AllFinished
    );
    runs_on_a_fresh_layer(&store, "order-after-stop").await
}

#[tokio::test]
async fn finish_waits_for_handlers_in_flight_and_names_those_past_the_limit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let layer = IdempotencyLayer::new(store.clone());
    let drain = layer.drain();
    let (entered, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let (app, runs) = gated(layer, entered.clone(), gate.clone(), StatusCode::CREATED);
    let in_flight = tokio::spawn(send_owned(app.clone(), post_req("order-in-flight", BODY)));
    entered.acquire().await?.forget();
    drain.start();
    assert_eq!(drain.in_flight(), 1);
    assert_eq!(
        drain.finish(Duration::from_millis(50)).await,
        Drained::LimitPassed {
            in_progress: vec![Scope::new("acct_a", "POST /orders", "order-in-flight")?]
        },
        "a handler still running at the limit is named"
    );
    gate.add_permits(1);
    assert_eq!(
        drain.finish(Duration::from_secs(10)).await,
        Drained::AllFinished
    );
    let answer = in_flight.await??;
    assert_eq!(
        answer.status,
        StatusCode::CREATED,
        "it finished and was stored"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(drain.in_flight(), 0);
    // Stored: a retry on a fresh layer replays it.
    let (fresh, fresh_runs) = orders_app(IdempotencyLayer::new(store.clone()));
    let retry = send(&fresh, post_req("order-in-flight", BODY)).await?;
    assert!(retry.replayed(), "{}", retry.body);
    assert_eq!(fresh_runs.load(Ordering::SeqCst), 0);
    Ok(())
}

/// A duplicate waiting for the first attempt (`.wait`) is claimed when the first releases its
/// key; if the stop began meanwhile, it gives the key back before its handler runs.
#[tokio::test]
async fn a_claim_made_after_the_stop_began_is_released_before_its_handler_runs() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let layer = IdempotencyLayer::new(store.clone())
        .wait(Duration::from_secs(30))
        .failures(Failures::ReleaseAll);
    let drain = layer.drain();
    let (entered, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let (app, runs) = gated(
        layer,
        entered.clone(),
        gate.clone(),
        StatusCode::INTERNAL_SERVER_ERROR,
    );
    let first = tokio::spawn(send_owned(app.clone(), post_req("order-handed-on", BODY)));
    entered.acquire().await?.forget();
    let second = tokio::spawn(send_owned(app.clone(), post_req("order-handed-on", BODY)));
    // The second is admitted and waits on the first's claim.
    while drain.in_flight() < 2 {
        tokio::task::yield_now().await;
    }
    drain.start();
    gate.add_permits(1); // the first fails with 500, and its claim is released
    assert_eq!(first.await??.status, StatusCode::INTERNAL_SERVER_ERROR);
    let second = second.await??;
    assert_eq!(
        second.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        second.body
    );
    assert_eq!(second.problem_type(), "urn:idemstore:problem:stopping");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the second never ran");
    assert_eq!(
        drain.finish(Duration::from_secs(1)).await,
        Drained::AllFinished
    );
    runs_on_a_fresh_layer(&store, "order-handed-on").await
}

/// A request admitted before the stop whose body is still arriving: if its claim is a first
/// attempt it gives the key back (503, nothing ran); if it is a recovery of an attempt that
/// may have done the work, it runs.
#[tokio::test]
async fn a_first_claim_made_during_the_stop_is_given_back_and_a_recovery_runs() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = store(&dir, &clock)?;
    // An attempt on `order-recovered` that died: its claim left in progress, its lease over.
    let scope = Scope::new("acct_a", "POST /orders", "order-recovered")?;
    let layer = IdempotencyLayer::new(store.clone());
    let drain = layer.drain();
    let (app, runs) = orders_app(layer);
    // The dead attempt, claimed through a layer (so with the request's own fingerprint) whose
    // handler never answers.
    {
        let (entered, gate) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
        let (stuck, _) = gated(
            IdempotencyLayer::new(store.clone()),
            entered.clone(),
            gate,
            StatusCode::CREATED,
        );
        let attempt = tokio::spawn(send_owned(stuck, post_req("order-recovered", BODY)));
        entered.acquire().await?.forget();
        attempt.abort(); // the client goes; the handler's task waits on its gate forever
    }
    clock.advance(common::LEASE + Duration::from_secs(1));

    let streamed = |key: &str| {
        let (sender, body) = http_body_util::channel::Channel::<axum::body::Bytes>::new(1);
        let request = request_with(
            axum::http::Method::POST,
            "/orders",
            Some(key),
            axum::body::Body::new(body),
        );
        (sender, tokio::spawn(send_owned(app.clone(), request)))
    };
    let (mut fresh_body, fresh) = streamed("order-fresh-during-stop");
    let (mut recovery_body, recovery) = streamed("order-recovered");
    while drain.in_flight() < 2 {
        tokio::task::yield_now().await;
    }
    drain.start();
    for sender in [&mut fresh_body, &mut recovery_body] {
        sender.send_data(BODY.into()).await?;
    }
    drop((fresh_body, recovery_body));
    let fresh = fresh.await??;
    assert_eq!(
        fresh.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        fresh.body
    );
    assert_eq!(fresh.problem_type(), "urn:idemstore:problem:stopping");
    let recovery = recovery.await??;
    assert_eq!(recovery.status, StatusCode::CREATED, "{}", recovery.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the recovery ran");
    assert!(matches!(
        store.begin(&scope, idemstore::Fingerprint::of_bytes(b"other"))?,
        idemstore::Begin::Mismatch
    ));
    runs_on_a_fresh_layer(&store, "order-fresh-during-stop").await
}
