//! An edge service that takes payments safely under retries: the README's main command.
//!
//! `cargo run --release -p edge-service` serves on 127.0.0.1:3000 with its data in
//! `./idemstore-data` (the store in `./idemstore-data/edge_service`, the simulated
//! processor's ledger beside it). `POST /charges` calls a payment processor that sometimes times out, then commits the
//! charge row and the response in one transaction; retries with the same `Idempotency-Key`
//! are replayed, refused or answered 409, never charged twice. See the README for curl.
//!
//! Settings (flag or environment variable):
//!
//! | flag | env | default |
//! | --- | --- | --- |
//! | `--addr` | `EDGE_ADDR` | `127.0.0.1:3000` |
//! | `--data` | `EDGE_DATA` | `./idemstore-data` |
//! | `--timeout-rate` | `EDGE_TIMEOUT_RATE` | `0.1` (share of processor calls whose answer is lost) |
//! | `--latency-ms` | `EDGE_LATENCY_MS` | `50` (processor round trip) |
//! | `--lease-secs` | `EDGE_LEASE_SECS` | `30` |
//! | `--wait-ms` | `EDGE_WAIT_MS` | `0` (how long a duplicate waits for the first before 409) |
//! | `--tokens` | `EDGE_TOKENS` | `sk_test_alice=acct_alice,sk_test_bob=acct_bob` |
//! | `--admin-token` | `EDGE_ADMIN_TOKEN` | none (the operator's view of `/stats` is off) |
//! | `--complete-every-ms` | `EDGE_COMPLETE_EVERY_MS` | `10000` (how often abandoned charges are completed) |
//! | `--log-segment-kb` | `EDGE_LOG_SEGMENT_KB` | `8192` (the store's log segment size) |
//! | `--nats` | `EDGE_NATS` | none: `charges.created` events stay in the outbox (see `/stats`); with a URL (feature `nats`), a relay publishes them to the JetStream stream `CHARGES` (on either backend; over PostgreSQL every instance runs one and one at a time delivers) (`EDGE_NATS_STREAM` renames it; `EDGE_NATS_SUBJECT_PREFIX` prefixes the subjects sent) |
//! | `--ship` | `EDGE_SHIP` | none; with a NATS URL (feature `nats`), the store's log is shipped to JetStream (`EDGE_SHIP_STREAM`, default `edge_service`; `EDGE_SHIP_MODE`: `async`, `sync`, `sync-fallback`); with `--restore` / `EDGE_RESTORE=1` and no store yet, it is first rebuilt from the stream (see `ship`) |
//! | `--memory` | `EDGE_MEMORY_MB` | `64` (the store's memory budget, MiB: `Builder::memory_budget`) |
//! | `--processor-ledger` | `EDGE_PROCESSOR_LEDGER` | `<data>/processor-ledger.jsonl` (the simulated processor's side effects; a real processor keeps them elsewhere) |
//! | `--backend` | `EDGE_BACKEND` | `local` (the embedded store in `<data>`); `postgres` (feature `postgres`) keeps claims, charges and responses in PostgreSQL, shared by every instance |
//! | `--header-timeout-secs` | `EDGE_HEADER_TIMEOUT_SECS` | `10` (a request head must arrive within it; also how long an idle keep-alive connection stays open) |
//! | `--max-connections` | `EDGE_MAX_CONNECTIONS` | `1024` (connections past it are closed at once) |
//! | `--drain-secs` | `EDGE_DRAIN_SECS` | `20` (on SIGTERM or SIGINT, how long requests in flight get to finish; see `serve`) |
//! | `--pg-url` | `EDGE_PG_URL` | `postgres://postgres@127.0.0.1:5432/test` (with `--backend postgres`; tables prefixed `EDGE_PG_PREFIX`, default `edge_`; pool `EDGE_PG_POOL`, default 16 connections) |
//!
//! `GET /metrics` serves the store's metrics in Prometheus text format on either backend (see
//! `metrics`); `GET /stats` has one shape on both (see `stats`).
//!
//! Test hooks, for the tests that kill this process: `EDGE_MANUAL_CLOCK=1` runs the store on
//! a manual clock advanced by `POST /_test/clock?advance_secs=N`; `EDGE_PAUSE_AFTER_CHARGE=1`
//! makes `POST /charges` print `PAUSED <key>` and hang after the processor call.

mod auth;
mod charges;
mod metrics;
#[cfg(feature = "postgres")]
mod pg;
mod processor;
mod serve;
mod stats;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router, middleware};
use idemstore::http::{Drain, IdempotencyLayer, KeyPolicy};
use idemstore::{Clock, Completer, ManualClock, Store, SystemClock};

use processor::Processor;

/// Test hooks (off unless set).
#[derive(Debug, Clone, Default)]
struct Hooks {
    manual_clock: Option<ManualClock>,
    pause_after_charge: bool,
}

/// What the handlers share.
#[derive(Clone)]
struct App {
    store: Store,
    processor: Processor,
    lease: Duration,
    hooks: Hooks,
}

impl App {
    fn charging(&self) -> charges::Charging {
        charges::Charging {
            processor: self.processor.clone(),
            lease: self.lease,
            pause_after_charge: self.hooks.pause_after_charge,
        }
    }
}

/// A problem+json answer.
fn problem(status: StatusCode, kind: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": format!("urn:edge-service:problem:{kind}"),
        "title": status.canonical_reason().unwrap_or("error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// `--name value` from the command line, else `ENV`, else the default.
fn setting(args: &[String], flag: &str, env: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(env).ok())
        .unwrap_or_else(|| default.to_owned())
}

fn parsed<T: std::str::FromStr>(
    args: &[String],
    flag: &str,
    env: &str,
    default: &str,
) -> Result<T, String> {
    let text = setting(args, flag, env, default);
    text.parse()
        .map_err(|_| format!("{flag} / {env}: `{text}` is not a valid value"))
}

#[derive(serde::Deserialize)]
struct Advance {
    advance_secs: u64,
}

/// Test hook: moves the store's manual clock forward.
async fn advance_clock(State(hooks): State<Hooks>, Query(q): Query<Advance>) -> Response {
    match &hooks.manual_clock {
        Some(clock) => {
            clock.advance(Duration::from_secs(q.advance_secs));
            Json(serde_json::json!({ "now_ms": clock.now().as_millis() })).into_response()
        }
        None => problem(
            StatusCode::NOT_FOUND,
            "no-manual-clock",
            "start with EDGE_MANUAL_CLOCK=1",
        ),
    }
}

/// The test hooks' routes, on every backend.
fn test_routes(hooks: Hooks) -> Router {
    Router::new()
        .route("/_test/clock", post(advance_clock))
        .with_state(hooks)
}

/// The idempotency layer both backends put on `POST /charges`, and its stop.
fn idempotency<P: idemstore::Protocol>(store: P, wait: Duration) -> (IdempotencyLayer<P>, Drain) {
    let layer = IdempotencyLayer::new(store)
        .key(KeyPolicy::Required)
        .max_body(16 * 1024)
        .wait(wait);
    let drain = layer.drain();
    (layer, drain)
}

fn router(
    app: App,
    tokens: Arc<auth::Tokens>,
    wait: Duration,
    exporter: metrics::Exporter,
) -> (Router, Drain) {
    let (idempotency, drain) = idempotency(app.store.clone(), wait);
    let api = Router::new()
        .route("/charges", post(charges::create))
        .route("/charges/{id}", get(charges::show))
        // After routing: the operation is "POST /charges", whatever the path's ids.
        .route_layer(idempotency)
        .route("/stats", get(charges::stats))
        // Outside: a request it refuses never reaches the store.
        .layer(middleware::from_fn_with_state(tokens, auth::authenticate));
    let hooks = app.hooks.clone();
    let store = app.store.clone();
    let refresh = move || {
        let store = store.clone();
        async move {
            // Store::stats (not the exact count) sets the gauges: cheap enough for every scrape.
            match tokio::task::spawn_blocking(move || store.stats()).await {
                Ok(stats) => stats.map(drop).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    let router = Router::new()
        .merge(api)
        .with_state(app)
        .merge(metrics::route(exporter, refresh))
        .merge(test_routes(hooks));
    (router, drain)
}

#[tokio::main]
pub(crate) async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::INFO)
        .init();
    let exporter = metrics::install();
    let args: Vec<String> = std::env::args().collect();
    let addr: SocketAddr = parsed(&args, "--addr", "EDGE_ADDR", "127.0.0.1:3000")?;
    let data = PathBuf::from(setting(&args, "--data", "EDGE_DATA", "idemstore-data"));
    let timeout_rate: f64 = parsed(&args, "--timeout-rate", "EDGE_TIMEOUT_RATE", "0.1")?;
    let latency: u64 = parsed(&args, "--latency-ms", "EDGE_LATENCY_MS", "50")?;
    let lease = Duration::from_secs(parsed(&args, "--lease-secs", "EDGE_LEASE_SECS", "30")?);
    let wait = Duration::from_millis(parsed(&args, "--wait-ms", "EDGE_WAIT_MS", "0")?);
    let segment_kb: u64 = parsed(&args, "--log-segment-kb", "EDGE_LOG_SEGMENT_KB", "8192")?;
    let memory_mb: usize = parsed(&args, "--memory", "EDGE_MEMORY_MB", "64")?;
    let limits = serve::Limits {
        header_timeout: Duration::from_secs(parsed(
            &args,
            "--header-timeout-secs",
            "EDGE_HEADER_TIMEOUT_SECS",
            "10",
        )?),
        max_connections: parsed(&args, "--max-connections", "EDGE_MAX_CONNECTIONS", "1024")?,
        drain: Duration::from_secs(parsed(&args, "--drain-secs", "EDGE_DRAIN_SECS", "20")?),
    };
    let complete_every = Duration::from_millis(parsed(
        &args,
        "--complete-every-ms",
        "EDGE_COMPLETE_EVERY_MS",
        "10000",
    )?);
    let tokens = auth::parse_tokens(
        &setting(
            &args,
            "--tokens",
            "EDGE_TOKENS",
            "sk_test_alice=acct_alice,sk_test_bob=acct_bob",
        ),
        Some(setting(&args, "--admin-token", "EDGE_ADMIN_TOKEN", "")),
    )?;
    let hooks = Hooks {
        manual_clock: (std::env::var("EDGE_MANUAL_CLOCK").as_deref() == Ok("1"))
            .then(|| ManualClock::new(SystemClock.now())),
        pause_after_charge: std::env::var("EDGE_PAUSE_AFTER_CHARGE").as_deref() == Ok("1"),
    };

    std::fs::create_dir_all(&data)?;
    let ledger = PathBuf::from(setting(
        &args,
        "--processor-ledger",
        "EDGE_PROCESSOR_LEDGER",
        &data.join("processor-ledger.jsonl").to_string_lossy(),
    ));
    let processor = Processor::open(&ledger, timeout_rate, Duration::from_millis(latency))?;
    match setting(&args, "--backend", "EDGE_BACKEND", "local").as_str() {
        "local" => {}
        #[cfg(feature = "postgres")]
        "postgres" => {
            let url = setting(
                &args,
                "--pg-url",
                "EDGE_PG_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            );
            let app = pg::PgApp {
                store: pg::open(&url, lease, &hooks).await?,
                processor,
                lease,
                hooks: hooks.clone(),
            };
            let completer = pg::completer(&app, complete_every);
            let nats = setting(&args, "--nats", "EDGE_NATS", "");
            // Every instance may run one: only the one holding the outbox's lock delivers.
            let _relay = start_relay(&app.store, &nats).await?;
            let stop = serve::Stop::install()?;
            let listener = tokio::net::TcpListener::bind(addr).await?;
            println!("listening on http://{}", listener.local_addr()?);
            println!(
                "claims and charges in PostgreSQL ({})",
                app.store.records_table()
            );
            let (router, drain) = pg::router(app, tokens, wait, exporter);
            serve::serve(
                listener,
                router.merge(test_routes(hooks)),
                drain,
                limits,
                stop,
            )
            .await?;
            drop(completer);
            return Ok(());
        }
        other => {
            return Err(format!(
                "--backend / EDGE_BACKEND: `{other}` is not a backend (local{})",
                if cfg!(feature = "postgres") {
                    ", postgres"
                } else {
                    "; postgres needs the edge service's feature postgres, on by default"
                }
            )
            .into());
        }
    }
    let mut builder = Store::builder()
        .table(charges::CHARGES)
        .lease(lease)
        .log_segment_bytes(segment_kb * 1024)
        .memory_budget(memory_mb.saturating_mul(1024 * 1024))
        .checkpoint_bytes((segment_kb * 1024).max(64 * 1024 * 1024));
    if let Some(clock) = &hooks.manual_clock {
        builder = builder.clock(clock.clone());
    }
    #[cfg(feature = "nats")]
    {
        builder = ship(builder, &args, &data.join("edge_service"))?;
    }
    let store = builder.open(data.join("edge_service"))?;
    let replayed = store.recovery_report().frames_replayed;
    let app = App {
        store: store.clone(),
        processor,
        lease,
        hooks,
    };

    // Charges whose request was abandoned (a processor timeout nobody retried, a crash after
    // the charge) are finished by the completer: it asks the processor what happened.
    let completer = {
        let app = app.clone();
        Completer::new(store.clone())
            .operation("POST /charges", move |claim| {
                charges::complete(app.clone(), claim)
            })
            .every(complete_every)
            .start()
    };

    let nats = setting(&args, "--nats", "EDGE_NATS", "");
    let _relay = start_relay(&store, &nats).await?;

    let stop = serve::Stop::install()?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!(
        "store in {} ({replayed} log frames replayed at open)",
        data.join("edge_service").display()
    );
    let (router, drain) = router(app, tokens, wait, exporter);
    serve::serve(listener, router, drain, limits, stop).await?;
    drop(completer);
    // What the stop leaves in the log is applied now, so the next start replays nothing.
    if let Err(e) = store.checkpoint() {
        tracing::warn!(error = %e, "the checkpoint at the stop failed; the next start replays the log");
    }
    println!("stopped");
    Ok(())
}

/// With `--ship URL` (feature `nats`), the store's log is shipped to the JetStream stream
/// named `--ship-stream` (`EDGE_SHIP_STREAM`, default `edge_service`), in `--ship-mode`
/// (`EDGE_SHIP_MODE`): `async` (the default), `sync` (refuse writes while NATS is away) or
/// `sync-fallback`. With `--restore` (`EDGE_RESTORE=1`) and no store in the data directory
/// yet, the store is first rebuilt from that stream, taking it over: how a new box replaces a
/// lost one.
#[cfg(feature = "nats")]
fn ship(
    builder: idemstore::Builder,
    args: &[String],
    dir: &std::path::Path,
) -> Result<idemstore::Builder, Box<dyn std::error::Error>> {
    use idemstore::{Shipping, Takeover, Unreachable};
    let url = setting(args, "--ship", "EDGE_SHIP", "");
    if url.is_empty() {
        return Ok(builder);
    }
    let name = setting(args, "--ship-stream", "EDGE_SHIP_STREAM", "edge_service");
    let mode = match setting(args, "--ship-mode", "EDGE_SHIP_MODE", "async").as_str() {
        "async" => Shipping::Async,
        "sync" => Shipping::Sync(Unreachable::Refuse),
        "sync-fallback" => Shipping::Sync(Unreachable::FallBack),
        other => {
            return Err(format!(
                "--ship-mode / EDGE_SHIP_MODE: `{other}` is not a mode (async, sync, sync-fallback)"
            )
            .into());
        }
    };
    let replica = idemstore::replica::JetStream::connect(&url, &name)?;
    let restore = args.iter().any(|a| a == "--restore")
        || std::env::var("EDGE_RESTORE").as_deref() == Ok("1");
    if restore && !dir.exists() {
        let restored = Store::restore(&replica, dir, Takeover::Yes)?;
        println!(
            "restored {} from stream {name} up to frame {} ({} frames replayed at open)",
            dir.display(),
            restored.last_frame,
            restored.frames
        );
    }
    Ok(builder.ship(replica, mode))
}

/// With `--nats URL`, a relay that publishes the outbox's `charges.created` events to the
/// JetStream stream `CHARGES` (made if missing, on `charges.>`), exactly once by message id.
/// Without it, none: the events wait in the outbox. `EDGE_NATS_STREAM` and
/// `EDGE_NATS_SUBJECT_PREFIX` rename the stream and put a prefix before every subject sent
/// (tests use their own, so that they never share a stream).
#[cfg(feature = "nats")]
async fn start_relay<B: idemstore::relay::Outbox>(
    store: &B,
    url: &str,
) -> Result<Option<idemstore::relay::Relay>, Box<dyn std::error::Error>> {
    if url.is_empty() {
        return Ok(None);
    }
    let stream = std::env::var("EDGE_NATS_STREAM").unwrap_or_else(|_| "CHARGES".to_owned());
    let prefix = std::env::var("EDGE_NATS_SUBJECT_PREFIX").unwrap_or_default();
    let client = async_nats::connect(url).await?;
    let jetstream = async_nats::jetstream::new(client);
    jetstream
        .get_or_create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}charges.>")],
            ..Default::default()
        })
        .await?;
    println!("publishing {prefix}charges.created to JetStream stream {stream} at {url}");
    let sink = Prefixed {
        inner: idemstore::relay::JetStreamSink::new(jetstream),
        prefix,
    };
    Ok(Some(idemstore::relay::Relay::start(
        store,
        sink,
        idemstore::relay::RelayConfig::default(),
    )))
}

/// The JetStream sink, with a prefix before each subject.
#[cfg(feature = "nats")]
struct Prefixed {
    inner: idemstore::relay::JetStreamSink,
    prefix: String,
}

#[cfg(feature = "nats")]
impl idemstore::relay::Sink for Prefixed {
    async fn deliver(&self, message: &idemstore::Message) -> Result<(), idemstore::BoxError> {
        if self.prefix.is_empty() {
            return self.inner.deliver(message).await;
        }
        let mut renamed = message.clone();
        renamed.subject = format!("{}{}", self.prefix, message.subject);
        self.inner.deliver(&renamed).await
    }
}

#[cfg(not(feature = "nats"))]
async fn start_relay<B>(store: &B, url: &str) -> Result<Option<()>, Box<dyn std::error::Error>> {
    let _ = store;
    if url.is_empty() {
        return Ok(None);
    }
    Err("--nats needs the edge service built with its feature nats (cargo run --release -p edge-service --features nats -- --nats URL)".into())
}
