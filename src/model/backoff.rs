//! Waiting longer after each failure, with jitter: the one rule for every retry in the crate
//! (a checkpoint, healing a poisoned store, the relay's deliveries and its store, the
//! completer, a waiter's polls, the `Retry-After` of an outage), so that a peer that stays
//! down is not hammered and many retriers do not come back in step.
//!
//! A wait doubles from `first` up to `max` ([`Doubling`]); the jitter ([`spread`]) then takes
//! up to half of it off at random ("equal jitter"): never longer than the rule says, never
//! less than half.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::time::{Duration, Instant};

/// A wait that doubles after each failure in a row, from `first` up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Doubling {
    first: Duration,
    max: Duration,
}

impl Doubling {
    /// `max` below `first` is taken as `first`.
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Doubling {
            first,
            max: max.max(first),
        }
    }

    /// The wait after the `failures`-th failure in a row (1 and 0 both wait `first`), before
    /// jitter.
    pub(crate) fn after(self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        let wait = self.first.saturating_mul(1u32 << doublings).min(self.max);
        debug_assert!(wait >= self.first.min(self.max) && wait <= self.max);
        wait
    }

    /// [`Doubling::after`] with the jitter applied.
    pub(crate) fn spread_after(self, failures: u32) -> Duration {
        spread(self.after(failures))
    }
}

/// `wait` with up to half of it taken off at random: in `(wait / 2, wait]`.
pub(crate) fn spread(wait: Duration) -> Duration {
    let spread = wait.mul_f64(1.0 - 0.5 * random_fraction());
    debug_assert!(spread <= wait);
    spread
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

/// When to try something again after it failed: [`Doubling`] with its count of failures and
/// the instant the next attempt is due.
#[derive(Debug)]
pub(crate) struct Backoff {
    rule: Doubling,
    /// Failures in a row since the last success.
    failures: u32,
    /// When the next attempt may run.
    next: Option<Instant>,
}

impl Backoff {
    /// `first` is the wait after one failure; it doubles up to `max`. A `first` of
    /// `Duration::MAX` means "never retry on a timer".
    pub(crate) fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            rule: Doubling::new(first, max),
            failures: 0,
            next: None,
        }
    }

    /// An attempt failed: the next waits longer. Returns that wait.
    pub(crate) fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = self.rule.spread_after(self.failures);
        self.next = Instant::now().checked_add(wait);
        wait
    }

    /// An attempt succeeded.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
        self.next = None;
    }

    /// Whether an attempt may run now.
    pub(crate) fn due(&self) -> bool {
        self.next.is_none_or(|next| Instant::now() >= next)
    }

    /// How long until an attempt may run; `None` if retrying on a timer is off.
    pub(crate) fn wait(&self) -> Option<Duration> {
        if self.rule.first == Duration::MAX {
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

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_from_first_up_to_max() {
        let rule = Doubling::new(100 * MS, 300 * MS);
        let waits: Vec<Duration> = (0..6).map(|n| rule.after(n)).collect();
        assert_eq!(
            waits,
            [100 * MS, 100 * MS, 200 * MS, 300 * MS, 300 * MS, 300 * MS]
        );
        assert_eq!(
            Doubling::new(100 * MS, MS).after(5),
            100 * MS,
            "max below first"
        );
        assert_eq!(
            Doubling::new(Duration::MAX, Duration::MAX).after(u32::MAX),
            Duration::MAX,
            "saturates"
        );
    }

    #[test]
    fn the_jitter_takes_off_up_to_half_and_varies() {
        let samples: Vec<Duration> = (0..200).map(|_| spread(100 * MS)).collect();
        assert!(samples.iter().all(|w| *w > 50 * MS && *w <= 100 * MS));
        assert!(samples.windows(2).any(|w| w[0] != w[1]), "{samples:?}");
        let fractions: Vec<f64> = (0..64).map(|_| random_fraction()).collect();
        assert!(fractions.iter().all(|f| (0.0..1.0).contains(f)));
    }

    #[test]
    fn a_backoff_counts_failures_and_resets_on_success() {
        let mut b = Backoff::new(100 * MS, 300 * MS);
        assert!(b.due());
        assert_eq!(b.wait(), Some(Duration::ZERO));
        let first = b.failed();
        assert!(first > 50 * MS && first <= 100 * MS, "{first:?}");
        assert!(!b.due());
        assert!(b.wait().unwrap_or_default() <= first);
        for _ in 0..3 {
            b.failed();
        }
        let capped = b.wait().unwrap_or_default();
        assert!(capped <= 300 * MS, "{capped:?}");
        b.reset();
        assert!(b.due());
        assert_eq!(Backoff::new(Duration::MAX, Duration::MAX).wait(), None);
    }
}
