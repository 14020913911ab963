//! Counters the writer keeps, read without locks by `Store::stats`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Requests sent to the writer and not yet taken into a group.
    pub(crate) queued: AtomicUsize,
    /// Groups that wrote something and were made durable.
    pub(crate) groups_committed: AtomicU64,
    /// Requests answered by the writer (in any group, written or not).
    pub(crate) requests: AtomicU64,
    /// Bytes appended to the write-ahead log (frames with their headers).
    pub(crate) log_bytes: AtomicU64,
    /// Log checkpoints made (redb made durable, log segments freed).
    pub(crate) checkpoints: AtomicU64,
}

impl Counters {
    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}
