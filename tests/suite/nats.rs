//! The outbox and the inbox against a real NATS JetStream server (feature `nats`).
//!
//! The server is `IDEMSTORE_NATS_URL` (default `nats://127.0.0.1:4222`). Each test makes its
//! own stream and subjects and deletes them. An unreachable server fails the tests, under
//! `CI=true` and elsewhere alike; the message says how to start it.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{AckKind, consumer, stream};
use futures_util::StreamExt;
use idemstore::relay::{JetStreamSink, Relay, RelayConfig, Sink};
use idemstore::{Begin, BoxError, Execution, Fingerprint, Message, Response};

use common::nats::{connect, unique};
use common::{ORDERS, TestResult, builder, clock, fp, order_count, scope};

/// JetStream, but the first attempt of every message "loses" the stream's ack after the
/// stream stored it: what a crash or a timeout between publish and settlement looks like to
/// the relay, which then publishes it again.
struct AckLost {
    inner: JetStreamSink,
    seen: parking_lot::Mutex<HashSet<String>>,
    lost: AtomicU32,
}

/// The sink the relay holds; the test keeps the other handle.
struct Wrapper(Arc<AckLost>);

impl Sink for Wrapper {
    async fn deliver(&self, message: &Message) -> Result<(), BoxError> {
        let this = &self.0;
        this.inner.deliver(message).await?;
        if this.seen.lock().insert(message.id.clone()) {
            this.lost.fetch_add(1, Ordering::Relaxed);
            return Err("the ack was lost after the stream stored the message".into());
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_message_is_in_the_stream_exactly_once_despite_redeliveries() -> TestResult
{
    let js = connect().await;
    let name = unique("IDEMSTORE_OUTBOX");
    let subject = format!("{}.charges.created", name.to_lowercase());
    let mut stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![format!("{}.>", name.to_lowercase())],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await?;

    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path())?;
    let mut committed = HashSet::new();
    for i in 0..40 {
        let key = format!("charge-{i}");
        let Begin::Claimed(claim) = store.begin(&scope(&key), fp(&key))? else {
            return Err(format!("{key} was not new").into());
        };
        let (subject, ids) = (subject.clone(), Arc::new(parking_lot::Mutex::new(None)));
        let out = ids.clone();
        claim.commit(move |tx| {
            tx.insert(&ORDERS, key.as_str(), "charged")?;
            *out.lock() = Some(tx.publish(&subject, format!("{{\"n\":{i}}}"))?);
            Ok(Response::new(201, vec![]))
        })?;
        committed.insert(ids.lock().clone().ok_or("no id")?);
    }

    let sink = Arc::new(AckLost {
        inner: JetStreamSink::new(js.clone()),
        seen: parking_lot::Mutex::default(),
        lost: AtomicU32::new(0),
    });
    let config = RelayConfig::default()
        .backoff(Duration::from_millis(1), Duration::from_millis(10))
        .idle_poll(Duration::from_millis(2));
    let relay = Relay::start(&store, Wrapper(sink.clone()), config);
    for _ in 0..2_000 {
        if store.exact_stats()?.outbox_pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = relay.stats();
    relay.stop().await;
    assert_eq!(store.exact_stats()?.outbox_pending, 0, "the outbox drained");
    assert_eq!(
        sink.lost.load(Ordering::Relaxed),
        40,
        "each message was published twice"
    );
    assert_eq!(stats.delivered, 40, "{stats:?}");

    // The stream: one message per commit, by stable id.
    let info = stream.info().await?.state.messages;
    assert_eq!(info, 40, "JetStream kept one copy of each");
    let mut in_stream = HashSet::new();
    for seq in 1..=info {
        let m = stream.get_raw_message(seq).await?;
        let id = m
            .headers
            .get("Nats-Msg-Id")
            .ok_or("a message without Nats-Msg-Id")?
            .to_string();
        assert!(in_stream.insert(id), "a duplicate in the stream");
    }
    assert_eq!(in_stream, committed);
    js.delete_stream(&name).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_applies_each_redelivered_message_once_commit_then_ack() -> TestResult {
    let js = connect().await;
    let name = unique("IDEMSTORE_INBOX");
    let subject = format!("{}.charges.created", name.to_lowercase());
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            ..Default::default()
        })
        .await?;
    let mut total = 0u64;
    for i in 1..=20u64 {
        total += i * 100;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("charge-{i}").as_str());
        js.publish_with_headers(subject.clone(), headers, (i * 100).to_string().into())
            .await?
            .await?;
    }
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("ledger".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await?;

    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path())?;
    let applied = Arc::new(AtomicU64::new(0));
    let mut acked = HashSet::new();
    let mut crashed_before_ack = HashSet::new();
    let mut rounds = 0;
    while acked.len() < 20 {
        rounds += 1;
        assert!(rounds < 200, "the consumer made no progress");
        let mut batch = consumer
            .fetch()
            .max_messages(10)
            .expires(Duration::from_millis(500))
            .messages()
            .await?;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| e.to_string())?;
            let id = message
                .headers
                .as_ref()
                .and_then(|h| h.get("Nats-Msg-Id"))
                .ok_or("no id")?
                .to_string();
            let amount: u64 = std::str::from_utf8(&message.payload)?.parse()?;
            let (applied, key) = (applied.clone(), id.clone());
            let outcome = store
                .consume_async(
                    "ledger",
                    &id,
                    Fingerprint::of_bytes(&message.payload),
                    move |tx| {
                        applied.fetch_add(amount, Ordering::SeqCst);
                        tx.insert(&ORDERS, key.as_str(), "applied")?;
                        Ok(Response::new(200, vec![]))
                    },
                )
                .await?;
            assert!(
                matches!(outcome, Execution::Executed(_) | Execution::Replay(_)),
                "{outcome:?}"
            );
            // The first delivery of each "crashes" after the commit and before the ack: the
            // broker delivers it again (a nak makes that immediate).
            if crashed_before_ack.insert(id.clone()) {
                message
                    .ack_with(AckKind::Nak(None))
                    .await
                    .map_err(|e| e.to_string())?;
            } else {
                message.ack().await.map_err(|e| e.to_string())?;
                acked.insert(id);
            }
        }
    }
    assert_eq!(
        applied.load(Ordering::SeqCst),
        total,
        "the ledger applied each charge once"
    );
    assert_eq!(order_count(&store)?, 20);
    js.delete_stream(&name).await?;
    Ok(())
}
