//! How long to tell clients to wait while the store cannot answer: longer the longer it lasts,
//! and never the same for everyone, so that a recovering store is not met by every client at
//! once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::model::backoff::spread;

/// The first `Retry-After` of an outage, in seconds.
const FIRST: u64 = 1;
/// The longest `Retry-After`, in seconds.
const LONGEST: u64 = 60;

/// Tracks the current outage of the store, as the middleware sees it.
#[derive(Debug)]
pub(crate) struct Outage {
    /// When the layer was made: the origin of `since_ms`.
    origin: Instant,
    /// Milliseconds from `origin` to the first failure of the current outage, plus one; zero
    /// while the store answers.
    since_ms: AtomicU64,
}

impl Default for Outage {
    fn default() -> Self {
        Outage {
            origin: Instant::now(),
            since_ms: AtomicU64::new(0),
        }
    }
}

impl Outage {
    /// The store answered: the outage, if any, is over.
    pub(crate) fn answered(&self) {
        if self.since_ms.load(Ordering::Relaxed) != 0 {
            self.since_ms.store(0, Ordering::Relaxed);
        }
    }

    /// The store failed: how long this client should wait. About the outage so far (at least
    /// 1 s, at most 60 s), with the crate's jitter ([`spread`]) taking up to half off.
    pub(crate) fn failed(&self) -> Duration {
        let now = u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let since =
            match self
                .since_ms
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => now,
                Err(since) => since,
            };
        let lasted = Duration::from_millis(now.saturating_sub(since));
        let base = Duration::from_secs(lasted.as_secs().clamp(2 * FIRST, LONGEST));
        let secs = spread(base).as_secs_f64().round() as u64;
        Duration::from_secs(secs.clamp(FIRST, LONGEST))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_start_short_spread_out_and_reset() {
        let outage = Outage::default();
        let first: Vec<u64> = (0..200).map(|_| outage.failed().as_secs()).collect();
        assert!(first.iter().all(|&s| (1..=2).contains(&s)), "{first:?}");
        assert!(
            first.contains(&1) && first.contains(&2),
            "jitter spreads them"
        );
        outage.answered();
        assert_eq!(outage.since_ms.load(Ordering::Relaxed), 0);
    }
}
