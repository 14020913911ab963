//! The edge service stopped as a supervisor stops it (SIGTERM, SIGINT) while clients charge,
//! then started again on the same data: every charge answered 201 replays, no retry waits for
//! a lease, and the processor charged each key once.
//!
//! The children are this test binary re-executed to run only [`service_process`], as in
//! `http_service`. The second process runs on a manual clock that never moves: a key left in
//! progress would answer 409 to every retry, so a single 409 shows a retry waiting for a
//! lease.

use crate::common;

use crate::edge_service;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::service::Service;
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const ALICE: &str = "Bearer sk_test_alice";

/// Not a test: the service process the tests start (see the module docs).
#[test]
#[ignore = "the service process started by the other tests"]
fn service_process() {
    if std::env::var_os("EDGE_SERVICE_CHILD").is_some() {
        edge_service::main().expect("the service runs");
    }
}

fn start(data: &Path, env: &[(&str, &str)]) -> Result<Service, Box<dyn std::error::Error>> {
    Service::start(&crate::child_test!("service_process"), data, env)
}

/// What a client saw for one charge.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// 201: the charge's response, byte for byte.
    Created(Vec<u8>),
    /// Any other status.
    Status(u16),
    /// No answer: the connection was refused or closed (the listener is gone).
    NoAnswer,
}

fn charge(agent: &ureq::Agent, base: &str, key: &str) -> Seen {
    let sent = agent
        .post(format!("{base}/charges"))
        .header("authorization", ALICE)
        .header("idempotency-key", key)
        .content_type("application/json")
        .send(json!({"amount": 1900, "currency": "eur", "customer": "cus_42"}).to_string());
    match sent {
        Ok(mut answer) => match answer.status().as_u16() {
            201 => Seen::Created(answer.body_mut().read_to_vec().unwrap_or_default()),
            other => Seen::Status(other),
        },
        Err(_) => Seen::NoAnswer,
    }
}

/// A charge whose head and first half of body are sent now, and the rest by `finish`: admitted
/// by the service before a stop, claimed after it began.
struct HalfSent {
    stream: TcpStream,
    rest: &'static [u8],
}

const HALF_BODY: &[u8] = br#"{"amount": 1900, "currency": "eur", "#;
const REST_OF_BODY: &[u8] = br#""customer": "cus_42"}"#;

impl HalfSent {
    fn start(base: &str, key: &str) -> std::io::Result<HalfSent> {
        let mut stream = TcpStream::connect(base.trim_start_matches("http://"))?;
        let length = HALF_BODY.len() + REST_OF_BODY.len();
        write!(
            stream,
            "POST /charges HTTP/1.1\r\nHost: x\r\nAuthorization: {ALICE}\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        )?;
        stream.write_all(HALF_BODY)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(HalfSent {
            stream,
            rest: REST_OF_BODY,
        })
    }

    /// Sends the rest; the status line and the head of the answer.
    fn finish(mut self) -> std::io::Result<String> {
        self.stream.write_all(self.rest)?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 1024];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = self.stream.read(&mut buf)?;
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
        }
        Ok(String::from_utf8_lossy(&answer).into_owned())
    }
}

/// The processor's side effects: its ledger's lines.
fn side_effects(data: &Path) -> Result<usize, Box<dyn std::error::Error>> {
    Ok(
        std::fs::read_to_string(data.join("processor-ledger.jsonl"))?
            .lines()
            .filter(|l| !l.is_empty())
            .count(),
    )
}

/// Stops a service under load with `signal`, starts another on the same data, and retries
/// every key there.
fn stop_under_load(signal: &'static str) -> TestResult {
    let dir = tempfile::tempdir()?;
    // A 300 ms processor: the signal lands while charges are inside their handlers.
    let first = start(dir.path(), &[("EDGE_LATENCY_MS", "300")])?;
    let seen_addr = first.base.trim_start_matches("http://").to_owned();
    let clients = 24;
    let barrier = Arc::new(Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (agent, base, barrier) = (first.agent.clone(), first.base.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                // Two waves: one in flight at the signal, one arriving during the stop.
                if i % 2 == 1 {
                    std::thread::sleep(Duration::from_millis(150));
                }
                let key = format!("order-stop-{i:03}");
                let seen = charge(&agent, &base, &key);
                (key, seen)
            })
        })
        .collect();
    // Two more, admitted (their heads read) before the signal and claimed after it: their
    // first claims are given back, 503.
    let half_sent = [
        (
            "order-stop-half-1",
            HalfSent::start(&first.base, "order-stop-half-1")?,
        ),
        (
            "order-stop-half-2",
            HalfSent::start(&first.base, "order-stop-half-2")?,
        ),
    ];
    barrier.wait();
    std::thread::sleep(Duration::from_millis(100));
    let stopping = std::thread::spawn({
        let mut first = first;
        move || first.stop_with(signal).map_err(|e| e.to_string())
    });
    // Once the listener is gone the stop has begun: then the rest of the bodies go.
    let addr = seen_addr.clone();
    let deadline = std::time::Instant::now() + common::service::PATIENCE;
    while TcpStream::connect(&addr).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener never closed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut seen = BTreeMap::new();
    for (key, half) in half_sent {
        let head = half.finish()?;
        assert!(
            head.starts_with("HTTP/1.1 503")
                && head.to_ascii_lowercase().contains("retry-after: 1"),
            "{key}: claimed after the stop began, given back: {head}"
        );
        seen.insert(key.to_owned(), Seen::Status(503));
    }
    let status = stopping.join().map_err(|_| "the stopper panicked")??;
    assert!(status.success(), "a clean exit after SIG{signal}: {status}");
    for thread in threads {
        let (key, answer) = thread.join().map_err(|_| "a client panicked")?;
        seen.insert(key, answer);
    }
    let created = seen
        .values()
        .filter(|s| matches!(s, Seen::Created(_)))
        .count();
    assert!(created >= 1, "the charges in flight finished: {seen:?}");
    for answer in seen.values() {
        assert!(
            matches!(
                answer,
                Seen::Created(_) | Seen::Status(503) | Seen::NoAnswer
            ),
            "in flight: finished; arriving during the stop: 503 or no connection; {seen:?}"
        );
    }
    assert_eq!(
        side_effects(dir.path())?,
        created,
        "one charge at the processor for each 201, and none for the rest"
    );

    // The next process, on a clock that never moves: a key left in progress would be a 409.
    let second = start(dir.path(), &[("EDGE_MANUAL_CLOCK", "1")])?;
    for (key, before) in &seen {
        let again = charge(&second.agent, &second.base, key);
        match before {
            Seen::Created(body) => assert_eq!(&again, before, "{key}: replayed, {body:?}"),
            _ => assert!(
                matches!(again, Seen::Created(_)),
                "{key}: runs at once on the next process, no lease to wait for: {again:?}"
            ),
        }
    }
    assert_eq!(
        side_effects(dir.path())?,
        seen.len(),
        "each key charged exactly once across both processes"
    );
    Ok(())
}

#[test]
fn sigterm_under_load_finishes_in_flight_charges_and_frees_the_rest() -> TestResult {
    stop_under_load("TERM")
}

#[test]
fn sigint_stops_the_same_way() -> TestResult {
    stop_under_load("INT")
}

/// A handler still running at the drain limit is left in progress (its outcome is unknown):
/// the next process answers its retry 409 until the lease ends, then recovers it, charging
/// once.
#[test]
fn a_handler_past_the_drain_limit_is_left_in_progress_and_recovered_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let mut first = start(
        dir.path(),
        &[
            ("EDGE_PAUSE_AFTER_CHARGE", "1"),
            ("EDGE_DRAIN_SECS", "1"),
            ("EDGE_MANUAL_CLOCK", "1"),
        ],
    )?;
    let client = std::thread::spawn({
        let (agent, base) = (first.agent.clone(), first.base.clone());
        move || charge(&agent, &base, "order-stuck-1")
    });
    first.line_starting("PAUSED order-stuck-1")?;
    let status = first.stop_with("TERM")?;
    assert!(status.success(), "{status}");
    let seen = client.join().map_err(|_| "a client panicked")?;
    assert!(!matches!(seen, Seen::Created(_)), "{seen:?}");
    assert_eq!(side_effects(dir.path())?, 1, "the charge was made");

    let second = start(
        dir.path(),
        &[("EDGE_MANUAL_CLOCK", "1"), ("EDGE_LEASE_SECS", "30")],
    )?;
    assert_eq!(
        charge(&second.agent, &second.base, "order-stuck-1"),
        Seen::Status(409),
        "its outcome is unknown: in progress until the lease ends"
    );
    second.advance_clock(31)?;
    assert!(matches!(
        charge(&second.agent, &second.base, "order-stuck-1"),
        Seen::Created(_)
    ));
    assert_eq!(
        side_effects(dir.path())?,
        1,
        "recovered without a second charge"
    );
    Ok(())
}
