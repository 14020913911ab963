//! Retention at scale and with tombstones: eviction in bounded batches through the index,
//! never touching in-progress work, and tombstones that answer `Expired`.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{TTL, TestResult, builder, clock, fp, scope};
use idemstore::testing::SimDisk;
use idemstore::{Backlog, Begin, RecordState, Response, Store};

/// Claims and commits `n` keys from 32 threads.
fn complete(store: &Store, prefix: &str, n: u64) -> TestResult {
    let next = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..32)
        .map(|_| {
            let (store, next, prefix) = (store.clone(), next.clone(), prefix.to_owned());
            std::thread::spawn(move || -> Result<(), idemstore::Error> {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok(());
                    }
                    let Begin::Claimed(claim) =
                        store.begin(&scope(&format!("{prefix}{i}")), fp("req"))?
                    else {
                        continue;
                    };
                    claim.commit(|_| Ok(Response::new(200, vec![1; 16])))?;
                }
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "worker panicked")??;
    }
    Ok(())
}

#[test]
fn a_hundred_thousand_expired_records_are_evicted_in_batches_of_a_thousand() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    let store = builder(&clock).open_simulated(&disk)?;
    complete(&store, "k", 100_000)?;
    // Work in progress whose lease ran out long ago: never evicted, whatever its age.
    let mut abandoned = Vec::new();
    for i in 0..5 {
        let Begin::Claimed(claim) = store.begin(&scope(&format!("held{i}")), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        abandoned.push(claim);
    }
    assert_eq!(store.exact_stats()?.records, 100_005);

    clock.advance(TTL);
    for step in 1..=100u64 {
        let evicted = store.evict_expired(1_000)?;
        assert_eq!(evicted.removed, 1_000, "step {step}");
        let expected = if step < 100 {
            Backlog::More
        } else {
            Backlog::Empty
        };
        assert_eq!(evicted.backlog, expected, "step {step}");
        let counts = store.exact_stats()?;
        assert_eq!(counts.records, 100_005 - step * 1_000, "step {step}");
        assert_eq!(counts.completed, 100_000 - step * 1_000, "step {step}");
    }
    let last = store.evict_expired(1_000)?;
    assert_eq!((last.removed, last.backlog), (0, Backlog::Empty));
    for i in 0..5 {
        let record = store
            .get(&scope(&format!("held{i}")))?
            .ok_or("in-progress work was evicted")?;
        assert!(matches!(record.state(), RecordState::InProgress { .. }));
    }
    assert_eq!(store.exact_stats()?.in_progress, 5);
    Ok(())
}

#[test]
fn a_retry_after_the_ttl_is_told_expired_while_the_tombstone_lasts() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let tombstone = Duration::from_secs(7 * 24 * 3600);
    let store = builder(&clock)
        .tombstone_ttl(tombstone)
        .open(dir.path().join("idem"))?;
    let Begin::Claimed(claim) = store.begin(&scope("k"), fp("req"))? else {
        return Err("expected Claimed".into());
    };
    let completed_at = idemstore::Clock::now(&clock);
    claim.commit(|_| Ok(Response::new(201, b"charged".to_vec())))?;

    clock.advance(TTL);
    // Before eviction ran...
    assert!(
        matches!(store.begin(&scope("k"), fp("req"))?, Begin::Expired { completed_at: at } if at == completed_at)
    );
    assert!(matches!(
        store.begin(&scope("k"), fp("other"))?,
        Begin::Mismatch
    ));
    let evicted = store.evict_expired(100)?;
    assert_eq!((evicted.removed, evicted.tombstones_removed), (1, 0));
    let counts = store.exact_stats()?;
    assert_eq!(
        (counts.records, counts.completed, counts.tombstones),
        (1, 0, 1)
    );
    // ...and after: the same answer, the response gone.
    assert!(matches!(
        store.begin(&scope("k"), fp("req"))?,
        Begin::Expired { .. }
    ));
    let record = store.get(&scope("k"))?.ok_or("the tombstone is gone")?;
    assert!(matches!(record.state(), RecordState::Tombstone { .. }));
    assert_eq!(record.response(), None);
    assert_eq!(record.fingerprint(), fp("req"));
    // Reopened, it is still a tombstone.
    drop(store);
    let store = builder(&clock)
        .tombstone_ttl(tombstone)
        .open(dir.path().join("idem"))?;
    assert!(matches!(
        store.begin(&scope("k"), fp("req"))?,
        Begin::Expired { .. }
    ));

    // Once the tombstone's time runs out, the key is free again and eviction clears it.
    clock.advance(tombstone);
    assert_eq!(store.get(&scope("k"))?, None);
    let evicted = store.evict_expired(100)?;
    assert_eq!((evicted.removed, evicted.tombstones_removed), (0, 1));
    assert_eq!(store.exact_stats()?.records, 0);
    assert!(matches!(store.begin(&scope("k"), fp("req"))?, Begin::Claimed(c) if c.attempt() == 1));
    Ok(())
}

#[test]
fn without_tombstones_a_retry_after_the_ttl_runs_again() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock).open(dir.path().join("idem"))?;
    let Begin::Claimed(claim) = store.begin(&scope("k"), fp("req"))? else {
        return Err("expected Claimed".into());
    };
    claim.commit(|_| Ok(Response::new(201, vec![])))?;
    clock.advance(TTL);
    assert!(matches!(
        store.begin(&scope("k"), fp("req"))?,
        Begin::Claimed(_)
    ));
    Ok(())
}

#[test]
fn the_sweeper_evicts_on_its_own_and_stops_when_the_store_is_dropped() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let open = || {
        builder(&clock)
            .sweep(idemstore::Sweep::Every {
                interval: Duration::from_millis(5),
                batch: 100,
            })
            .open(dir.path().join("idem"))
    };
    let store = open()?;
    complete(&store, "k", 1_000)?;
    clock.advance(TTL);
    // The sweeper runs on its own schedule: poll for its effect, bounded.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store.exact_stats()?.records > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper never evicted: {:?}",
            store.exact_stats()?
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Dropping the store stops the sweeper and the writer: the directory reopens at once.
    drop(store);
    let store = open()?;
    assert_eq!(store.exact_stats()?.records, 0);
    Ok(())
}

/// Dropping the last handle while the sweeper is in the middle of a tick (it holds the engine
/// for a pass of many batches) closes the file before `drop` returns: an immediate reopen
/// never finds it still open.
#[test]
fn dropping_the_last_handle_mid_sweep_closes_the_file_before_drop_returns() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let open = || {
        builder(&clock)
            .sweep(idemstore::Sweep::Every {
                interval: Duration::from_millis(1),
                batch: 1,
            })
            .open(dir.path().join("idem"))
    };
    for round in 0..10 {
        let store = open()?;
        complete(&store, &format!("r{round}-"), 400)?;
        clock.advance(TTL);
        // Wait (bounded) until the sweeper is at work, then drop the last handle mid-tick.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while store.stats()?.evicted == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the sweeper never ran"
            );
            std::thread::yield_now();
        }
        drop(store);
        open().map_err(|e| format!("round {round}: reopening right after the drop: {e}"))?;
    }
    Ok(())
}
