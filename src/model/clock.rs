//! Time, injected: every lease and TTL decision reads a [`Clock`], so tests move time forward
//! instead of sleeping.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch: the unit of every lease and expiry stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// A timestamp from milliseconds since the Unix epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// `self + d`, saturating at the far future instead of wrapping.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_millis(d)))
    }

    /// `self - d`, saturating at the epoch.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_millis(d)))
    }

    /// How long from `earlier` to `self`; zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// Whole milliseconds in `d`, rounded up so a non-zero duration never becomes zero.
pub(crate) fn duration_millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if !d.subsec_nanos().is_multiple_of(1_000_000) {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// A source of the current time.
///
/// The store reads it on every decision; it must be cheap and monotonic enough that leases do
/// not jump backwards by more than the lease length.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock. The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that moves only when told to, for tests of leases and TTLs without sleeping.
///
/// Clones share the same time, so a test keeps one handle and gives another to the store.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    ms: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> Self {
        ManualClock {
            ms: Arc::new(AtomicU64::new(start.0)),
        }
    }

    /// Moves time forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.ms.fetch_add(duration_millis(d), Ordering::SeqCst);
    }

    /// Sets the time (it may go backwards: tests of clock skew need that).
    pub fn set(&self, t: Timestamp) {
        self.ms.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.ms.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_millisecond_durations_round_up() {
        assert_eq!(duration_millis(Duration::from_micros(1)), 1);
        assert_eq!(duration_millis(Duration::from_millis(3)), 3);
        assert_eq!(duration_millis(Duration::from_micros(3001)), 4);
    }

    #[test]
    fn manual_clock_clones_share_time() {
        let a = ManualClock::new(Timestamp::from_millis(10));
        let b = a.clone();
        a.advance(Duration::from_secs(1));
        assert_eq!(b.now(), Timestamp::from_millis(1010));
    }
}
