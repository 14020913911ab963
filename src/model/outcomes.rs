//! The events every backend counts the same way: what `begin` answered, the stale claims
//! refused, what eviction removed (kept for `stats`), and the commits and releases
//! acknowledged (metrics only). Each is counted and sent to the `metrics` facade here, once
//! for both backends; each backend's stats read the counts with [`Outcomes::fill`], and the
//! local store adds its log and writer counters around them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::metrics;
use crate::model::begin::Begin;
use crate::model::stats::Stats;

/// Outcomes since the store was opened, in this process.
#[derive(Debug, Default)]
pub(crate) struct Outcomes {
    claims: AtomicU64,
    recoveries: AtomicU64,
    replays: AtomicU64,
    in_progress: AtomicU64,
    mismatches: AtomicU64,
    expired: AtomicU64,
    /// Operations refused because the claim's fence was stale.
    stale: AtomicU64,
    /// Completed records evicted, and tombstones removed.
    evicted: AtomicU64,
    tombstones_removed: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Outcomes {
    /// Counts a `begin` answer that took `took` (from the call to the answer); `tenant` only
    /// where the user opted in to the label.
    pub(crate) fn answered<C>(&self, answer: &Begin<C>, tenant: Option<&str>, took: Duration) {
        metrics::begin(answer.outcome(), tenant, took);
        add(
            match answer {
                Begin::Claimed(_) => &self.claims,
                Begin::Recovered(_) => &self.recoveries,
                Begin::Replay(_) => &self.replays,
                Begin::InProgress { .. } => &self.in_progress,
                Begin::Mismatch => &self.mismatches,
                Begin::Expired { .. } => &self.expired,
            },
            1,
        );
    }

    /// Counts an acknowledged (durable) commit that took `took`.
    pub(crate) fn committed(&self, took: Duration) {
        metrics::count(metrics::COMMITS, 1);
        metrics::seconds(metrics::COMMIT_SECONDS, took);
    }

    /// Counts an acknowledged release.
    pub(crate) fn released(&self) {
        metrics::count(metrics::RELEASES, 1);
    }

    /// Counts a refusal of a stale claim.
    pub(crate) fn stale(&self) {
        add(&self.stale, 1);
        metrics::count(metrics::STALE, 1);
    }

    /// Counts what an eviction pass removed.
    pub(crate) fn evicted(&self, records: u64, tombstones: u64) {
        add(&self.evicted, records);
        add(&self.tombstones_removed, tombstones);
        metrics::count(metrics::EVICTED, records);
        metrics::count(metrics::TOMBSTONES_REMOVED, tombstones);
    }

    /// Fills in a [`Stats`]'s outcome counters.
    pub(crate) fn fill(&self, stats: &mut Stats) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        stats.claims = get(&self.claims);
        stats.recoveries = get(&self.recoveries);
        stats.replays = get(&self.replays);
        stats.in_progress_answers = get(&self.in_progress);
        stats.mismatches = get(&self.mismatches);
        stats.expired_answers = get(&self.expired);
        stats.stale_rejections = get(&self.stale);
        stats.evicted = get(&self.evicted);
        stats.tombstones_removed = get(&self.tombstones_removed);
    }
}
