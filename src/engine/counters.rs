//! Counters kept since the store was opened, read without locks by `Store::stats`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::metrics;
use crate::model::begin::Begin;
use crate::model::outcomes::Outcomes;
use crate::model::stats::{GROUP_SIZE_BUCKETS, Stats};

#[derive(Debug)]
pub(crate) struct Counters {
    /// When the store was opened: the origin of `last_checkpoint_ms`.
    pub(crate) opened: std::time::Instant,
    /// Requests sent to the writer and not yet taken into a group.
    pub(crate) queued: AtomicUsize,
    /// Groups that wrote something and were made durable.
    pub(crate) groups_committed: AtomicU64,
    /// Writer groups by number of requests, in power-of-two buckets.
    pub(crate) group_sizes: [AtomicU64; GROUP_SIZE_BUCKETS],
    /// Requests answered by the writer (in any group, written or not).
    pub(crate) requests: AtomicU64,
    /// Bytes appended to the write-ahead log (frames with their headers).
    pub(crate) log_bytes: Arc<AtomicU64>,
    /// Log checkpoints made (redb made durable, log segments freed).
    pub(crate) checkpoints: AtomicU64,
    /// Epochs published: redb commits that made groups visible to readers.
    pub(crate) epochs: AtomicU64,
    /// In-place recoveries (the log replayed into redb, the file reopened if needed).
    pub(crate) restores: AtomicU64,
    /// Milliseconds since the store opened at the last checkpoint (0: none yet).
    pub(crate) last_checkpoint_ms: AtomicU64,
    /// Log bytes written since the last checkpoint, as of the last epoch.
    pub(crate) log_since_checkpoint: AtomicU64,
    /// `begin` answers, commits, releases, stale refusals, evictions: counted (and sent to
    /// the metrics facade) as on every backend.
    pub(crate) outcomes: Outcomes,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            opened: std::time::Instant::now(),
            queued: AtomicUsize::default(),
            groups_committed: AtomicU64::default(),
            group_sizes: Default::default(),
            requests: AtomicU64::default(),
            log_bytes: Arc::default(),
            checkpoints: AtomicU64::default(),
            restores: AtomicU64::default(),
            epochs: AtomicU64::default(),
            last_checkpoint_ms: AtomicU64::default(),
            log_since_checkpoint: AtomicU64::default(),
            outcomes: Outcomes::default(),
        }
    }
}

impl Counters {
    /// Counts a `begin` answer that took `took` (from the call to the answer); `tenant` only
    /// where the user opted in to the label.
    pub(crate) fn answered<C>(
        &self,
        answer: &Begin<C>,
        tenant: Option<&str>,
        took: std::time::Duration,
    ) {
        self.outcomes.answered(answer, tenant, took);
    }

    /// Fills in a [`Stats`]'s counters kept since open.
    pub(crate) fn fill(&self, stats: &mut Stats) {
        let get = Counters::get;
        stats.log_bytes = get(&self.log_bytes);
        stats.checkpoints = get(&self.checkpoints);
        stats.restores = get(&self.restores);
        self.outcomes.fill(stats);
        stats.groups_committed = get(&self.groups_committed);
        stats.epochs = get(&self.epochs);
        for (out, bucket) in stats.group_sizes.iter_mut().zip(&self.group_sizes) {
            *out = get(bucket);
        }
        stats.writer_requests = get(&self.requests);
        stats.queued = self.queued.load(Ordering::Relaxed);
    }

    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts an acknowledged commit that took `took`.
    pub(crate) fn committed(&self, took: std::time::Duration) {
        self.outcomes.committed(took);
    }

    /// Counts an acknowledged release.
    pub(crate) fn released(&self) {
        self.outcomes.released();
    }

    /// Counts a refusal of a stale claim.
    pub(crate) fn stale(&self) {
        self.outcomes.stale();
    }

    /// Counts what an eviction pass removed.
    pub(crate) fn evicted(&self, records: u64, tombstones: u64) {
        self.outcomes.evicted(records, tombstones);
    }

    /// Counts an in-place recovery.
    pub(crate) fn restored(&self) {
        Self::add(&self.restores, 1);
        metrics::count(metrics::RESTORES, 1);
    }

    /// Counts a checkpoint: nothing left in the log to replay.
    pub(crate) fn checkpointed(&self) {
        Self::add(&self.checkpoints, 1);
        metrics::count(metrics::CHECKPOINTS, 1);
        self.log_since(0);
    }

    /// Publishes the log bytes a crash now would replay.
    pub(crate) fn log_since(&self, bytes: u64) {
        self.log_since_checkpoint.store(bytes, Ordering::Relaxed);
        metrics::gauge(metrics::LOG_SINCE_CHECKPOINT, bytes as f64);
    }

    /// Counts one writer group of `size` requests.
    pub(crate) fn group(&self, size: usize) {
        metrics::group(size);
        let bucket = (usize::BITS - size.max(1).leading_zeros() - 1) as usize;
        Self::add(&self.group_sizes[bucket.min(GROUP_SIZE_BUCKETS - 1)], 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_sizes_land_in_power_of_two_buckets() {
        let c = Counters::default();
        for size in [1, 2, 3, 4, 7, 8, 600, 100_000] {
            c.group(size);
        }
        let got: Vec<u64> = c.group_sizes.iter().map(Counters::get).collect();
        assert_eq!(got, vec![1, 2, 2, 1, 0, 0, 0, 0, 0, 1, 1]);
    }
}
