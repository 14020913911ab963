//! How long an operation's claims take, from claim to completion, and what a duplicate of a
//! request in flight is told from that: the `retry_after` of
//! [`Begin::InProgress`](crate::Begin::InProgress) on every backend, and the HTTP layer's
//! `Retry-After` on a 409.
//!
//! The lease is the wrong answer to "when will it be done": it is how long a holder may run
//! before it counts as dead (30 s by default), while most requests finish in milliseconds.
//! A client told the lease waits that long for an answer that was ready at once.
//!
//! This module owns the rule ([`advice`]) and the per-operation estimate it reads ([`Pace`]).
//! It reads no clock: callers pass durations measured on their store's clock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::RwLock;

/// The shortest advice: `Retry-After` counts whole seconds, so anything shorter is one
/// second on the wire anyway, and a client polling faster than that mostly reads "still in
/// progress" again. Shorter only when the lease itself ends sooner.
pub(crate) const SHORTEST: Duration = Duration::from_secs(1);

/// Operations tracked at most: a store serves a handful of operation names (an HTTP service,
/// one per route), so this bounds memory without ever being reached in practice. Operations
/// past it get the advice for an operation with no history.
pub(crate) const MAX_OPERATIONS: usize = 256;

/// The weight of a new sample in the moving average, as a shift: 1/8, TCP's for its smoothed
/// round-trip time. Recent enough to follow a change within a few dozen requests, smooth
/// enough that one outlier moves it by an eighth.
const WEIGHT_SHIFT: u32 = 3;

/// No sample yet.
const EMPTY: u64 = u64::MAX;

/// A claim in flight, as a duplicate of its request finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InFlight {
    /// Until its lease ends: a live lease, so more than zero.
    pub(crate) lease_left: Duration,
    /// How long it has run. A take-over's start is not stored (only its first attempt's), so
    /// a recovered attempt counts as just started: zero.
    pub(crate) running_for: Duration,
}

/// What to tell a duplicate of a request in flight: the time the holder probably still
/// needs, between [`SHORTEST`] (or the lease's end, if sooner) and the lease's end.
///
/// - With an `estimate` of the operation's completion time that the holder has not reached
///   yet: what is left of it.
/// - With no history, or an estimate the holder has already outrun (so it says nothing about
///   this one): as long again as it has run so far. Successive retries then back off
///   geometrically (1 s, 2 s, 4 s, ...), so a long request costs a few 409s, not one a second.
///
/// Past the lease's end the holder is presumed dead and a retry recovers it, so the advice
/// never goes beyond it.
pub(crate) fn advice(estimate: Option<Duration>, in_flight: InFlight) -> Duration {
    let InFlight {
        lease_left,
        running_for,
    } = in_flight;
    let expected = match estimate {
        Some(estimate) if estimate > running_for => estimate - running_for,
        Some(_) | None => running_for,
    };
    let shortest = SHORTEST.min(lease_left);
    let advised = expected.clamp(shortest, lease_left);
    debug_assert!(advised <= lease_left, "advice past the lease: {advised:?}");
    advised
}

/// Recent completion times, per operation name: an exponentially weighted moving average of
/// each operation's claim-to-completion durations, in this process.
///
/// Cheap on the hot path: recording a completion of a known operation takes a read lock (an
/// atomic increment) and updates an atomic; no allocation. Only an operation's first
/// completion takes the write lock and allocates its name. Per operation and not per tenant:
/// the work behind a route does not depend on who calls it, and tenants are unbounded.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    operations: RwLock<HashMap<Box<str>, Average>>,
}

impl Pace {
    /// Records that a claim of `operation` completed `took` after it was made.
    pub(crate) fn completed(&self, operation: &str, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(EMPTY - 1);
        if let Some(average) = self.operations.read().get(operation) {
            average.add(micros);
            return;
        }
        let mut operations = self.operations.write();
        if operations.len() >= MAX_OPERATIONS && !operations.contains_key(operation) {
            return;
        }
        operations.entry(operation.into()).or_default().add(micros);
        debug_assert!(operations.len() <= MAX_OPERATIONS);
    }

    /// The estimated completion time of `operation`, if one of its claims completed here.
    pub(crate) fn estimate(&self, operation: &str) -> Option<Duration> {
        self.operations.read().get(operation)?.get()
    }

    /// [`advice`] for a claim of `operation` in flight, from this estimate.
    pub(crate) fn advise(&self, operation: &str, in_flight: InFlight) -> Duration {
        advice(self.estimate(operation), in_flight)
    }
}

/// One operation's moving average, in microseconds ([`EMPTY`] before the first sample).
#[derive(Debug)]
struct Average(AtomicU64);

impl Default for Average {
    fn default() -> Self {
        Average(AtomicU64::new(EMPTY))
    }
}

impl Average {
    fn add(&self, sample: u64) {
        debug_assert!(sample < EMPTY);
        // Never fails: the closure always returns a value.
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == EMPTY {
                    sample
                } else {
                    old - (old >> WEIGHT_SHIFT) + (sample >> WEIGHT_SHIFT)
                })
            });
    }

    fn get(&self) -> Option<Duration> {
        match self.0.load(Ordering::Relaxed) {
            EMPTY => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn in_flight(running_for: Duration) -> InFlight {
        InFlight {
            lease_left: LEASE - running_for,
            running_for,
        }
    }

    #[test]
    fn a_fast_operation_is_advised_the_shortest_wait_not_the_lease() {
        assert_eq!(advice(Some(ms(50)), in_flight(ms(10))), SHORTEST);
    }

    #[test]
    fn a_slow_operation_is_advised_what_is_left_of_its_estimate() {
        assert_eq!(
            advice(
                Some(Duration::from_secs(12)),
                in_flight(Duration::from_secs(2))
            ),
            Duration::from_secs(10)
        );
    }

    #[test]
    fn an_operation_longer_than_the_lease_is_advised_the_rest_of_the_lease() {
        let running = Duration::from_secs(10);
        assert_eq!(
            advice(Some(Duration::from_secs(45)), in_flight(running)),
            LEASE - running
        );
    }

    #[test]
    fn without_history_or_once_outrun_the_advice_is_as_long_again() {
        assert_eq!(advice(None, in_flight(ms(0))), SHORTEST);
        assert_eq!(
            advice(None, in_flight(Duration::from_secs(4))),
            Duration::from_secs(4)
        );
        assert_eq!(
            advice(Some(ms(50)), in_flight(Duration::from_secs(4))),
            Duration::from_secs(4)
        );
        assert_eq!(
            advice(None, in_flight(Duration::from_secs(20))),
            Duration::from_secs(10),
            "never past the lease"
        );
    }

    #[test]
    fn a_lease_ending_within_the_shortest_wait_is_advised_its_end() {
        let ending = InFlight {
            lease_left: ms(300),
            running_for: ms(10),
        };
        assert_eq!(advice(Some(ms(5_000)), ending), ms(300));
        assert_eq!(advice(None, ending), ms(300));
    }

    #[test]
    fn the_estimate_follows_recent_completions_per_operation() {
        let pace = Pace::default();
        assert_eq!(pace.estimate("create_order"), None);
        pace.completed("create_order", ms(80));
        assert_eq!(pace.estimate("create_order"), Some(ms(80)));
        assert_eq!(pace.estimate("refund"), None, "per operation");
        for _ in 0..64 {
            pace.completed("create_order", ms(40));
        }
        let estimate = pace.estimate("create_order").unwrap_or_default();
        assert!(
            estimate >= ms(40) && estimate < ms(41),
            "close to the recent 40 ms: {estimate:?}"
        );
        pace.completed("create_order", ms(840));
        let after = pace.estimate("create_order").unwrap_or_default();
        assert!(
            after > ms(130) && after < ms(150),
            "one outlier moves it by an eighth: {after:?}"
        );
    }

    #[test]
    fn operations_past_the_bound_are_not_tracked() {
        let pace = Pace::default();
        for n in 0..MAX_OPERATIONS + 10 {
            pace.completed(&format!("op-{n}"), ms(5));
        }
        assert_eq!(pace.operations.read().len(), MAX_OPERATIONS);
        assert_eq!(pace.estimate(&format!("op-{}", MAX_OPERATIONS + 1)), None);
        assert_eq!(pace.estimate("op-0"), Some(ms(5)));
    }
}
