//! The conformance suite: the behaviour every backend of the [`Protocol`] must keep, written
//! once against the traits and run on every backend (features `testing` and `tokio`).
//!
//! A backend passes when every case here passes on it. Each case opens a fresh backend
//! through a [`Harness`] (settings, and a [`ManualClock`] the case advances: no case sleeps to
//! wait for a lease), drives it with real tasks, and asserts both the answers and the side
//! effects: how many times the "work" ran, counted by the case itself.
//!
//! Run it with [`conformance_suite!`](crate::conformance_suite), which makes one
//! `#[tokio::test]` per case:
//!
//! ```no_run
//! mod wal {
//!     idemstore::conformance_suite!(idemstore::testing::conformance::Local::new(
//!         idemstore::Durability::Wal
//!     ));
//! }
//! ```

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use crate::api::claim::Begin;
use crate::api::store::Store;
use crate::error::{BoxError, ClaimError, CommitError, StaleClaim};
use crate::model::clock::{Clock, ManualClock, Timestamp};
use crate::model::config::{Durability, Sweep};
use crate::model::fingerprint::Fingerprint;
use crate::model::maintenance::Backlog;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::protocol::{Protocol, ProtocolClaim};

/// What a case asks of the backend it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// How long a claim holds its key.
    pub lease: Duration,
    /// How long a completed record answers retries.
    pub ttl: Duration,
    /// How long a tombstone answers `Expired` after the TTL (zero: off).
    pub tombstone_ttl: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(3600),
            tombstone_ttl: Duration::ZERO,
        }
    }
}

/// Opens fresh, empty backends for the suite. Background eviction, if the backend has any,
/// must be off: the cases evict when they mean to.
pub trait Harness: Send + Sync {
    /// The backend under test.
    type Backend: Protocol;

    /// A fresh backend with `settings`, reading the time from `clock`. Each call gives a
    /// backend that shares nothing with the ones before (its own directory, schema, or
    /// table prefix).
    fn open(
        &self,
        settings: Settings,
        clock: ManualClock,
    ) -> impl Future<Output = Result<Self::Backend, BoxError>> + Send;
}

/// The local [`Store`] in a temporary directory, in either durability mode.
#[derive(Debug)]
pub struct Local {
    durability: Durability,
    /// Removed, with every store in it, when the harness is dropped.
    root: PathBuf,
    opened: AtomicUsize,
}

impl Local {
    /// Stores in a new directory under the system's temporary directory.
    ///
    /// # Panics
    /// If the directory cannot be created.
    pub fn new(durability: Durability) -> Self {
        static HARNESSES: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "idemstore-conformance-{}-{}-{}",
            std::process::id(),
            HARNESSES.fetch_add(1, Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        std::fs::create_dir_all(&root).expect("a temporary directory for the conformance suite");
        Local {
            durability,
            root,
            opened: AtomicUsize::new(0),
        }
    }
}

impl Local {
    /// A directory for one more store, under the harness's root.
    pub(crate) fn fresh_dir(&self) -> PathBuf {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        self.root.join(format!("store-{n}"))
    }

    /// The durability mode its stores open with.
    pub(crate) fn durability(&self) -> Durability {
        self.durability
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Harness for Local {
    type Backend = Store;

    async fn open(&self, settings: Settings, clock: ManualClock) -> Result<Store, BoxError> {
        Ok(Store::builder()
            .durability(self.durability)
            .lease(settings.lease)
            .ttl(settings.ttl)
            .tombstone_ttl(settings.tombstone_ttl)
            .clock(clock)
            .sweep(Sweep::Off)
            .open(self.fresh_dir())?)
    }
}

#[cfg(feature = "postgres")]
pub use super::postgres::Postgres;

/// One `#[tokio::test]` per case of the suite, against the harness `$harness` (an expression
/// building a [`Harness`]). Put it in a module of its own per backend.
#[macro_export]
macro_rules! conformance_suite {
    ($harness:expr) => {
        $crate::conformance_suite!(@cases $harness;
            claim_then_replay_byte_for_byte,
            a_live_claim_answers_in_progress_and_writes_nothing,
            in_progress_advises_the_operations_pace_within_the_lease,
            another_fingerprint_is_a_mismatch_and_changes_nothing,
            an_expired_lease_is_recovered_with_its_checkpoint,
            a_stale_holder_is_refused_on_every_operation,
            a_released_key_is_claimed_afresh,
            completed_records_are_evicted_in_batches_oldest_first,
            tombstones_answer_expired_until_they_go,
            begin_or_wait_gets_the_outcome_of_the_holder,
            abandoned_lists_expired_leases_oldest_first,
            tenants_never_see_each_other,
            sixty_four_racing_tasks_run_each_key_once,
            sixty_four_racing_take_overs_recover_once
        );
    };
    (@cases $harness:expr; $($case:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() -> Result<(), $crate::BoxError> {
            $crate::testing::conformance::$case(&$harness).await
        }
    )*};
}

/// A clock for a case, at a fixed start.
fn clock() -> ManualClock {
    ManualClock::new(Timestamp::from_millis(1_700_000_000_000))
}

fn scope(tenant: &str, key: &str) -> Scope {
    Scope::new(tenant, "create_order", key).expect("a valid scope")
}

fn fingerprint(request: &str) -> Fingerprint {
    Fingerprint::of_bytes(request.as_bytes())
}

/// The claim of a `begin` that must claim (fresh or recovered).
fn claimed<C: ProtocolClaim>(begin: Begin<C>, what: &str) -> Result<C, BoxError> {
    match begin {
        Begin::Claimed(claim) | Begin::Recovered(claim) => Ok(claim),
        other => Err(format!("{what}: expected a claim, got {}", other.outcome()).into()),
    }
}

/// A stale claim's error, or a failure saying what was wrong.
fn stale<T: std::fmt::Debug>(result: Result<T, ClaimError>, op: &str) -> Result<(), BoxError> {
    match result {
        Err(ClaimError::Stale(StaleClaim { .. })) => Ok(()),
        other => Err(format!("{op} by a stale holder: expected Stale, got {other:?}").into()),
    }
}

/// A response with a status, headers and a body that is not text: what a replay must give
/// back byte for byte.
fn stored_response(tag: &str) -> Response {
    let mut body = tag.as_bytes().to_vec();
    body.extend([0u8, 255, 10, 13, 0xC3, 0x28]);
    Response::new(201, body)
        .with_header("content-type", "application/octet-stream")
        .with_header("location", format!("/orders/{tag}"))
}

/// Claims a key, completes it, and replays it: the same status, headers and bytes.
pub async fn claim_then_replay_byte_for_byte<H: Harness>(harness: &H) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let key = scope("tenant-a", "order-0001");
    let claim = match backend.begin(&key, fingerprint("widget x3")).await? {
        Begin::Claimed(claim) => claim,
        other => {
            return Err(format!("a new key: expected Claimed, got {}", other.outcome()).into());
        }
    };
    assert_eq!(claim.attempt(), 1);
    assert_eq!(claim.last_checkpoint(), None);
    let response = stored_response("1");
    let completed = claim.complete(response.clone()).await?;
    assert_eq!(completed, response);
    for _ in 0..3 {
        match backend.begin(&key, fingerprint("widget x3")).await? {
            Begin::Replay(replayed) => {
                assert_eq!(
                    replayed, response,
                    "a replay is the stored response, byte for byte"
                );
            }
            other => {
                return Err(format!("a retry: expected Replay, got {}", other.outcome()).into());
            }
        }
    }
    let stats = backend.stats().await?;
    assert_eq!((stats.completed, stats.in_progress), (1, 0), "{stats:?}");
    Ok(())
}

/// A retry while the claim's lease is live answers `InProgress`, within the rest of the lease,
/// and writes nothing.
pub async fn a_live_claim_answers_in_progress_and_writes_nothing<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "order-0002");
    let claim = claimed(backend.begin(&key, fingerprint("r")).await?, "a new key")?;
    clock.advance(Duration::from_secs(10));
    match backend.begin(&key, fingerprint("r")).await? {
        Begin::InProgress { retry_after } => {
            assert!(retry_after <= settings.lease - Duration::from_secs(10));
        }
        other => return Err(format!("expected InProgress, got {}", other.outcome()).into()),
    }
    assert_eq!(
        claim.lease_until(),
        Timestamp::from_millis(1_700_000_000_000).saturating_add(settings.lease)
    );
    // The retry changed nothing: the holder still completes.
    claim.complete(Response::new(200, "done")).await?;
    Ok(())
}

/// Claims `key` of `operation`, lets `took` pass on the clock and completes it: one
/// completion time for the operation's pace.
async fn complete_after<P: Protocol>(
    backend: &P,
    clock: &ManualClock,
    key: &Scope,
    took: Duration,
) -> Result<(), BoxError> {
    let claim = claimed(backend.begin(key, fingerprint("r")).await?, "a new key")?;
    clock.advance(took);
    claim.complete(Response::new(201, "done")).await?;
    Ok(())
}

/// What `InProgress` advises after `running` of a fresh claim of `key`; the claim is then
/// released.
async fn advised<P: Protocol>(
    backend: &P,
    clock: &ManualClock,
    key: &Scope,
    running: Duration,
) -> Result<Duration, BoxError> {
    let claim = claimed(backend.begin(key, fingerprint("r")).await?, "a new key")?;
    clock.advance(running);
    let answer = backend.begin(key, fingerprint("r")).await?;
    claim.release().await?;
    match answer {
        Begin::InProgress { retry_after } => Ok(retry_after),
        other => Err(format!("a duplicate: expected InProgress, got {}", other.outcome()).into()),
    }
}

/// `InProgress` advises what the holder probably still needs, from the operation's recent
/// completion times: a 50 ms operation is told one second (not the lease), one that takes
/// longer than the lease the rest of the lease, one with no history as long again as it has
/// run; never past the lease.
pub async fn in_progress_advises_the_operations_pace_within_the_lease<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let of = |operation: &str, key: &str| Scope::new("tenant-a", operation, key);

    complete_after(
        &backend,
        &clock,
        &of("fast", "k1")?,
        Duration::from_millis(50),
    )
    .await?;
    let fast = advised(
        &backend,
        &clock,
        &of("fast", "k2")?,
        Duration::from_millis(10),
    )
    .await?;
    assert_eq!(fast, Duration::from_secs(1), "a 50 ms operation");

    // Completed past its lease (nobody took it over, so the holder still could).
    complete_after(
        &backend,
        &clock,
        &of("slow", "k1")?,
        Duration::from_secs(45),
    )
    .await?;
    let running = Duration::from_secs(10);
    let slow = advised(&backend, &clock, &of("slow", "k2")?, running).await?;
    assert_eq!(
        slow,
        settings.lease - running,
        "an operation longer than the lease"
    );

    let unknown = advised(&backend, &clock, &of("new", "k1")?, Duration::from_secs(4)).await?;
    assert_eq!(unknown, Duration::from_secs(4), "no history: as long again");
    let fresh = advised(&backend, &clock, &of("new", "k2")?, Duration::ZERO).await?;
    assert_eq!(fresh, Duration::from_secs(1), "no history, just claimed");
    Ok(())
}

/// The same key with another request is refused, while held and once completed, and the
/// refusal writes nothing.
pub async fn another_fingerprint_is_a_mismatch_and_changes_nothing<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let key = scope("tenant-a", "order-0003");
    let claim = claimed(backend.begin(&key, fingerprint("first")).await?, "new")?;
    assert!(matches!(
        backend.begin(&key, fingerprint("second")).await?,
        Begin::Mismatch
    ));
    let fence = claim.fence();
    let response = stored_response("3");
    claim.complete(response.clone()).await?;
    assert!(matches!(
        backend.begin(&key, fingerprint("second")).await?,
        Begin::Mismatch
    ));
    match backend.begin(&key, fingerprint("first")).await? {
        Begin::Replay(replayed) => assert_eq!(replayed, response),
        other => return Err(format!("expected Replay, got {}", other.outcome()).into()),
    }
    let stats = backend.stats().await?;
    assert_eq!((stats.completed, stats.in_progress), (1, 0), "{stats:?}");
    assert!(fence > 0);
    Ok(())
}

/// After the lease ends, the next attempt takes over knowing it: `Recovered`, the next attempt
/// number, a new fence, the previous attempt's checkpoint and the same downstream key.
pub async fn an_expired_lease_is_recovered_with_its_checkpoint<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "order-0004");
    let mut first = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    first.checkpoint(b"charged ch_123".to_vec()).await?;
    assert_eq!(first.last_checkpoint(), Some(&b"charged ch_123"[..]));
    let downstream = first.downstream_key();

    clock.advance(settings.lease - Duration::from_millis(1));
    assert!(matches!(
        backend.begin(&key, fingerprint("r")).await?,
        Begin::InProgress { .. }
    ));
    clock.advance(Duration::from_millis(1));
    let second = match backend.begin(&key, fingerprint("r")).await? {
        Begin::Recovered(claim) => claim,
        other => {
            return Err(format!(
                "after the lease: expected Recovered, got {}",
                other.outcome()
            )
            .into());
        }
    };
    assert_eq!(second.attempt(), 2);
    assert_ne!(second.fence(), first.fence());
    assert_eq!(second.last_checkpoint(), Some(&b"charged ch_123"[..]));
    assert_eq!(second.downstream_key(), downstream);
    second.complete(Response::new(201, "recovered")).await?;
    drop(first);
    Ok(())
}

/// Once another attempt took over, every operation of the old holder is refused as stale and
/// changes nothing: extend, checkpoint, release and complete.
pub async fn a_stale_holder_is_refused_on_every_operation<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "order-0005");
    let mut first = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    clock.advance(settings.lease);
    let mut second = claimed(backend.begin(&key, fingerprint("r")).await?, "take-over")?;
    second.checkpoint(b"second's step".to_vec()).await?;

    stale(first.extend(Duration::from_secs(60)).await, "extend")?;
    stale(
        first.checkpoint(b"first's step".to_vec()).await,
        "checkpoint",
    )?;
    clock.advance(settings.lease);
    let third = claimed(
        backend.begin(&key, fingerprint("r")).await?,
        "second take-over",
    )?;
    assert_eq!(third.attempt(), 3);
    assert_eq!(
        third.last_checkpoint(),
        Some(&b"second's step"[..]),
        "a stale checkpoint changed nothing"
    );
    stale(second.release().await, "release")?;
    match first.complete(Response::new(500, "stale")).await {
        Err(CommitError::Stale(_)) => {}
        other => {
            return Err(
                format!("complete by a stale holder: expected Stale, got {other:?}").into(),
            );
        }
    }
    let response = stored_response("5");
    third.complete(response.clone()).await?;
    match backend.begin(&key, fingerprint("r")).await? {
        Begin::Replay(replayed) => assert_eq!(replayed, response, "the holder's response"),
        other => return Err(format!("expected Replay, got {}", other.outcome()).into()),
    }
    assert!(backend.stats().await?.stale_rejections >= 4);
    Ok(())
}

/// A released key is new again: the next `begin` claims it as attempt 1 with a new fence.
pub async fn a_released_key_is_claimed_afresh<H: Harness>(harness: &H) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let key = scope("tenant-a", "order-0006");
    let claim = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let (fence, downstream) = (claim.fence(), claim.downstream_key());
    claim.release().await?;
    let again = match backend.begin(&key, fingerprint("other request")).await? {
        Begin::Claimed(claim) => claim,
        other => {
            return Err(
                format!("after a release: expected Claimed, got {}", other.outcome()).into(),
            );
        }
    };
    assert_eq!(again.attempt(), 1);
    assert_ne!(again.fence(), fence);
    assert_ne!(again.downstream_key(), downstream, "a new operation");
    again.release().await?;
    Ok(())
}

/// Past their TTL, completed records are evicted in batches of the limit asked for, oldest
/// first, saying whether more is due; in-progress records are never evicted.
pub async fn completed_records_are_evicted_in_batches_oldest_first<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings {
        lease: Duration::from_secs(3600 * 4),
        ..Settings::default()
    };
    let backend = harness.open(settings, clock.clone()).await?;
    for i in 0..25 {
        let key = scope("tenant-a", &format!("order-{i:04}"));
        let claim = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
        claim.complete(Response::new(200, format!("{i}"))).await?;
        clock.advance(Duration::from_secs(1));
    }
    let held = claimed(
        backend
            .begin(&scope("tenant-a", "still-running"), fingerprint("r"))
            .await?,
        "new",
    )?;
    let evicted = backend.evict_expired(10).await?;
    assert_eq!(
        (evicted.removed, evicted.backlog),
        (0, Backlog::Empty),
        "none due yet"
    );

    // The first 12 are past their TTL.
    clock.set(
        Timestamp::from_millis(1_700_000_000_000)
            .saturating_add(settings.ttl + Duration::from_secs(11)),
    );
    let evicted = backend.evict_expired(10).await?;
    assert_eq!((evicted.removed, evicted.backlog), (10, Backlog::More));
    let evicted = backend.evict_expired(10).await?;
    assert_eq!((evicted.removed, evicted.backlog), (2, Backlog::Empty));
    for i in 0..25 {
        let key = scope("tenant-a", &format!("order-{i:04}"));
        let answer = backend.begin(&key, fingerprint("r")).await?;
        match (i < 12, answer) {
            (true, Begin::Claimed(claim)) => claim.release().await?,
            (false, Begin::Replay(response)) => {
                assert_eq!(response.body(), format!("{i}").as_bytes())
            }
            (due, other) => {
                return Err(format!("key {i} (due: {due}): got {}", other.outcome()).into());
            }
        }
    }
    clock.advance(settings.ttl);
    let mut removed = 0;
    loop {
        let evicted = backend.evict_expired(4).await?;
        assert!(evicted.removed <= 4, "a pass stays within its limit");
        removed += evicted.removed;
        if evicted.backlog == Backlog::Empty {
            break;
        }
    }
    assert_eq!(removed, 13);
    let stats = backend.stats().await?;
    assert_eq!((stats.completed, stats.in_progress), (0, 1), "{stats:?}");
    held.complete(Response::new(200, "late")).await?;
    Ok(())
}

/// With tombstones on, a retry after the TTL is told `Expired` (never run again) until the
/// tombstone's own time runs out; then the key is new.
pub async fn tombstones_answer_expired_until_they_go<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings {
        tombstone_ttl: Duration::from_secs(600),
        ..Settings::default()
    };
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "order-0008");
    let claim = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let completed_at = Clock::now(&clock);
    claim.complete(Response::new(201, "done")).await?;

    clock.advance(settings.ttl);
    for pass in ["before eviction", "after eviction"] {
        match backend.begin(&key, fingerprint("r")).await? {
            Begin::Expired { completed_at: at } => assert_eq!(at, completed_at, "{pass}"),
            other => {
                return Err(format!("{pass}: expected Expired, got {}", other.outcome()).into());
            }
        }
        assert!(matches!(
            backend.begin(&key, fingerprint("another")).await?,
            Begin::Mismatch
        ));
        if pass == "before eviction" {
            let evicted = backend.evict_expired(10).await?;
            assert_eq!((evicted.removed, evicted.tombstones_removed), (1, 0));
        }
    }
    assert_eq!(backend.stats().await?.tombstones, 1);
    clock.advance(settings.tombstone_ttl);
    let evicted = backend.evict_expired(10).await?;
    assert_eq!((evicted.removed, evicted.tombstones_removed), (0, 1));
    let again = claimed(
        backend.begin(&key, fingerprint("r")).await?,
        "after the tombstone",
    )?;
    again.release().await?;
    Ok(())
}

/// `begin_or_wait` waits for a live holder and answers its outcome: its response if it
/// completed, a claim if it released; past `max_wait` it answers `InProgress`.
pub async fn begin_or_wait_gets_the_outcome_of_the_holder<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let max_wait = Duration::from_secs(30);

    let key = scope("tenant-a", "order-0009");
    let holder = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let waiter = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            backend
                .begin_or_wait(&key, fingerprint("r"), max_wait)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let response = stored_response("9");
    holder.complete(response.clone()).await?;
    match waiter.await?? {
        Begin::Replay(replayed) => assert_eq!(replayed, response),
        other => return Err(format!("a waiter on a commit: got {}", other.outcome()).into()),
    }

    let key = scope("tenant-a", "order-0010");
    let holder = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let waiter = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            backend
                .begin_or_wait(&key, fingerprint("r"), max_wait)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    holder.release().await?;
    let claim = match waiter.await?? {
        Begin::Claimed(claim) => claim,
        other => return Err(format!("a waiter on a release: got {}", other.outcome()).into()),
    };

    let started = tokio::time::Instant::now();
    let answer = backend
        .begin_or_wait(&key, fingerprint("r"), Duration::from_millis(200))
        .await?;
    assert!(
        matches!(answer, Begin::InProgress { .. }),
        "got {}",
        answer.outcome()
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by max_wait"
    );
    claim.release().await?;
    Ok(())
}

/// `abandoned` lists in-progress records whose lease ended, oldest lease first, with what a
/// reconciler needs to take them over; live leases and completed records are not listed.
pub async fn abandoned_lists_expired_leases_oldest_first<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let mut held = Vec::new();
    for i in 0..3 {
        let key = scope("tenant-a", &format!("abandoned-{i}"));
        let mut claim = claimed(
            backend.begin(&key, fingerprint(&format!("r{i}"))).await?,
            "new",
        )?;
        claim.checkpoint(format!("step {i}").into_bytes()).await?;
        held.push(claim);
        clock.advance(Duration::from_secs(1));
    }
    let done = claimed(
        backend
            .begin(&scope("tenant-a", "completed-1"), fingerprint("r"))
            .await?,
        "new",
    )?;
    done.complete(Response::new(200, "ok")).await?;
    assert!(
        backend.abandoned(10).await?.is_empty(),
        "every lease is live"
    );

    clock.advance(settings.lease);
    let fresh = claimed(
        backend
            .begin(&scope("tenant-a", "live-1"), fingerprint("r"))
            .await?,
        "new",
    )?;
    let listed = backend.abandoned(10).await?;
    let keys: Vec<&str> = listed.iter().map(|a| a.scope.key()).collect();
    assert_eq!(keys, ["abandoned-0", "abandoned-1", "abandoned-2"]);
    for (i, abandoned) in listed.iter().enumerate() {
        assert_eq!(abandoned.fingerprint, fingerprint(&format!("r{i}")));
        assert_eq!(abandoned.fence, held[i].fence());
        assert_eq!(abandoned.attempt, 1);
        assert_eq!(
            abandoned.checkpoint.as_deref(),
            Some(format!("step {i}").as_bytes())
        );
    }
    assert_eq!(backend.abandoned(2).await?.len(), 2, "at most the limit");
    // A reconciler takes one over with the listed fingerprint.
    let first = &listed[0];
    let taken = match backend.begin(&first.scope, first.fingerprint).await? {
        Begin::Recovered(claim) => claim,
        other => return Err(format!("expected Recovered, got {}", other.outcome()).into()),
    };
    taken.complete(Response::new(200, "reconciled")).await?;
    assert_eq!(backend.abandoned(10).await?.len(), 2);
    fresh.release().await?;
    Ok(())
}

/// The same operation and key under two tenants are two independent operations.
pub async fn tenants_never_see_each_other<H: Harness>(harness: &H) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let (a, b) = (
        scope("tenant-a", "shared-key-1"),
        scope("tenant-b", "shared-key-1"),
    );
    let claim_a = claimed(backend.begin(&a, fingerprint("a's request")).await?, "a")?;
    let claim_b = match backend.begin(&b, fingerprint("b's request")).await? {
        Begin::Claimed(claim) => claim,
        other => return Err(format!("tenant b: expected Claimed, got {}", other.outcome()).into()),
    };
    claim_a.complete(Response::new(201, "for a")).await?;
    claim_b.complete(Response::new(201, "for b")).await?;
    for (scope, request, body) in [(&a, "a's request", "for a"), (&b, "b's request", "for b")] {
        match backend.begin(scope, fingerprint(request)).await? {
            Begin::Replay(response) => assert_eq!(response.body(), body.as_bytes()),
            other => return Err(format!("{scope}: got {}", other.outcome()).into()),
        }
    }
    Ok(())
}

/// Races `tasks` tasks on each of `keys` keys: every task retries until it has the key's
/// response. Returns how many times the work ran per key.
async fn race<P: Protocol>(backend: &P, keys: usize, tasks: usize) -> Result<Vec<u32>, BoxError> {
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..keys).map(|_| AtomicU32::new(0)).collect());
    let mut racing = tokio::task::JoinSet::new();
    for task in 0..tasks {
        for k in 0..keys {
            let (backend, runs) = (backend.clone(), runs.clone());
            racing.spawn(async move {
                let key = scope("tenant-a", &format!("raced-{k:03}"));
                loop {
                    match backend.begin(&key, fingerprint("same request")).await? {
                        Begin::Claimed(claim) | Begin::Recovered(claim) => {
                            runs[k].fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            let body = format!("key {k} by task {task}");
                            let stored = claim.complete(Response::new(201, body)).await?;
                            return Ok::<_, BoxError>((k, stored.into_body()));
                        }
                        Begin::Replay(response) => return Ok((k, response.into_body())),
                        Begin::InProgress { .. } => tokio::task::yield_now().await,
                        other => return Err(format!("a racer got {}", other.outcome()).into()),
                    }
                }
            });
        }
    }
    let mut bodies: Vec<HashSet<Vec<u8>>> = vec![HashSet::new(); keys];
    while let Some(done) = racing.join_next().await {
        let (k, body) = done??;
        bodies[k].insert(body);
    }
    for (k, seen) in bodies.iter().enumerate() {
        assert_eq!(
            seen.len(),
            1,
            "key {k}: every racer got the one stored response"
        );
    }
    Ok(runs.iter().map(|r| r.load(Ordering::SeqCst)).collect())
}

/// 64 tasks racing each of 8 keys: the work runs exactly once per key, and every task gets
/// that run's response.
pub async fn sixty_four_racing_tasks_run_each_key_once<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let runs = race(&backend, 8, 64).await?;
    assert_eq!(runs, vec![1; 8], "side effects per key");
    let stats = backend.stats().await?;
    assert_eq!((stats.completed, stats.in_progress), (8, 0), "{stats:?}");
    Ok(())
}

/// 64 tasks racing to take over one expired lease: exactly one recovers it, and the work runs
/// once more, not 64 times.
pub async fn sixty_four_racing_take_overs_recover_once<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "raced-000");
    let crashed = claimed(
        backend.begin(&key, fingerprint("same request")).await?,
        "new",
    )?;
    clock.advance(settings.lease);
    let recovered = Arc::new(AtomicU32::new(0));
    let mut racing = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (backend, key, recovered) = (backend.clone(), key.clone(), recovered.clone());
        racing.spawn(async move {
            match backend.begin(&key, fingerprint("same request")).await? {
                Begin::Recovered(claim) => {
                    recovered.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(Some(claim))
                }
                Begin::InProgress { .. } => Ok(None),
                other => Err(format!("a racer got {}", other.outcome()).into()),
            }
        });
    }
    let mut winner = None;
    while let Some(done) = racing.join_next().await {
        if let Some(claim) = done?? {
            winner = Some(claim);
        }
    }
    assert_eq!(
        recovered.load(Ordering::SeqCst),
        1,
        "take-overs of one lease"
    );
    let winner = winner.ok_or("nobody took the lease over")?;
    assert_eq!(winner.attempt(), 2);
    winner.complete(Response::new(201, "once")).await?;
    drop(crashed);
    Ok(())
}
