//! What the HTTP layer costs on top of the store. `cargo bench --bench http`.
//!
//! Each request goes through an axum `Router` in process (`tower::ServiceExt::oneshot`, no
//! sockets), so the figures are the layer's own work: header parsing, body buffering, JSON
//! canonicalization and hashing, the extractor, response conversion.
//!
//! - `new_key/{direct,layer}/{1,64}`: requests with a new key per second from 1 and 64 tasks;
//!   `direct` calls `begin_async` + `commit_async` itself with the same row and response, so
//!   the ratio layer/direct is the layer's overhead on a durable claim + commit;
//! - `replay/{direct,layer}`: a completed key again, from one task;
//! - `replay/no_layer`: a handler answering the same bytes without the layer (axum's own cost).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, header};
use axum::routing::post;
use common::{BODY as RESPONSE, ORDERS, ROW};
use criterion::{Criterion, Throughput, criterion_main};
use idemstore::http::{IdempotencyLayer, IdempotentRequest, Tenant};
use idemstore::{Begin, Fingerprint, Response, Scope, Store};
use tower::ServiceExt;

const BODY: &str = r#"{"amount": 1900, "currency": "eur", "customer": "cus_42", "lines": [{"sku": "w-1", "qty": 3}]}"#;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A handler that commits a row and a response through the extractor, behind the layer.
fn app(store: &Store) -> Router {
    let handler = post(|idem: IdempotentRequest| async move {
        let id = idem.scope().key().to_owned();
        idem.commit(move |tx| {
            tx.insert(&ORDERS, id.as_str(), ROW.as_slice())?;
            Ok(Response::new(201, RESPONSE.to_vec())
                .with_header("content-type", "application/json"))
        })
        .await
        .unwrap_or_else(axum::response::IntoResponse::into_response)
    });
    Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()))
}

fn request(key: &str) -> Request {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri("/orders")
        .header(header::CONTENT_TYPE, "application/json")
        .header("idempotency-key", key)
        .body(Body::from(BODY))
        .expect("request");
    request.extensions_mut().insert(Tenant("acct_42".into()));
    request
}

async fn through_layer(app: &Router, key: &str) {
    let response = app.clone().oneshot(request(key)).await.expect("infallible");
    assert_eq!(response.status(), 201);
}

async fn direct(store: &Store, key: &str) {
    let scope = Scope::new("acct_42", "POST /orders", key).expect("scope");
    let fingerprint = Fingerprint::of_bytes(BODY.as_bytes());
    match store.begin_async(&scope, fingerprint).await.expect("begin") {
        Begin::Claimed(claim) => {
            let id = key.to_owned();
            claim
                .commit_async(move |tx| {
                    tx.insert(&ORDERS, id.as_str(), ROW.as_slice())?;
                    Ok(Response::new(201, RESPONSE.to_vec()))
                })
                .await
                .expect("commit");
        }
        Begin::Replay(stored) => assert_eq!(stored.status(), 201),
        other => panic!("unexpected {other:?}"),
    }
}

#[derive(Clone, Copy)]
enum Path {
    Direct,
    Layer,
}

/// Runs `iters` requests over `tasks` tasks with fresh keys; returns the time taken.
fn run(
    rt: &tokio::runtime::Runtime,
    store: &Store,
    path: Path,
    tasks: u64,
    iters: u64,
    next: &Arc<AtomicU64>,
) -> Duration {
    let app = app(store);
    rt.block_on(async {
        let start = Instant::now();
        let mut handles = Vec::new();
        for t in 0..tasks {
            let share = iters / tasks + u64::from(t < iters % tasks);
            let (store, app, next) = (store.clone(), app.clone(), next.clone());
            handles.push(tokio::spawn(async move {
                for _ in 0..share {
                    let key = format!("key-{:012}", next.fetch_add(1, Ordering::Relaxed));
                    match path {
                        Path::Direct => direct(&store, &key).await,
                        Path::Layer => through_layer(&app, &key).await,
                    }
                }
            }));
        }
        for handle in handles {
            handle.await.expect("task");
        }
        start.elapsed()
    })
}

fn new_key(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::builder()
        .table(ORDERS)
        .open(dir.path().join("idem"))
        .expect("open");
    let next = Arc::new(AtomicU64::new(0));
    let mut group = c.benchmark_group("new_key");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(6));
    for tasks in [1u64, 64] {
        for (name, path) in [("direct", Path::Direct), ("layer", Path::Layer)] {
            group.bench_function(format!("{name}/{tasks}"), |b| {
                b.iter_custom(|iters| run(&rt, &store, path, tasks, iters, &next));
            });
        }
    }
    group.finish();
}

fn replay(c: &mut Criterion) {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::builder()
        .table(ORDERS)
        .open(dir.path().join("idem"))
        .expect("open");
    let app = app(&store);
    rt.block_on(through_layer(&app, "done-through-layer"));
    rt.block_on(direct(&store, "done-direct"));
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(1));
    group.bench_function("direct", |b| {
        b.iter(|| rt.block_on(direct(&store, "done-direct")))
    });
    group.bench_function("layer", |b| {
        b.iter(|| {
            rt.block_on(async {
                let response = app
                    .clone()
                    .oneshot(request("done-through-layer"))
                    .await
                    .expect("infallible");
                assert!(response.headers().contains_key("idempotent-replayed"));
            });
        });
    });
    let plain = Router::new().route(
        "/orders",
        post(|| async { (axum::http::StatusCode::CREATED, RESPONSE.to_vec()) }),
    );
    group.bench_function("no_layer", |b| {
        b.iter(|| {
            rt.block_on(async {
                plain
                    .clone()
                    .oneshot(request("x"))
                    .await
                    .expect("infallible")
            })
        });
    });
    group.finish();
}

fn benches() {
    let mut c = Criterion::default().configure_from_args();
    new_key(&mut c);
    replay(&mut c);
}

criterion_main!(benches);
