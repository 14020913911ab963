//! A ledger fed by the edge service's `charges.created` events, each applied exactly once.
//!
//! `cargo run --release -p edge-service --bin ledger-consumer` pulls from the JetStream stream `CHARGES`
//! through a durable consumer `ledger`, applies every event to a ledger in its own embedded
//! store (`./ledger-data`) through the inbox ([`Store::consume`](idemstore::Store::consume)),
//! acks after the commit, and serves the totals on `GET http://127.0.0.1:3001/totals`. Run
//! the edge service with `-- --nats nats://127.0.0.1:4222` beside it.
//!
//! Settings (flag or environment variable):
//!
//! | flag | env | default |
//! | --- | --- | --- |
//! | `--nats` | `LEDGER_NATS` | `nats://127.0.0.1:4222` |
//! | `--stream` | `LEDGER_STREAM` | `CHARGES` (made, on `--subject`, if missing) |
//! | `--subject` | `LEDGER_SUBJECT` | `charges.created` |
//! | `--durable` | `LEDGER_DURABLE` | `ledger` (the consumer's name on the server, and the inbox's) |
//! | `--ack-wait-ms` | `LEDGER_ACK_WAIT_MS` | `30000` (how long the server waits for an ack before redelivering) |
//! | `--data` | `LEDGER_DATA` | `./ledger-data` |
//! | `--addr` | `LEDGER_ADDR` | `127.0.0.1:3001` |
//!
//! Test hook, for the test that kills this process between commit and ack:
//! `LEDGER_HANG_AFTER=N` prints `COMMITTED <id>` after the Nth event this process applies and
//! hangs before acking it.

mod ledger;
mod pull;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use idemstore::Store;

use pull::{Counters, Hang};

/// How long the inbox remembers an event: far beyond any redelivery (the server redelivers
/// an unacked event after `--ack-wait-ms`), so a late duplicate is still recognized.
const INBOX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Clone)]
struct App {
    store: Store,
    counters: Arc<Counters>,
}

/// `--name value` from the command line, else `ENV`, else the default.
fn setting(args: &[String], flag: &str, env: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(env).ok())
        .unwrap_or_else(|| default.to_owned())
}

/// Opens the ledger, connects to JetStream, consumes in the background and serves the totals.
#[tokio::main]
pub async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = setting(&args, "--nats", "LEDGER_NATS", "nats://127.0.0.1:4222");
    let stream_name = setting(&args, "--stream", "LEDGER_STREAM", "CHARGES");
    let subject = setting(&args, "--subject", "LEDGER_SUBJECT", "charges.created");
    let durable = setting(&args, "--durable", "LEDGER_DURABLE", "ledger");
    let ack_wait = setting(&args, "--ack-wait-ms", "LEDGER_ACK_WAIT_MS", "30000")
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| "--ack-wait-ms / LEDGER_ACK_WAIT_MS: not a number of milliseconds")?;
    let data = std::path::PathBuf::from(setting(&args, "--data", "LEDGER_DATA", "./ledger-data"));
    let addr = setting(&args, "--addr", "LEDGER_ADDR", "127.0.0.1:3001");
    let hang = match std::env::var("LEDGER_HANG_AFTER") {
        Ok(n) => Hang::AfterApplying(n.parse().map_err(|_| "LEDGER_HANG_AFTER: not a number")?),
        Err(_) => Hang::Never,
    };

    let store = Store::builder()
        .table(ledger::ENTRIES)
        .table(ledger::TOTALS)
        .ttl(INBOX_TTL)
        .open(&data)?;

    let client = async_nats::connect(&url).await.map_err(|e| {
        format!(
            "cannot reach NATS at {url} ({e}); start it with `nats-server -js`, or pass --nats URL"
        )
    })?;
    let js = jetstream::new(client);
    let stream = js
        .get_or_create_stream(stream::Config {
            name: stream_name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await?;
    let consumer: consumer::PullConsumer = stream
        .get_or_create_consumer(
            &durable,
            consumer::pull::Config {
                durable_name: Some(durable.clone()),
                filter_subject: subject.clone(),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait,
                ..Default::default()
            },
        )
        .await?;
    let counters = Arc::new(Counters::default());
    tokio::spawn(pull::run(
        store.clone(),
        consumer,
        durable.clone(),
        counters.clone(),
        hang,
    ));

    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    println!(
        "consuming {subject} from stream {stream_name} as {durable}; ledger in {}",
        data.display()
    );
    let app = Router::new()
        .route("/totals", get(totals))
        .with_state(App { store, counters });
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// `GET /totals`: the ledger per currency, the number of charges in it, and what this process
/// did since it started.
async fn totals(State(app): State<App>) -> Response {
    let store = app.store.clone();
    let read =
        tokio::task::spawn_blocking(move || ledger::totals(&store).map_err(|e| e.to_string()))
            .await;
    let (currencies, charges) = match read {
        Ok(Ok(totals)) => totals,
        Ok(Err(e)) => return (StatusCode::SERVICE_UNAVAILABLE, e).into_response(),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    let c = &app.counters;
    Json(serde_json::json!({
        "currencies": currencies,
        "charges": charges,
        "this_process": {
            "applied": c.applied.load(Ordering::Relaxed),
            "replayed": c.replayed.load(Ordering::Relaxed),
            "refused": c.refused.load(Ordering::Relaxed),
            "retried": c.retried.load(Ordering::Relaxed),
        },
    }))
    .into_response()
}
