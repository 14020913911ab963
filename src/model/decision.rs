//! The state machine, as pure functions of (stored record, request, now).
//!
//! Nothing here touches storage: the writer thread and the read path both call [`decide`], and a
//! second backend can reuse these functions with the same tests. This module must never read a
//! clock or a table itself.

use std::time::Duration;

use crate::model::claim::{Phase, REQUEST_ORIGIN, check_holder};
use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::invalid::StaleReason;
use crate::model::pace::InFlight;
use crate::model::record::{Record, RecordState, Visibility};
use crate::model::response::Response;

/// What `begin` must do, decided from the stored record alone, with what it decided on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision<'a> {
    /// No live record: claim it (fresh attempt 1). The writer answers the claim `Recovered`
    /// instead of `Claimed` while a restore that may lack acknowledged writes is recent
    /// ([`AfterRestore::covers`](crate::model::restore::AfterRestore::covers)): the old
    /// store may have run the request.
    Claim,
    /// An in-progress record whose lease ended: take it over as the next attempt.
    TakeOver(&'a Record),
    /// A completed record for the same request: answer with its response.
    Replay(&'a Response),
    /// A live claim for the same request holds the scope; what to advise its duplicate is
    /// [`pace`](crate::model::pace)'s to say.
    InProgress(InFlight),
    /// The scope is held or completed for a different request.
    Mismatch,
    /// The same request completed, but its response was evicted; the tombstone remains.
    Expired { completed_at: Timestamp },
}

/// The table in DESIGN.md, as code. `tombstone_ttl` is how long a completed record past its
/// TTL still answers `Expired` (zero: tombstones are off).
pub(crate) fn decide<'a>(
    existing: Option<&'a Record>,
    fingerprint: &Fingerprint,
    now: Timestamp,
    tombstone_ttl: Duration,
) -> Decision<'a> {
    let Some(record) = existing else {
        return Decision::Claim;
    };
    let visibility = record.visibility(now, tombstone_ttl);
    if visibility == Visibility::Gone {
        return Decision::Claim;
    }
    if record.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    if let Visibility::Tombstone { completed_at, .. } = visibility {
        return Decision::Expired { completed_at };
    }
    match &record.state {
        RecordState::Completed { response, .. } => Decision::Replay(response),
        // A stored tombstone that is no longer a tombstone by the clock is `Gone` (above).
        RecordState::Tombstone { completed_at, .. } => Decision::Expired {
            completed_at: *completed_at,
        },
        RecordState::InProgress { lease_until, .. } if *lease_until > now => {
            Decision::InProgress(in_flight(record, *lease_until, now))
        }
        RecordState::InProgress { .. } => Decision::TakeOver(record),
    }
}

/// The live claim of `record` at `now`, as its duplicate finds it. Only a first attempt's
/// start is stored (`created_at`); a take-over counts as just started.
fn in_flight(record: &Record, lease_until: Timestamp, now: Timestamp) -> InFlight {
    debug_assert!(lease_until > now, "a live lease");
    let running_for = match record.attempt {
        1 => now.saturating_since(record.created_at),
        _ => Duration::ZERO,
    };
    InFlight {
        lease_left: lease_until.saturating_since(now),
        running_for,
    }
}

/// The record written by a fresh claim: its downstream key derives from the request
/// ([`REQUEST_ORIGIN`]), so a restored store derives the same one.
pub(crate) fn claimed(
    fingerprint: Fingerprint,
    fence: u64,
    now: Timestamp,
    lease: Duration,
) -> Record {
    Record {
        fingerprint,
        fence,
        origin_fence: REQUEST_ORIGIN,
        attempt: 1,
        created_at: now,
        state: RecordState::InProgress {
            lease_until: now.saturating_add(lease),
            checkpoint: None,
        },
    }
}

/// The record written when an expired lease is taken over: a new fence, the next attempt, and
/// the previous holder's checkpoint kept for the new holder to read.
pub(crate) fn taken_over(previous: &Record, fence: u64, now: Timestamp, lease: Duration) -> Record {
    let checkpoint = match &previous.state {
        RecordState::InProgress { checkpoint, .. } => checkpoint.clone(),
        RecordState::Completed { .. } | RecordState::Tombstone { .. } => None,
    };
    Record {
        fence,
        attempt: previous.attempt.saturating_add(1),
        state: RecordState::InProgress {
            lease_until: now.saturating_add(lease),
            checkpoint,
        },
        ..previous.clone()
    }
}

/// The record written by a successful commit.
pub(crate) fn completed(
    held: &Record,
    response: Response,
    now: Timestamp,
    ttl: Duration,
) -> Record {
    Record {
        state: RecordState::Completed {
            completed_at: now,
            expires_at: now.saturating_add(ttl),
            response,
        },
        ..held.clone()
    }
}

/// Checks that the holder of `fence` still holds the scope: the record exists, is in progress
/// and carries that fence ([`check_holder`]).
pub(crate) fn check_fence(existing: Option<&Record>, fence: u64) -> Result<&Record, StaleReason> {
    let stored = existing.map(|record| {
        let phase = match record.state {
            RecordState::InProgress { .. } => Phase::InProgress,
            RecordState::Completed { .. } | RecordState::Tombstone { .. } => Phase::Finished,
        };
        (record.fence, phase)
    });
    check_holder(stored, fence)?;
    existing.ok_or(StaleReason::Gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);
    const TTL: Duration = Duration::from_secs(3600);

    fn fp(s: &str) -> Fingerprint {
        Fingerprint::of_bytes(s.as_bytes())
    }

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn absent_is_claimed() {
        assert_eq!(
            decide(None, &fp("a"), t(0), Duration::ZERO),
            Decision::Claim
        );
    }

    #[test]
    fn live_lease_same_request_is_in_progress_with_remaining_lease_and_time_run() {
        let rec = claimed(fp("a"), 1, t(1_000), LEASE);
        assert_eq!(
            decide(Some(&rec), &fp("a"), t(11_000), Duration::ZERO),
            Decision::InProgress(InFlight {
                lease_left: Duration::from_secs(20),
                running_for: Duration::from_secs(10),
            })
        );
        let recovered = taken_over(&rec, 2, t(40_000), LEASE);
        assert_eq!(
            decide(Some(&recovered), &fp("a"), t(45_000), Duration::ZERO),
            Decision::InProgress(InFlight {
                lease_left: Duration::from_secs(25),
                running_for: Duration::ZERO,
            }),
            "a take-over's start is not stored"
        );
    }

    #[test]
    fn expired_lease_is_taken_over_exactly_at_expiry() {
        let rec = claimed(fp("a"), 1, t(0), LEASE);
        assert!(matches!(
            decide(Some(&rec), &fp("a"), t(29_999), Duration::ZERO),
            Decision::InProgress(_)
        ));
        assert_eq!(
            decide(Some(&rec), &fp("a"), t(30_000), Duration::ZERO),
            Decision::TakeOver(&rec)
        );
    }

    #[test]
    fn different_request_is_a_mismatch_whatever_the_state() {
        let held = claimed(fp("a"), 1, t(0), LEASE);
        let expired_lease = held.clone();
        let done = completed(&held, Response::new(200, b"ok".to_vec()), t(5), TTL);
        assert_eq!(
            decide(Some(&held), &fp("b"), t(1), Duration::ZERO),
            Decision::Mismatch
        );
        assert_eq!(
            decide(Some(&expired_lease), &fp("b"), t(60_000), Duration::ZERO),
            Decision::Mismatch
        );
        assert_eq!(
            decide(Some(&done), &fp("b"), t(10), Duration::ZERO),
            Decision::Mismatch
        );
    }

    #[test]
    fn completed_replays_until_ttl_then_counts_as_absent() {
        let held = claimed(fp("a"), 1, t(0), LEASE);
        let done = completed(&held, Response::new(201, b"x".to_vec()), t(100), TTL);
        assert!(matches!(
            decide(Some(&done), &fp("a"), t(3_600_099), Duration::ZERO),
            Decision::Replay(r) if r.body() == b"x"
        ));
        assert_eq!(
            decide(Some(&done), &fp("a"), t(3_600_100), Duration::ZERO),
            Decision::Claim
        );
        assert_eq!(
            decide(Some(&done), &fp("b"), t(3_600_100), Duration::ZERO),
            Decision::Claim
        );
    }

    #[test]
    fn with_tombstones_a_completed_record_past_its_ttl_answers_expired_then_goes() {
        let tomb = Duration::from_secs(7 * 24 * 3600);
        let held = claimed(fp("a"), 1, t(0), LEASE);
        let done = completed(&held, Response::new(201, b"x".to_vec()), t(100), TTL);
        let expires = 100 + 3_600_000;
        assert!(matches!(
            decide(Some(&done), &fp("a"), t(expires - 1), tomb),
            Decision::Replay(_)
        ));
        assert_eq!(
            decide(Some(&done), &fp("a"), t(expires), tomb),
            Decision::Expired {
                completed_at: t(100)
            }
        );
        assert_eq!(
            decide(Some(&done), &fp("b"), t(expires), tomb),
            Decision::Mismatch
        );
        let gone = expires + 7 * 24 * 3_600_000;
        assert_eq!(
            decide(Some(&done), &fp("a"), t(gone), tomb),
            Decision::Claim
        );
        // The same answers once eviction has turned the record into a tombstone.
        let marker = Record {
            state: RecordState::Tombstone {
                completed_at: t(100),
                until: t(gone),
            },
            ..done.clone()
        };
        assert_eq!(
            decide(Some(&marker), &fp("a"), t(expires), tomb),
            Decision::Expired {
                completed_at: t(100)
            }
        );
        assert_eq!(
            decide(Some(&marker), &fp("a"), t(gone), tomb),
            Decision::Claim
        );
    }

    #[test]
    fn take_over_bumps_attempt_keeps_origin_and_checkpoint() {
        let mut held = claimed(fp("a"), 4, t(0), LEASE);
        held.state = RecordState::InProgress {
            lease_until: t(30_000),
            checkpoint: Some(b"charged".to_vec()),
        };
        let next = taken_over(&held, 9, t(40_000), LEASE);
        assert_eq!(next.fence, 9);
        assert_eq!(next.origin_fence, REQUEST_ORIGIN);
        let by_an_earlier_build = Record {
            origin_fence: 4,
            ..held.clone()
        };
        assert_eq!(
            taken_over(&by_an_earlier_build, 9, t(40_000), LEASE).origin_fence,
            4,
            "an earlier build's origin stays"
        );
        assert_eq!(next.attempt, 2);
        assert_eq!(
            next.state,
            RecordState::InProgress {
                lease_until: t(70_000),
                checkpoint: Some(b"charged".to_vec()),
            }
        );
    }

    #[test]
    fn fence_check_names_why_a_claim_is_stale() {
        let held = claimed(fp("a"), 4, t(0), LEASE);
        assert!(check_fence(Some(&held), 4).is_ok());
        assert_eq!(check_fence(None, 4), Err(StaleReason::Gone));
        assert_eq!(
            check_fence(Some(&held), 3),
            Err(StaleReason::TakenOver { current_fence: 4 })
        );
        let done = completed(&held, Response::new(200, vec![]), t(1), TTL);
        assert_eq!(
            check_fence(Some(&done), 4),
            Err(StaleReason::AlreadyCompleted)
        );
    }
}
