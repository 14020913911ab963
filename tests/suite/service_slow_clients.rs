//! Slow clients against the real edge service: connections that send their headers a byte at a
//! time, or nothing, are closed at the header timeout; connections past the cap are closed at
//! once; and a normal client's charge is answered as quickly as without them.
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

#[test]
fn slow_and_surplus_connections_are_closed_while_normal_requests_keep_their_latency() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let service = Service::start(
        &crate::child_test!("service_process"),
        dir.path(),
        &[
            ("EDGE_LATENCY_MS", "5"),
            ("EDGE_HEADER_TIMEOUT_SECS", "1"),
            ("EDGE_MAX_CONNECTIONS", "40"),
        ],
    )?;
    let addr = service.base.trim_start_matches("http://").to_owned();
    let alone = charge_took(&service, "order-slow-0001")?;

    // Thirty slow clients: under the cap, so the normal client still gets a connection.
    let opened = Instant::now();
    let mut slow: Vec<TcpStream> = (0..30)
        .map(|_| slow_connection(&addr))
        .collect::<Result<_, _>>()?;
    // A byte every 200 ms on the first ten: trickling does not reset the timeout.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(200));
        for stream in &mut slow[..10] {
            let _ = stream.write_all(b"X");
        }
    }
    let beside = charge_took(&service, "order-slow-0002")?;
    assert!(
        beside < alone + Duration::from_millis(500),
        "a normal charge beside the slow clients took {beside:?}, alone {alone:?}"
    );

    // Every slow connection is closed at the header timeout (1 s), with a bound for a busy
    // machine; none of them before it.
    let deadline = opened + Duration::from_secs(5);
    for (i, stream) in slow.iter_mut().enumerate() {
        assert!(
            closed_by(stream, deadline),
            "slow connection {i} still open"
        );
    }
    assert!(
        opened.elapsed() >= Duration::from_secs(1),
        "closed before the timeout"
    );

    // Past the cap: 40 idle connections hold every slot; the 41st is closed at once.
    let held: Vec<TcpStream> = (0..40)
        .map(|_| slow_connection(&addr))
        .collect::<Result<_, _>>()?;
    std::thread::sleep(Duration::from_millis(100));
    let mut surplus = slow_connection(&addr)?;
    assert!(
        closed_by(&mut surplus, Instant::now() + Duration::from_millis(800)),
        "a connection past the cap is closed before the header timeout"
    );
    drop(held);
    // The slots come back: once the held ones are gone, charges are served again.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match charge_took(&service, "order-slow-0003") {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
