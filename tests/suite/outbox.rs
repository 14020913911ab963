//! The outbox and the inbox on the local store: messages commit with the business writes,
//! the relay delivers each at least once in commit order per subject through faults, gives
//! poison messages up to the dead letters, and the inbox applies each message once.

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::{ORDERS, TestResult, builder, clock, fp, order_count, scope};
use idemstore::relay::{Relay, RelayConfig, Sink};
use idemstore::testing::{SimDisk, Tear, wait};
use idemstore::{Begin, BoxError, Execution, Fingerprint, Message, MessageError, Response, Store};
use parking_lot::Mutex;

/// Records every message it accepts, in order.
#[derive(Default)]
struct Recorder {
    accepted: Mutex<Vec<Message>>,
}

/// A sink the test keeps a handle on.
struct Shared<T>(Arc<T>);

impl Sink for Shared<Recorder> {
    async fn deliver(&self, message: &Message) -> Result<(), BoxError> {
        self.0.accepted.lock().push(message.clone());
        Ok(())
    }
}

/// A sink that fails, times out and stalls on purpose, deterministically by message id: each
/// message fails its first `id_hash % 3` attempts (one in five of those by hanging past the
/// attempt timeout), every fourth message is slow, and messages whose payload is `poison`
/// always fail.
#[derive(Default)]
struct Faulty {
    accepted: Mutex<Vec<Message>>,
    attempts: Mutex<HashMap<String, u32>>,
    failures: AtomicU64,
}

impl Sink for Shared<Faulty> {
    async fn deliver(&self, message: &Message) -> Result<(), BoxError> {
        let this = &self.0;
        let attempt = {
            let mut attempts = this.attempts.lock();
            let n = attempts.entry(message.id.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let h = message
            .id
            .bytes()
            .fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        if message.payload == b"poison" {
            this.failures.fetch_add(1, Ordering::Relaxed);
            return Err("the broker refuses this message".into());
        }
        if attempt <= h % 3 {
            this.failures.fetch_add(1, Ordering::Relaxed);
            if h % 5 == 0 {
                // Past the attempt timeout: the relay gives up on this attempt and aborts it.
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            return Err(format!("attempt {attempt} refused").into());
        }
        if h % 4 == 0 {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        this.accepted.lock().push(message.clone());
        Ok(())
    }
}

fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .max_attempts(4)
        .backoff(Duration::from_millis(1), Duration::from_millis(8))
        .attempt_timeout(Duration::from_millis(200))
        .idle_poll(Duration::from_millis(2))
}

/// Claims `key` and commits an order row plus `messages` (subject, payload) in one commit.
fn commit_with_messages(
    store: &Store,
    key: &str,
    messages: Vec<(String, Vec<u8>)>,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let Begin::Claimed(claim) = store.begin(&scope(key), fp(key))? else {
        return Err(format!("{key} was not new").into());
    };
    let ids = Arc::new(Mutex::new(Vec::new()));
    let out = ids.clone();
    let owned = key.to_owned();
    claim.commit(move |tx| {
        tx.insert(&ORDERS, owned.as_str(), "placed")?;
        for (subject, payload) in messages {
            out.lock().push(tx.publish(&subject, payload)?);
        }
        Ok(Response::new(201, vec![]))
    })?;
    let ids = ids.lock().clone();
    Ok(ids)
}

#[test]
fn messages_commit_with_the_business_writes_or_not_at_all() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path())?;

    let ids = commit_with_messages(
        &store,
        "a",
        vec![
            ("orders.placed".into(), b"1".to_vec()),
            ("orders.placed".into(), b"2".to_vec()),
        ],
    )
    .map_err(|e| e.to_string())?;
    let Some(idemstore::Record { .. }) = store.get(&scope("a"))? else {
        return Err("no record".into());
    };
    // Stable ids: the claim's downstream key and the index in the commit.
    assert_eq!(ids.len(), 2);
    assert!(ids[0].ends_with("-0") && ids[1].ends_with("-1"), "{ids:?}");
    assert_eq!(ids[0].trim_end_matches("-0"), ids[1].trim_end_matches("-1"));

    // A commit whose closure fails after publishing keeps neither its row nor its message.
    let Begin::Claimed(claim) = store.begin(&scope("b"), fp("b"))? else {
        return Err("b was not new".into());
    };
    let failed = claim.commit(|tx| {
        tx.insert(&ORDERS, "b", "placed")?;
        tx.publish("orders.placed", b"b".to_vec())?;
        Err("the card was declined".into())
    });
    assert!(failed.is_err());
    let stats = store.exact_stats()?;
    assert_eq!(stats.outbox_pending, 2, "only a's two messages");
    assert_eq!(order_count(&store)?, 1);

    // Outside a commit there is no key to derive ids from: refused, nothing written.
    let refused = store.write(|tx| {
        tx.insert(&ORDERS, "w", "x")?;
        tx.publish("orders.placed", b"w".to_vec())?;
        Ok(())
    });
    let message = refused.expect_err("publish in write").to_string();
    assert!(message.contains("publish needs a commit"), "{message}");

    // A bad subject is refused with what is wrong, and the commit aborts.
    let err = commit_with_messages(&store, "c", vec![("bad subject".into(), vec![])])
        .expect_err("a subject with a space");
    assert!(err.to_string().contains("whitespace"), "{err}");
    let stats = store.exact_stats()?;
    assert_eq!((stats.outbox_pending, order_count(&store)?), (2, 1));
    let _ = MessageError::NotInCommit; // the variant the write above was refused with
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_delivers_every_message_in_commit_order_per_subject() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path())?;
    let recorder = Arc::new(Recorder::default());
    let relay = Relay::start(&store, Shared(recorder.clone()), relay_config());

    // 16 threads commit 25 orders each, each order publishing to one of three subjects.
    let writers: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || -> Result<(), String> {
                for i in 0..25 {
                    let subject = format!("orders.s{}", (t + i) % 3);
                    commit_with_messages(&store, &format!("t{t}-{i}"), vec![(subject, vec![1])])
                        .map_err(|e| e.to_string())?;
                }
                Ok(())
            })
        })
        .collect();
    for w in writers {
        w.join().map_err(|_| "a writer panicked")??;
    }
    wait::eventually("400 messages delivered", || async {
        Ok(recorder.accepted.lock().len() >= 400)
    })
    .await?;
    wait::eventually("the outbox empty", || async {
        Ok(store.exact_stats().is_ok_and(|s| s.outbox_pending == 0))
    })
    .await?;
    relay.stop().await;

    let accepted = recorder.accepted.lock().clone();
    let ids: HashSet<&str> = accepted.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(
        ids.len(),
        400,
        "every message, each once with a healthy sink"
    );
    assert_eq!(accepted.len(), 400);
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for m in &accepted {
        let previous = last.insert(&m.subject, m.seq);
        assert!(
            previous < Some(m.seq),
            "{} delivered after a later message",
            m.id
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_failures_timeouts_and_stalls_nothing_is_lost_or_reordered_and_poison_dies()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path())?;
    let sink = Arc::new(Faulty::default());
    let relay = Relay::start(&store, Shared(sink.clone()), relay_config());

    let mut poison_ids = Vec::new();
    for i in 0..120 {
        let payload = if i % 40 == 7 {
            b"poison".to_vec()
        } else {
            vec![i as u8]
        };
        let ids = commit_with_messages(
            &store,
            &format!("k{i}"),
            vec![(format!("ledger.s{}", i % 4), payload.clone())],
        )
        .map_err(|e| e.to_string())?;
        if payload == b"poison" {
            poison_ids.extend(ids);
        }
    }
    wait::eventually("all settled", || async {
        Ok(store
            .exact_stats()
            .is_ok_and(|s| s.outbox_pending == 0 && s.dead_letters == 3))
    })
    .await?;
    let stats = relay.stats();
    relay.stop().await;

    let accepted = sink.accepted.lock().clone();
    // At least once: every good message accepted; its first acceptance in commit order.
    let mut first: Vec<&Message> = Vec::new();
    let mut seen = HashSet::new();
    for m in &accepted {
        if seen.insert(m.id.clone()) {
            first.push(m);
        }
    }
    assert_eq!(first.len(), 117, "every message but the 3 poison ones");
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for m in &first {
        let previous = last.insert(&m.subject, m.seq);
        assert!(
            previous < Some(m.seq),
            "{} overtook an earlier message",
            m.id
        );
    }
    assert!(
        sink.failures.load(Ordering::Relaxed) > 20,
        "the sink did fail"
    );
    assert!(stats.retried > 0 && stats.dead_lettered == 3, "{stats:?}");

    // The dead letters name the message and the last error; one is retried, one dropped.
    let dead = store.dead_letters(10)?;
    let dead_ids: Vec<&str> = dead.iter().map(|d| d.message.id.as_str()).collect();
    assert_eq!(
        dead_ids,
        poison_ids.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert!(
        dead.iter()
            .all(|d| d.attempts == 4 && d.last_error.contains("refuses"))
    );
    assert!(store.drop_dead_letter(dead[0].message.seq)?);
    assert!(
        !store.drop_dead_letter(dead[0].message.seq)?,
        "already dropped"
    );
    let requeued = store
        .retry_dead_letter(dead[1].message.seq)?
        .ok_or("no dead letter to retry")?;
    assert_eq!(requeued.id, dead[1].message.id, "the id survives a retry");
    assert!(requeued.seq > dead[2].message.seq, "requeued at the end");
    let after = store.exact_stats()?;
    assert_eq!((after.dead_letters, after.outbox_pending), (1, 1));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_messages_survive_a_restart_and_a_crash() -> TestResult {
    let clock = clock();
    let disk = SimDisk::new();
    let store = builder(&clock).open_simulated(&disk)?;
    for i in 0..10 {
        commit_with_messages(&store, &format!("k{i}"), vec![("s".into(), vec![i])])
            .map_err(|e| e.to_string())?;
    }
    // A crash: what the disk held at this moment, the log unreplayed, nothing checkpointed.
    let image = disk.crash_image(Tear::Drop);
    drop(store);
    let store = builder(&clock).open_simulated(&image)?;
    assert_eq!(store.exact_stats()?.outbox_pending, 10);
    let recorder = Arc::new(Recorder::default());
    let relay = Relay::start(&store, Shared(recorder.clone()), relay_config());
    wait::eventually("the 10 messages", || async {
        Ok(recorder.accepted.lock().len() >= 10)
    })
    .await?;
    relay.stop().await;
    let payloads: Vec<u8> = recorder
        .accepted
        .lock()
        .iter()
        .map(|m| m.payload[0])
        .collect();
    assert_eq!(payloads, (0..10).collect::<Vec<u8>>());
    // New messages after the restart get later seqs (the counter was replayed too).
    let before = recorder.accepted.lock().last().map(|m| m.seq).unwrap_or(0);
    commit_with_messages(&store, "after", vec![("s".into(), vec![99])])
        .map_err(|e| e.to_string())?;
    let relay = Relay::start(&store, Shared(recorder.clone()), relay_config());
    wait::eventually("the message after the restart", || async {
        Ok(recorder.accepted.lock().iter().any(|m| m.payload == [99]))
    })
    .await?;
    relay.stop().await;
    // At least once: a message delivered as the first relay stopped may come again; the new
    // one is the one with payload 99.
    let new = recorder
        .accepted
        .lock()
        .iter()
        .find(|m| m.payload == [99])
        .map(|m| m.seq)
        .ok_or("the message after the restart was not delivered")?;
    assert!(new > before, "seq {new} is not after {before}");
    Ok(())
}

#[test]
fn the_inbox_applies_each_message_once_however_often_it_is_delivered() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path())?;
    let applied = Arc::new(AtomicU32::new(0));
    // 16 threads receive the same 20 messages (a broker redelivering), racing each other.
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (store, applied) = (store.clone(), applied.clone());
            std::thread::spawn(move || -> Result<Vec<bool>, String> {
                let mut replayed = Vec::new();
                for m in 0..20 {
                    let id = format!("msg-{m}");
                    let applied = applied.clone();
                    let key = id.clone();
                    let outcome = store
                        .consume(
                            "ledger",
                            &id,
                            Fingerprint::of_bytes(id.as_bytes()),
                            move |tx| {
                                applied.fetch_add(1, Ordering::SeqCst);
                                tx.insert(&ORDERS, key.as_str(), "applied")?;
                                Ok(Response::new(200, b"applied".to_vec()))
                            },
                        )
                        .map_err(|e| e.to_string())?;
                    match outcome {
                        Execution::Executed(_) => replayed.push(false),
                        Execution::Replay(r) => {
                            assert_eq!(r.body(), b"applied");
                            replayed.push(true);
                        }
                        // Another delivery of it is being applied: not acked, delivered again.
                        Execution::InProgress { .. } => {}
                        other => return Err(format!("{id}: {other:?}")),
                    }
                }
                Ok(replayed)
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a consumer panicked")??;
    }
    assert_eq!(
        applied.load(Ordering::SeqCst),
        20,
        "each effect exactly once"
    );
    assert_eq!(order_count(&store)?, 20);
    // The same id with another payload is a mismatch, not a second effect.
    let other = store.consume("ledger", "msg-0", Fingerprint::of_bytes(b"else"), |_| {
        Ok(Response::new(200, vec![]))
    })?;
    assert!(matches!(other, Execution::Mismatch), "{other:?}");
    // A bad message id is refused before anything is read or written.
    let bad = store.consume("ledger", "", Fingerprint::of_bytes(b"x"), |_| {
        Ok(Response::new(200, vec![]))
    });
    assert!(
        matches!(bad, Err(idemstore::ExecuteError::BadScope(_))),
        "{bad:?}"
    );
    Ok(())
}
