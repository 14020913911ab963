//! What the relay has done since it started.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) delivered: AtomicU64,
    pub(super) retried: AtomicU64,
    pub(super) unavailable: AtomicU64,
    pub(super) dead_lettered: AtomicU64,
    pub(super) passes: AtomicU64,
    pub(super) last_error: Mutex<Option<String>>,
}

/// The relay's activity since it started. The outbox's own size (pending messages, the age of
/// the oldest, dead letters) is in [`Stats`](crate::Stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Messages the sink accepted.
    pub delivered: u64,
    /// Failed attempts that will be retried.
    pub retried: u64,
    /// Attempts that found the sink [`Unavailable`](super::Unavailable) (not counted against
    /// the message's attempts).
    pub unavailable: u64,
    /// Messages moved to the dead letters.
    pub dead_lettered: u64,
    /// Passes over the outbox.
    pub passes: u64,
    /// The last error: of the sink, or of the store while reading or settling.
    pub last_error: Option<String>,
}

impl Counters {
    pub(super) fn snapshot(&self) -> RelayStats {
        RelayStats {
            delivered: self.delivered.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            unavailable: self.unavailable.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            passes: self.passes.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
        }
    }

    pub(super) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn error(&self, error: String) {
        *self.last_error.lock() = Some(error);
    }
}
