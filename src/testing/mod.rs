//! Tools for testing a store against crashes and I/O faults (feature `testing`).
//!
//! [`SimDisk`] runs a store on simulated storage that can crash at any operation; the bodies of
//! the fuzz targets live here too, so a seeded test runs them on stable. [`conformance`] is the
//! suite every backend of the claim protocol must pass, and [`outbox_conformance`] the one
//! every backend's outbox and the relay over it must pass. [`wait`] is the one polling helper
//! for tests that wait on another task.

#[cfg(feature = "tokio")]
pub mod conformance;
mod crash;
mod damage;
mod log_decode;
#[cfg(feature = "tokio")]
pub mod outbox_conformance;
#[cfg(feature = "postgres")]
pub mod postgres;
mod record_decode;
mod replica;
#[cfg(feature = "tokio")]
pub mod wait;
mod workload;

pub use crate::storage::sim_disk::{DiskCounters, FaultPlan, SecondFault, SimDisk, Tear, Then};
pub use crash::{
    CaseReport, CrashCase, CrashOp, Fault, REOPENS, Violation, run_case, second_faults,
};
pub use damage::damage;
pub use log_decode::{build_segment, check_log_decode};
pub use record_decode::{check_record_decode, sample_records};
pub use replica::{MemoryReplica, ReplicaFault};
pub use workload::{Rng, workload};

/// The box-loss protocol's rules as pure transitions, for the model checker that explores
/// them (`tests/suite/handover_model.rs`): the same functions the replicas, the shipper and
/// the restore call.
pub mod handover {
    pub use crate::model::restore::{Lineage, PendingRestore, RestoreMark, RestoreWindow};
    pub use crate::model::writer_epoch::{
        AfterClaim, Claim, Refusal, SameStore, Slot, after_claim, claim, claimed, follows,
        may_write, released, taken_over,
    };
}

/// Bytes in the store's redb page cache now: what a test checks the memory budget against
/// (redb counts them because feature `testing` turns on its `cache_metrics`).
///
/// # Errors
/// If the database is being reopened after a failure.
pub fn redb_cache_used_bytes(store: &crate::Store) -> Result<usize, crate::StoreError> {
    store.engine().redb_cache_used()
}

/// One pass of the background sweeper, run by hand: up to `limit` records, as
/// [`Store::evict_expired`](crate::Store::evict_expired) removes them. For tests and benches
/// that drive eviction with a manual clock.
///
/// # Errors
/// [`StoreError`](crate::StoreError) if storage fails or the store is poisoned.
pub fn sweep_pass(store: &crate::Store, limit: usize) -> Result<crate::Evicted, crate::StoreError> {
    store.engine().evict(limit)
}
