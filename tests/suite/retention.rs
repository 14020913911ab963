//! Retention at scale and with tombstones: eviction in bounded batches a partition at a time,
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
    // Past the TTL of every record: their partition is all gone.
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

/// The open partition takes records for an eighth of the TTL.
const WINDOW: Duration = Duration::from_secs(TTL.as_secs() / 8);

/// Random keys in two partitions, every tenth of the first abandoned: once the first
/// partition is all gone, eviction removes exactly its completed records, in passes, and
/// leaves the abandoned claims and the second partition alone. Power lost part way through:
/// what was removed is in the log, and the rest is removed after the reopen, each record
/// exactly once.
#[test]
fn gone_records_go_with_their_partition_and_in_progress_work_never_does() -> TestResult {
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
    clock.advance(WINDOW + Duration::from_millis(1));
    for i in 0..NEW {
        let Begin::Claimed(claim) = store.begin(&scope(&random_key(2, i)), fp("req"))? else {
            return Err("a new key must be claimed".into());
        };
        claim.commit(|_| Ok(Response::new(200, vec![2; 16])))?;
    }
    let stats = store.exact_stats()?;
    assert_eq!(stats.partitions, 2);
    assert_eq!(
        (stats.in_progress, stats.completed),
        (abandoned, OLD - abandoned + NEW)
    );

    // The first partition is all gone; the second is not.
    clock.advance(TTL - WINDOW);
    let first = store.evict_expired(1_000)?;
    assert_eq!((first.removed, first.backlog), (1_000, Backlog::More));
    // Power lost now: the pass's removals are in its log frame, and replay.
    let image = disk.crash_image(idemstore::testing::Tear::Drop);
    drop(store);
    let store = builder(&clock).open_simulated(&image)?;
    let after_crash = store.exact_stats()?;
    assert_eq!(after_crash.completed, OLD - abandoned + NEW - 1_000);
    let mut rest = 0;
    loop {
        let evicted = store.evict_expired(1_000)?;
        rest += evicted.removed as u64;
        if evicted.backlog == Backlog::Empty {
            break;
        }
    }
    assert_eq!(
        rest + 1_000,
        OLD - abandoned,
        "every gone record removed exactly once"
    );
    let left = store.exact_stats()?;
    assert_eq!((left.in_progress, left.completed), (abandoned, NEW));
    assert_eq!(store.abandoned(usize::MAX)?.len() as u64, abandoned);
    for i in 0..NEW {
        assert!(matches!(
            store.begin(&scope(&random_key(2, i)), fp("req"))?,
            Begin::Replay(_)
        ));
    }
    Ok(())
}

/// With tombstones kept, eviction turns a partition's expired records into tombstones
/// (counted apart, and still counted after a reopen), then removes them with their partition
/// once their time runs out, counted as tombstones removed.
#[test]
fn tombstones_are_counted_apart_and_go_with_their_partition() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let open = || {
        builder(&clock)
            .tombstone_ttl(TTL)
            .open(dir.path().join("idem"))
    };
    let store = open()?;
    for i in 0..500 {
        let Begin::Claimed(claim) = store.begin(&scope(&random_key(3, i)), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        claim.commit(|_| Ok(Response::new(200, vec![])))?;
    }
    clock.advance(TTL);
    let turned = store.evict_expired(1_000)?;
    let stats = store.exact_stats()?;
    assert_eq!(
        (turned.removed, stats.tombstones, stats.completed),
        (500, 500, 0)
    );
    drop(store);
    let store = open()?;
    assert_eq!(
        store.exact_stats()?.tombstones,
        500,
        "counted after a reopen"
    );
    let before = store.stats()?;
    clock.advance(TTL);
    let pass = store.evict_expired(1_000)?;
    assert_eq!((pass.removed, pass.tombstones_removed), (0, 500));
    let after = store.stats()?;
    assert_eq!(after.tombstones_removed - before.tombstones_removed, 500);
    assert_eq!(after.evicted, before.evicted, "no record was evicted");
    let left = store.exact_stats()?;
    assert_eq!((left.records, left.tombstones), (0, 0));
    Ok(())
}
