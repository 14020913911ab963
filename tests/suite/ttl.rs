//! Retention: completed records expire after the TTL and are evicted through the expiry index.

use crate::common;

use std::time::Duration;

use common::{TTL, TestResult, clock, fp, open, scope};
use idemstore::{Backlog, Begin, Clock, Response, Store, Timestamp};

#[test]
fn after_the_ttl_a_completed_key_is_absent_but_indexed_until_evicted() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    for key in ["a", "b"] {
        let Begin::Claimed(claim) = store.begin(&scope(key), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        claim.commit(|_| Ok(Response::new(200, b"done".to_vec())))?;
    }
    let both = (2, 2, 0, 0);
    assert_eq!(counts(&store)?, both);

    clock.advance(TTL - Duration::from_millis(1));
    assert!(matches!(
        store.begin(&scope("a"), fp("req"))?,
        Begin::Replay(_)
    ));
    assert_eq!(store.evict_expired(100)?.removed, 0, "not yet due");

    clock.advance(Duration::from_millis(1));
    assert_eq!(store.get(&scope("a"))?, None, "expired counts as absent");
    assert_eq!(
        counts(&store)?,
        both,
        "still stored and indexed until evicted"
    );

    // A retry after the TTL is a new operation.
    let Begin::Claimed(again) = store.begin(&scope("b"), fp("req"))? else {
        return Err("an expired key should be claimed afresh".into());
    };
    assert_eq!(again.attempt(), 1);
    assert_eq!(
        counts(&store)?,
        (2, 1, 1, 0),
        "re-claiming moved b from the expiry index to the lease index"
    );

    let evicted = store.evict_expired(0)?;
    assert_eq!(
        (evicted.removed, evicted.backlog),
        (1, Backlog::Empty),
        "a limit of 0 is taken as 1, so a caller looping on More makes progress"
    );
    assert_eq!(counts(&store)?, (1, 0, 1, 0));
    assert_eq!(
        store.evict_expired(100)?.removed,
        0,
        "eviction never removes in-progress work"
    );
    assert!(store.get(&scope("b"))?.is_some());
    Ok(())
}

#[test]
fn eviction_runs_in_bounded_batches_oldest_first() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    for i in 0..25 {
        let Begin::Claimed(claim) = store.begin(&scope(&format!("k{i:02}")), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        claim.commit(|_| Ok(Response::new(200, vec![])))?;
        clock.advance(Duration::from_secs(1));
    }
    // Only the first ten have expired.
    clock.advance(TTL - Duration::from_secs(16)); // now = first completion + 9 s + TTL
    let first = store.evict_expired(4)?;
    assert_eq!((first.removed, first.backlog), (4, Backlog::More));
    // Oldest first: with the clock moved back before any TTL passed, the first four are gone
    // for good and the other six are still there.
    let now = clock.now();
    clock.set(Timestamp::from_millis(
        now.as_millis() - TTL.as_millis() as u64,
    ));
    for i in 0..10 {
        let present = store.get(&scope(&format!("k{i:02}")))?.is_some();
        assert_eq!(present, i >= 4, "k{i:02}");
    }
    clock.set(now);
    let second = store.evict_expired(4)?;
    assert_eq!((second.removed, second.backlog), (4, Backlog::More));
    let third = store.evict_expired(4)?;
    assert_eq!((third.removed, third.backlog), (2, Backlog::Empty));
    assert_eq!(store.exact_stats()?.records, 15);
    // The survivors still replay.
    assert!(matches!(
        store.begin(&scope("k10"), fp("req"))?,
        Begin::Replay(_)
    ));
    Ok(())
}

/// Records, completed, in progress and tombstones, exactly.
fn counts(store: &Store) -> Result<(u64, u64, u64, u64), idemstore::StoreError> {
    let stats = store.exact_stats()?;
    Ok((
        stats.records,
        stats.completed,
        stats.in_progress,
        stats.tombstones,
    ))
}
