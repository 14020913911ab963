//! What only the real JetStream replica (`idemstore::replica::JetStream`, feature `nats`) can
//! show against a NATS server: frames stored once as the server counts them, frames larger
//! than a message, lost acknowledgements, what a snapshot leaves on the server, gaps, names,
//! and every call bounded when the server is down or silent. The contract both replicas keep
//! (order, one writer, take-overs, snapshots, a broker that forgets) is
//! `tests/suite/replica_contract.rs`.
//!
//! The server is `IDEMSTORE_NATS_URL` (default `nats://127.0.0.1:4222`). Each test uses a
//! stream name of its own and deletes the stream and buckets it made. An unreachable server
//! fails the tests, under `CI=true` and elsewhere alike; the message says how to start it.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use idemstore::Lineage;
use idemstore::replica::JetStream;
use idemstore::{Guarantee, Replica, ReplicaError, ReplicaSource, ShippedFrame};

use common::TestResult;
use common::frames::{frame, frames, store};
use common::nats::{unique, url};

/// The time limit the tests give the replica where they measure it.
const SHORT: Duration = Duration::from_secs(1);

/// A stream name of this test's own, whose stream and buckets are deleted at the end (even
/// when the test fails).
struct Scratch {
    name: String,
}

impl Scratch {
    fn new() -> Scratch {
        // Fails, saying how to start NATS, if it is unreachable: never a skip.
        common::nats::require();
        Scratch { name: unique("rj") }
    }

    /// A new replica handle on this stream.
    fn replica(&self) -> Result<JetStream, ReplicaError> {
        JetStream::connect(&url(), &self.name)
    }

    /// Runs `f` with a JetStream context of the test's own (to look at, or tamper with, what
    /// the server holds).
    fn inspect<T>(&self, f: impl AsyncFnOnce(async_nats::jetstream::Context) -> T) -> T {
        common::nats::runtime().block_on(async { f(common::nats::connect().await).await })
    }

    fn stream(&self) -> String {
        format!("IDEMSTORE_LOG_{}", self.name)
    }

    fn subject(&self) -> String {
        format!("idemstore.log.{}", self.name)
    }

    /// How many messages the log stream holds.
    fn messages(&self) -> Result<u64, Box<dyn std::error::Error>> {
        let stream = self.stream();
        self.inspect(async move |js| -> Result<u64, Box<dyn std::error::Error>> {
            let mut stream = js.get_stream(stream).await?;
            Ok(stream.info().await?.state.messages)
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        common::nats::drop_replica(&self.name);
    }
}

/// Every frame after `after`, as `frames_after` gives them, and the last frame it returns.
fn read_after(
    source: &JetStream,
    after: u64,
) -> Result<(Vec<(ShippedFrame, Lineage)>, u64), ReplicaError> {
    let mut read = Vec::new();
    let last = source.frames_after(after, &mut |frame, guarantee| {
        read.push((frame, guarantee));
        Ok(())
    })?;
    Ok((read, last))
}

fn seqs(read: &[(ShippedFrame, Lineage)]) -> Vec<u64> {
    read.iter().map(|(f, _)| f.seq).collect()
}

/// The contract's re-send case reads the frames back; here the server's own count shows
/// that no duplicate message was stored either (a read could skip one).
#[test]
fn frames_sent_again_are_stored_once_on_the_server() -> TestResult {
    let scratch = Scratch::new();
    let replica = scratch.replica()?;
    replica.claim(&store("/stores/a", 1), 0)?;
    replica.publish(&frames(1..=3), &Lineage::of(Guarantee::Complete))?;
    replica.publish(&frames(2..=5), &Lineage::of(Guarantee::Complete))?;
    replica.publish(&frames(1..=5), &Lineage::of(Guarantee::Complete))?;
    assert_eq!(scratch.messages()?, 5);
    drop(replica);
    let restarted = scratch.replica()?;
    restarted.claim(&store("/stores/a", 2), 0)?;
    restarted.publish(&frames(3..=7), &Lineage::of(Guarantee::Complete))?;
    assert_eq!(scratch.messages()?, 7);
    Ok(())
}

/// A TCP proxy to NATS that can hold back everything the server sends (acknowledgements
/// lost, as far as the client can tell) while still forwarding what the client sends.
struct AckHolder {
    addr: SocketAddr,
    holding: Arc<AtomicBool>,
}

impl AckHolder {
    fn start() -> Result<AckHolder, Box<dyn std::error::Error>> {
        let upstream = url();
        let upstream = upstream
            .trim_start_matches("nats://")
            .split(',')
            .next()
            .unwrap_or_default()
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let holding = Arc::new(AtomicBool::new(false));
        let hold = holding.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    return;
                };
                let (Ok(client_reader), Ok(server_reader)) =
                    (client.try_clone(), server.try_clone())
                else {
                    return;
                };
                std::thread::spawn(move || pipe(client_reader, server, None));
                let hold = hold.clone();
                std::thread::spawn(move || pipe(server_reader, client, Some(hold)));
            }
        });
        Ok(AckHolder { addr, holding })
    }

    fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    fn hold(&self, holding: bool) {
        self.holding.store(holding, Ordering::SeqCst);
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, hold: Option<Arc<AtomicBool>>) {
    let mut buffer = vec![0; 64 << 10];
    loop {
        let n = match from.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while hold.as_ref().is_some_and(|h| h.load(Ordering::SeqCst)) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buffer[..n]).is_err() {
            return;
        }
    }
}

#[test]
fn a_batch_whose_acknowledgements_were_lost_is_stored_once_when_sent_again() -> TestResult {
    let scratch = Scratch::new();
    let proxy = AckHolder::start()?;
    let replica = JetStream::connect(&proxy.url(), &scratch.name)?.timeout(SHORT);
    replica.claim(&store("/stores/a", 1), 0)?;
    replica.publish(&frames(1..=2), &Lineage::of(Guarantee::Complete))?;

    // The server stores 3..=5 but the client never hears so: a connection gone silent.
    proxy.hold(true);
    let started = Instant::now();
    let lost = replica.publish(&frames(3..=5), &Lineage::of(Guarantee::Complete));
    assert!(
        matches!(lost, Err(ReplicaError::Unreachable { .. })),
        "{lost:?}"
    );
    assert!(
        started.elapsed() < 2 * SHORT,
        "publish took {:?}",
        started.elapsed()
    );
    // A snapshot too gives up within the limit, and commits nothing.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("snapshot.redb");
    write_file(&file, b"database")?;
    let started = Instant::now();
    let silent = replica.snapshot(2, &file, &Lineage::of(Guarantee::Complete));
    assert!(
        matches!(silent, Err(ReplicaError::Unreachable { .. })),
        "{silent:?}"
    );
    assert!(
        started.elapsed() < 2 * SHORT,
        "snapshot took {:?}",
        started.elapsed()
    );
    proxy.hold(false);
    assert_eq!(scratch.messages()?, 5);

    // Sent again with one more: duplicates acknowledged, the new frame fenced after them.
    replica.publish(&frames(3..=6), &Lineage::of(Guarantee::Complete))?;
    assert_eq!(scratch.messages()?, 6);
    replica.publish(&frames(7..=7), &Lineage::of(Guarantee::Complete))?;
    let (read, last) = read_after(&replica, 0)?;
    assert_eq!((seqs(&read), last), ((1..=7).collect(), 7));
    assert_eq!(replica.fetch_snapshot(&dir.path().join("fetched"))?, None);
    Ok(())
}

#[test]
fn a_frame_larger_than_a_message_round_trips_in_chunks() -> TestResult {
    let scratch = Scratch::new();
    let replica = scratch.replica()?;
    replica.claim(&store("/stores/a", 1), 0)?;
    let large = ShippedFrame {
        seq: 2,
        payload: Arc::new(common::incompressible((3 << 20) + 17)),
    };
    let batch = vec![frame(1), large.clone(), frame(3)];
    replica.publish(&batch, &Lineage::of(Guarantee::Complete))?;
    // Sent again: its chunks are duplicates too.
    replica.publish(&batch, &Lineage::of(Guarantee::Complete))?;
    assert!(scratch.messages()? > 3, "the large frame was not split");

    let (read, last) = read_after(&scratch.replica()?, 0)?;
    assert_eq!(last, 3);
    assert_eq!(
        read.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>(),
        batch
    );
    let (read, _) = read_after(&replica, 1)?;
    assert_eq!(read.first().map(|(f, _)| f), Some(&large));
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

/// The contract's snapshot case reads what is left; here the server shows it: the purged
/// frames' messages and the older snapshot's object are gone from the streams.
#[test]
fn a_snapshot_leaves_on_the_server_only_what_it_does_not_cover() -> TestResult {
    let scratch = Scratch::new();
    let dir = tempfile::tempdir()?;
    let replica = scratch.replica()?;
    replica.claim(&store("/stores/a", 1), 0)?;
    replica.publish(&frames(1..=5), &Lineage::of(Guarantee::MayLag))?;
    let file = dir.path().join("snapshot-3.redb");
    write_file(&file, &common::incompressible((2 << 20) + 5))?;
    replica.snapshot(3, &file, &Lineage::of(Guarantee::MayLag))?;
    assert_eq!(scratch.messages()?, 2, "frames 4 and 5 are kept");

    replica.publish(&frames(6..=6), &Lineage::of(Guarantee::Complete))?;
    let file = dir.path().join("snapshot-6.redb");
    write_file(&file, b"the database at frame 6")?;
    replica.snapshot(6, &file, &Lineage::of(Guarantee::Complete))?;
    assert_eq!(scratch.messages()?, 0);
    let bucket = format!("OBJ_IDEMSTORE_SNAP_{}", scratch.name);
    let objects = scratch.inspect(async move |js| -> Result<u64, Box<dyn std::error::Error>> {
        let mut stream = js.get_stream(bucket).await?;
        Ok(stream.info().await?.state.messages)
    })?;
    assert_eq!(objects, 2, "one chunk and one metadata message are left");
    Ok(())
}

#[test]
fn a_gap_in_the_stream_is_corrupt_naming_the_missing_frames() -> TestResult {
    let scratch = Scratch::new();
    let replica = scratch.replica()?;
    replica.claim(&store("/stores/a", 1), 0)?;
    replica.publish(&frames(1..=3), &Lineage::of(Guarantee::Complete))?;

    // Frame 6 appended by hand: frames 4 and 5 are missing.
    let subject = scratch.subject();
    scratch.inspect(async move |js| -> Result<(), Box<dyn std::error::Error>> {
        let mut headers = HeaderMap::new();
        headers.insert("Idemstore-Seq", "6");
        headers.insert("Idemstore-Guarantee", "complete");
        headers.insert("Idemstore-Writer", "someone");
        js.publish_with_headers(subject, headers, "frame 6".into())
            .await?
            .await?;
        Ok(())
    })?;

    let gap = read_after(&replica, 0);
    let Err(ReplicaError::Corrupt { detail }) = &gap else {
        panic!("a gap was read through: {gap:?}");
    };
    assert!(detail.contains("frames 4 to 5"), "{detail}");
    Ok(())
}

#[test]
fn a_restore_from_a_stream_that_does_not_exist_names_it() -> TestResult {
    let scratch = Scratch::new();
    let replica = scratch.replica()?;
    let missing = read_after(&replica, 0);
    let Err(ReplicaError::Refused { detail }) = &missing else {
        panic!("{missing:?}");
    };
    assert!(detail.contains(&scratch.stream()), "{detail}");
    let dir = tempfile::tempdir()?;
    let fetched = replica.fetch_snapshot(&dir.path().join("s.redb"));
    assert!(
        matches!(fetched, Err(ReplicaError::Refused { .. })),
        "{fetched:?}"
    );
    Ok(())
}

#[test]
fn an_invalid_stream_name_is_refused_clearly() {
    let refused = JetStream::connect(&url(), "orders.eu");
    let Err(ReplicaError::Refused { detail }) = &refused else {
        panic!("{refused:?}");
    };
    assert!(detail.contains("A-Z, a-z, 0-9, _ and -"), "{detail}");
}

#[tokio::test(flavor = "current_thread")]
async fn calls_from_inside_a_tokio_runtime_do_not_block_on_it() -> TestResult {
    let scratch = Scratch::new();
    let replica = scratch.replica()?;
    replica.claim(&store("/stores/a", 1), 0)?;
    replica.publish(&frames(1..=2), &Lineage::of(Guarantee::Complete))?;
    let (read, _) = read_after(&replica, 0)?;
    assert_eq!(seqs(&read), vec![1, 2]);
    Ok(())
}

/// One of the replica's calls, by name.
type Call<'a> = (&'static str, Box<dyn Fn() -> Result<(), ReplicaError> + 'a>);

/// Every call of `replica` fails as unreachable within about two time limits.
fn every_call_is_unreachable_in_time(replica: &JetStream) -> TestResult {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("snapshot.redb");
    std::fs::write(&file, b"database")?;
    let calls: Vec<Call<'_>> = vec![
        (
            "claim",
            Box::new(|| replica.claim(&store("/stores/a", 1), 0).map(drop)),
        ),
        (
            "frames_after",
            Box::new(|| read_after(replica, 0).map(drop)),
        ),
        (
            "latest_snapshot",
            Box::new(|| replica.latest_snapshot().map(drop)),
        ),
        (
            "fetch_snapshot",
            Box::new(|| replica.fetch_snapshot(&dir.path().join("f")).map(drop)),
        ),
        (
            "take_over",
            Box::new(|| replica.take_over(&store("/stores/b", 2), 0, 0).map(drop)),
        ),
    ];
    for (name, call) in calls {
        let started = Instant::now();
        let answer = call();
        let took = started.elapsed();
        assert!(
            matches!(answer, Err(ReplicaError::Unreachable { .. })),
            "{name}: {answer:?}"
        );
        assert!(
            took < 2 * SHORT + Duration::from_millis(500),
            "{name} took {took:?}"
        );
    }
    Ok(())
}

#[test]
fn a_server_that_is_down_is_unreachable_within_the_time_limit() -> TestResult {
    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let replica =
        JetStream::connect(&format!("nats://127.0.0.1:{port}"), &unique("down"))?.timeout(SHORT);
    every_call_is_unreachable_in_time(&replica)
}

#[test]
fn a_server_that_accepts_and_stays_silent_is_unreachable_within_the_time_limit() -> TestResult {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let held = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for socket in listener.incoming().flatten() {
            keep.lock().push(socket); // open, and never a byte
        }
    });
    let started = Instant::now();
    let replica = JetStream::connect(&format!("nats://{addr}"), &unique("silent"))?.timeout(SHORT);
    assert!(started.elapsed() < SHORT, "connect waited for the server");
    every_call_is_unreachable_in_time(&replica)?;
    assert!(
        !held.lock().is_empty(),
        "the client never connected to the silent server"
    );
    Ok(())
}
