//! A slow or failing store, a slow handler, failing bodies, and too many requests: the
//! middleware answers in bounded time, sheds load before the store, and keeps every key's state
//! right (a claim that may exist stays in progress; nothing runs twice).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Method, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use common::http::*;
use common::{LEASE, TestResult, builder, clock};
use idemstore::http::IdempotencyLayer;
use idemstore::testing::{FaultPlan, SimDisk, wait};
use idemstore::{RecordState, Scope, Store};
use tokio::sync::Notify;
use tower::ServiceExt;

fn orders_scope(key: &str) -> Scope {
    Scope::new("acct_a", "POST /orders", key).expect("a valid scope")
}

/// Holds the store's writer with a write whose closure waits on `release`; returns once the
/// writer is held.
fn stall_writer(store: &Store) -> (Arc<std::sync::Barrier>, std::thread::JoinHandle<()>) {
    let release = Arc::new(std::sync::Barrier::new(2));
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let held = std::thread::spawn({
        let (store, release) = (store.clone(), release.clone());
        move || {
            let _ = store.write(move |_tx| {
                let _ = held_tx.send(());
                release.wait();
                Ok(())
            });
        }
    });
    // Bounded: a writer that never runs the stalling write fails the test, not hangs it.
    let _ = held_rx.recv_timeout(Duration::from_secs(30));
    (release, held)
}

/// The store does not answer within the layer's timeout (its writer is stalled): 503 with a
/// `Retry-After`, in bounded time, and the handler does not run. The claim the store makes
/// afterwards stays in progress: a retry within the lease is told so, and the first after the
/// lease is a recovery that runs the handler once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_store_answers_503_in_bounded_time_and_keeps_the_key_right() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = store(&dir, &clock)?;
    let (app, runs) =
        orders_app(IdempotencyLayer::new(store.clone()).store_timeout(Duration::from_millis(200)));
    let (release, held) = stall_writer(&store);
    let started = std::time::Instant::now();
    let answer = send(&app, post_req("stalled-1", BODY)).await?;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.body
    );
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:idempotency-store-timeout"
    );
    assert!(answer.headers.contains_key(header::RETRY_AFTER));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by the timeout"
    );
    tokio::task::spawn_blocking(move || {
        release.wait();
        held.join()
    })
    .await?
    .map_err(|_| "the stalling write panicked")?;
    // The claim queued behind the stall was made: in progress, its request never ran.
    let mut record = None;
    wait::eventually("the queued claim made", async || {
        record = store.get(&orders_scope("stalled-1"))?;
        Ok(record.is_some())
    })
    .await?;
    assert!(matches!(
        record.map(|r| r.state().clone()),
        Some(RecordState::InProgress { .. })
    ));
    assert_eq!(
        send(&app, post_req("stalled-1", BODY)).await?.status,
        StatusCode::CONFLICT
    );
    clock.advance(LEASE);
    let recovered = send(&app, post_req("stalled-1", BODY)).await?;
    assert_eq!(recovered.status, StatusCode::CREATED, "{}", recovered.body);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "ran once, as the recovery");
    Ok(())
}

/// Over the cap on requests in flight, a request is refused with 503 before the store is
/// touched; once one finishes, the next is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_in_flight_cap_are_shed_before_the_store() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let (started, go, runs) = (started.clone(), go.clone(), runs.clone());
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            started.notify_one();
            go.notified().await;
            (StatusCode::CREATED, "done")
        })
    };
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()).max_in_flight(1));
    let first = tokio::spawn(send_owned(app.clone(), post_req("inflight-1", BODY)));
    started.notified().await;
    let claims = store.stats()?.claims;
    let shed = send(&app, post_req("inflight-2", BODY)).await?;
    assert_eq!(
        shed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        shed.body
    );
    assert_eq!(shed.problem_type(), "urn:idemstore:problem:overloaded");
    assert!(shed.headers.contains_key(header::RETRY_AFTER));
    assert_eq!(store.stats()?.claims, claims, "the store was not touched");
    go.notify_one();
    assert_eq!(first.await??.status, StatusCode::CREATED);
    go.notify_one();
    // The first holds its place until its response is stored, which ends just after the client
    // has it: until then the next is still shed (and the store still untouched).
    let mut taken = None;
    wait::eventually("the next request no longer shed", async || {
        let answer = send_owned(app.clone(), post_req("inflight-2", BODY)).await?;
        let shed = answer.status == StatusCode::SERVICE_UNAVAILABLE;
        taken = Some(answer);
        Ok(!shed)
    })
    .await?;
    let taken = taken.ok_or("no answer")?;
    assert_eq!(taken.status, StatusCode::CREATED, "{}", taken.body);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    Ok(())
}

/// Storing the response fails after the handler ran: the client still gets the handler's
/// response, and the key stays in progress, so a retry after the lease is a recovery (which
/// finds what the first run did), never a silent fresh start.
#[tokio::test]
async fn a_failure_to_store_after_the_handler_still_answers_and_leaves_a_recovery() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    let store = builder(&clock).open_simulated(&disk)?;
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let (disk, runs) = (disk.clone(), runs.clone());
        post(move || async move {
            let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
            if n == 1 {
                // The next disk operation (the log write of the stored response) fails.
                disk.plan(FaultPlan {
                    fail_at: Some(disk.counters().ops + 1),
                    ..FaultPlan::default()
                });
            }
            (StatusCode::CREATED, format!("run {n}"))
        })
    };
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()));
    let first = send(&app, post_req("unstored-1", BODY)).await?;
    assert_eq!(
        (first.status, first.body.as_str()),
        (StatusCode::CREATED, "run 1")
    );
    assert!(matches!(
        store
            .get(&orders_scope("unstored-1"))?
            .map(|r| r.state().clone()),
        Some(RecordState::InProgress { .. })
    ));
    assert_eq!(
        send(&app, post_req("unstored-1", BODY)).await?.status,
        StatusCode::CONFLICT
    );
    clock.advance(LEASE);
    let recovery = send(&app, post_req("unstored-1", BODY)).await?;
    assert_eq!(
        (recovery.status, recovery.body.as_str()),
        (StatusCode::CREATED, "run 2")
    );
    let record = store
        .get(&orders_scope("unstored-1"))?
        .ok_or("the record")?;
    assert_eq!(record.attempt(), 2, "a recovery, not a fresh start");
    Ok(())
}

/// A request body stream that fails part way is answered 400, and nothing is claimed.
#[tokio::test]
async fn a_request_body_that_fails_part_way_is_a_400_and_claims_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (app, runs) = orders_app(IdempotencyLayer::new(store.clone()));
    let (mut sender, body) = http_body_util::channel::Channel::<Bytes, std::io::Error>::new(2);
    sender.send_data(Bytes::from("{\"item\":")).await?;
    sender.abort(std::io::Error::other("the client's connection broke"));
    let answer = send(
        &app,
        request_with(Method::POST, "/orders", Some("broken-1"), Body::new(body)),
    )
    .await?;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:unreadable-body"
    );
    assert_eq!((runs.load(Ordering::SeqCst), store.stats()?.claims), (0, 0));
    Ok(())
}

/// A response body that fails part way: the client sees the failure; the fixed 500 is
/// stored in its place, so a retry does not run the handler again.
#[tokio::test]
async fn a_response_body_that_fails_part_way_stores_the_fixed_500() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let runs = runs.clone();
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let (mut sender, body) =
                http_body_util::channel::Channel::<Bytes, std::io::Error>::new(2);
            tokio::spawn(async move {
                let _ = sender.send_data(Bytes::from("part")).await;
                sender.abort(std::io::Error::other("the report generator crashed"));
            });
            (StatusCode::OK, Body::new(body)).into_response()
        })
    };
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()));
    let failed = app.clone().oneshot(post_req("failing-body", BODY)).await?;
    assert_eq!(failed.status(), StatusCode::OK);
    let read = axum::body::to_bytes(failed.into_body(), usize::MAX).await;
    assert!(read.is_err(), "the client sees the body fail");
    let retry = send(&app, post_req("failing-body", BODY)).await?;
    assert_eq!(
        (retry.status, retry.replayed()),
        (StatusCode::INTERNAL_SERVER_ERROR, true)
    );
    assert_eq!(
        retry.problem_type(),
        "urn:idemstore:problem:response-not-stored"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

/// A live handler that works for three leases is never taken over: its lease is renewed
/// while it runs. Its duplicate is answered 409 with a `Retry-After` that reflects the
/// renewal (more than the lease the first claim had left), and it runs once. The runtime's
/// paused clock is the store's clock too.
#[tokio::test(start_paused = true)]
async fn a_slow_handler_is_never_taken_over_while_it_runs() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = RuntimeClock::new();
    let store = builder(&common::clock())
        .clock(clock.clone())
        .open(dir.path().join("idem"))?;
    let (runs, go) = (Arc::new(AtomicU32::new(0)), Arc::new(Notify::new()));
    let handler = {
        let (runs, go) = (runs.clone(), go.clone());
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            go.notified().await;
            (StatusCode::CREATED, "done")
        })
    };
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()).store_timeout(Duration::MAX));
    let first = tokio::spawn(send_owned(app.clone(), post_req("slow-handler", BODY)));
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let scope = orders_scope("slow-handler");
    let mut retry_after = 0;
    for _ in 0..9 {
        tokio::time::advance(LEASE / 3).await;
        // Renewed when due (through the store's writer thread; the clock does not move while
        // the test waits for it).
        let now = idemstore::Clock::now(&clock);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(RecordState::InProgress { lease_until, .. }) =
                store.get(&scope)?.map(|r| r.state().clone())
                && lease_until > now.saturating_add(LEASE / 3)
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the lease was not renewed"
            );
            tokio::task::yield_now().await;
        }
        let duplicate = send(&app, post_req("slow-handler", BODY)).await?;
        assert_eq!(duplicate.status, StatusCode::CONFLICT, "{}", duplicate.body);
        retry_after = duplicate.headers[header::RETRY_AFTER]
            .to_str()?
            .parse::<u64>()?;
        // As long again as it has run (no completion seen yet), within the renewed lease.
        assert!(retry_after >= LEASE.as_secs() / 3, "{retry_after}");
    }
    assert!(retry_after <= LEASE.as_secs());
    go.notify_one();
    assert_eq!(first.await??.status, StatusCode::CREATED);
    assert!(send(&app, post_req("slow-handler", BODY)).await?.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}
