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
    // Past the TTL and the sweeper's default grace (a quarter of the TTL).
    clock.advance(TTL + TTL / 4);
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
        clock.advance(TTL + TTL / 4);
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

/// A key's hex name from a small generator: keys in no order, as users send them.
fn random_key(stream: u64, i: u64) -> String {
    let mut z = (stream << 32 | i).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    format!("{:016x}", z ^ (z >> 31))
}

/// A key claimed for the first time removes the records that are gone among the few stored
/// after it, in its own transaction; in-progress work beside it stays, and `evict_expired`
/// finds exactly the rest. Every removal is counted once, and survives a crash (it is in the
/// claim's log frame).
#[test]
fn a_new_claim_removes_the_gone_records_beside_it_and_eviction_finds_the_rest() -> TestResult {
    const OLD: u64 = 3_000;
    const NEW: u64 = 300;
    let disk = SimDisk::new();
    let clock = clock();
    let store = builder(&clock).open_simulated(&disk)?;
    for i in 0..OLD {
        let Begin::Claimed(claim) = store.begin(&scope(&random_key(1, i)), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        // Every tenth is abandoned (dropped unfinished): in progress, its lease long gone,
        // never to be removed.
        if i % 10 == 0 {
            drop(claim);
        } else {
            claim.commit(|_| Ok(Response::new(200, vec![1; 16])))?;
        }
    }
    let abandoned = OLD / 10;
    let before = store.stats()?.evicted;
    // A claim made before anything is gone reads nothing beside it and removes nothing.
    let Begin::Claimed(claim) = store.begin(&scope("early"), fp("req"))? else {
        return Err("expected Claimed".into());
    };
    claim.commit(|_| Ok(Response::new(200, vec![])))?;
    assert_eq!(store.exact_stats()?.records, OLD + 1);

    clock.advance(TTL + Duration::from_millis(1));
    for i in 0..NEW {
        let Begin::Claimed(claim) = store.begin(&scope(&random_key(2, i)), fp("req"))? else {
            return Err("a new key must be claimed".into());
        };
        claim.commit(|_| Ok(Response::new(200, vec![2; 16])))?;
    }
    let stats = store.exact_stats()?;
    let beside = OLD + 1 + NEW - stats.records;
    // Each claim looks at eight records, of which about nine in ten are gone.
    assert!(
        beside > NEW && beside <= NEW * 8,
        "{beside} removed beside {NEW} new keys"
    );
    assert_eq!(store.stats()?.evicted - before, beside, "counted once each");
    assert_eq!(
        stats.in_progress, abandoned,
        "in-progress work is never removed"
    );
    assert_eq!(stats.completed, OLD + 1 - abandoned + NEW - beside);

    // Power lost now: what the claims removed is in their log frames, and replays.
    let image = disk.crash_image(idemstore::testing::Tear::Drop);
    drop(store);
    let store = builder(&clock).open_simulated(&image)?;
    let counts = |s: &idemstore::Stats| (s.records, s.in_progress, s.completed, s.tombstones);
    assert_eq!(
        counts(&store.exact_stats()?),
        counts(&stats),
        "the removals were logged with the claims"
    );
    let mut rest = 0;
    loop {
        let evicted = store.evict_expired(1_000)?;
        rest += evicted.removed as u64;
        if evicted.backlog == Backlog::Empty {
            break;
        }
    }
    assert_eq!(
        rest + beside,
        OLD + 1 - abandoned,
        "every gone record removed exactly once"
    );
    let left = store.exact_stats()?;
    assert_eq!((left.in_progress, left.completed), (abandoned, NEW));
    for i in 0..NEW {
        assert!(matches!(
            store.begin(&scope(&random_key(2, i)), fp("req"))?,
            Begin::Replay(_)
        ));
    }
    Ok(())
}

/// A tombstone whose time ran out goes beside a new key like a record does, and is counted as
/// a tombstone removed, not as a record evicted.
#[test]
fn tombstones_that_ran_out_go_beside_new_keys_and_count_as_tombstones() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock)
        .tombstone_ttl(TTL)
        .open(dir.path().join("idem"))?;
    for i in 0..500 {
        let Begin::Claimed(claim) = store.begin(&scope(&random_key(3, i)), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        claim.commit(|_| Ok(Response::new(200, vec![])))?;
    }
    clock.advance(TTL);
    let turned = store.evict_expired(1_000)?;
    assert_eq!(
        (turned.removed, store.exact_stats()?.tombstones),
        (500, 500)
    );
    let before = store.stats()?;
    clock.advance(TTL);
    for i in 0..50 {
        let Begin::Claimed(claim) = store.begin(&scope(&random_key(4, i)), fp("req"))? else {
            return Err("a new key must be claimed".into());
        };
        claim.commit(|_| Ok(Response::new(200, vec![])))?;
    }
    let after = store.stats()?;
    let beside = 500 - store.exact_stats()?.tombstones;
    assert!(
        beside > 200,
        "{beside} tombstones removed beside 50 new keys (about 8 each)"
    );
    assert_eq!(after.tombstones_removed - before.tombstones_removed, beside);
    assert_eq!(after.evicted, before.evicted, "no record was evicted");
    Ok(())
}
