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

mod claims;
mod decide;
mod execute;
mod races;
mod retention;
mod waiting;

pub use claims::*;
pub use decide::*;
pub use execute::*;
pub use races::*;
pub use retention::*;
pub use waiting::*;

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
            .table(ROWS)
            .open(self.fresh_dir())?)
    }
}

/// The business table of the local harness's `execute` work: row name → 1.
const ROWS: redb::TableDefinition<'static, &str, u64> =
    redb::TableDefinition::new("conformance.rows");

impl ExecuteHarness for Local {
    async fn execute(
        backend: &Store,
        scope: &Scope,
        fingerprint: Fingerprint,
        row: String,
        work: Work,
        ran: Arc<AtomicU32>,
    ) -> Result<crate::model::execution::Execution, crate::error::ExecuteError> {
        backend
            .execute_async(scope, fingerprint, move |tx| {
                ran.fetch_add(1, Ordering::SeqCst);
                tx.insert(&ROWS, row.as_str(), 1)?;
                execute::finish(work)
            })
            .await
    }

    async fn rows(backend: &Store) -> Result<Vec<String>, BoxError> {
        use redb::ReadableTable;
        let table = backend.read()?.open_table(ROWS)?;
        let mut rows = Vec::new();
        for entry in table.iter()? {
            rows.push(entry?.0.value().to_owned());
        }
        Ok(rows)
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
            begin_answers_what_the_state_machine_decides,
            a_live_claim_answers_in_progress_and_writes_nothing,
            in_progress_advises_the_operations_pace_within_the_lease,
            another_fingerprint_is_a_mismatch_and_changes_nothing,
            an_expired_lease_is_recovered_with_its_checkpoint,
            a_stale_holder_is_refused_on_every_operation,
            a_released_key_is_claimed_afresh,
            the_downstream_key_names_the_request_not_the_store,
            expired_records_are_evicted_in_bounded_passes_and_live_ones_never,
            tombstones_answer_expired_until_they_go,
            begin_or_wait_gets_the_outcome_of_the_holder,
            abandoned_lists_expired_leases_oldest_first,
            tenants_never_see_each_other,
            sixty_four_racing_tasks_run_each_key_once,
            sixty_four_racing_take_overs_recover_once,
            a_burst_of_begins_gets_one_claim_per_key_and_exact_answers,
            execute_runs_once_and_replays_byte_for_byte,
            failed_or_panicked_execute_writes_nothing,
            execute_defers_to_a_live_claim_and_takes_over_an_expired_one,
            sixty_four_racing_executes_run_each_key_once
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
