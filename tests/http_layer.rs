//! The Idempotency-Key middleware in process: each answer of the table in `idemstore::http`,
//! what is stored and replayed, the handler's ways of finishing a claim, and the failures that
//! leave it in progress. Time is the store's manual clock; nothing sleeps.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use common::{LEASE, ORDERS, TestResult, builder, clock, order_count};
use idemstore::http::{
    Failures, IDEMPOTENT_REPLAYED, IdempotencyLayer, IdempotentRequest, KeyPolicy, Tenant,
};
use idemstore::{ManualClock, Store};
use tower::ServiceExt;

const BODY: &str = r#"{"item": "widget", "quantity": 3}"#;

/// A counted handler: increments `runs` and answers 201 with the run number.
fn counted(runs: &Arc<AtomicU32>) -> axum::routing::MethodRouter {
    let runs = runs.clone();
    post(move || async move {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        (
            StatusCode::CREATED,
            [(header::CONTENT_TYPE, "text/plain")],
            format!("run {n}"),
        )
    })
}

/// `POST /orders` answered by [`counted`] behind `layer`, and the handler's run count.
fn orders_app(layer: IdempotencyLayer) -> (Router, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/orders", counted(&runs))
        .route_layer(layer);
    (app, runs)
}

fn request(method: Method, uri: &str, key: Option<&str>, body: &str) -> Request {
    request_with(method, uri, key, Body::from(body.to_owned()))
}

/// A JSON request from tenant `acct_a`, as its authentication layer would have marked it.
fn request_with(method: Method, uri: &str, key: Option<&str>, body: Body) -> Request {
    let mut builder = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    let mut request = builder.body(body).expect("a valid request");
    request.extensions_mut().insert(Tenant("acct_a".into()));
    request
}

fn post_req(key: &str, body: &str) -> Request {
    request(Method::POST, "/orders", Some(key), body)
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn replayed(&self) -> bool {
        self.headers
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v == "true")
    }

    fn problem_type(&self) -> String {
        assert_eq!(
            self.headers[header::CONTENT_TYPE],
            "application/problem+json",
            "{}",
            self.body
        );
        let json: serde_json::Value = serde_json::from_str(&self.body).expect("problem JSON");
        json["type"].as_str().expect("a problem type").to_owned()
    }
}

async fn send(app: &Router, request: Request) -> Result<Answer, Box<dyn std::error::Error>> {
    let response = app.clone().oneshot(request).await?;
    let (parts, body) = response.into_parts();
    let body = String::from_utf8(to_bytes(body, usize::MAX).await?.to_vec())?;
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

fn store(dir: &tempfile::TempDir, clock: &ManualClock) -> Result<Store, idemstore::OpenError> {
    builder(clock).open(dir.path().join("idem"))
}

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

    let first = send(&app, post_req("k1", BODY)).await?;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(
        first.headers[header::SET_COOKIE],
        "session=abc",
        "the first answer is the handler's own"
    );

    // Same request, keys in another order and other whitespace: the same canonical JSON.
    let retry = send(&app, post_req("k1", r#"{"quantity":3,"item":"widget"}"#)).await?;
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
        send(&app, post_req("k1", BODY)).await?.status,
        StatusCode::CREATED
    );
    let changed = send(&app, post_req("k1", r#"{"item":"widget","quantity":4}"#)).await?;
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
            Some("r1"),
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

    let mut twice = post_req("a", BODY);
    twice
        .headers_mut()
        .append("idempotency-key", HeaderValue::from_static("b"));
    let long = "k".repeat(256);
    let tab = HeaderValue::from_static("a\tb"); // a valid header value, not a valid key
    let mut with_tab = post_req("x", BODY);
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

    let large = send(&app, post_req("big", &format!("\"{}\"", "x".repeat(100)))).await?;
    assert_eq!(large.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(large.problem_type(), "urn:idemstore:problem:body-too-large");

    let mut anonymous = post_req("k", BODY);
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
        send(&app, post_req("\"q-1\"", BODY)).await?.status,
        StatusCode::CREATED
    );
    assert!(send(&app, post_req("q-1", BODY)).await?.replayed());
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
        send(&app, post_req("k", BODY)).await?.status,
        StatusCode::UNAUTHORIZED
    );
    let get_twice = || {
        let mut r = request(Method::GET, "/orders", Some("k"), "");
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
    assert_eq!(send(&app, post_req("k", BODY)).await?.body, "claimed");
    assert!(send(&app, post_req("k", BODY)).await?.replayed());
    assert_eq!(seen.load(Ordering::SeqCst), 3);
    Ok(())
}

#[tokio::test]
async fn a_handler_without_the_layer_gets_a_clear_500_from_the_extractor() -> TestResult {
    let app = Router::new().route(
        "/orders",
        post(|_idem: IdempotentRequest| async { "never" }),
    );
    let answer = send(&app, post_req("k", BODY)).await?;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:missing-idempotency-layer"
    );
    Ok(())
}

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
    let r = || request(Method::POST, "/orders", Some("s"), BODY);
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
        let answer = send(&lenient, r("l", "")).await?;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!answer.replayed(), "released: the retry runs the handler");
    }
    assert_eq!(
        send(&lenient, r("p", "?status=402")).await?.status,
        StatusCode::PAYMENT_REQUIRED
    );
    assert!(
        send(&lenient, r("p", "?status=402")).await?.replayed(),
        "4xx still stored"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    let release_all = Router::new()
        .route("/orders", failing(&runs))
        .route_layer(IdempotencyLayer::new(store.clone()).failures(Failures::ReleaseAll));
    for _ in 0..2 {
        let answer = send(&release_all, r("a", "?status=402")).await?;
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

    let first = send(&app, post_req("k", BODY)).await?;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(first.body.starts_with("order-"));
    assert!(!first.replayed(), "the first answer is not a replay");
    let writes_after_first = store.stats()?.writer_requests;
    assert_eq!(
        writes_after_first, 2,
        "one claim and one commit: the middleware stored nothing more"
    );
    let retry = send(&app, post_req("k", BODY)).await?;
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
        let answer = send(&app, post_req("k", BODY)).await?;
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

    for (key, query) in [("p", "?panic"), ("c", "?cancel")] {
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
        assert_eq!(
            retry.headers[header::RETRY_AFTER],
            LEASE.as_secs().to_string().as_str()
        );
        assert_eq!(
            retry.problem_type(),
            "urn:idemstore:problem:request-in-progress"
        );
    }
    clock.advance(LEASE + Duration::from_secs(1));
    for (key, query) in [("p", "?panic"), ("c", "?cancel")] {
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
        send(&app, post_req("k", BODY)).await?.status,
        StatusCode::GATEWAY_TIMEOUT
    );
    clock.advance(LEASE / 2);
    let early = send(&app, post_req("k", BODY)).await?;
    assert_eq!(early.status, StatusCode::CONFLICT);
    assert_eq!(
        early.headers[header::RETRY_AFTER],
        (LEASE / 2).as_secs().to_string().as_str()
    );
    clock.advance(LEASE);
    let recovered = send(&app, post_req("k", BODY)).await?;
    assert_eq!(
        (recovered.status, recovered.body.as_str()),
        (StatusCode::CREATED, "attempt 2 saw charged py_1")
    );
    assert!(send(&app, post_req("k", BODY)).await?.replayed());
    Ok(())
}

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

    let first = tokio::spawn(send_owned(app.clone(), post_req("k", BODY)));
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let second = tokio::spawn(send_owned(app.clone(), post_req("k", BODY)));
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

async fn send_owned(app: Router, request: Request) -> Result<Answer, String> {
    send(&app, request).await.map_err(|e| e.to_string())
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
            send_owned(app, post_req("same", BODY)).await
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
        send(&app, post_req("k", BODY)).await?.status,
        StatusCode::CREATED
    );
    clock.advance(Duration::from_secs(120));
    let gone = send(&app, post_req("k", BODY)).await?;
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
    let mut other_tenant = post_req("k", BODY);
    other_tenant
        .extensions_mut()
        .insert(Tenant("acct_b".into()));
    let answers = [
        send(&app, post_req("k", BODY)).await?,
        send(&app, other_tenant).await?,
        send(&app, request(Method::POST, "/refunds", Some("k"), BODY)).await?,
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
    let first = send(&app, post_req("k", BODY)).await?;
    assert!(!first.replayed());
    let replay = send(&app, post_req("k", BODY)).await?;
    assert_eq!(
        (replay.status, replay.body.as_str(), replay.replayed()),
        (StatusCode::ACCEPTED, "accepted", true)
    );
    let links: Vec<_> = replay.headers.get_all(header::LINK).iter().collect();
    assert_eq!(links, ["</a>; rel=a", "</b>; rel=b"]);
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
        ("e", "?err", Failures::Store),
        ("p", "?panic", Failures::Store),
        ("r", "?err", Failures::ReleaseAll),
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
/// lease, get that answer and never run it again.
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
    for (key, uri) in [("body", "/orders"), ("headers", "/orders?headers")] {
        let r = || request(Method::POST, uri, Some(key), BODY);
        let first = send(&app, r()).await?;
        assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR, "{key}");
        assert_eq!(
            first.problem_type(),
            "urn:idemstore:problem:response-not-stored"
        );
        assert!(!first.replayed());
        let retry = send(&app, r()).await?;
        assert_eq!(
            (retry.status, retry.replayed(), retry.body.as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, true, first.body.as_str()),
            "{key}"
        );
    }
    clock.advance(LEASE * 2);
    assert!(send(&app, post_req("body", BODY)).await?.replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each handler ran once");
    let stats = store.stats()?;
    assert_eq!((stats.claims, stats.replays), (2, 3));
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
    let app = Router::new()
        .route("/orders", handler.clone())
        .route_layer(IdempotencyLayer::new(store.clone()).wait(Duration::from_secs(5)));

    let first = tokio::spawn(send_owned(app.clone(), post_req("k", BODY)));
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    let second = send(&app, post_req("k", BODY)).await?;
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "it waited first"
    );
    assert_eq!(second.status, StatusCode::CONFLICT);
    assert_eq!(
        second.headers[header::RETRY_AFTER],
        LEASE.as_secs().to_string().as_str(),
        "the store's clock did not move: the whole lease is left"
    );
    go.notify_one();
    assert_eq!(first.await??.status, StatusCode::CREATED);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let forever = Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()).wait(Duration::MAX));
    assert!(send(&forever, post_req("k", BODY)).await?.replayed());
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
    let mut request = request_with(Method::POST, "/orders", Some("k"), Body::new(endless));
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
    let answer = send(&app, request(Method::POST, &long_path, Some("k"), BODY)).await?;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:invalid-operation"
    );
    let mut bad_tenant = post_req("k", BODY);
    bad_tenant.extensions_mut().insert(Tenant(String::new()));
    let answer = send(&app, bad_tenant).await?;
    assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        answer.problem_type(),
        "urn:idemstore:problem:invalid-tenant"
    );
    assert_eq!((runs.load(Ordering::SeqCst), store.stats()?.claims), (0, 0));

    let quoted = send(&app, post_req("\"a, b\"", BODY)).await?;
    assert_eq!(quoted.status, StatusCode::CREATED);
    Ok(())
}
