//! Exactly once across a queue, with real processes killed by SIGKILL and a real JetStream:
//!
//! - the edge service (its outbox and relay), killed at random moments while clients charge:
//!   the stream ends up with exactly one `charges.created` per committed charge, by id;
//! - the ledger consumer (its inbox), killed between its commit and its ack: JetStream
//!   redelivers, and the ledger applies each event once, its totals the sum of the charges.
//!
//! Each test makes its own stream, subjects and durable consumer, and deletes the stream.
//! NATS must be up (see `common::nats`): an unreachable server fails the tests.

#![cfg(unix)]

use crate::common;

use crate::edge_service;
#[path = "../../examples/edge-service/src/bin/ledger-consumer/main.rs"]
#[allow(dead_code, unreachable_pub)]
mod ledger_consumer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use idemstore::Store;
use idemstore::redb::{ReadableTable, TableDefinition};
use parking_lot::Mutex;
use serde_json::Value;

use common::TestResult;
use common::nats::{connect, unique, url};
use common::service::{PATIENCE, Service};

/// The edge service's charges table, read after its last run.
const CHARGES: TableDefinition<&str, &[u8]> = TableDefinition::new("charges");
const ADMIN: &str = "Bearer admin-secret";

/// Not a test: the edge service process the tests start.
#[test]
#[ignore = "the service process started by the other tests"]
fn service_process() {
    if std::env::var_os("EDGE_SERVICE_CHILD").is_some() {
        edge_service::main().expect("the service runs");
    }
}

/// Not a test: the ledger consumer process the tests start.
#[test]
#[ignore = "the consumer process started by the other tests"]
fn ledger_process() {
    if std::env::var_os("LEDGER_CHILD").is_some() {
        ledger_consumer::main().expect("the consumer runs");
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// A seed for this run's random moments, printed so a failure can be read back.
fn seed() -> u64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(7, |d| d.as_nanos() as u64);
    println!("seed {seed}");
    seed
}

/// xorshift: enough randomness for when to kill.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Every message in `stream`, as (its `Nats-Msg-Id`, its payload).
async fn stream_messages(
    js: &jetstream::Context,
    name: &str,
) -> Result<Vec<(String, Vec<u8>)>, Box<dyn std::error::Error>> {
    let mut stream = js.get_stream(name).await?;
    let state = stream.info().await?.state.clone();
    let mut out = Vec::new();
    if state.messages == 0 {
        return Ok(out);
    }
    for seq in state.first_sequence..=state.last_sequence {
        let message = stream.get_raw_message(seq).await?;
        let id = message
            .headers
            .get("Nats-Msg-Id")
            .ok_or(format!("stream message {seq} has no Nats-Msg-Id"))?
            .to_string();
        out.push((id, message.payload.to_vec()));
    }
    Ok(out)
}

/// Charges until the service goes away; records the ids of the charges it answered 201.
fn charge_until_killed(
    base: &str,
    tenant: &str,
    prefix: &str,
    answered: &Mutex<HashSet<String>>,
) -> usize {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    for i in 0.. {
        let body = format!(
            r#"{{"amount": {}, "currency": "eur", "customer": "cus_{i}"}}"#,
            100 + i
        );
        let sent = agent
            .post(format!("{base}/charges"))
            .header("authorization", format!("Bearer {tenant}"))
            .header("idempotency-key", format!("{prefix}-{i}"))
            .content_type("application/json")
            .send(body.as_str());
        let Ok(mut response) = sent else {
            return i; // killed
        };
        if response.status().as_u16() == 201
            && let Ok(text) = response.body_mut().read_to_string()
            && let Ok(json) = serde_json::from_str::<Value>(&text)
            && let Some(id) = json["id"].as_str()
        {
            answered.lock().insert(id.to_owned());
        }
    }
    unreachable!()
}

#[test]
fn sigkilled_edge_service_leaves_exactly_one_event_per_charge_in_the_stream() -> TestResult {
    let rt = runtime()?;
    let js = rt.block_on(connect());
    let name = unique("IDEMSTORE_KILL_OUTBOX");
    let prefix = format!("{}.", name.to_lowercase());
    rt.block_on(js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![format!("{prefix}charges.>")],
        duplicate_window: Duration::from_secs(600),
        ..Default::default()
    }))?;
    let dir = tempfile::tempdir()?;
    let url = url();
    let env = [
        ("EDGE_NATS", url.as_str()),
        ("EDGE_NATS_STREAM", name.as_str()),
        ("EDGE_NATS_SUBJECT_PREFIX", prefix.as_str()),
        ("EDGE_LATENCY_MS", "1"),
        ("EDGE_ADMIN_TOKEN", "admin-secret"),
    ];
    let mut random = seed();
    let answered = Arc::new(Mutex::new(HashSet::new()));
    const ROUNDS: usize = 5;
    for round in 0..ROUNDS {
        let service = Service::start(&crate::child_test!("service_process"), dir.path(), &env)?;
        let clients: Vec<_> = ["sk_test_alice", "sk_test_bob", "sk_test_alice"]
            .into_iter()
            .enumerate()
            .map(|(c, tenant)| {
                let (base, answered) = (service.base.clone(), answered.clone());
                std::thread::spawn(move || {
                    charge_until_killed(&base, tenant, &format!("r{round}-c{c}"), &answered)
                })
            })
            .collect();
        let wait = 150 + next(&mut random) % 600;
        std::thread::sleep(Duration::from_millis(wait));
        service.kill()?;
        let sent: Vec<usize> = clients
            .into_iter()
            .map(|c| c.join().map_err(|_| "a client panicked"))
            .collect::<Result<_, _>>()?;
        println!("round {round}: killed after {wait} ms; requests sent per client {sent:?}");
    }

    // A last run with no clients: the relay sends what the kills left in the outbox.
    let service = Service::start(&crate::child_test!("service_process"), dir.path(), &env)?;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut answer = service
            .agent
            .get(format!("{}/stats", service.base))
            .header("authorization", ADMIN)
            .call()?;
        let stats: Value = serde_json::from_str(&answer.body_mut().read_to_string()?)?;
        if stats["store"]["outbox_pending"].as_u64() == Some(0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not drain the outbox: {stats}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    service.kill()?;

    // The charges the store committed.
    let store = Store::builder()
        .table(CHARGES)
        .open(dir.path().join("edge_service"))?;
    let mut committed = HashMap::new();
    for row in store.read()?.open_table(CHARGES)?.iter()? {
        let (_, charge) = row?;
        let charge: Value = serde_json::from_slice(charge.value())?;
        let id = charge["id"]
            .as_str()
            .ok_or("a charge without id")?
            .to_owned();
        committed.insert(id, charge);
    }
    let answered = answered.lock().clone();
    assert!(
        answered.len() >= ROUNDS,
        "too few charges to test anything: {}",
        answered.len()
    );
    let lost: Vec<_> = answered
        .iter()
        .filter(|id| !committed.contains_key(*id))
        .collect();
    assert!(
        lost.is_empty(),
        "charges answered 201 but not in the store: {lost:?}"
    );

    // The stream: one event per committed charge, by the outbox's id and by the charge's.
    let messages = rt.block_on(stream_messages(&js, &name))?;
    let mut by_message_id = HashSet::new();
    let mut by_charge: HashMap<String, usize> = HashMap::new();
    for (id, payload) in &messages {
        assert!(
            by_message_id.insert(id.clone()),
            "message {id} twice in the stream"
        );
        let charge: Value = serde_json::from_slice(payload)?;
        let charge_id = charge["id"].as_str().ok_or("an event without charge id")?;
        *by_charge.entry(charge_id.to_owned()).or_default() += 1;
        assert_eq!(
            committed.get(charge_id),
            Some(&charge),
            "an event for a charge the store does not hold as sent"
        );
    }
    let doubled: Vec<_> = by_charge.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        doubled.is_empty(),
        "charges with several events: {doubled:?}"
    );
    let missing: Vec<_> = committed
        .keys()
        .filter(|id| !by_charge.contains_key(*id))
        .collect();
    assert!(
        missing.is_empty(),
        "committed charges with no event: {missing:?}"
    );
    assert_eq!(messages.len(), committed.len());
    println!(
        "{} charges committed ({} answered 201 before a kill), {} events in the stream",
        committed.len(),
        answered.len(),
        messages.len()
    );
    rt.block_on(js.delete_stream(&name))?;
    Ok(())
}

#[test]
fn sigkilled_consumer_between_commit_and_ack_applies_each_charge_once() -> TestResult {
    let rt = runtime()?;
    let js = rt.block_on(connect());
    let name = unique("IDEMSTORE_KILL_INBOX");
    let subject = format!("{}.charges.created", name.to_lowercase());
    rt.block_on(js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        ..Default::default()
    }))?;
    // The events, as the edge service's relay publishes them.
    const EVENTS: u64 = 80;
    let mut expected: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    rt.block_on(async {
        for i in 0..EVENTS {
            let currency = if i % 3 == 0 { "usd" } else { "eur" };
            let amount = 100 + i * 7;
            let e = expected.entry(currency).or_default();
            e.0 += 1;
            e.1 += amount;
            let charge = serde_json::json!({
                "id": format!("ch_{i:04}"), "amount": amount, "currency": currency,
                "customer": "cus_1", "processor_charge": format!("pc_{i}"), "attempt": 1,
            });
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", format!("evt-{i}").as_str());
            js.publish_with_headers(subject.clone(), headers, charge.to_string().into())
                .await?
                .await?;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;

    let dir = tempfile::tempdir()?;
    let data = dir.path().join("ledger");
    let data = data.to_str().ok_or("path")?;
    let url = url();
    let mut env = vec![
        ("LEDGER_CHILD", "1"),
        ("LEDGER_NATS", url.as_str()),
        ("LEDGER_STREAM", name.as_str()),
        ("LEDGER_SUBJECT", subject.as_str()),
        ("LEDGER_DURABLE", "ledger"),
        ("LEDGER_DATA", data),
        ("LEDGER_ADDR", "127.0.0.1:0"),
        // Redelivery of an unacked event half a second after the kill.
        ("LEDGER_ACK_WAIT_MS", "500"),
    ];
    let mut random = seed();
    let mut killed_before_ack = Vec::new();
    for round in 0..5 {
        let hang = (1 + next(&mut random) % 12).to_string();
        let mut with_hang = env.clone();
        with_hang.push(("LEDGER_HANG_AFTER", hang.as_str()));
        let consumer = Service::spawn(&crate::child_test!("ledger_process"), &with_hang)?;
        let line = consumer.line_starting("COMMITTED ")?;
        let id = line["COMMITTED ".len()..].trim().to_owned();
        consumer.kill()?;
        println!("round {round}: killed after applying {hang}, before acking {id}");
        killed_before_ack.push(id);
    }

    // A last run with no hang applies the rest; the killed events come back and are replayed.
    env.retain(|(k, _)| *k != "LEDGER_HANG_AFTER");
    let consumer = Service::spawn(&crate::child_test!("ledger_process"), &env)?;
    let deadline = Instant::now() + PATIENCE;
    let totals = loop {
        let mut answer = consumer
            .agent
            .get(format!("{}/totals", consumer.base))
            .call()?;
        let totals: Value = serde_json::from_str(&answer.body_mut().read_to_string()?)?;
        let drained = rt.block_on(async {
            let mut c: jetstream::consumer::PullConsumer = js
                .get_stream(&name)
                .await?
                .get_consumer("ledger")
                .await
                .map_err(|e| e.to_string())?;
            let info = c.info().await?;
            Ok::<_, Box<dyn std::error::Error>>(info.num_pending == 0 && info.num_ack_pending == 0)
        })?;
        if drained && totals["charges"].as_u64() == Some(EVENTS) {
            break totals;
        }
        assert!(
            Instant::now() < deadline,
            "the consumer did not catch up: {totals}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // Let anything still in flight land, then read again: nothing more may be applied.
    std::thread::sleep(Duration::from_millis(700));
    let mut answer = consumer
        .agent
        .get(format!("{}/totals", consumer.base))
        .call()?;
    let again: Value = serde_json::from_str(&answer.body_mut().read_to_string()?)?;
    assert_eq!(
        again["currencies"], totals["currencies"],
        "applied after catching up"
    );
    consumer.kill()?;

    for (currency, (count, amount)) in &expected {
        let got = &totals["currencies"][*currency];
        assert_eq!(
            (got["count"].as_u64(), got["amount"].as_u64()),
            (Some(*count), Some(*amount)),
            "{currency}: the ledger applied each charge once ({totals})"
        );
    }
    assert_eq!(totals["charges"].as_u64(), Some(EVENTS), "{totals}");
    assert!(
        again["this_process"]["replayed"].as_u64() >= Some(1),
        "the last run saw no redelivery of an applied event: {again} (killed before ack: {killed_before_ack:?})"
    );
    rt.block_on(js.delete_stream(&name))?;
    Ok(())
}
