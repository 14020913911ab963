//! The backend's `begin` against the state machine itself: each answer is the one
//! [`decide`](crate::model::decision::decide) gives for the same record at the same time. A
//! backend that restates the decision (PostgreSQL does, in its claiming statement's `WHERE`)
//! is tied to the one copy here, at every edge of the table.

use std::time::Duration;

use super::{
    Backlog, Begin, BoxError, Clock, Harness, ManualClock, Protocol, ProtocolClaim, Response,
    Scope, Settings, claimed, clock, fingerprint, scope,
};
use crate::model::decision::{self, Decision};
use crate::model::record::{Record, RecordState};

/// The record a scenario leaves before its probe.
#[derive(Debug, Clone, Copy)]
enum Setup {
    Absent,
    InProgress,
    Completed,
    /// Completed, past its TTL, and turned into a tombstone by an eviction.
    Evicted,
}

/// The request that probes the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Same,
    Other,
}

/// Every row of the state machine's table, at the edges of the lease, the TTL and the
/// tombstone's time: `begin` on each backend answers what `decide` answers for the record the
/// setup wrote, and a claim it grants is the record `decide`'s rules write.
pub async fn begin_answers_what_the_state_machine_decides<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let settings = Settings {
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(60),
        tombstone_ttl: Duration::from_secs(120),
    };
    let (lease, ttl, tomb) = (settings.lease, settings.ttl, settings.tombstone_ttl);
    let ms = Duration::from_millis(1);
    let scenarios: Vec<(Setup, Probe, Duration)> = vec![
        (Setup::Absent, Probe::Same, Duration::ZERO),
        (Setup::InProgress, Probe::Same, lease - ms),
        (Setup::InProgress, Probe::Same, lease),
        (Setup::InProgress, Probe::Other, lease - ms),
        (Setup::InProgress, Probe::Other, lease + ms),
        (Setup::Completed, Probe::Same, ttl - ms),
        (Setup::Completed, Probe::Other, ttl - ms),
        (Setup::Completed, Probe::Same, ttl),
        (Setup::Completed, Probe::Other, ttl),
        (Setup::Completed, Probe::Same, ttl + tomb - ms),
        (Setup::Completed, Probe::Same, ttl + tomb),
        (Setup::Completed, Probe::Other, ttl + tomb),
        (Setup::Evicted, Probe::Same, ttl + ms),
        (Setup::Evicted, Probe::Other, ttl + ms),
        (Setup::Evicted, Probe::Same, ttl + tomb - ms),
        (Setup::Evicted, Probe::Same, ttl + tomb),
    ];
    let clock = clock();
    let backend = harness.open(settings, clock.clone()).await?;
    for (i, (setup, probe, after)) in scenarios.into_iter().enumerate() {
        let key = scope("tenant-d", &format!("decide-{i}"));
        let what = format!("{setup:?}, probed by the {probe:?} request {after:?} later");
        let start = clock.now();
        let record = set_up(&backend, &clock, &key, setup, settings).await?;
        clock.set(start.saturating_add(after));
        let now = clock.now();
        let request = match probe {
            Probe::Same => fingerprint("the request"),
            Probe::Other => fingerprint("another request"),
        };
        let decided = decision::decide(record.as_ref(), &request, now, tomb);
        let answer = backend.begin(&key, request).await?;
        let expected = match &decided {
            Decision::Claim => "claimed",
            Decision::TakeOver(_) => "recovered",
            Decision::Replay(_) => "replay",
            Decision::InProgress(_) => "in_progress",
            Decision::Mismatch => "mismatch",
            Decision::Expired { .. } => "expired",
        };
        assert_eq!(answer.outcome(), expected, "{what}: {decided:?}");
        if let Begin::Claimed(claim) | Begin::Recovered(claim) = answer {
            let fence = claim.fence();
            let written = match decided {
                Decision::TakeOver(previous) => decision::taken_over(previous, fence, now, lease),
                _ => decision::claimed(request, fence, now, lease),
            };
            assert_eq!(claim.attempt(), written.attempt, "{what}");
            assert_eq!(
                claim.downstream_key(),
                key.downstream_key(&request, written.origin_fence),
                "{what}: the key derives from the request"
            );
            let recovery = match decided {
                Decision::TakeOver(_) => Some(crate::model::claim::Recovery::LeaseExpired),
                _ => None,
            };
            assert_eq!(claim.recovery(), recovery, "{what}");
            let RecordState::InProgress {
                lease_until,
                checkpoint,
            } = &written.state
            else {
                unreachable!("a claim writes an in-progress record");
            };
            assert_eq!(claim.lease_until(), *lease_until, "{what}");
            assert_eq!(claim.last_checkpoint(), checkpoint.as_deref(), "{what}");
            claim.release().await?;
        }
        // The next scenario starts after everything this one left has gone.
        clock.set(start.saturating_add(ttl + tomb + lease + Duration::from_secs(1)));
    }
    Ok(())
}

/// Leaves `key` as `setup` says, and returns the record the state machine holds for it.
async fn set_up<P: Protocol>(
    backend: &P,
    clock: &ManualClock,
    key: &Scope,
    setup: Setup,
    settings: Settings,
) -> Result<Option<Record>, BoxError> {
    let request = fingerprint("the request");
    if let Setup::Absent = setup {
        return Ok(None);
    }
    let now = clock.now();
    let mut claim = claimed(backend.begin(key, request).await?, "a new key")?;
    claim.checkpoint(b"step 1".to_vec()).await?;
    let mut held = decision::claimed(request, claim.fence(), now, settings.lease);
    if let RecordState::InProgress { checkpoint, .. } = &mut held.state {
        *checkpoint = Some(b"step 1".to_vec());
    }
    if let Setup::InProgress = setup {
        drop(claim); // unfinished: the key stays in progress
        return Ok(Some(held));
    }
    let response = Response::new(201, "made");
    claim.complete(response.clone()).await?;
    let completed = decision::completed(&held, response, now, settings.ttl);
    if let Setup::Completed = setup {
        return Ok(Some(completed));
    }
    clock.advance(settings.ttl + Duration::from_millis(1));
    while backend.evict_expired(100).await?.backlog == Backlog::More {}
    let RecordState::Completed { expires_at, .. } = completed.state else {
        unreachable!("completed above");
    };
    Ok(Some(Record {
        state: RecordState::Tombstone {
            completed_at: now,
            until: expires_at.saturating_add(settings.tombstone_ttl),
        },
        ..completed
    }))
}
