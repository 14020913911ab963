//! Faults around the middleware, each one a way a client, a handler or the disk can go wrong:
//! a client that disconnects mid-handler, a request an extractor refuses, a streamed response
//! (and one that outlives the lease), a full disk, a holder taken over, and what the problem
//! answers tell the client.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Json, Request};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Router, middleware};
use common::http::*;
use common::{LEASE, TestResult, builder, clock};
use http_body_util::BodyExt;
use idemstore::http::{IdempotencyLayer, IdempotentRequest, NotStarted, Tenant};
use idemstore::testing::SimDisk;
use idemstore::{ManualClock, RecordState, Scope, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tower::ServiceExt;

/// The scope the middleware claims for `POST /orders` with `key`, for tenant `acct_a`.
fn orders_scope(key: &str) -> Scope {
    Scope::new("acct_a", "POST /orders", key).expect("a valid scope")
}

/// Waits (bounded) until the record of `key` is completed: the request's task stores it after
/// the handler's answer went out.
async fn completed(store: &Store, key: &str) -> TestResult {
    for _ in 0..5_000 {
        if let Some(record) = store.get(&orders_scope(key))?
            && matches!(record.state(), RecordState::Completed { .. })
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Err(format!("the record of {key} was never completed").into())
}

/// A handler that counts its runs, says it started, and answers once `go` is notified.
fn held_handler(runs: &Arc<AtomicU32>, started: &Arc<Notify>, go: &Arc<Notify>) -> Router {
    let (runs, started, go) = (runs.clone(), started.clone(), go.clone());
    Router::new().route(
        "/orders",
        post(move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            started.notify_one();
            go.notified().await;
            (StatusCode::CREATED, "charged")
        }),
    )
}

/// Marks every request as tenant `acct_a`, as an authentication layer would.
async fn as_tenant(mut request: Request, next: middleware::Next) -> Response {
    request.extensions_mut().insert(Tenant("acct_a".into()));
    next.run(request).await
}

/// A raw HTTP/1.1 request over loopback; the answer's status and body (read to the end).
async fn http(
    addr: std::net::SocketAddr,
    key: &str,
) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(raw_request(key).as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let status = answer.split(' ').nth(1).ok_or("no status line")?.parse()?;
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    Ok((status, body))
}

fn raw_request(key: &str) -> String {
    format!(
        "POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{BODY}",
        BODY.len()
    )
}

/// The case the product exists for: the client times out and disconnects while the handler
/// runs. The handler runs to the end anyway and its response is stored, so the client's retry
/// gets the outcome (409 while it still runs, the replay after), with one side effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_handler_finds_the_outcome_on_retry() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (runs, started, go) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
    );
    let app = held_handler(&runs, &started, &go)
        .route_layer(IdempotencyLayer::new(store.clone()))
        .layer(middleware::from_fn(as_tenant));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The client sends its request, and gives up while the handler runs.
    let mut client = tokio::net::TcpStream::connect(addr).await?;
    client
        .write_all(raw_request("request-k1").as_bytes())
        .await?;
    started.notified().await;
    drop(client);

    // A retry while the handler still runs: told it is in progress.
    let (status, _) = http(addr, "request-k1").await?;
    assert_eq!(status, 409);
    go.notify_one();
    completed(&store, "request-k1").await?;
    let (status, body) = http(addr, "request-k1").await?;
    assert_eq!((status, body.as_str()), (201, "charged"), "the replay");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "one side effect");
    Ok(())
}

#[derive(Debug, serde::Deserialize)]
struct Order {
    #[allow(dead_code)]
    item: String,
    #[allow(dead_code)]
    quantity: u32,
}

/// A route whose handler takes a typed JSON body, counting its runs.
fn json_app(store: &Store, runs: &Arc<AtomicU32>) -> Router {
    let runs = runs.clone();
    Router::new()
        .route(
            "/orders",
            post(move |Json(_order): Json<Order>| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                (StatusCode::CREATED, "created")
            }),
        )
        .route_layer(IdempotencyLayer::new(store.clone()))
}

fn raw(key: &str, content_type: &str, body: &str) -> Request {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri("/orders")
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body.to_owned()))
        .expect("a valid request");
    request.extensions_mut().insert(Tenant("acct_a".into()));
    request
}

/// A request an extractor refuses (415 for the content type, 400 for JSON syntax, 422 for its
/// shape) never reached the handler: nothing is stored, and the corrected request with the
/// same key runs, once.
#[tokio::test]
async fn a_request_refused_by_an_extractor_leaves_the_key_for_the_corrected_request() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let app = json_app(&store, &runs);
    let cases = [
        (
            "request-k415",
            "text/plain",
            BODY,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "request-k400",
            "application/json",
            "{\"item\": ",
            StatusCode::BAD_REQUEST,
        ),
        (
            "request-k422",
            "application/json",
            r#"{"item": 3}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (n, (key, content_type, body, refused)) in cases.into_iter().enumerate() {
        let first = send(&app, raw(key, content_type, body)).await?;
        assert_eq!(first.status, refused, "{key}: {}", first.body);
        assert!(
            store.get(&orders_scope(key))?.is_none(),
            "{key}: nothing stored"
        );
        // The same bad request again is refused again, not replayed.
        let again = send(&app, raw(key, content_type, body)).await?;
        assert_eq!((again.status, again.replayed()), (refused, false), "{key}");
        let fixed = send(&app, raw(key, "application/json", BODY)).await?;
        assert_eq!(
            (fixed.status, fixed.replayed()),
            (StatusCode::CREATED, false),
            "{key}"
        );
        let replay = send(&app, raw(key, "application/json", BODY)).await?;
        assert!(replay.replayed(), "{key}");
        assert_eq!(runs.load(Ordering::SeqCst), n as u32 + 1, "{key} ran once");
    }
    Ok(())
}

/// The handler's own 4xx is its answer, stored and replayed as before; a custom extractor's
/// rejection marked `NotStarted` is not.
#[tokio::test]
async fn the_handlers_own_refusal_is_stored_and_a_marked_rejection_is_not() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let handler = {
        let runs = runs.clone();
        post(move |request: Request| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut response = (
                StatusCode::BAD_REQUEST,
                "Failed to parse your order: no item",
            )
                .into_response();
            if request.uri().query() == Some("marked") {
                response.extensions_mut().insert(NotStarted);
            }
            response
        })
    };
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()));
    let own = || request(Method::POST, "/orders", Some("request-own"), BODY);
    assert_eq!(send(&app, own()).await?.status, StatusCode::BAD_REQUEST);
    assert!(
        send(&app, own()).await?.replayed(),
        "the handler's 400 is stored"
    );
    let marked = || request(Method::POST, "/orders?marked", Some("request-marked"), BODY);
    assert!(!send(&app, marked()).await?.replayed());
    assert!(
        !send(&app, marked()).await?.replayed(),
        "released, so it ran again"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    Ok(())
}

/// A handler answering with a body it feeds from `chunks`; counts its runs.
fn streaming_app(
    store: &Store,
    runs: &Arc<AtomicU32>,
    chunks: tokio::sync::mpsc::Receiver<Bytes>,
    layer: impl FnOnce(IdempotencyLayer) -> IdempotencyLayer,
) -> Router {
    let runs = runs.clone();
    let chunks = Arc::new(parking_lot::Mutex::new(Some(chunks)));
    Router::new()
        .route(
            "/orders",
            post(move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let Some(mut chunks) = chunks.lock().take() else {
                    return (StatusCode::CONFLICT, "ran twice").into_response();
                };
                let (mut sender, body) = http_body_util::channel::Channel::<Bytes>::new(1);
                tokio::spawn(async move {
                    while let Some(chunk) = chunks.recv().await {
                        if sender.send_data(chunk).await.is_err() {
                            return;
                        }
                    }
                });
                (StatusCode::OK, Body::new(body)).into_response()
            }),
        )
        .route_layer(layer(IdempotencyLayer::new(store.clone())))
}

/// The first byte of a streamed response reaches the client before the stream ends; the
/// replay is the whole body.
#[tokio::test]
async fn the_first_byte_of_a_streamed_response_arrives_before_the_stream_ends() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let runs = Arc::new(AtomicU32::new(0));
    let (chunks, fed) = tokio::sync::mpsc::channel(8);
    let app = streaming_app(&store, &runs, fed, |layer| layer);
    chunks.send(Bytes::from("chunk 0;")).await?;
    let response = tokio::time::timeout(
        Duration::from_secs(10),
        app.clone().oneshot(post_req("request-s", BODY)),
    )
    .await
    .map_err(|_| "the response head was held back until the stream ended")??;
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .map_err(|_| "the first chunk was held back")?
        .ok_or("no first frame")??;
    assert_eq!(first.into_data().ok(), Some(Bytes::from("chunk 0;")));
    for i in 1..5 {
        chunks.send(Bytes::from(format!("chunk {i};"))).await?;
    }
    drop(chunks);
    let rest = body.collect().await?.to_bytes();
    assert_eq!(rest, "chunk 1;chunk 2;chunk 3;chunk 4;");
    let replay = send(&app, post_req("request-s", BODY)).await?;
    assert!(replay.replayed());
    assert_eq!(replay.body, "chunk 0;chunk 1;chunk 2;chunk 3;chunk 4;");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Ok(())
}

/// Waits (bounded, in steps that let the writer answer) until the lease of `scope` ends at
/// `until` or later.
async fn lease_reaches(store: &Store, scope: &Scope, until: idemstore::Timestamp) -> TestResult {
    // Bounded in real time: the renewal goes through the store's writer thread, which a loaded
    // machine may keep waiting; yielding does not move the runtime's paused clock.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Some(RecordState::InProgress { lease_until, .. }) =
            store.get(scope)?.map(|r| r.state().clone())
            && lease_until >= until
        {
            return Ok(());
        }
        tokio::task::yield_now().await;
    }
    Err(format!(
        "the lease of {scope} was never renewed to {until}: {:?}",
        store.get(scope)?.map(|r| r.state().clone())
    )
    .into())
}

/// A stream that goes on for three leases keeps its lease renewed while bytes flow: a retry
/// meanwhile is told it is in progress (never taken over and run a second time), and gets the
/// replay once the stream ends. The runtime's clock is paused and is the store's clock too, so
/// the lease and its renewals move together.
#[tokio::test(start_paused = true)]
async fn a_stream_that_outlives_the_lease_is_not_taken_over_or_run_twice() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = RuntimeClock::new();
    let store = builder(&common::clock())
        .clock(clock.clone())
        .open(dir.path().join("idem"))?;
    let runs = Arc::new(AtomicU32::new(0));
    let (chunks, fed) = tokio::sync::mpsc::channel(8);
    let app = streaming_app(&store, &runs, fed, |layer| {
        layer.store_timeout(Duration::MAX)
    });
    chunks.send(Bytes::from("a")).await?;
    let first = tokio::spawn({
        let app = app.clone();
        async move { send_owned(app, post_req("request-long", BODY)).await }
    });
    let scope = orders_scope("request-long");
    lease_reaches(&store, &scope, idemstore::Clock::now(&clock)).await?;
    // The handler ran: its request's renewals are scheduled (from before it ran).
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    for _ in 0..9 {
        tokio::time::advance(LEASE / 3).await;
        // More than a third of the lease left: the heartbeat renews every third, so whenever
        // this is not already true, a renewal is due now (it goes through the store's writer
        // thread; the test waits for it without moving the clock).
        let now = idemstore::Clock::now(&clock);
        let margin = LEASE / 3 + Duration::from_millis(1);
        lease_reaches(&store, &scope, now.saturating_add(margin)).await?;
        chunks.send(Bytes::from("a")).await?;
    }
    let retry = send(&app, post_req("request-long", BODY)).await?;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{}", retry.body);
    drop(chunks);
    let first = first.await??;
    assert_eq!(first.body, "a".repeat(10));
    let replay = send(&app, post_req("request-long", BODY)).await?;
    assert!(replay.replayed());
    assert_eq!(replay.body, "a".repeat(10));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "never run twice");
    Ok(())
}

/// A full disk: once the log has used the space it holds, new keys get 503 with a
/// `Retry-After` spread at random and a detail that says what to do (not what failed inside);
/// replays of what is stored go on throughout; once space is freed, new keys run again,
/// without a restart.
#[tokio::test]
async fn a_full_disk_refuses_new_keys_with_503_keeps_replaying_and_recovers_when_freed()
-> TestResult {
    let disk = SimDisk::new();
    let store = builder(&clock())
        .log_segment_bytes(64 * 1024)
        .checkpoint_bytes(64 * 1024)
        .open_simulated(&disk)?;
    let (app, runs) = orders_app(IdempotencyLayer::new(store.clone()));
    assert_eq!(
        send(&app, post_req("request-k1", BODY)).await?.status,
        StatusCode::CREATED
    );

    disk.set_full(true);
    let mut waits = std::collections::BTreeSet::new();
    let mut served = 0;
    for i in 0..2_000 {
        let answer = send(&app, post_req(&format!("request-new-{i}"), BODY)).await?;
        if answer.status == StatusCode::CREATED {
            // The log still had room in the space it holds.
            served += 1;
            continue;
        }
        assert_eq!(
            answer.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            answer.body
        );
        assert_eq!(
            answer.problem_type(),
            "urn:idemstore:problem:idempotency-store-unavailable"
        );
        assert!(answer.body.contains("storage is full"), "{}", answer.body);
        for internal in ["simulated", "redb", "log", "os error"] {
            assert!(
                !answer.body.contains(internal),
                "{internal} in {}",
                answer.body
            );
        }
        waits.insert(
            answer.headers[header::RETRY_AFTER]
                .to_str()?
                .parse::<u64>()?,
        );
        let replay = send(&app, post_req("request-k1", BODY)).await?;
        assert!(replay.replayed(), "replays go on while the disk is full");
        if waits.len() > 1 {
            break;
        }
    }
    assert!(
        !waits.is_empty(),
        "the full disk never refused a request ({served} served)"
    );
    assert!(
        waits.len() > 1,
        "Retry-After is spread at random: {waits:?}"
    );
    assert!(waits.iter().all(|&w| (1..=60).contains(&w)), "{waits:?}");

    disk.set_full(false);
    let again = send(&app, post_req("request-after", BODY)).await?;
    assert_eq!(
        (again.status, again.replayed()),
        (StatusCode::CREATED, false),
        "{}",
        again.body
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        served + 2,
        "refused requests never ran"
    );
    Ok(())
}

/// A holder whose lease ran out and was taken over is refused when it commits: 409, with a
/// `Retry-After`, and a detail that tells the client what to do, without fences or scopes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_taken_over_answers_409_with_retry_after_and_no_internals() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock: ManualClock = clock();
    let store = store(&dir, &clock)?;
    let (started, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let handler = {
        let (started, go) = (started.clone(), go.clone());
        post(move |idem: IdempotentRequest| async move {
            if idem.attempt() == 1 {
                started.notify_one();
                go.notified().await;
            }
            idem.commit(|_| Ok(idemstore::Response::new(201, "done")))
                .await
                .into_response()
        })
    };
    let app = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()));
    let slow = tokio::spawn({
        let app = app.clone();
        async move { send_owned(app, post_req("request-k", BODY)).await }
    });
    started.notified().await;
    clock.advance(LEASE * 2);
    let recovery = send(&app, post_req("request-k", BODY)).await?;
    assert_eq!(recovery.status, StatusCode::CREATED, "{}", recovery.body);
    go.notify_one();
    let stale = slow.await??;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.body);
    assert_eq!(
        stale.problem_type(),
        "urn:idemstore:problem:claim-taken-over"
    );
    assert!(stale.headers.contains_key(header::RETRY_AFTER));
    for internal in ["fence", "acct_a", "POST /orders"] {
        assert!(
            !stale.body.contains(internal),
            "{internal} in {}",
            stale.body
        );
    }
    Ok(())
}

/// A request with no tenant gets a 401 with the `WWW-Authenticate` challenge RFC 9110 asks for;
/// a key with malformed RFC 8941 parameters is refused.
#[tokio::test]
async fn a_401_carries_a_challenge_and_malformed_key_parameters_are_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = store(&dir, &clock())?;
    let (app, runs) = orders_app(
        IdempotencyLayer::new(store).challenge(HeaderValue::from_static("Bearer realm=\"shop\"")),
    );
    let mut anonymous = post_req("request-k", BODY);
    anonymous.extensions_mut().remove::<Tenant>();
    let refused = send(&app, anonymous).await?;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        refused.headers[header::WWW_AUTHENTICATE],
        "Bearer realm=\"shop\""
    );
    let garbage = send(&app, post_req("\"p1\";;;garbage", BODY)).await?;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        garbage.problem_type(),
        "urn:idemstore:problem:invalid-idempotency-key"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    Ok(())
}
