//! Compaction gives space back after eviction, keeps everything else, and refuses while a
//! snapshot is open.

use crate::common;

use std::time::Duration;

use common::{ORDERS, TTL, TestResult, builder, clock, fp, order_count, scope};
use idemstore::{Begin, CompactError, Durability, Response};

#[test]
fn compaction_after_eviction_gives_space_back_and_keeps_the_rest() -> TestResult {
    for durability in [Durability::Wal, Durability::Redb] {
        let dir = tempfile::tempdir()?;
        let clock = clock();
        let open = || {
            builder(&clock)
                .durability(durability)
                .open(dir.path().join("idem"))
        };
        let store = open()?;
        for i in 0..1500 {
            let Begin::Claimed(claim) = store.begin(&scope(&format!("k{i}")), fp("req"))? else {
                return Err("expected Claimed".into());
            };
            claim.commit(move |tx| {
                if i % 100 == 0 {
                    tx.insert(&ORDERS, format!("o{i}").as_str(), "kept")?;
                }
                Ok(Response::new(201, common::incompressible(8 * 1024)))
            })?;
            // The last 15 complete later, so they outlive the others' TTL.
            if i == 1484 {
                clock.advance(Duration::from_secs(600));
            }
        }
        clock.advance(TTL - Duration::from_secs(1));
        let mut evicted = 0;
        loop {
            let pass = store.evict_expired(500)?;
            evicted += pass.removed;
            if pass.backlog == idemstore::Backlog::Empty {
                break;
            }
        }
        assert_eq!(evicted, 1485, "{durability:?}");

        // A snapshot blocks compaction, with an error that says so.
        let snapshot = store.read()?;
        assert!(
            matches!(store.compact(), Err(CompactError::SnapshotOpen)),
            "{durability:?}"
        );
        drop(snapshot);

        let compacted = store.compact()?;
        assert!(
            compacted.bytes_after * 2 < compacted.bytes_before,
            "{durability:?}: {compacted:?}"
        );
        for i in 1485..1500 {
            assert!(matches!(
                store.begin(&scope(&format!("k{i}")), fp("req"))?,
                Begin::Replay(_)
            ));
        }
        assert_eq!(order_count(&store)?, 15);
        drop(store);
        let store = open()?;
        assert_eq!(store.exact_stats()?.records, 15, "{durability:?}");
        assert_eq!(order_count(&store)?, 15);
    }
    Ok(())
}

/// Compaction is not refused because the store's own short reads are running (stats, counts,
/// the abandoned-work listing, begin): it waits for them to finish. Only a snapshot the caller
/// holds refuses it.
#[test]
fn compaction_waits_for_the_stores_own_readers_instead_of_failing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock).open(dir.path().join("idem"))?;
    for i in 0..200 {
        let Begin::Claimed(claim) = store.begin(&scope(&format!("k{i}")), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        claim.commit(|_| Ok(Response::new(201, vec![b'x'; 512])))?;
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || -> Result<u64, String> {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    store.stats().map_err(|e| e.to_string())?;
                    store.exact_stats().map_err(|e| e.to_string())?;
                    store.abandoned(10).map_err(|e| e.to_string())?;
                    store.get(&scope("k1")).map_err(|e| e.to_string())?;
                    reads += 1;
                }
                Ok(reads)
            })
        })
        .collect();
    let mut refused = 0;
    for _ in 0..200 {
        match store.compact() {
            Ok(_) => {}
            Err(CompactError::SnapshotOpen) => refused += 1,
            Err(e) => return Err(e.into()),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut reads = 0;
    for reader in readers {
        reads += reader.join().map_err(|_| "a reader panicked")??;
    }
    assert!(reads > 0, "the readers ran alongside");
    assert_eq!(refused, 0, "compaction refused by the store's own readers");
    Ok(())
}
