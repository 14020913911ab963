//! The write-ahead log on a simulated disk: what survives a crash, what is dropped, what is
//! refused.

use crate::common;

use common::{ORDERS, TestResult, builder, clock, fp, order_count, scope};
use idemstore::testing::{FaultPlan, SimDisk, Tear};
use idemstore::{
    Begin, Durability, ManualClock, OpenError, RecordState, RecoveryError, Response, Store,
    StoreError,
};

fn open(disk: &SimDisk, clock: &ManualClock) -> Result<Store, OpenError> {
    builder(clock)
        .log_segment_bytes(64 * 1024)
        .checkpoint_bytes(1 << 30)
        .open_simulated(disk)
}

/// Claims and commits `key` with a business row and a response of `size` bytes.
fn order(store: &Store, key: &str, size: usize) -> TestResult {
    let Begin::Claimed(claim) = store.begin(&scope(key), fp("req"))? else {
        return Err(format!("{key}: expected Claimed").into());
    };
    let row = format!("order-{key}");
    claim.commit(move |tx| {
        tx.insert(&ORDERS, row.as_str(), "paid")?;
        Ok(Response::new(201, common::incompressible(size)))
    })?;
    Ok(())
}

fn is_replay(store: &Store, key: &str) -> Result<bool, Box<dyn std::error::Error>> {
    Ok(matches!(
        store.begin(&scope(key), fp("req"))?,
        Begin::Replay(_)
    ))
}

/// The disk as a crash left it after one acknowledged order, `k`, in the log only.
fn crashed_after_one_order() -> Result<(SimDisk, ManualClock), Box<dyn std::error::Error>> {
    let disk = SimDisk::new();
    let clock = clock();
    let store = open(&disk, &clock)?;
    order(&store, "k", 10)?;
    Ok((disk.crash_image(Tear::Drop), clock))
}

/// The name and bytes of the log's first segment on `disk`.
fn first_segment(disk: &SimDisk) -> Result<(String, Vec<u8>), Box<dyn std::error::Error>> {
    let segment = disk
        .files()
        .into_iter()
        .find(|f| f.starts_with("wal/seg-"))
        .ok_or("no log segment")?;
    let bytes = disk.file(&segment).ok_or("segment vanished")?;
    Ok((segment, bytes))
}

#[test]
fn acknowledged_commits_survive_a_crash_by_replay() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    let store = open(&disk, &clock)?;
    for i in 0..20 {
        order(&store, &format!("k{i}"), 100)?;
    }
    assert_eq!(store.stats()?.checkpoints, 0);
    let image = disk.crash_image(Tear::Drop);
    drop(store);

    let store = open(&image, &clock)?;
    let report = store.recovery_report().clone();
    assert_eq!(
        report.frames_replayed, 40,
        "20 claims and 20 commits: {report:?}"
    );
    assert_eq!(report.torn_tail, None);
    for i in 0..20 {
        assert!(is_replay(&store, &format!("k{i}"))?, "k{i} lost");
    }
    assert_eq!(order_count(&store)?, 20);
    drop(store);

    // Recovery checkpointed: the next open has nothing to replay.
    let store = open(&image, &clock)?;
    assert_eq!(store.recovery_report().frames_replayed, 0);
    Ok(())
}

#[test]
fn after_a_checkpoint_there_is_nothing_to_replay() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    let store = open(&disk, &clock)?;
    for i in 0..5 {
        order(&store, &format!("k{i}"), 100)?;
    }
    store.checkpoint()?;
    order(&store, "after", 100)?;
    let image = disk.crash_image(Tear::Drop);
    drop(store);
    let store = open(&image, &clock)?;
    assert_eq!(
        store.recovery_report().frames_replayed,
        2,
        "only the frames after the checkpoint"
    );
    assert!(is_replay(&store, "k0")? && is_replay(&store, "after")?);
    Ok(())
}

#[test]
fn a_torn_frame_at_the_tail_is_dropped_and_reported() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    let store = open(&disk, &clock)?;
    order(&store, "before", 100)?;
    let Begin::Claimed(claim) = store.begin(&scope("torn"), fp("req"))? else {
        return Err("expected Claimed".into());
    };
    // The next operation is the frame's write, the one after it its sync: crash at the sync.
    let ops = disk.counters().ops;
    disk.plan(FaultPlan {
        crash_at: Some(ops + 2),
        ..FaultPlan::default()
    });
    let err = claim
        .commit(|tx| {
            tx.insert(&ORDERS, "torn-row", "x")?;
            Ok(Response::new(201, common::incompressible(3000)))
        })
        .err()
        .ok_or("a commit whose sync crashed succeeded")?;
    assert!(
        matches!(
            err,
            idemstore::CommitError::Store(StoreError::OutcomeUnknown { .. })
        ),
        "{err}"
    );

    // The frame's first sector reached the disk, the rest did not.
    let image = disk.crash_image(Tear::Sectors(1));
    drop(store);
    let store = open(&image, &clock)?;
    let report = store.recovery_report().clone();
    let (segment, _) = report
        .torn_tail
        .clone()
        .ok_or("the torn frame should be reported")?;
    assert!(segment.starts_with("seg-"), "{report:?}");
    assert!(report.bytes_dropped > 3000, "{report:?}");
    assert!(is_replay(&store, "before")?);
    // The unacknowledged commit is not half-applied: still in progress, and no row.
    assert!(matches!(
        store.get(&scope("torn"))?.map(|r| r.state().clone()),
        Some(RecordState::InProgress { .. })
    ));
    assert_eq!(order_count(&store)?, 1);
    Ok(())
}

#[test]
fn damage_in_the_middle_of_the_log_is_an_error_naming_the_segment_and_offset() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    let store = open(&disk, &clock)?;
    for i in 0..6 {
        order(&store, &format!("k{i}"), 100)?;
    }
    let image = disk.crash_image(Tear::Drop);
    drop(store);
    let (segment, mut bytes) = first_segment(&image)?;
    // A byte inside the second frame's payload (frames start at 64, each with a 20-byte
    // header; the first is a claim).
    let second = 64 + 20 + u32::from_le_bytes(bytes[64..68].try_into()?) as usize;
    bytes[second + 24] ^= 0x5a;
    image.set_file(&segment, bytes);

    let err = open(&image, &clock).err().ok_or("a damaged log opened")?;
    match &err {
        OpenError::Recovery(RecoveryError::Corrupt {
            segment: path,
            offset,
            ..
        }) => {
            assert!(path.ends_with(segment.trim_start_matches("wal/")), "{err}");
            assert_eq!(*offset, second as u64);
        }
        other => return Err(format!("expected Corrupt, got {other:?}").into()),
    }
    assert!(
        err.to_string()
            .contains("restore the store directory from a backup"),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_log_in_another_format_is_refused_and_left_as_it_is() -> TestResult {
    let (image, clock) = crashed_after_one_order()?;
    let (segment, mut bytes) = first_segment(&image)?;
    // The header as format 1 wrote it: version 1, its CRC recomputed.
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32fast::hash(&bytes[0..32]);
    bytes[32..36].copy_from_slice(&crc.to_le_bytes());
    image.set_file(&segment, bytes.clone());

    let err = open(&image, &clock).err().ok_or("a format-1 log opened")?;
    assert!(
        matches!(
            err,
            OpenError::Recovery(RecoveryError::OtherFormat {
                found: 1,
                supported: 2,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("close it cleanly"), "{err}");
    assert_eq!(image.file(&segment), Some(bytes), "the segment was changed");
    Ok(())
}

#[test]
fn a_log_that_writes_an_unregistered_table_fails_clearly() -> TestResult {
    let (image, clock) = crashed_after_one_order()?;
    let err = Store::builder()
        .clock(clock.clone())
        .open_simulated(&image)
        .err()
        .ok_or("a log naming an unregistered table replayed")?;
    assert!(
        matches!(&err, OpenError::Recovery(RecoveryError::UnknownTable { table, .. }) if table == "orders"),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_failed_sync_fails_the_group_the_store_heals_in_place_and_a_reopen_keeps_what_was_acknowledged()
-> TestResult {
    for durability in [Durability::Wal, Durability::Redb] {
        let disk = SimDisk::new();
        let clock = clock();
        let store = builder(&clock)
            .durability(durability)
            .open_simulated(&disk)?;
        for i in 0..5 {
            order(&store, &format!("k{i}"), 100)?;
        }
        let Begin::Claimed(claim) = store.begin(&scope("failing"), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        // Fail the first sync of the commit's group, once; the disk itself keeps working.
        let next_sync = disk.counters().syncs() + 1;
        disk.plan(FaultPlan {
            fail_sync: Some(next_sync),
            ..FaultPlan::default()
        });
        let err = claim
            .commit(|tx| {
                tx.insert(&ORDERS, "failing-row", "x")?;
                Ok(Response::new(201, b"never acknowledged".to_vec()))
            })
            .err()
            .ok_or("a commit whose sync failed succeeded")?;
        assert!(
            matches!(
                err,
                idemstore::CommitError::Store(StoreError::OutcomeUnknown { .. })
            ),
            "{durability:?}: {err}"
        );
        // The store recovered in place before the failure was reported: reads replay, and
        // writes are accepted again without a restart.
        assert!(
            is_replay(&store, "k0")?,
            "{durability:?}: a replay after the failure"
        );
        order(&store, "after", 100)?;
        assert!(store.writable().is_ok());
        assert!(store.stats()?.restores >= 1, "it recovered in place");
        // What a reboot now would find: only what was synced.
        let image = disk.crash_image(Tear::Drop);
        drop(store);

        let store = builder(&clock)
            .durability(durability)
            .open_simulated(&image)?;
        for i in 0..5 {
            assert!(
                is_replay(&store, &format!("k{i}"))?,
                "{durability:?}: k{i} lost"
            );
        }
        // The failed commit left the claim in progress or, if its bytes did land, completed
        // with its row; never one without the other.
        let record = store
            .get(&scope("failing"))?
            .ok_or("the acknowledged claim was lost")?;
        let row = store.read()?.open_table(ORDERS).map(|t| {
            idemstore::redb::ReadableTable::get(&t, "failing-row").map(|v| v.is_some())
        })??;
        match record.state() {
            RecordState::InProgress { .. } => assert!(!row, "{durability:?}: row without record"),
            RecordState::Completed { .. } => assert!(row, "{durability:?}: record without row"),
            RecordState::Tombstone { .. } => {
                return Err(
                    format!("{durability:?}: a tombstone without tombstones enabled").into(),
                );
            }
        }
    }
    Ok(())
}

#[test]
fn segments_are_reused_after_checkpoints() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    let store = builder(&clock)
        .log_segment_bytes(64 * 1024)
        .checkpoint_bytes(128 * 1024)
        .open_simulated(&disk)?;
    for i in 0..300 {
        order(&store, &format!("k{i}"), 1000)?;
    }
    let stats = store.stats()?;
    assert!(stats.log_bytes > 300 * 1024, "{stats:?}");
    assert!(stats.checkpoints >= 3, "{stats:?}");
    let segments = disk
        .files()
        .iter()
        .filter(|f| f.starts_with("wal/"))
        .count();
    assert!(
        segments <= 5,
        "{segments} segments for {} log bytes",
        stats.log_bytes
    );

    let image = disk.crash_image(Tear::Drop);
    drop(store);
    let store = open(&image, &clock)?;
    assert!(store.recovery_report().frames_replayed < 600);
    for i in 0..300 {
        assert!(is_replay(&store, &format!("k{i}"))?, "k{i} lost");
    }
    Ok(())
}

#[test]
fn a_store_last_opened_with_the_log_replays_it_when_reopened_without() -> TestResult {
    let (image, clock) = crashed_after_one_order()?;
    let store = builder(&clock)
        .durability(Durability::Redb)
        .open_simulated(&image)?;
    assert_eq!(store.recovery_report().frames_replayed, 2);
    assert!(is_replay(&store, "k")?);
    Ok(())
}

#[test]
fn spare_segments_beyond_one_checkpoint_interval_are_deleted() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    // A long stretch without checkpoints needs many segments...
    let store = builder(&clock)
        .log_segment_bytes(64 * 1024)
        .checkpoint_bytes(1 << 30)
        .open_simulated(&disk)?;
    for i in 0..400 {
        order(&store, &format!("k{i}"), 1000)?;
    }
    let segments = || {
        disk.files()
            .iter()
            .filter(|f| f.starts_with("wal/"))
            .count()
    };
    let during = segments();
    assert!(during > 8, "{during}");
    drop(store);
    // ...reopened with checkpoints every two segments, the spares shrink to what that needs.
    let store = builder(&clock)
        .log_segment_bytes(64 * 1024)
        .checkpoint_bytes(128 * 1024)
        .open_simulated(&disk)?;
    order(&store, "after", 10)?;
    store.checkpoint()?;
    assert!(
        segments() <= 4,
        "{} segments kept after the checkpoint",
        segments()
    );
    for i in 0..400 {
        assert!(is_replay(&store, &format!("k{i}"))?, "k{i} lost");
    }
    Ok(())
}

/// Issue 26, item 6. A stray segment file with a higher number (here header-only: number
/// 1000, first frame 1) must not hide the acknowledged frames of the real log. Recovery used to
/// start from the newest segment starting at or before the checkpoint (the stray), replay
/// nothing, and hand the real segment to reuse: five acknowledged orders gone. Now every frame
/// past the checkpoint is read from whichever segment holds it, and a segment that does not fit
/// the chain is refused by name, with nothing changed.
#[test]
fn a_stray_segment_that_does_not_fit_the_chain_is_refused_by_name() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    let store = open(&disk, &clock)?;
    for i in 0..3 {
        order(&store, &format!("k{i}"), 100)?;
    }
    store.checkpoint()?;
    for i in 3..8 {
        order(&store, &format!("k{i}"), 100)?;
    }
    let image = disk.crash_image(Tear::Drop);
    drop(store);
    let intact = image.crash_image(Tear::Drop);
    image.set_file(
        "wal/seg-00000099.log",
        idemstore::testing::build_segment(1000, 1, &[]),
    );

    let err = open(&image, &clock)
        .err()
        .ok_or("a log with a stray segment opened")?;
    match &err {
        OpenError::Recovery(RecoveryError::Stray { segment, .. }) => {
            assert!(segment.ends_with("seg-00000099.log"), "{err}");
        }
        other => return Err(format!("expected Stray, got {other:?}").into()),
    }
    assert!(
        err.to_string().contains("move it out of the log directory"),
        "{err}"
    );

    // Taken out, the store opens with every acknowledged order.
    let store = open(&intact, &clock)?;
    for i in 0..8 {
        assert!(is_replay(&store, &format!("k{i}"))?, "k{i} lost");
    }
    Ok(())
}

/// A segment numbered below the one the checkpoint names whose header starts later than that
/// one is a header that contradicts its neighbours: refused by name too.
#[test]
fn an_older_segment_that_starts_later_is_refused_by_name() -> TestResult {
    let (image, clock) = crashed_after_one_order()?;
    let store = open(&image, &clock)?;
    store.checkpoint()?;
    order(&store, "after", 10)?;
    let image = image.crash_image(Tear::Drop);
    drop(store);
    image.set_file(
        "wal/seg-00000050.log",
        idemstore::testing::build_segment(0, 9_999, &[b"x".to_vec()]),
    );
    let err = open(&image, &clock)
        .err()
        .ok_or("a log with a stray segment opened")?;
    assert!(
        matches!(&err, OpenError::Recovery(RecoveryError::Stray { segment, .. }) if segment.ends_with("seg-00000050.log")),
        "{err}"
    );
    Ok(())
}
