//! Waiting longer after each failure, with jitter: for retrying a checkpoint and for healing a
//! poisoned store, so that a disk that stays broken is not hammered.

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
        let jitter = wait.mul_f64(crate::model::jitter::random_fraction() / 4.0);
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
}
