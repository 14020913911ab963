//! Retention: completed records expire after the TTL, answer as absent from then on, and are
//! removed a partition at a time once every record in it is gone.

use crate::common;

use std::time::Duration;

use common::{TTL, TestResult, clock, fp, open, scope};
use idemstore::{Backlog, Begin, Clock, Response, Store};

/// The open partition takes records for an eighth of the TTL.
const WINDOW: Duration = Duration::from_secs(TTL.as_secs() / 8);

fn commit(store: &Store, key: &str) -> TestResult {
    let Begin::Claimed(claim) = store.begin(&scope(key), fp("req"))? else {
        return Err(format!("{key}: expected Claimed").into());
    };
    claim.commit(|_| Ok(Response::new(200, b"done".to_vec())))?;
    Ok(())
}

#[test]
fn after_the_ttl_a_completed_key_is_absent_but_stored_until_evicted() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    for key in ["a", "b"] {
        commit(&store, key)?;
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
    assert_eq!(counts(&store)?, both, "still stored until evicted");

    // A retry after the TTL is a new operation; the old record stays stored, hidden by the
    // claim, until its partition goes.
    let Begin::Claimed(again) = store.begin(&scope("b"), fp("req"))? else {
        return Err("an expired key should be claimed afresh".into());
    };
    assert_eq!(again.attempt(), 1);
    assert_eq!(counts(&store)?, (3, 2, 1, 0));

    let evicted = store.evict_expired(0)?;
    assert_eq!(
        (evicted.removed, evicted.backlog),
        (1, Backlog::More),
        "a limit of 0 is taken as 1, so a caller looping on More makes progress"
    );
    assert_eq!(store.evict_expired(100)?.removed, 1);
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
fn eviction_runs_in_bounded_batches_oldest_partition_first() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    let start = clock.now();
    // Three partitions: ten keys, ten more a window later, five more a window after that.
    for i in 0..25 {
        if i == 10 || i == 20 {
            clock.advance(WINDOW);
        }
        commit(&store, &format!("k{i:02}"))?;
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(store.exact_stats()?.partitions, 3);
    // The first partition's last record (k09, at start + 9 s) is past its TTL; the second's
    // first is not.
    clock.set(start.saturating_add(TTL + Duration::from_secs(9)));
    let first = store.evict_expired(4)?;
    assert_eq!((first.removed, first.backlog), (4, Backlog::More));
    // In key order within the partition: with the clock moved back before any TTL passed,
    // the first four are gone for good and the other six are still there.
    let now = clock.now();
    clock.set(start);
    for i in 0..10 {
        let present = store.get(&scope(&format!("k{i:02}")))?.is_some();
        assert_eq!(present, i >= 4, "k{i:02}");
    }
    clock.set(now);
    let second = store.evict_expired(4)?;
    assert_eq!((second.removed, second.backlog), (4, Backlog::More));
    let third = store.evict_expired(4)?;
    assert_eq!(
        (third.removed, third.backlog),
        (2, Backlog::Empty),
        "the next partition is not all gone"
    );
    assert_eq!(store.exact_stats()?.records, 15);
    // The survivors still replay.
    assert!(matches!(
        store.begin(&scope("k10"), fp("req"))?,
        Begin::Replay(_)
    ));
    // A record is kept at most a window past its TTL: the second partition's last record was
    // written a window and ten seconds after the first partition's first.
    clock.set(start.saturating_add(TTL + WINDOW + Duration::from_secs(19)));
    assert_eq!(store.evict_expired(100)?.removed, 10);
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
