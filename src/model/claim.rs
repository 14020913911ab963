//! What a claim is, the same in every backend: the grant `begin` made, how a lease moves, and
//! who still holds a scope. The engine and the PostgreSQL backend both answer by these rules;
//! the claim types above them (`Claim`, `PgClaim`) carry a [`Grant`].

use std::fmt;
use std::time::Duration;

use crate::model::clock::Timestamp;
use crate::model::invalid::StaleReason;

/// The origin a claim records when its downstream key is derived from the request (the scope
/// and the fingerprint) rather than from a fence: every claim this build makes. A record of an
/// earlier build carries its first attempt's fence instead (fences start at 1), and keeps the
/// key derived from it (see [`Scope::downstream_key`](crate::model::scope::Scope)).
pub(crate) const REQUEST_ORIGIN: u64 = 0;

/// Why a claim is a recovery ([`Begin::Recovered`](crate::Begin::Recovered)): an attempt may
/// already have done the work, so find out downstream, with the claim's downstream key,
/// before doing it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Recovery {
    /// The previous attempt's lease expired and this claim took the key over from it (attempt
    /// n + 1): that attempt may have had side effects; its last checkpoint is on the claim.
    LeaseExpired,
    /// The store was restored (from a backup, or from a replica that may lag behind the old
    /// store) less than its restore window ago, and has no live record of the key: the old
    /// store may have run this request, and acknowledged it, after what the restore holds.
    /// Nothing of that attempt is here (no checkpoint); its downstream key is the one this
    /// claim has. See [`Builder::restore_window`](crate::Builder::restore_window).
    Restored,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Recovery::LeaseExpired => "lease expired, a previous attempt may have run",
            Recovery::Restored => "restored, may have run elsewhere",
        })
    }
}

/// What `begin` granted a claim: its fence, which attempt it is, and its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    /// New on every claim and take-over, never repeated in a store.
    pub(crate) fence: u64,
    /// What the downstream key derives from: [`REQUEST_ORIGIN`] (the request), or, for an
    /// operation an earlier build began, the fence of its first attempt.
    pub(crate) origin_fence: u64,
    /// 1 for a fresh claim; n + 1 when taking over from attempt n.
    pub(crate) attempt: u32,
    /// Why the claim is a recovery; `None` for a plain first attempt.
    pub(crate) recovery: Option<Recovery>,
    pub(crate) lease_until: Timestamp,
    /// When this attempt was granted (by the backend's clock): the start of the claim-to-
    /// completion time its commit adds to the operation's pace.
    pub(crate) claimed_at: Timestamp,
    /// The latest checkpoint: the previous attempt's when recovered, then this one's own.
    pub(crate) checkpoint: Option<Vec<u8>>,
}

impl Grant {
    /// What is wrong with this grant, if anything: every backend's grants keep these.
    pub(crate) fn invalid(&self) -> Option<&'static str> {
        let fenced_origin = self.origin_fence != REQUEST_ORIGIN;
        if self.attempt == 0 {
            Some("attempts count from 1")
        } else if fenced_origin && self.origin_fence > self.fence {
            Some("a take-over's fence is below its first attempt's")
        } else if self.attempt == 1 && fenced_origin && self.origin_fence != self.fence {
            Some("a first attempt is its own origin")
        } else if (self.attempt > 1) != (self.recovery == Some(Recovery::LeaseExpired)) {
            Some("exactly the take-overs recover from an expired lease")
        } else {
            None
        }
    }

    /// The grant, after asserting it is valid: for a grant the engine made itself, where an
    /// invalid one means the engine is broken.
    pub(crate) fn checked(self) -> Self {
        if let Some(broken) = self.invalid() {
            panic!("the engine granted a broken claim ({broken}): {self:?}");
        }
        self
    }
}

/// How an extension moves the end of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extension {
    /// To exactly `lease` from now, even if that is sooner (`extend`: the holder says so).
    Exactly,
    /// To `lease` from now unless it already ends later (a heartbeat never shortens a lease
    /// the holder extended itself).
    AtLeast,
}

impl Extension {
    /// Where the lease that ends at `current` ends after this extension by `lease` at `now`.
    pub(crate) fn lease_end(
        self,
        current: Timestamp,
        now: Timestamp,
        lease: Duration,
    ) -> Timestamp {
        let wanted = now.saturating_add(lease);
        match self {
            Extension::Exactly => wanted,
            Extension::AtLeast => current.max(wanted),
        }
    }
}

/// Where a stored record stands, as far as a holder's fence check cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    InProgress,
    /// Completed, or a tombstone.
    Finished,
}

/// Checks that the holder of `fence` still holds the scope, whose record is `stored` (its
/// fence and phase; `None` when there is none). An expired lease that nobody took over is still
/// held: the fence, not the clock, decides who may finish.
pub(crate) fn check_holder(stored: Option<(u64, Phase)>, fence: u64) -> Result<(), StaleReason> {
    let (current_fence, phase) = stored.ok_or(StaleReason::Gone)?;
    if current_fence != fence {
        return Err(StaleReason::TakenOver { current_fence });
    }
    match phase {
        Phase::InProgress => Ok(()),
        Phase::Finished => Err(StaleReason::AlreadyCompleted),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn an_exact_extension_may_shorten_a_lease_and_a_heartbeat_never_does() {
        let lease = Duration::from_secs(10);
        assert_eq!(
            Extension::Exactly.lease_end(t(60_000), t(1_000), lease),
            t(11_000)
        );
        assert_eq!(
            Extension::AtLeast.lease_end(t(60_000), t(1_000), lease),
            t(60_000)
        );
        assert_eq!(
            Extension::AtLeast.lease_end(t(5_000), t(1_000), lease),
            t(11_000)
        );
    }

    #[test]
    fn the_fence_decides_who_holds() {
        assert_eq!(check_holder(None, 3), Err(StaleReason::Gone));
        assert_eq!(
            check_holder(Some((4, Phase::InProgress)), 3),
            Err(StaleReason::TakenOver { current_fence: 4 })
        );
        assert_eq!(
            check_holder(Some((4, Phase::Finished)), 3),
            Err(StaleReason::TakenOver { current_fence: 4 }),
            "a take-over that then completed is still a take-over"
        );
        assert_eq!(
            check_holder(Some((3, Phase::Finished)), 3),
            Err(StaleReason::AlreadyCompleted)
        );
        assert_eq!(check_holder(Some((3, Phase::InProgress)), 3), Ok(()));
    }

    fn grant(fence: u64, origin_fence: u64, attempt: u32, recovery: Option<Recovery>) -> Grant {
        Grant {
            fence,
            origin_fence,
            attempt,
            recovery,
            lease_until: t(0),
            claimed_at: t(0),
            checkpoint: None,
        }
    }

    #[test]
    #[should_panic(expected = "broken claim (a first attempt is its own origin)")]
    fn a_first_attempt_with_another_origin_is_a_broken_grant() {
        let _ = grant(5, 4, 1, None).checked();
    }

    #[test]
    fn a_request_origin_fits_every_attempt_and_a_fenced_one_only_its_own() {
        assert_eq!(grant(5, REQUEST_ORIGIN, 1, None).invalid(), None);
        assert_eq!(
            grant(5, REQUEST_ORIGIN, 1, Some(Recovery::Restored)).invalid(),
            None
        );
        let taken_over = Some(Recovery::LeaseExpired);
        assert_eq!(grant(9, REQUEST_ORIGIN, 2, taken_over).invalid(), None);
        // An operation an earlier build began keeps its first attempt's fence.
        assert_eq!(grant(5, 5, 1, None).invalid(), None);
        assert_eq!(grant(9, 5, 2, taken_over).invalid(), None);
        assert!(grant(4, 5, 2, taken_over).invalid().is_some());
    }

    #[test]
    fn only_a_take_over_recovers_from_an_expired_lease() {
        for (attempt, recovery) in [
            (1, Some(Recovery::LeaseExpired)),
            (2, None),
            (2, Some(Recovery::Restored)),
        ] {
            assert_eq!(
                grant(9, REQUEST_ORIGIN, attempt, recovery).invalid(),
                Some("exactly the take-overs recover from an expired lease"),
                "attempt {attempt}, {recovery:?}"
            );
        }
    }

    #[test]
    fn a_restored_recovery_says_it_may_have_run_elsewhere() {
        assert_eq!(
            Recovery::Restored.to_string(),
            "restored, may have run elsewhere"
        );
    }
}
