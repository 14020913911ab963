//! The outbox's cost and the relay's speed.
//!
//! `cargo bench --bench outbox --features nats` (about a minute):
//!
//! 1. pairs/s from 64 client threads without the outbox, and with one message published per
//!    commit while a relay drains it to a sink that accepts everything: three alternating
//!    runs of 3 s each, medians and their ratio (issue 14's target: ≥ 0.8×);
//! 2. the relay's throughput into JetStream: 20,000 committed messages drained from a stopped
//!    start, messages/s;
//! 3. commit-to-stream latency: one client committing a message every 2 ms while the relay
//!    delivers to JetStream; p50 and p99 from the commit's timestamp to the stream's ack.
//!
//! Parts 2 and 3 need NATS JetStream on `IDEMSTORE_NATS_URL` (default
//! `nats://127.0.0.1:4222`); without it they are skipped, saying why.
//!
//! With `--features nats,postgres,testing`, a part 4 does part 1 on the PostgreSQL backend
//! (`IDEMSTORE_PG_URL`, default the machine's `test` database): 16 client tasks, without the
//! outbox and with one message per commit while a relay drains it, three alternating runs of
//! 3 s, medians and their ratio.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{BODY, ORDERS, ROW, scope};
use idemstore::relay::{JetStreamSink, Relay, RelayConfig, Sink};
use idemstore::{Begin, BoxError, Clock, Fingerprint, Message, Response, Store, SystemClock};
use parking_lot::Mutex;

const CLIENTS: u64 = 64;

/// Accepts everything.
struct Accept;

impl Sink for Accept {
    async fn deliver(&self, _message: &Message) -> Result<(), BoxError> {
        Ok(())
    }
}

/// One pair, with `publish` messages in its commit.
fn pair(store: &Store, i: u64, publish: bool) {
    let key = format!("k{i:012}");
    let Begin::Claimed(claim) = store
        .begin(
            &scope(i, key.clone()),
            Fingerprint::of_bytes(key.as_bytes()),
        )
        .expect("begin")
    else {
        panic!("{key} was not new");
    };
    claim
        .commit(move |tx| {
            tx.insert(&ORDERS, key.as_str(), ROW.as_slice())?;
            if publish {
                tx.publish("orders.created", ROW.to_vec())?;
            }
            Ok(Response::new(201, BODY.to_vec()))
        })
        .expect("commit");
}

fn pairs_per_s(store: &Store, publish: bool, duration: Duration) -> f64 {
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    pair(store, next.fetch_add(1, Ordering::Relaxed), publish);
                }
            });
        }
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
    });
    next.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn open(dir: &std::path::Path) -> Store {
    Store::builder().table(ORDERS).open(dir).expect("open")
}

/// Records commit-to-ack latency of each message it delivers.
struct Timed {
    inner: JetStreamSink,
    latencies: Arc<Mutex<Vec<u64>>>,
}

impl Sink for Timed {
    async fn deliver(&self, message: &Message) -> Result<(), BoxError> {
        self.inner.deliver(message).await?;
        let now = SystemClock.now().as_millis();
        self.latencies
            .lock()
            .push(now.saturating_sub(message.committed_at.as_millis()));
        Ok(())
    }
}

async fn jetstream() -> Result<async_nats::jetstream::Context, String> {
    let url =
        std::env::var("IDEMSTORE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    match tokio::time::timeout(Duration::from_secs(3), async_nats::connect(&url)).await {
        Ok(Ok(client)) => Ok(async_nats::jetstream::new(client)),
        Ok(Err(e)) => Err(format!("{url}: {e}")),
        Err(_) => Err(format!("{url}: no answer within 3 s")),
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let duration = Duration::from_secs(3);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let dir = tempfile::tempdir().expect("dir");
        let store = open(dir.path());
        without.push(pairs_per_s(&store, false, duration));
        drop(store);
        let dir = tempfile::tempdir().expect("dir");
        let store = open(dir.path());
        let relay =
            runtime.block_on(async { Relay::start(&store, Accept, RelayConfig::default()) });
        with.push(pairs_per_s(&store, true, duration));
        let delivered = relay.stats().delivered;
        runtime.block_on(relay.stop());
        println!(
            "  run: without {:.0} pairs/s, with the outbox {:.0} pairs/s ({delivered} delivered meanwhile)",
            without.last().copied().unwrap_or(0.0),
            with.last().copied().unwrap_or(0.0)
        );
    }
    let (a, b) = (median(without), median(with));
    println!(
        "pairs/s at {CLIENTS} clients: without the outbox {a:.0}, with one message per commit {b:.0}: {:.2}x (target >= 0.8x)",
        b / a
    );

    #[cfg(all(feature = "postgres", feature = "testing"))]
    pg::pairs_with_and_without(&runtime, duration);

    let js = match runtime.block_on(jetstream()) {
        Ok(js) => js,
        Err(why) => {
            println!("JetStream parts skipped: NATS unreachable ({why})");
            return;
        }
    };
    let stream = format!("IDEMSTORE_BENCH_{}", std::process::id());
    runtime
        .block_on(js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec!["orders.created".into()],
            ..Default::default()
        }))
        .expect("a stream");

    // Throughput: 20,000 messages committed, then drained.
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path());
    let n = 20_000;
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        break;
                    }
                    pair(&store, i, true);
                }
            });
        }
    });
    let started = Instant::now();
    let relay = runtime.block_on(async {
        Relay::start(
            &store,
            JetStreamSink::new(js.clone()),
            RelayConfig::default(),
        )
    });
    while store.exact_stats().expect("stats").outbox_pending > 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    runtime.block_on(relay.stop());
    println!(
        "relay into JetStream: {n} messages in {:.2} s, {rate:.0} messages/s",
        started.elapsed().as_secs_f64()
    );
    drop(store);

    // Latency: one client, a commit every 2 ms, 2,000 commits.
    let dir = tempfile::tempdir().expect("dir");
    let store = open(dir.path());
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let sink = Timed {
        inner: JetStreamSink::new(js.clone()),
        latencies: latencies.clone(),
    };
    let relay = runtime.block_on(async {
        Relay::start(
            &store,
            sink,
            RelayConfig::default().idle_poll(Duration::from_millis(1)),
        )
    });
    for i in 0..2_000 {
        pair(&store, 1_000_000 + i, true);
        std::thread::sleep(Duration::from_millis(2));
    }
    while store.exact_stats().expect("stats").outbox_pending > 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    runtime.block_on(relay.stop());
    let mut all = latencies.lock().clone();
    all.sort_unstable();
    let at = |p: f64| all[((all.len() as f64 - 1.0) * p) as usize];
    println!(
        "commit to JetStream ack, 1 client: p50 {} ms, p99 {} ms ({} messages, millisecond clock)",
        at(0.5),
        at(0.99),
        all.len()
    );
    let _ = runtime.block_on(js.delete_stream(&stream));
}

/// Part 4: the outbox's cost on the PostgreSQL backend.
#[cfg(all(feature = "postgres", feature = "testing"))]
mod pg {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use idemstore::relay::{Relay, RelayConfig};
    use idemstore::sqlx::{self, AssertSqlSafe};
    use idemstore::testing::postgres::{database_url, drop_prefixes, unique_prefix};
    use idemstore::{Begin, Fingerprint, PgStore, Protocol, Response, Scope, Sweep};

    use super::{Accept, BODY, ROW, median};

    const CLIENTS: u64 = 16;

    async fn open(prefix: &str) -> Result<PgStore, idemstore::BoxError> {
        let store = PgStore::builder(&database_url())
            .prefix(prefix)
            .pool_size(CLIENTS as u32)
            .sweep(Sweep::Off)
            .open()
            .await?;
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {prefix}orders (id text PRIMARY KEY, body bytea NOT NULL)"
        )))
        .execute(store.pool())
        .await?;
        Ok(store)
    }

    async fn pair(store: &PgStore, insert: &str, i: u64, publish: bool) {
        let key = format!("k{i:012}");
        let scope = Scope::new("t", "create_order", &key).expect("scope");
        let begun = store
            .begin(&scope, Fingerprint::of_bytes(key.as_bytes()))
            .await
            .expect("begin");
        let Begin::Claimed(claim) = begun else {
            panic!("{key} was not new");
        };
        let mut tx = claim.transaction().await.expect("transaction");
        sqlx::query(AssertSqlSafe(insert.to_owned()))
            .bind(&key)
            .bind(&ROW[..])
            .execute(tx.conn())
            .await
            .expect("row");
        if publish {
            tx.publish("orders.created", ROW.to_vec()).expect("publish");
        }
        tx.commit(Response::new(201, BODY.to_vec()))
            .await
            .expect("commit");
    }

    async fn run(store: &PgStore, prefix: &str, publish: bool, duration: Duration) -> f64 {
        let insert: Arc<str> =
            format!("INSERT INTO {prefix}orders (id, body) VALUES ($1, $2)").into();
        let next = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (store, insert) = (store.clone(), insert.clone());
                let (next, stop) = (next.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        pair(
                            &store,
                            &insert,
                            next.fetch_add(1, Ordering::Relaxed),
                            publish,
                        )
                        .await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(duration).await;
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.expect("a client task");
        }
        next.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
    }

    pub(super) fn pairs_with_and_without(runtime: &tokio::runtime::Runtime, duration: Duration) {
        let (mut without, mut with) = (Vec::new(), Vec::new());
        let mut prefixes = Vec::new();
        for _ in 0..3 {
            let opened = runtime.block_on(async {
                let plain = unique_prefix("ob_plain");
                let store = open(&plain).await?;
                let rate = run(&store, &plain, false, duration).await;
                let outbox = unique_prefix("ob_outbox");
                let published = open(&outbox).await?;
                let relay = Relay::start(&published, Accept, RelayConfig::default());
                let with_rate = run(&published, &outbox, true, duration).await;
                let delivered = relay.stats().delivered;
                relay.stop().await;
                Ok::<_, idemstore::BoxError>((plain, outbox, rate, with_rate, delivered))
            });
            let (plain, outbox, rate, with_rate, delivered) = match opened {
                Ok(run) => run,
                Err(e) => {
                    println!("PostgreSQL part skipped: {e}");
                    return;
                }
            };
            println!(
                "  PostgreSQL run: without {rate:.0} pairs/s, with the outbox {with_rate:.0} pairs/s ({delivered} delivered meanwhile)"
            );
            without.push(rate);
            with.push(with_rate);
            prefixes.extend([plain, outbox]);
        }
        let (a, b) = (median(without), median(with));
        println!(
            "PostgreSQL pairs/s at {CLIENTS} clients: without the outbox {a:.0}, with one message per commit {b:.0}: {:.2}x",
            b / a
        );
        drop_prefixes(&database_url(), prefixes);
    }
}
