//! The outbox's conformance suite: what every backend's outbox and the relay over it must
//! keep, written once and run on the local store (both durability modes) and PostgreSQL
//! (features `testing` and `tokio`).
//!
//! A case opens a fresh backend through an [`OutboxHarness`], commits messages through
//! real claims (a [`ManualClock`] moves leases: no case sleeps to wait for one), runs a real
//! [`Relay`] into a sink the case keeps a handle on, and checks what arrived: every
//! committed id, its payload, per-subject order, how many deliveries, the dead letters.
//! Waiting for the relay is polling with a generous deadline and a message saying what
//! did not happen.
//!
//! Run it with [`outbox_conformance_suite!`](crate::outbox_conformance_suite), one
//! `#[tokio::test]` per case:
//!
//! ```no_run
//! mod wal {
//!     idemstore::outbox_conformance_suite!(idemstore::testing::conformance::Local::new(
//!         idemstore::Durability::Wal
//!     ));
//! }
//! ```

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::conformance::Local;
use crate::api::claim::{Begin, Claim};
use crate::api::store::Store;
use crate::error::{BoxError, CommitError};
use crate::model::clock::{Clock, ManualClock, Timestamp};
use crate::model::config::Sweep;
use crate::model::fingerprint::Fingerprint;
use crate::model::message::{DeadLetter, Message};
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::protocol::{Protocol, ProtocolClaim};
use crate::relay::{OutboxSource, Relay, RelayConfig, Sink};

/// How a case ends the commit it published in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Ending {
    /// The work succeeds: business writes, messages and the completed record commit.
    Commit,
    /// The work fails after publishing: everything is rolled back.
    Fail,
}

/// What became of a commit that published messages.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Committed {
    /// It committed; the messages' ids, in publishing order.
    Kept(Vec<String>),
    /// The work failed ([`Ending::Fail`]) and nothing was kept.
    RolledBack,
    /// Another attempt had taken the key over: refused, nothing kept.
    Stale,
}

/// Opens backends for the outbox suite and does, per backend, what the protocol traits do
/// not cover: a commit that publishes, the dead letters, and opening the same data again.
pub trait OutboxHarness: Send + Sync {
    /// The backend under test.
    type Backend: Protocol + OutboxSource;
    /// Where a backend's data lives (a directory, a table prefix).
    type Place: Send + Sync;

    /// A fresh place, sharing nothing with the ones before; removed when the harness is.
    fn place(&self) -> Self::Place;

    /// Opens the backend at `place` (creating it the first time), its time from `clock`,
    /// background eviction off. The previous handle on `place`, if any, has been dropped.
    fn open_at(
        &self,
        place: &Self::Place,
        clock: ManualClock,
    ) -> impl Future<Output = Result<Self::Backend, BoxError>> + Send;

    /// Publishes `messages` (subject, payload) in the commit of `claim`, then ends it as
    /// `ending` says.
    fn commit(
        &self,
        claim: <Self::Backend as Protocol>::Claim,
        messages: Vec<(String, Vec<u8>)>,
        ending: Ending,
    ) -> impl Future<Output = Result<Committed, BoxError>> + Send;

    /// Up to `limit` dead letters, oldest first.
    fn dead_letters(
        &self,
        backend: &Self::Backend,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, BoxError>> + Send;

    /// Puts a dead letter back at the end of the outbox.
    fn retry_dead_letter(
        &self,
        backend: &Self::Backend,
        seq: u64,
    ) -> impl Future<Output = Result<Option<Message>, BoxError>> + Send;

    /// Deletes a dead letter; whether there was one.
    fn drop_dead_letter(
        &self,
        backend: &Self::Backend,
        seq: u64,
    ) -> impl Future<Output = Result<bool, BoxError>> + Send;
}

impl OutboxHarness for Local {
    type Backend = Store;
    type Place = std::path::PathBuf;

    fn place(&self) -> std::path::PathBuf {
        self.fresh_dir()
    }

    async fn open_at(
        &self,
        place: &std::path::PathBuf,
        clock: ManualClock,
    ) -> Result<Store, BoxError> {
        Ok(Store::builder()
            .durability(self.durability())
            .clock(clock)
            .sweep(Sweep::Off)
            .open(place)?)
    }

    async fn commit(
        &self,
        claim: Claim,
        messages: Vec<(String, Vec<u8>)>,
        ending: Ending,
    ) -> Result<Committed, BoxError> {
        let ids = Arc::new(Mutex::new(Vec::new()));
        let published = ids.clone();
        let result = claim
            .commit_async(move |tx| {
                for (subject, payload) in messages {
                    let id = tx.publish(&subject, payload)?;
                    published.lock().push(id);
                }
                match ending {
                    Ending::Commit => Ok(Response::new(201, "committed")),
                    Ending::Fail => Err("the work failed after publishing".into()),
                }
            })
            .await;
        match result {
            Ok(_) => Ok(Committed::Kept(ids.lock().clone())),
            Err(CommitError::Stale(_)) => Ok(Committed::Stale),
            Err(CommitError::Aborted { .. }) if ending == Ending::Fail => Ok(Committed::RolledBack),
            Err(other) => Err(format!("the commit failed: {other}").into()),
        }
    }

    async fn dead_letters(&self, store: &Store, limit: usize) -> Result<Vec<DeadLetter>, BoxError> {
        Ok(store.dead_letters(limit)?)
    }

    async fn retry_dead_letter(
        &self,
        store: &Store,
        seq: u64,
    ) -> Result<Option<Message>, BoxError> {
        Ok(store.retry_dead_letter(seq)?)
    }

    async fn drop_dead_letter(&self, store: &Store, seq: u64) -> Result<bool, BoxError> {
        Ok(store.drop_dead_letter(seq)?)
    }
}

/// One `#[tokio::test]` per case of the outbox suite, against the harness `$harness` (an
/// expression building an [`OutboxHarness`]). Put it in a module of its own per backend.
#[macro_export]
macro_rules! outbox_conformance_suite {
    ($harness:expr) => {
        $crate::outbox_conformance_suite!(@cases $harness;
            a_rolled_back_or_stale_commit_leaves_no_message,
            committed_messages_carry_the_downstream_key_and_index_and_their_payload,
            the_relay_delivers_every_message_in_order_per_subject_through_a_faulty_sink,
            a_poison_message_is_dead_lettered_then_retried_or_dropped,
            a_subject_that_keeps_failing_does_not_starve_the_others,
            pending_messages_survive_a_reopen_and_are_delivered_after_it
        );
    };
    (@cases $harness:expr; $($case:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() -> Result<(), $crate::BoxError> {
            $crate::testing::outbox_conformance::$case(&$harness).await
        }
    )*};
}

/// How long a case waits for the relay before it fails.
const PATIENCE: Duration = Duration::from_secs(60);

fn clock() -> ManualClock {
    ManualClock::new(Timestamp::from_millis(1_700_000_000_000))
}

fn scope(key: &str) -> Scope {
    Scope::new("tenant-a", "place_order", key).expect("a valid scope")
}

/// Claims `key`, which must be new.
async fn claim<B: Protocol>(backend: &B, key: &str) -> Result<B::Claim, BoxError> {
    match backend
        .begin(&scope(key), Fingerprint::of_bytes(key.as_bytes()))
        .await?
    {
        Begin::Claimed(claim) => Ok(claim),
        other => Err(format!("{key}: expected a new claim, got {}", other.outcome()).into()),
    }
}

/// Claims `key` and commits `messages`; their ids.
async fn commit_new<H: OutboxHarness>(
    harness: &H,
    backend: &H::Backend,
    key: &str,
    messages: Vec<(String, Vec<u8>)>,
) -> Result<Vec<String>, BoxError> {
    let claim = claim(backend, key).await?;
    match harness.commit(claim, messages, Ending::Commit).await? {
        Committed::Kept(ids) => Ok(ids),
        other => Err(format!("{key}: expected the commit to be kept, got {other:?}").into()),
    }
}

/// A relay with short waits, so that cases end quickly: 4 attempts, 1 to 8 ms backoff,
/// 200 ms per attempt, 2 ms idle poll.
fn relay_config() -> RelayConfig {
    RelayConfig::default()
        .max_attempts(4)
        .backoff(Duration::from_millis(1), Duration::from_millis(8))
        .attempt_timeout(Duration::from_millis(200))
        .idle_poll(Duration::from_millis(2))
}

/// Polls `check` until it holds, for at most [`PATIENCE`].
async fn eventually<F, Fut>(what: &str, check: F) -> Result<(), BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, BoxError>>,
{
    within(PATIENCE, what, check).await
}

/// Polls `check` until it holds, for at most `patience`.
async fn within<F, Fut>(patience: Duration, what: &str, mut check: F) -> Result<(), BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, BoxError>>,
{
    let deadline = std::time::Instant::now() + patience;
    loop {
        if check().await? {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("after {patience:?}, still not {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the outbox has `pending` messages and `dead` dead letters.
async fn outbox_is<B: Protocol>(backend: &B, pending: u64, dead: u64) -> Result<(), BoxError> {
    let what = format!("{pending} pending and {dead} dead letters");
    eventually(&what, || async {
        let stats = backend.stats().await?;
        Ok(stats.outbox_pending == pending && stats.dead_letters == dead)
    })
    .await
}

/// A sink that fails, times out and stalls on purpose, deterministically by message id:
/// a message fails its first `hash % 3` attempts (hanging past the attempt timeout on one
/// of them when `hash % 7 == 0`), every fourth is slow, and a payload `poison` fails every
/// attempt until the case cures it. It keeps every message it accepted, in order.
#[derive(Default)]
pub(crate) struct Faulty {
    accepted: Mutex<Vec<Message>>,
    attempts: Mutex<HashMap<String, u32>>,
    failures: AtomicU64,
    poison_cured: AtomicBool,
}

/// The sink the relay owns, sharing the case's [`Faulty`].
struct Shared(Arc<Faulty>);

impl Sink for Shared {
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
        if message.payload == b"poison" && !this.poison_cured.load(Ordering::SeqCst) {
            this.failures.fetch_add(1, Ordering::Relaxed);
            return Err("the broker refuses this message".into());
        }
        if attempt <= h % 3 {
            this.failures.fetch_add(1, Ordering::Relaxed);
            if h % 7 == 0 && attempt == 1 {
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

impl Faulty {
    fn accepted(&self) -> Vec<Message> {
        self.accepted.lock().clone()
    }

    fn has(&self, id: &str) -> bool {
        self.accepted.lock().iter().any(|m| m.id == id)
    }
}

/// A commit whose work fails after publishing, and a commit by a holder that another
/// attempt took over, leave no message; the holder's own commit does.
pub async fn a_rolled_back_or_stale_commit_leaves_no_message<H: OutboxHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let backend = harness.open_at(&harness.place(), clock.clone()).await?;
    let failing = claim(&backend, "rolled-back").await?;
    let ended = harness
        .commit(
            failing,
            vec![("orders.placed".into(), b"1".to_vec())],
            Ending::Fail,
        )
        .await?;
    assert_eq!(ended, Committed::RolledBack);
    let stats = backend.stats().await?;
    assert_eq!(stats.outbox_pending, 0, "a rolled-back commit's message");

    let first = claim(&backend, "taken-over").await?;
    clock.advance(backend.limits().lease);
    let second = match backend
        .begin(&scope("taken-over"), Fingerprint::of_bytes(b"taken-over"))
        .await?
    {
        Begin::Recovered(claim) => claim,
        other => return Err(format!("expected Recovered, got {}", other.outcome()).into()),
    };
    let stale = harness
        .commit(
            first,
            vec![("orders.placed".into(), b"2".to_vec())],
            Ending::Commit,
        )
        .await?;
    assert_eq!(stale, Committed::Stale);
    let stats = backend.stats().await?;
    assert_eq!(stats.outbox_pending, 0, "a stale commit's message");

    let kept = harness
        .commit(
            second,
            vec![("orders.placed".into(), b"3".to_vec())],
            Ending::Commit,
        )
        .await?;
    assert!(
        matches!(kept, Committed::Kept(ref ids) if ids.len() == 1),
        "{kept:?}"
    );
    let stats = backend.stats().await?;
    assert_eq!(stats.outbox_pending, 1, "the holder's message");
    assert_eq!(
        stats.oldest_pending_message,
        Some(Duration::ZERO),
        "{stats:?}"
    );
    Ok(())
}

/// A message's id is the claim's downstream key (the same for every attempt of the
/// operation), a dash and its index in the commit; it arrives with its subject, payload and
/// commit time.
pub async fn committed_messages_carry_the_downstream_key_and_index_and_their_payload<
    H: OutboxHarness,
>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let backend = harness.open_at(&harness.place(), clock.clone()).await?;
    let first = claim(&backend, "order-1").await?;
    let downstream = first.downstream_key();
    clock.advance(backend.limits().lease);
    // A recovered attempt publishes under the same key as the first would have.
    let recovered = match backend
        .begin(&scope("order-1"), Fingerprint::of_bytes(b"order-1"))
        .await?
    {
        Begin::Recovered(claim) => claim,
        other => return Err(format!("expected Recovered, got {}", other.outcome()).into()),
    };
    drop(first);
    let committed_at = clock.now();
    let payloads: Vec<(String, Vec<u8>)> = vec![
        ("orders.placed".into(), vec![0, 255, 10, 13]),
        ("orders.billed".into(), b"{\"total\":3}".to_vec()),
        ("orders.placed".into(), Vec::new()),
    ];
    let ids = match harness
        .commit(recovered, payloads.clone(), Ending::Commit)
        .await?
    {
        Committed::Kept(ids) => ids,
        other => return Err(format!("expected Kept, got {other:?}").into()),
    };
    let expected: Vec<String> = (0..3).map(|i| format!("{downstream}-{i}")).collect();
    assert_eq!(ids, expected);

    let sink = Arc::new(Faulty::default());
    let relay = Relay::start(&backend, Shared(sink.clone()), relay_config());
    outbox_is(&backend, 0, 0).await?;
    relay.stop().await;
    let accepted = sink.accepted();
    let got: Vec<(String, String, Vec<u8>)> = accepted
        .iter()
        .map(|m| (m.id.clone(), m.subject.clone(), m.payload.clone()))
        .collect();
    let want: Vec<(String, String, Vec<u8>)> = ids
        .iter()
        .cloned()
        .zip(payloads)
        .map(|(id, (subject, payload))| (id, subject, payload))
        .collect();
    let mut got_sorted = got.clone();
    got_sorted.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(got_sorted, want_sorted, "each message once, as published");
    assert!(
        accepted.iter().all(|m| m.committed_at == committed_at),
        "committed at the clock's time: {accepted:?}"
    );
    Ok(())
}

/// Four tasks commit 30 orders each, each task to a subject of its own (so that the
/// commits of one subject never overlap), some commits publishing two messages, while the
/// relay delivers through a sink that fails, times out and stalls: every committed id
/// arrives exactly once (failed attempts are never accepted), and per subject in commit
/// order.
pub async fn the_relay_delivers_every_message_in_order_per_subject_through_a_faulty_sink<
    H: OutboxHarness,
>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open_at(&harness.place(), clock()).await?;
    let sink = Arc::new(Faulty::default());
    let relay = Relay::start(&backend, Shared(sink.clone()), relay_config());
    let committed: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let mut tasks = Vec::new();
    for task in 0..4 {
        let subject = format!("ledger.s{task}");
        let mut keys = Vec::new();
        for i in 0..30 {
            let messages = if i % 5 == 0 { 2 } else { 1 };
            keys.push((format!("t{task}-{i}"), messages));
        }
        tasks.push((subject, keys));
    }
    let runs = tasks.into_iter().map(|(subject, keys)| {
        let committed = committed.clone();
        let backend = &backend;
        async move {
            for (key, n) in keys {
                let messages = (0..n)
                    .map(|m| (subject.clone(), format!("{key}/{m}").into_bytes()))
                    .collect();
                let ids = commit_new(harness, backend, &key, messages).await?;
                committed
                    .lock()
                    .entry(subject.clone())
                    .or_default()
                    .extend(ids);
            }
            Ok::<_, BoxError>(())
        }
    });
    for run in futures_join(runs).await {
        run?;
    }
    let committed = committed.lock().clone();
    let total: usize = committed.values().map(Vec::len).sum();
    assert_eq!(total, 4 * (30 + 6));
    eventually("every committed message delivered", || async {
        Ok(sink.accepted.lock().len() >= total)
    })
    .await?;
    outbox_is(&backend, 0, 0).await?;
    let stats = relay.stats();
    relay.stop().await;

    let accepted = sink.accepted();
    let ids: HashSet<&str> = accepted.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(
        accepted.len(),
        total,
        "deliveries: each message accepted once"
    );
    assert_eq!(ids.len(), total);
    assert_eq!(stats.delivered, total as u64, "{stats:?}");
    assert!(stats.retried > 0, "the sink did fail: {stats:?}");
    assert!(
        sink.failures.load(Ordering::Relaxed) > 10,
        "the sink did fail"
    );
    let mut arrived: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in &accepted {
        arrived
            .entry(m.subject.clone())
            .or_default()
            .push(m.id.clone());
    }
    assert_eq!(arrived, committed, "per subject, in commit order");
    Ok(())
}

/// Runs the futures at once on this task; their outputs in order.
async fn futures_join<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in pinned.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// A message the sink always refuses moves to the dead letters after the relay's
/// `max_attempts` (4), with its last error, and its subject goes on; retried, it goes back
/// to the end of the outbox with its id and is delivered; dropped, it is gone.
pub async fn a_poison_message_is_dead_lettered_then_retried_or_dropped<H: OutboxHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open_at(&harness.place(), clock()).await?;
    let sink = Arc::new(Faulty::default());
    let relay = Relay::start(&backend, Shared(sink.clone()), relay_config());
    let mut poison = Vec::new();
    let mut good = Vec::new();
    for i in 0..12 {
        let payload = if i % 5 == 2 {
            b"poison".to_vec()
        } else {
            vec![i]
        };
        let is_poison = payload == b"poison";
        let ids = commit_new(
            harness,
            &backend,
            &format!("k{i}"),
            vec![(format!("billing.s{}", i % 2), payload)],
        )
        .await?;
        if is_poison {
            poison.extend(ids);
        } else {
            good.extend(ids);
        }
    }
    assert_eq!(poison.len(), 2);
    outbox_is(&backend, 0, 2).await?;
    assert!(
        good.iter().all(|id| sink.has(id)),
        "the good messages went on"
    );
    assert!(poison.iter().all(|id| !sink.has(id)));
    let dead = harness.dead_letters(&backend, 10).await?;
    let dead_ids: Vec<&str> = dead.iter().map(|d| d.message.id.as_str()).collect();
    assert_eq!(
        dead_ids,
        poison.iter().map(String::as_str).collect::<Vec<_>>()
    );
    for letter in &dead {
        assert_eq!(letter.attempts, 4, "{letter:?}");
        assert!(letter.last_error.contains("refuses"), "{letter:?}");
        assert_eq!(letter.message.payload, b"poison");
    }
    assert_eq!(
        harness.dead_letters(&backend, 1).await?.len(),
        1,
        "the limit"
    );

    sink.poison_cured.store(true, Ordering::SeqCst);
    let requeued = harness
        .retry_dead_letter(&backend, dead[0].message.seq)
        .await?
        .ok_or("no dead letter to retry")?;
    assert_eq!(requeued.id, dead[0].message.id, "the id survives a retry");
    assert!(requeued.seq > dead[1].message.seq, "requeued at the end");
    let id = requeued.id.clone();
    eventually("the retried message delivered", || async {
        Ok(sink.has(&id))
    })
    .await?;
    assert!(
        harness
            .drop_dead_letter(&backend, dead[1].message.seq)
            .await?
    );
    assert!(
        !harness
            .drop_dead_letter(&backend, dead[1].message.seq)
            .await?,
        "already dropped"
    );
    assert!(
        harness
            .retry_dead_letter(&backend, dead[0].message.seq)
            .await?
            .is_none(),
        "already retried"
    );
    outbox_is(&backend, 0, 0).await?;
    let stats = relay.stats();
    relay.stop().await;
    assert_eq!(stats.dead_lettered, 2, "{stats:?}");
    assert!(
        !sink.has(&dead[1].message.id),
        "the dropped one never arrived"
    );
    Ok(())
}

/// One subject whose messages all fail (retried, never given up within the case) fills
/// more than a batch ahead of other subjects: the others are delivered all the same, within
/// seconds, while it waits out its backoff; cured, it is delivered in order. (A relay that
/// read the first `batch` messages by seq read only the failing subject's, skipped them
/// while they waited, and read the same batch again: the others waited until the whole
/// subject was dead-lettered.)
pub async fn a_subject_that_keeps_failing_does_not_starve_the_others<H: OutboxHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open_at(&harness.place(), clock()).await?;
    let mut stuck = Vec::new();
    for i in 0..3 {
        let poison = vec![("billing.stuck".to_owned(), b"poison".to_vec()); 2];
        stuck.extend(commit_new(harness, &backend, &format!("stuck{i}"), poison).await?);
    }
    let mut others = Vec::new();
    for i in 0..4u8 {
        let message = vec![(format!("billing.ok{}", i % 2), vec![i])];
        others.extend(commit_new(harness, &backend, &format!("ok{i}"), message).await?);
    }
    let sink = Arc::new(Faulty::default());
    let config = relay_config()
        .batch(4)
        .max_attempts(10_000)
        .backoff(Duration::from_millis(20), Duration::from_millis(200));
    let relay = Relay::start(&backend, Shared(sink.clone()), config);
    within(
        Duration::from_secs(10),
        "the other subjects delivered past the failing one",
        || async { Ok(others.iter().all(|id| sink.has(id))) },
    )
    .await?;
    assert!(
        stuck.iter().all(|id| !sink.has(id)),
        "the failing subject waits"
    );
    assert!(sink.failures.load(Ordering::Relaxed) > 0, "it was tried");
    sink.poison_cured.store(true, Ordering::SeqCst);
    outbox_is(&backend, 0, 0).await?;
    relay.stop().await;
    let arrived: Vec<String> = sink
        .accepted()
        .into_iter()
        .filter(|m| m.subject == "billing.stuck")
        .map(|m| m.id)
        .collect();
    assert_eq!(arrived, stuck, "the failing subject, in order, once cured");
    Ok(())
}

/// Messages committed while no relay runs are still pending after the backend is closed
/// and opened again, and a relay started then delivers them in commit order; what is
/// committed after the reopen comes after them.
pub async fn pending_messages_survive_a_reopen_and_are_delivered_after_it<H: OutboxHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let place = harness.place();
    let backend = harness.open_at(&place, clock.clone()).await?;
    let mut ids = Vec::new();
    for i in 0..10u8 {
        ids.extend(
            commit_new(
                harness,
                &backend,
                &format!("k{i}"),
                vec![("s".into(), vec![i])],
            )
            .await?,
        );
    }
    drop(backend);
    let backend = harness.open_at(&place, clock.clone()).await?;
    assert_eq!(backend.stats().await?.outbox_pending, 10);
    ids.extend(commit_new(harness, &backend, "after", vec![("s".into(), vec![99])]).await?);
    let sink = Arc::new(Faulty::default());
    let relay = Relay::start(&backend, Shared(sink.clone()), relay_config());
    outbox_is(&backend, 0, 0).await?;
    relay.stop().await;
    let arrived: Vec<String> = sink.accepted().into_iter().map(|m| m.id).collect();
    assert_eq!(arrived, ids, "in commit order, across the reopen");
    Ok(())
}
