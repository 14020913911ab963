//! Stats count exactly what happened.

use crate::common;

use std::time::Duration;

use common::{LEASE, TTL, TestResult, builder, clock, fp, scope};
use idemstore::{Begin, Response};

#[test]
fn stats_counters_match_the_operations_performed() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock)
        .tombstone_ttl(Duration::from_secs(3600))
        .open(dir.path().join("idem"))?;
    let zero = store.stats()?;
    assert_eq!(
        (zero.claims, zero.replays, zero.in_progress, zero.completed),
        (0, 0, 0, 0)
    );

    // 3 claims: a commits, b stays held, c is dropped (abandoned).
    let claim = |key: &str| match store.begin(&scope(key), fp("req")) {
        Ok(Begin::Claimed(c)) => Ok(c),
        other => Err(format!("expected Claimed, got {other:?}")),
    };
    claim("a")?.commit(|_| Ok(Response::new(200, vec![])))?;
    let b = claim("b")?;
    drop(claim("c")?);
    // 2 replays, 2 in-progress answers, 1 mismatch.
    for _ in 0..2 {
        assert!(matches!(
            store.begin(&scope("a"), fp("req"))?,
            Begin::Replay(_)
        ));
        assert!(matches!(
            store.begin(&scope("b"), fp("req"))?,
            Begin::InProgress { .. }
        ));
    }
    assert!(matches!(
        store.begin(&scope("a"), fp("other"))?,
        Begin::Mismatch
    ));
    clock.advance(Duration::from_secs(5));
    store.exact_stats()?; // publishes: stats reads what is published
    let s = store.stats()?;
    assert_eq!((s.in_progress, s.completed, s.tombstones), (2, 1, 0));
    assert_eq!(s.oldest_in_progress, Some(Duration::from_secs(5)));

    // 1 recovery of c, and the stale b is refused once after b is taken over.
    clock.advance(LEASE);
    let Begin::Recovered(c) = store.begin(&scope("c"), fp("req"))? else {
        return Err("expected Recovered".into());
    };
    let Begin::Recovered(b2) = store.begin(&scope("b"), fp("req"))? else {
        return Err("expected Recovered".into());
    };
    assert!(b.release().is_err());
    c.commit(|_| Ok(Response::new(200, vec![])))?;
    b2.commit(|_| Ok(Response::new(200, vec![])))?;

    // After the TTL: a is answered Expired, then all three are evicted into tombstones.
    clock.advance(TTL);
    assert!(matches!(
        store.begin(&scope("a"), fp("req"))?,
        Begin::Expired { .. }
    ));
    let evicted = store.evict_expired(100)?;
    assert_eq!(evicted.removed, 3);

    store.exact_stats()?;
    let s = store.stats()?;
    assert_eq!(s.claims, 3, "{s:?}");
    assert_eq!(s.recoveries, 2, "{s:?}");
    assert_eq!(s.replays, 2, "{s:?}");
    assert_eq!(s.in_progress_answers, 2, "{s:?}");
    assert_eq!(s.mismatches, 1, "{s:?}");
    assert_eq!(s.expired_answers, 1, "{s:?}");
    assert_eq!(s.stale_rejections, 1, "{s:?}");
    assert_eq!(s.evicted, 3, "{s:?}");
    assert_eq!(
        (s.in_progress, s.completed, s.tombstones),
        (0, 0, 3),
        "{s:?}"
    );
    assert_eq!(s.oldest_in_progress, None);
    assert!(s.groups_committed >= 6, "{s:?}");
    assert!(
        s.group_sizes.iter().sum::<u64>() >= s.groups_committed,
        "{s:?}"
    );
    assert_eq!(s.queued, 0);
    assert!(s.log_bytes > 0 && s.since_checkpoint.is_some(), "{s:?}");
    store.checkpoint()?;
    assert_eq!(store.stats()?.log_bytes_since_checkpoint, 0);
    Ok(())
}
