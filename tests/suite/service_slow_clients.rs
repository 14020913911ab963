//! Slow clients against the real edge service: connections that send their headers a byte at a
//! time, or nothing, are closed at the header timeout (and not before); connections past the
//! cap are closed at once; and a normal client's charge is answered as quickly as without them.
//!
//! The child is this test binary re-executed to run only [`service_process`], as in
//! `http_service`. The timeout under test is the server's own, in real time: the test waits for
//! it with a bound, as a client would.

use crate::common;

use crate::edge_service;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::service::Service;
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Not a test: the service process the tests start (see the module docs).
#[test]
#[ignore = "the service process started by the other tests"]
fn service_process() {
    if std::env::var_os("EDGE_SERVICE_CHILD").is_some() {
        edge_service::main().expect("the service runs");
    }
}

/// A connection that sent the start of a request head and then stalls.
fn slow_connection(addr: &str) -> std::io::Result<TcpStream> {
    let mut stream = TcpStream::connect(addr)?;
    stream.write_all(b"POST /charges HTTP/1.1\r\nHost: x\r\n")?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(stream)
}

/// Whether the server closed `stream` (a read sees the end, or a reset) before `deadline`.
fn closed_by(stream: &mut TcpStream, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    if stream
        .set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .is_err()
    {
        return false;
    }
    let mut buf = [0u8; 512];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            // A 408 or similar before the close is fine: keep reading to the end.
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
}

fn charge_took(service: &Service, key: &str) -> Result<Duration, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let answer = service
        .agent
        .post(format!("{}/charges", service.base))
        .header("authorization", "Bearer sk_test_alice")
        .header("idempotency-key", key)
        .content_type("application/json")
        .send(json!({"amount": 100, "currency": "eur", "customer": "cus_1"}).to_string())?;
    assert_eq!(answer.status().as_u16(), 201);
    Ok(started.elapsed())
}

/// Whether `stream` is still open: a read that does not wait finds nothing yet.
fn still_open(stream: &mut TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    let open =
        matches!(stream.read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    open && stream.set_nonblocking(false).is_ok()
}

#[test]
fn slow_connections_are_closed_at_the_header_timeout_while_normal_requests_keep_their_latency()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let service = Service::start(
        &crate::child_test!("service_process"),
        dir.path(),
        &[("EDGE_LATENCY_MS", "5"), ("EDGE_HEADER_TIMEOUT_SECS", "1")],
    )?;
    let addr = service.base.trim_start_matches("http://").to_owned();
    let alone = charge_took(&service, "order-slow-0001")?;

    let opened = Instant::now();
    let mut silent: Vec<TcpStream> = (0..20)
        .map(|_| slow_connection(&addr))
        .collect::<Result<_, _>>()?;
    let mut trickling: Vec<TcpStream> = (0..10)
        .map(|_| slow_connection(&addr))
        .collect::<Result<_, _>>()?;
    let beside = charge_took(&service, "order-slow-0002")?;
    assert!(
        beside < alone + Duration::from_millis(500),
        "a normal charge beside the slow clients took {beside:?}, alone {alone:?}"
    );
    // None is closed before the timeout (a busy machine fires a timer late, never early).
    std::thread::sleep(Duration::from_millis(500).saturating_sub(opened.elapsed()));
    for (i, stream) in silent.iter_mut().enumerate() {
        assert!(
            still_open(stream),
            "silent connection {i} closed before the timeout"
        );
    }
    // A byte every 200 ms for 3 s: if each byte restarted the timer, these would stay open.
    let mut closed = vec![None; trickling.len()];
    while opened.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(200));
        for (i, stream) in trickling.iter_mut().enumerate() {
            if closed[i].is_none() && (stream.write_all(b"X").is_err() || !still_open(stream)) {
                closed[i] = Some(opened.elapsed());
            }
        }
    }
    for (i, when) in closed.iter().enumerate() {
        assert!(
            when.is_some(),
            "trickling connection {i} still open after 3 s: the timeout restarts on each byte"
        );
    }
    // Every silent one is closed too, within a bound for a busy machine.
    let deadline = opened + Duration::from_secs(6);
    for (i, stream) in silent.iter_mut().enumerate() {
        assert!(
            closed_by(stream, deadline),
            "silent connection {i} still open"
        );
    }
    Ok(())
}

#[test]
fn connections_past_the_cap_are_closed_at_once_and_the_slots_come_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    // A long header timeout, so that only the cap can close a connection here.
    let service = Service::start(
        &crate::child_test!("service_process"),
        dir.path(),
        &[
            ("EDGE_LATENCY_MS", "5"),
            ("EDGE_HEADER_TIMEOUT_SECS", "30"),
            ("EDGE_MAX_CONNECTIONS", "8"),
        ],
    )?;
    let addr = service.base.trim_start_matches("http://").to_owned();
    let mut held: Vec<TcpStream> = (0..8)
        .map(|_| slow_connection(&addr))
        .collect::<Result<_, _>>()?;
    // Served: each held connection is open (the cap counts it).
    std::thread::sleep(Duration::from_millis(200));
    for (i, stream) in held.iter_mut().enumerate() {
        assert!(still_open(stream), "held connection {i} closed");
    }
    let mut surplus = slow_connection(&addr)?;
    assert!(
        closed_by(&mut surplus, Instant::now() + Duration::from_secs(10)),
        "a connection past the cap is closed long before the 30 s header timeout"
    );
    drop(held);
    // The slots come back once the held connections are gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match charge_took(&service, "order-cap-0001") {
            Ok(_) => break,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
