//! A sink that is down is not a message that fails: while the sink answers `Unavailable`,
//! the relay pauses every subject, counts no attempt and dead-letters nothing, then delivers
//! everything in order when it comes back. A poison message in the middle of an outage still
//! reaches the dead letters after its own `max_attempts`.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{ORDERS, TestResult, builder, clock, fp, scope};
use idemstore::relay::{Relay, RelayConfig, Sink, Unavailable};
use idemstore::testing::wait;
use idemstore::{Begin, BoxError, Message, Response, Store};
use parking_lot::Mutex;

/// Down for its first `outage` calls (answering `Unavailable`), then up; refuses messages
/// whose payload is `poison` whenever it is up.
struct Flaky {
    outage: u32,
    calls: AtomicU32,
    accepted: Mutex<Vec<Message>>,
    refused: AtomicU32,
}

struct Handle(Arc<Flaky>);

impl Sink for Handle {
    async fn deliver(&self, message: &Message) -> Result<(), BoxError> {
        let this = &self.0;
        if this.calls.fetch_add(1, Ordering::SeqCst) < this.outage {
            return Err(Unavailable::new("connection refused").into());
        }
        if message.payload == b"poison" {
            this.refused.fetch_add(1, Ordering::SeqCst);
            return Err("the broker refuses this message".into());
        }
        this.accepted.lock().push(message.clone());
        Ok(())
    }
}

/// Quick retries, `max_attempts` as given.
fn fast(max_attempts: u32) -> RelayConfig {
    RelayConfig::default()
        .max_attempts(max_attempts)
        .backoff(Duration::from_millis(1), Duration::from_millis(4))
        .idle_poll(Duration::from_millis(1))
}

/// Commits one order per payload, each publishing its payload on `subject`.
fn commit_all(store: &Store, subject: &str, payloads: &[&str]) -> TestResult {
    for (i, payload) in payloads.iter().enumerate() {
        let key = format!("{subject}-{i}");
        let Begin::Claimed(claim) = store.begin(&scope(&key), fp(&key))? else {
            return Err(format!("{key} was not new").into());
        };
        let (subject, payload, row) = (subject.to_owned(), payload.to_string(), key.clone());
        claim.commit(move |tx| {
            tx.insert(&ORDERS, row.as_str(), "placed")?;
            tx.publish(&subject, payload.into_bytes())?;
            Ok(Response::new(201, vec![]))
        })?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_dead_letters_nothing_and_keeps_order() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path())?;
    let payloads: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let payloads: Vec<&str> = payloads.iter().map(String::as_str).collect();
    commit_all(&store, "a.created", &payloads[..10])?;
    commit_all(&store, "b.created", &payloads[10..])?;

    // 40 calls refused, with max_attempts 3: counted per message, this would dead-letter
    // the head of each subject many times over.
    let sink = Arc::new(Flaky {
        outage: 40,
        calls: AtomicU32::new(0),
        accepted: Mutex::default(),
        refused: AtomicU32::new(0),
    });
    let relay = Relay::start(&store, Handle(sink.clone()), fast(3));
    wait::eventually("all 20 messages delivered", || async {
        Ok(sink.accepted.lock().len() == 20)
    })
    .await?;
    let stats = relay.stats();
    relay.stop().await;

    let accepted: Vec<String> = sink
        .accepted
        .lock()
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    let in_subject = |prefix: &str| -> Vec<String> {
        sink.accepted
            .lock()
            .iter()
            .filter(|m| m.subject.starts_with(prefix))
            .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
            .collect()
    };
    assert_eq!(
        accepted.len(),
        20,
        "everything delivered once: {accepted:?}"
    );
    assert_eq!(
        in_subject("a."),
        payloads[..10],
        "subject a in commit order"
    );
    assert_eq!(
        in_subject("b."),
        payloads[10..],
        "subject b in commit order"
    );
    assert!(
        store.dead_letters(10)?.is_empty(),
        "an outage dead-letters nothing"
    );
    assert_eq!(stats.unavailable, 40, "{stats:?}");
    assert_eq!(stats.dead_lettered, 0, "{stats:?}");
    assert_eq!(
        stats.retried, 0,
        "no message attempt was counted: {stats:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_still_dead_lettered_after_an_outage() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path())?;
    commit_all(&store, "c.created", &["first", "poison", "last"])?;
    let sink = Arc::new(Flaky {
        outage: 25,
        calls: AtomicU32::new(0),
        accepted: Mutex::default(),
        refused: AtomicU32::new(0),
    });
    let relay = Relay::start(&store, Handle(sink.clone()), fast(3));
    wait::eventually("two messages delivered and one dead-lettered", || async {
        Ok(sink.accepted.lock().len() == 2 && store.dead_letters(1).is_ok_and(|d| !d.is_empty()))
    })
    .await?;
    relay.stop().await;
    let accepted: Vec<Vec<u8>> = sink
        .accepted
        .lock()
        .iter()
        .map(|m| m.payload.clone())
        .collect();
    assert_eq!(accepted, [b"first".to_vec(), b"last".to_vec()]);
    let dead = store.dead_letters(10)?;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].message.payload, b"poison");
    assert_eq!(dead[0].attempts, 3, "only the message's own refusals count");
    assert_eq!(sink.refused.load(Ordering::SeqCst), 3);
    Ok(())
}

/// Hangs past the attempt timeout on its first `hangs` calls, then accepts.
struct Hanging {
    hangs: u32,
    calls: AtomicU32,
    accepted: Mutex<Vec<Message>>,
}

struct HangingHandle(Arc<Hanging>);

impl Sink for HangingHandle {
    async fn deliver(&self, message: &Message) -> Result<(), BoxError> {
        if self.0.calls.fetch_add(1, Ordering::SeqCst) < self.0.hangs {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        self.0.accepted.lock().push(message.clone());
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_does_not_answer_is_down_not_the_message() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path())?;
    commit_all(&store, "d.created", &["one", "two"])?;
    let sink = Arc::new(Hanging {
        hangs: 5,
        calls: AtomicU32::new(0),
        accepted: Mutex::default(),
    });
    let config = fast(2).attempt_timeout(Duration::from_millis(20));
    let relay = Relay::start(&store, HangingHandle(sink.clone()), config);
    wait::eventually("both messages delivered", || async {
        Ok(sink.accepted.lock().len() == 2)
    })
    .await?;
    let stats = relay.stats();
    relay.stop().await;
    let accepted: Vec<Vec<u8>> = sink
        .accepted
        .lock()
        .iter()
        .map(|m| m.payload.clone())
        .collect();
    assert_eq!(accepted, [b"one".to_vec(), b"two".to_vec()], "{stats:?}");
    assert!(
        store.dead_letters(10)?.is_empty(),
        "five timeouts, max_attempts 2"
    );
    assert_eq!(stats.unavailable, 5, "{stats:?}");
    Ok(())
}
