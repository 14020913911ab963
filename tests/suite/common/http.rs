//! Helpers for the HTTP middleware's tests: requests as an authentication layer would pass
//! them on, a counted handler, and answers read whole.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::routing::post;
use idemstore::http::{IDEMPOTENT_REPLAYED, IdempotencyLayer, Tenant};
use idemstore::{ManualClock, Store};
use tower::ServiceExt;

pub const BODY: &str = r#"{"item": "widget", "quantity": 3}"#;

/// A counted handler: increments `runs` and answers 201 with the run number.
pub fn counted(runs: &Arc<AtomicU32>) -> axum::routing::MethodRouter {
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
pub fn orders_app(layer: IdempotencyLayer) -> (Router, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/orders", counted(&runs))
        .route_layer(layer);
    (app, runs)
}

pub fn request(method: Method, uri: &str, key: Option<&str>, body: &str) -> Request {
    request_with(method, uri, key, Body::from(body.to_owned()))
}

/// A JSON request from tenant `acct_a`, as its authentication layer would have marked it.
pub fn request_with(method: Method, uri: &str, key: Option<&str>, body: Body) -> Request {
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

pub fn post_req(key: &str, body: &str) -> Request {
    request(Method::POST, "/orders", Some(key), body)
}

pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn replayed(&self) -> bool {
        self.headers
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|v| v == "true")
    }

    pub fn problem_type(&self) -> String {
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

pub async fn send(app: &Router, request: Request) -> Result<Answer, Box<dyn std::error::Error>> {
    let response = app.clone().oneshot(request).await?;
    let (parts, body) = response.into_parts();
    let body = String::from_utf8(to_bytes(body, usize::MAX).await?.to_vec())?;
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

pub fn store(dir: &tempfile::TempDir, clock: &ManualClock) -> Result<Store, idemstore::OpenError> {
    super::builder(clock).open(dir.path().join("idem"))
}

pub async fn send_owned(app: Router, request: Request) -> Result<Answer, String> {
    send(&app, request).await.map_err(|e| e.to_string())
}

/// Sends `copies` copies of one POST under `key` at once, checks each is answered 201 with
/// `body`, and counts them: (answered first, replayed).
pub async fn post_copies(
    app: &Router,
    copies: usize,
    key: &str,
    body: &str,
) -> Result<(u32, u32), Box<dyn std::error::Error>> {
    let sent: Vec<_> = (0..copies)
        .map(|_| tokio::spawn(send_owned(app.clone(), post_req(key, BODY))))
        .collect();
    let (mut first, mut replayed) = (0, 0);
    for copy in sent {
        let answer = copy.await??;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
        assert_eq!(answer.body, body);
        if answer.replayed() {
            replayed += 1;
        } else {
            first += 1;
        }
    }
    Ok((first, replayed))
}

/// A store clock that reads the tokio runtime's clock: a test on a paused runtime moves the
/// store's leases and the runtime's timers (a lease renewal's interval) together, with one
/// `tokio::time::advance`.
#[derive(Debug, Clone)]
pub struct RuntimeClock {
    runtime: tokio::runtime::Handle,
    origin: tokio::time::Instant,
    start: idemstore::Timestamp,
}

impl RuntimeClock {
    /// Starts at the tests' usual start time, now by the current runtime's clock.
    pub fn new() -> Self {
        RuntimeClock {
            runtime: tokio::runtime::Handle::current(),
            origin: tokio::time::Instant::now(),
            start: idemstore::Clock::now(&super::clock()),
        }
    }
}

impl idemstore::Clock for RuntimeClock {
    fn now(&self) -> idemstore::Timestamp {
        // The store reads its clock on its own threads: enter the runtime to read its clock.
        let _entered = self.runtime.enter();
        self.start
            .saturating_add(tokio::time::Instant::now().duration_since(self.origin))
    }
}
