//! Claims: replay, in progress and its advice, mismatch, recovery, fencing, release.

use std::time::Duration;

use super::{
    Begin, BoxError, CommitError, Harness, ManualClock, Protocol, ProtocolClaim, Response, Scope,
    Settings, Timestamp, claimed, clock, fingerprint, scope, stale, stored_response,
};
use crate::model::claim::Recovery;

/// Claims a key, completes it, and replays it: the same status, headers and bytes.
pub async fn claim_then_replay_byte_for_byte<H: Harness>(harness: &H) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let key = scope("tenant-a", "order-0001");
    let claim = match backend.begin(&key, fingerprint("widget x3")).await? {
        Begin::Claimed(claim) => claim,
        other => {
            return Err(format!("a new key: expected Claimed, got {}", other.outcome()).into());
        }
    };
    assert_eq!(claim.attempt(), 1);
    assert_eq!(claim.last_checkpoint(), None);
    let response = stored_response("1");
    let completed = claim.complete(response.clone()).await?;
    assert_eq!(completed, response);
    for _ in 0..3 {
        match backend.begin(&key, fingerprint("widget x3")).await? {
            Begin::Replay(replayed) => {
                assert_eq!(
                    replayed, response,
                    "a replay is the stored response, byte for byte"
                );
            }
            other => {
                return Err(format!("a retry: expected Replay, got {}", other.outcome()).into());
            }
        }
    }
    let stats = backend.stats().await?;
    assert_eq!((stats.completed, stats.in_progress), (1, 0), "{stats:?}");
    Ok(())
}

/// A retry while the claim's lease is live answers `InProgress`, within the rest of the lease,
/// and writes nothing.
pub async fn a_live_claim_answers_in_progress_and_writes_nothing<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "order-0002");
    let claim = claimed(backend.begin(&key, fingerprint("r")).await?, "a new key")?;
    clock.advance(Duration::from_secs(10));
    match backend.begin(&key, fingerprint("r")).await? {
        Begin::InProgress { retry_after } => {
            assert!(retry_after <= settings.lease - Duration::from_secs(10));
        }
        other => return Err(format!("expected InProgress, got {}", other.outcome()).into()),
    }
    assert_eq!(
        claim.lease_until(),
        Timestamp::from_millis(1_700_000_000_000).saturating_add(settings.lease)
    );
    // The retry changed nothing: the holder still completes.
    claim.complete(Response::new(200, "done")).await?;
    Ok(())
}

/// Claims `key` of `operation`, lets `took` pass on the clock and completes it: one
/// completion time for the operation's pace.
async fn complete_after<P: Protocol>(
    backend: &P,
    clock: &ManualClock,
    key: &Scope,
    took: Duration,
) -> Result<(), BoxError> {
    let claim = claimed(backend.begin(key, fingerprint("r")).await?, "a new key")?;
    clock.advance(took);
    claim.complete(Response::new(201, "done")).await?;
    Ok(())
}

/// What `InProgress` advises after `running` of a fresh claim of `key`; the claim is then
/// released.
async fn advised<P: Protocol>(
    backend: &P,
    clock: &ManualClock,
    key: &Scope,
    running: Duration,
) -> Result<Duration, BoxError> {
    let claim = claimed(backend.begin(key, fingerprint("r")).await?, "a new key")?;
    clock.advance(running);
    let answer = backend.begin(key, fingerprint("r")).await?;
    claim.release().await?;
    match answer {
        Begin::InProgress { retry_after } => Ok(retry_after),
        other => Err(format!("a duplicate: expected InProgress, got {}", other.outcome()).into()),
    }
}

/// `InProgress` advises what the holder probably still needs, from the operation's recent
/// completion times: a 50 ms operation is told one second (not the lease), one that takes
/// longer than the lease the rest of the lease, one with no history as long again as it has
/// run; never past the lease.
pub async fn in_progress_advises_the_operations_pace_within_the_lease<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let of = |operation: &str, key: &str| Scope::new("tenant-a", operation, key);

    complete_after(
        &backend,
        &clock,
        &of("fast", "k1")?,
        Duration::from_millis(50),
    )
    .await?;
    let fast = advised(
        &backend,
        &clock,
        &of("fast", "k2")?,
        Duration::from_millis(10),
    )
    .await?;
    assert_eq!(fast, Duration::from_secs(1), "a 50 ms operation");

    // Completed past its lease (nobody took it over, so the holder still could).
    complete_after(
        &backend,
        &clock,
        &of("slow", "k1")?,
        Duration::from_secs(45),
    )
    .await?;
    let running = Duration::from_secs(10);
    let slow = advised(&backend, &clock, &of("slow", "k2")?, running).await?;
    assert_eq!(
        slow,
        settings.lease - running,
        "an operation longer than the lease"
    );

    let unknown = advised(&backend, &clock, &of("new", "k1")?, Duration::from_secs(4)).await?;
    assert_eq!(unknown, Duration::from_secs(4), "no history: as long again");
    let fresh = advised(&backend, &clock, &of("new", "k2")?, Duration::ZERO).await?;
    assert_eq!(fresh, Duration::from_secs(1), "no history, just claimed");
    Ok(())
}

/// The same key with another request is refused, while held and once completed, and the
/// refusal writes nothing.
pub async fn another_fingerprint_is_a_mismatch_and_changes_nothing<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let key = scope("tenant-a", "order-0003");
    let claim = claimed(backend.begin(&key, fingerprint("first")).await?, "new")?;
    assert!(matches!(
        backend.begin(&key, fingerprint("second")).await?,
        Begin::Mismatch
    ));
    let fence = claim.fence();
    let response = stored_response("3");
    claim.complete(response.clone()).await?;
    assert!(matches!(
        backend.begin(&key, fingerprint("second")).await?,
        Begin::Mismatch
    ));
    match backend.begin(&key, fingerprint("first")).await? {
        Begin::Replay(replayed) => assert_eq!(replayed, response),
        other => return Err(format!("expected Replay, got {}", other.outcome()).into()),
    }
    let stats = backend.stats().await?;
    assert_eq!((stats.completed, stats.in_progress), (1, 0), "{stats:?}");
    assert!(fence > 0);
    Ok(())
}

/// After the lease ends, the next attempt takes over knowing it: `Recovered`, the next attempt
/// number, a new fence, the previous attempt's checkpoint and the same downstream key.
pub async fn an_expired_lease_is_recovered_with_its_checkpoint<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "order-0004");
    let mut first = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    assert_eq!(first.recovery(), None, "a first attempt recovers nothing");
    first.checkpoint(b"charged ch_123".to_vec()).await?;
    assert_eq!(first.last_checkpoint(), Some(&b"charged ch_123"[..]));
    let downstream = first.downstream_key();

    clock.advance(settings.lease - Duration::from_millis(1));
    assert!(matches!(
        backend.begin(&key, fingerprint("r")).await?,
        Begin::InProgress { .. }
    ));
    clock.advance(Duration::from_millis(1));
    let second = match backend.begin(&key, fingerprint("r")).await? {
        Begin::Recovered(claim) => claim,
        other => {
            return Err(format!(
                "after the lease: expected Recovered, got {}",
                other.outcome()
            )
            .into());
        }
    };
    assert_eq!(second.attempt(), 2);
    assert_eq!(second.recovery(), Some(Recovery::LeaseExpired));
    assert_ne!(second.fence(), first.fence());
    assert_eq!(second.last_checkpoint(), Some(&b"charged ch_123"[..]));
    assert_eq!(
        second.downstream_key(),
        downstream,
        "a take-over keeps the key"
    );
    second.complete(Response::new(201, "recovered")).await?;
    drop(first);
    Ok(())
}

/// Once another attempt took over, every operation of the old holder is refused as stale and
/// changes nothing: extend, checkpoint, release and complete.
pub async fn a_stale_holder_is_refused_on_every_operation<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "order-0005");
    let mut first = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    clock.advance(settings.lease);
    let mut second = claimed(backend.begin(&key, fingerprint("r")).await?, "take-over")?;
    second.checkpoint(b"second's step".to_vec()).await?;

    stale(first.extend(Duration::from_secs(60)).await, "extend")?;
    stale(
        first.checkpoint(b"first's step".to_vec()).await,
        "checkpoint",
    )?;
    clock.advance(settings.lease);
    let third = claimed(
        backend.begin(&key, fingerprint("r")).await?,
        "second take-over",
    )?;
    assert_eq!(third.attempt(), 3);
    assert_eq!(
        third.last_checkpoint(),
        Some(&b"second's step"[..]),
        "a stale checkpoint changed nothing"
    );
    stale(second.release().await, "release")?;
    match first.complete(Response::new(500, "stale")).await {
        Err(CommitError::Stale(_)) => {}
        other => {
            return Err(
                format!("complete by a stale holder: expected Stale, got {other:?}").into(),
            );
        }
    }
    let response = stored_response("5");
    third.complete(response.clone()).await?;
    match backend.begin(&key, fingerprint("r")).await? {
        Begin::Replay(replayed) => assert_eq!(replayed, response, "the holder's response"),
        other => return Err(format!("expected Replay, got {}", other.outcome()).into()),
    }
    assert!(backend.stats().await?.stale_rejections >= 4);
    Ok(())
}

/// A released key is new again: the next `begin` claims it as attempt 1 with a new fence. Its
/// downstream key names the request, so the same request gets the same one again (downstream
/// deduplicates it against the released attempt), and another request another.
pub async fn a_released_key_is_claimed_afresh<H: Harness>(harness: &H) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let key = scope("tenant-a", "order-0006");
    let claim = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let (fence, downstream) = (claim.fence(), claim.downstream_key());
    claim.release().await?;
    let same = fresh(
        backend.begin(&key, fingerprint("r")).await?,
        "after a release",
    )?;
    assert_eq!((same.attempt(), same.recovery()), (1, None));
    assert_ne!(same.fence(), fence);
    assert_eq!(same.downstream_key(), downstream, "the same request");
    same.release().await?;
    let again = fresh(
        backend.begin(&key, fingerprint("other request")).await?,
        "after a release",
    )?;
    assert_eq!(again.attempt(), 1);
    assert_ne!(again.fence(), fence);
    assert_ne!(again.downstream_key(), downstream, "another request");
    again.release().await?;
    Ok(())
}

/// The downstream key names the request on its scope and nothing a backend keeps: two stores
/// that never shared a record give the same request the same key (as a store restored from a
/// copy that lacks the request gives the key the old store's attempt passed downstream), a
/// take-over keeps it, and so does the same request once its record is gone; another request
/// on the key, or the same request on another key, gets another.
pub async fn the_downstream_key_names_the_request_not_the_store<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let settings = Settings::default();
    let elsewhere = harness.open(settings, clock()).await?;
    let clock = clock();
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "order-0007");
    // The other store hands out fences of its own first.
    for i in 0..3 {
        let warm = scope("tenant-a", &format!("warm-{i}"));
        claimed(elsewhere.begin(&warm, fingerprint("w")).await?, "warm-up")?
            .release()
            .await?;
    }
    let first = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let downstream = first.downstream_key();
    let there = claimed(
        elsewhere.begin(&key, fingerprint("r")).await?,
        "new elsewhere",
    )?;
    assert_ne!(there.fence(), first.fence(), "fences are each store's own");
    assert_eq!(
        there.downstream_key(),
        downstream,
        "the same request, another store"
    );
    let other = claimed(
        elsewhere
            .begin(&scope("tenant-a", "order-0008"), fingerprint("r"))
            .await?,
        "another key",
    )?;
    assert_ne!(other.downstream_key(), downstream, "another key");
    other.release().await?;
    there.release().await?;
    let another = claimed(
        elsewhere.begin(&key, fingerprint("r2")).await?,
        "another request",
    )?;
    assert_ne!(another.downstream_key(), downstream, "another request");
    another.release().await?;

    clock.advance(settings.lease);
    let taken = claimed(backend.begin(&key, fingerprint("r")).await?, "take-over")?;
    assert_eq!(taken.downstream_key(), downstream, "a take-over");
    drop(first);
    taken.complete(Response::new(201, "done")).await?;
    clock.advance(settings.ttl);
    let after = fresh(backend.begin(&key, fingerprint("r")).await?, "past the TTL")?;
    assert_eq!(
        after.downstream_key(),
        downstream,
        "the same request past its TTL"
    );
    after.release().await?;
    Ok(())
}

/// The claim of a `begin` that must claim afresh.
fn fresh<C: ProtocolClaim>(begin: Begin<C>, what: &str) -> Result<C, BoxError> {
    match begin {
        Begin::Claimed(claim) => Ok(claim),
        other => Err(format!("{what}: expected Claimed, got {}", other.outcome()).into()),
    }
}
