//! Waiting longer after each failure, with jitter: for retrying a checkpoint and for healing a
//! poisoned store, so that a disk that stays broken is not hammered.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::time::{Duration, Instant};

/// When to try something again after it failed.
#[derive(Debug)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    /// The wait after the last failure, if the last attempt failed.
    current: Option<Duration>,
    /// When the next attempt may run.
    next: Option<Instant>,
}

impl Backoff {
    /// `first` is the wait after one failure; it doubles up to `max`. A `first` of
    /// `Duration::MAX` means "never retry on a timer".
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            current: None,
            next: None,
        }
    }

    /// An attempt failed: the next waits longer (with up to a quarter more, at random, so
    /// that several stores or clients do not retry in step).
    pub(crate) fn failed(&mut self) {
        let wait = self
            .current
            .map_or(self.first, |w| w.saturating_mul(2))
            .min(self.max);
        self.current = Some(wait);
        let jitter = wait.mul_f64(random_fraction() / 4.0);
        self.next = Instant::now().checked_add(wait.saturating_add(jitter));
    }

    /// An attempt succeeded.
    pub(crate) fn reset(&mut self) {
        self.current = None;
        self.next = None;
    }

    /// Whether an attempt may run now.
    pub(crate) fn due(&self) -> bool {
        self.next.is_none_or(|next| Instant::now() >= next)
    }

    /// How long until an attempt may run; `None` if retrying on a timer is off.
    pub(crate) fn wait(&self) -> Option<Duration> {
        if self.first == Duration::MAX {
            return None;
        }
        Some(self.next.map_or(Duration::ZERO, |next| {
            next.saturating_duration_since(Instant::now())
        }))
    }
}

/// A number in `[0, 1)`, different on every call (from the standard library's per-process
/// random hash keys): enough to spread retries, not for anything secret.
pub(crate) fn random_fraction() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos().into()),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_reset_on_success() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(300));
        assert!(b.due());
        assert_eq!(b.wait(), Some(Duration::ZERO));
        b.failed();
        assert!(!b.due());
        let first = b.wait().unwrap_or_default();
        assert!(first > Duration::from_millis(50) && first <= Duration::from_millis(125));
        b.failed();
        b.failed();
        b.failed();
        let capped = b.wait().unwrap_or_default();
        assert!(capped <= Duration::from_millis(375), "{capped:?}");
        b.reset();
        assert!(b.due());
        assert_eq!(Backoff::new(Duration::MAX, Duration::MAX).wait(), None);
    }

    #[test]
    fn random_fractions_are_in_range_and_vary() {
        let samples: Vec<f64> = (0..64).map(|_| random_fraction()).collect();
        assert!(samples.iter().all(|f| (0.0..1.0).contains(f)));
        assert!(samples.windows(2).any(|w| w[0] != w[1]));
    }
}
