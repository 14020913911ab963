//! The outbox's conformance suite: what every backend's outbox and the relay over it must
//! keep, written once and run on the local store (both durability modes) and PostgreSQL
//! (features `testing` and `tokio`).
//!
//! A case opens a fresh backend through an [`OutboxHarness`], commits messages through
//! real claims (a [`ManualClock`] moves leases: no case sleeps to wait for one), runs a real
//! [`Relay`] into a sink the case keeps a handle on, and checks what arrived: every
//! committed id, its payload, per-subject order, how many deliveries, the dead letters.
//! Waiting for the relay is [`wait`](crate::testing::wait): polling with a generous deadline
//! and a message saying what did not happen.
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

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::conformance::Local;
use super::wait::{eventually, within};
use crate::api::claim::{Begin, Claim};
use crate::api::store::Store;
use crate::error::{BoxError, CommitError};
use crate::model::clock::{Clock, ManualClock, Timestamp};
use crate::model::config::Sweep;
use crate::model::fingerprint::Fingerprint;
use crate::model::message::Message;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::protocol::{Protocol, ProtocolClaim};
use crate::relay::{Outbox, Relay, RelayConfig, Sink};

mod delivery;
mod messages;

pub use delivery::*;
pub use messages::*;

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
/// not cover: a commit that publishes, and opening the same data again.
pub trait OutboxHarness: Send + Sync {
    /// The backend under test.
    type Backend: Protocol + Outbox;
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

/// Waits until the outbox has `pending` messages and `dead` dead letters.
async fn outbox_is<B: Protocol>(backend: &B, pending: u64, dead: u64) -> Result<(), BoxError> {
    let what = format!("{pending} pending and {dead} dead letters");
    eventually(&what, || async {
        let stats = backend.stats().await?;
        Ok(stats.outbox_pending == pending && stats.dead_letters == dead)
    })
    .await?;
    Ok(())
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
