//! Retention: eviction in bounded passes, tombstones.

use std::time::Duration;

use super::{
    Backlog, Begin, BoxError, Clock, Harness, Protocol, ProtocolClaim, Response, Settings,
    Timestamp, claimed, clock, fingerprint, scope,
};

/// Past their TTL, completed records answer as absent whether or not they were evicted yet;
/// eviction removes only records that are gone, in passes of at most the limit asked for,
/// saying whether more is due, and never removes in-progress work. How soon after its TTL a
/// record is removed is the backend's: the PostgreSQL backend removes each one once its TTL
/// has passed, the embedded store a partition at a time once every record in it is gone
/// (at most an eighth of the TTL later). Once every TTL is well past, all are removed.
pub async fn expired_records_are_evicted_in_bounded_passes_and_live_ones_never<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings {
        lease: Duration::from_secs(3600 * 4),
        ..Settings::default()
    };
    let backend = harness.open(settings, clock.clone()).await?;
    for i in 0..25 {
        let key = scope("tenant-a", &format!("order-{i:04}"));
        let claim = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
        claim.complete(Response::new(200, format!("{i}"))).await?;
        clock.advance(Duration::from_secs(1));
    }
    let held = claimed(
        backend
            .begin(&scope("tenant-a", "still-running"), fingerprint("r"))
            .await?,
        "new",
    )?;
    let evicted = backend.evict_expired(10).await?;
    assert_eq!(
        (evicted.removed, evicted.backlog),
        (0, Backlog::Empty),
        "none due yet"
    );

    // The first 12 are past their TTL: at most they are removed, never a live one.
    clock.set(
        Timestamp::from_millis(1_700_000_000_000)
            .saturating_add(settings.ttl + Duration::from_secs(11)),
    );
    let mut removed = drain(&backend, 10).await?;
    assert!(removed <= 12, "{removed} removed, 12 are past their TTL");
    for i in 0..25 {
        let key = scope("tenant-a", &format!("order-{i:04}"));
        let answer = backend.begin(&key, fingerprint("r")).await?;
        match (i < 12, answer) {
            (true, Begin::Claimed(claim)) => claim.release().await?,
            (false, Begin::Replay(response)) => {
                assert_eq!(response.body(), format!("{i}").as_bytes())
            }
            (due, other) => {
                return Err(format!("key {i} (due: {due}): got {}", other.outcome()).into());
            }
        }
    }
    clock.advance(settings.ttl);
    removed += drain(&backend, 4).await?;
    assert_eq!(removed, 25, "every completed record, once");
    let stats = backend.stats().await?;
    assert_eq!((stats.completed, stats.in_progress), (0, 1), "{stats:?}");
    held.complete(Response::new(200, "late")).await?;
    Ok(())
}

/// Evicts in passes of `limit` until nothing more is due; what was removed.
async fn drain<B: Protocol>(backend: &B, limit: usize) -> Result<usize, BoxError> {
    let mut removed = 0;
    loop {
        let evicted = backend.evict_expired(limit).await?;
        assert!(evicted.removed <= limit, "a pass stays within its limit");
        removed += evicted.removed;
        if evicted.backlog == Backlog::Empty {
            return Ok(removed);
        }
    }
}

/// With tombstones on, a retry after the TTL is told `Expired` (never run again) until the
/// tombstone's own time runs out; then the key is new.
pub async fn tombstones_answer_expired_until_they_go<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings {
        tombstone_ttl: Duration::from_secs(600),
        ..Settings::default()
    };
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "order-0008");
    let claim = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let completed_at = Clock::now(&clock);
    claim.complete(Response::new(201, "done")).await?;

    clock.advance(settings.ttl);
    for pass in ["before eviction", "after eviction"] {
        match backend.begin(&key, fingerprint("r")).await? {
            Begin::Expired { completed_at: at } => assert_eq!(at, completed_at, "{pass}"),
            other => {
                return Err(format!("{pass}: expected Expired, got {}", other.outcome()).into());
            }
        }
        assert!(matches!(
            backend.begin(&key, fingerprint("another")).await?,
            Begin::Mismatch
        ));
        if pass == "before eviction" {
            let evicted = backend.evict_expired(10).await?;
            assert_eq!((evicted.removed, evicted.tombstones_removed), (1, 0));
        }
    }
    assert_eq!(backend.stats().await?.tombstones, 1);
    clock.advance(settings.tombstone_ttl);
    let evicted = backend.evict_expired(10).await?;
    assert_eq!((evicted.removed, evicted.tombstones_removed), (0, 1));
    let again = claimed(
        backend.begin(&key, fingerprint("r")).await?,
        "after the tombstone",
    )?;
    again.release().await?;
    Ok(())
}
