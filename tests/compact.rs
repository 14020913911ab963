//! Compaction gives space back after eviction, keeps everything else, and refuses while a
//! snapshot is open.

mod common;

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
                Ok(Response::new(201, vec![b'x'; 8 * 1024]))
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
        assert_eq!(store.counts()?.records, 15, "{durability:?}");
        assert_eq!(order_count(&store)?, 15);
    }
    Ok(())
}
