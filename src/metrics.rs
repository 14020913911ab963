//! The store's metrics through the `metrics` facade (feature `metrics`), so that whatever
//! exporter the application installs (Prometheus, StatsD, ...) receives them; without the
//! feature every function here is an empty inline no-op.
//!
//! This module owns the names and labels; it is called from the one place each event happens
//! (`engine::counters` for most, the poison flag, the log's sync) and never decides anything.
//! Labels are bounded: a `begin` outcome or a record state, never a key or a tenant. The
//! table of every metric is in the README ("Operating it").

use std::time::Duration;

/// `begin` answers, by outcome.
pub(crate) const BEGIN: &str = "idemstore_begin_total";
/// `begin` latency, by outcome.
pub(crate) const BEGIN_SECONDS: &str = "idemstore_begin_duration_seconds";
/// Acknowledged commits (claims completed with their response).
pub(crate) const COMMITS: &str = "idemstore_commits_total";
/// `commit` latency: from the call to the durable answer.
pub(crate) const COMMIT_SECONDS: &str = "idemstore_commit_duration_seconds";
/// Acknowledged releases.
pub(crate) const RELEASES: &str = "idemstore_releases_total";
/// Operations refused because another attempt took the scope over.
pub(crate) const STALE: &str = "idemstore_stale_claim_refusals_total";
/// Completed records evicted after their TTL.
pub(crate) const EVICTED: &str = "idemstore_evicted_records_total";
/// Tombstones removed after their time.
pub(crate) const TOMBSTONES_REMOVED: &str = "idemstore_tombstones_removed_total";
/// Times the store was poisoned (a failure of unknown outcome; writes refused until healed).
pub(crate) const POISONED: &str = "idemstore_poison_events_total";
/// In-place recoveries.
pub(crate) const RESTORES: &str = "idemstore_restores_total";
/// Log checkpoints.
pub(crate) const CHECKPOINTS: &str = "idemstore_checkpoints_total";
/// Requests per writer group.
pub(crate) const GROUP_SIZE: &str = "idemstore_group_size";
/// One log frame's `fdatasync`.
pub(crate) const LOG_SYNC_SECONDS: &str = "idemstore_log_sync_duration_seconds";
/// Records by state.
pub(crate) const RECORDS: &str = "idemstore_records";
/// Age of the oldest work in progress.
pub(crate) const OLDEST_IN_PROGRESS: &str = "idemstore_oldest_in_progress_seconds";
/// Log bytes a crash now would replay.
pub(crate) const LOG_SINCE_CHECKPOINT: &str = "idemstore_log_bytes_since_checkpoint";
/// Size of the database file.
pub(crate) const FILE_BYTES: &str = "idemstore_file_bytes";
/// Log shipping: a frame's time from its local sync to the replica's acknowledgement.
pub(crate) const SHIP_LAG_SECONDS: &str = "idemstore_ship_lag_seconds";
/// Log shipping: how long the oldest frame not yet acknowledged has waited (0 when none).
pub(crate) const SHIP_BEHIND_SECONDS: &str = "idemstore_ship_behind_seconds";
/// Log shipping: frames acknowledged by the replica.
pub(crate) const SHIP_FRAMES: &str = "idemstore_ship_frames_total";
/// Log shipping: 1 while the replica is unreachable, the stream is written by another store,
/// or a snapshot must replace lost frames; else 0. The alert.
pub(crate) const SHIP_ALERT: &str = "idemstore_ship_alert";
/// Log shipping: snapshots sent.
pub(crate) const SHIP_SNAPSHOTS: &str = "idemstore_ship_snapshots_total";
/// Log shipping: snapshots that could not be made or sent (each is tried again).
pub(crate) const SHIP_SNAPSHOT_FAILURES: &str = "idemstore_ship_snapshot_failures_total";

/// Counts a `begin` answer and its latency. `outcome` is one of six fixed names; `tenant` is
/// `Some` only when the user opted in (`MetricLabels::WithTenant`).
#[inline]
pub(crate) fn begin(outcome: &'static str, tenant: Option<&str>, took: Duration) {
    #[cfg(feature = "metrics")]
    {
        match tenant {
            Some(tenant) => metrics::counter!(
                BEGIN, "outcome" => outcome, "tenant" => tenant.to_owned()
            )
            .increment(1),
            None => metrics::counter!(BEGIN, "outcome" => outcome).increment(1),
        }
        metrics::histogram!(BEGIN_SECONDS, "outcome" => outcome).record(took.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (BEGIN, BEGIN_SECONDS, outcome, tenant, took);
}

/// Adds `n` to a counter without labels.
#[inline]
pub(crate) fn count(name: &'static str, n: u64) {
    #[cfg(feature = "metrics")]
    metrics::counter!(name).increment(n);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, n);
}

/// Records a latency.
#[inline]
pub(crate) fn seconds(name: &'static str, took: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!(name).record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (name, took);
}

/// Records one writer group's size.
#[inline]
pub(crate) fn group(size: usize) {
    #[cfg(feature = "metrics")]
    metrics::histogram!(GROUP_SIZE).record(size as f64);
    #[cfg(not(feature = "metrics"))]
    let _ = (GROUP_SIZE, size);
}

/// Sets a gauge without labels.
#[inline]
pub(crate) fn gauge(name: &'static str, value: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(name).set(value);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, value);
}

/// Sets the records-by-state gauges and the age of the oldest work in progress (0 with none),
/// from either backend's exact count.
#[inline]
pub(crate) fn records(in_progress: u64, completed: u64, tombstones: u64, oldest: Option<Duration>) {
    #[cfg(feature = "metrics")]
    for (state, n) in [
        ("in_progress", in_progress),
        ("completed", completed),
        ("tombstone", tombstones),
    ] {
        metrics::gauge!(RECORDS, "state" => state).set(n as f64);
    }
    gauge(OLDEST_IN_PROGRESS, oldest.map_or(0.0, |d| d.as_secs_f64()));
    #[cfg(not(feature = "metrics"))]
    let _ = (RECORDS, in_progress, completed, tombstones);
}
