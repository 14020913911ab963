//! `Store::backup`: a copy made while writers commit holds every pair acknowledged before the
//! backup began, each whole (its record and its business row together), opens as a store in
//! either durability mode, verifies as `idemstore verify` checks, and carries the outbox;
//! destinations that hold something and tables the store did not register are refused, and
//! leave nothing behind.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{ORDERS, TestResult, fp, orders, scope};
use idemstore::{
    BackedUp, BackupError, Begin, Durability, ManualClock, Response, Store, Sweep, Timestamp,
};
use parking_lot::{Condvar, Mutex};

/// Threads committing pairs while the backup runs.
const WRITERS: usize = 4;
/// Pairs acknowledged before the backup starts (and again after it, so that it surely ran
/// under load).
const BEFORE: usize = 200;
/// The most pairs one writer commits: a bound on its loop.
const MOST_PER_WRITER: usize = 100_000;

/// Keys whose pair was acknowledged, in order, and a signal for each new one.
#[derive(Default)]
struct Acked {
    keys: Mutex<Vec<String>>,
    grew: Condvar,
}

impl Acked {
    fn push(&self, key: String) {
        self.keys.lock().push(key);
        self.grew.notify_all();
    }

    /// Waits (at most a minute) until `n` pairs are acknowledged; the keys then.
    fn at_least(&self, n: usize) -> Result<Vec<String>, String> {
        let mut keys = self.keys.lock();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while keys.len() < n {
            if self.grew.wait_until(&mut keys, deadline).timed_out() {
                return Err(format!(
                    "only {} of {n} pairs were acknowledged",
                    keys.len()
                ));
            }
        }
        Ok(keys.clone())
    }
}

fn store_builder(clock: &ManualClock, durability: Durability) -> idemstore::Builder {
    common::builder(clock).durability(durability)
}

/// One writer: pairs of a claim and an order row, committed together, until told to stop.
fn commit_pairs(
    store: &Store,
    writer: usize,
    stop: &AtomicBool,
    acked: &Acked,
) -> Result<(), String> {
    for i in 0..MOST_PER_WRITER {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let key = format!("w{writer}-{i}");
        let Begin::Claimed(claim) = store
            .begin(&scope(&key), fp(&key))
            .map_err(|e| e.to_string())?
        else {
            return Err(format!("{key} is new and must be claimed"));
        };
        let row = key.clone();
        claim
            .commit(move |tx| {
                tx.insert(&ORDERS, row.as_str(), "paid")?;
                Ok(Response::new(201, row.clone().into_bytes()))
            })
            .map_err(|e| e.to_string())?;
        acked.push(key);
    }
    Ok(())
}

/// Checks the copy as `idemstore verify` does (feature `cli`), before anything opens it.
fn verified(dir: &Path) -> TestResult {
    #[cfg(feature = "cli")]
    {
        use idemstore::inspect::{Inspector, LogDamage};
        let verification = Inspector::open(dir, LogDamage::Refuse)?.verify()?;
        assert!(
            verification.is_sound(),
            "the copy does not verify: {:?}",
            verification.problems
        );
    }
    let _ = dir;
    Ok(())
}

/// The names in `dir`, to show nothing was left beside a destination.
fn names_in(dir: &Path) -> Result<BTreeSet<String>, std::io::Error> {
    std::fs::read_dir(dir)?
        .map(|entry| Ok(entry?.file_name().to_string_lossy().into_owned()))
        .collect()
}

/// Writers commit pairs; once `BEFORE` are acknowledged the store is backed up, and they go
/// on. The copy must hold every pair acknowledged before the call, replaying its response,
/// with its row; and nothing in it may be half a pair or a pair never acknowledged.
fn backup_under_load(durability: Durability) -> TestResult {
    let tmp = tempfile::tempdir()?;
    let clock = common::clock();
    let store = store_builder(&clock, durability).open(tmp.path().join("idem"))?;
    let dest = tmp.path().join("backup");
    let (stop, acked) = (Arc::new(AtomicBool::new(false)), Arc::new(Acked::default()));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (store, stop, acked) = (store.clone(), stop.clone(), acked.clone());
            std::thread::spawn(move || commit_pairs(&store, w, &stop, &acked))
        })
        .collect();
    // The writers are stopped whatever happens, so that a failure cannot hang the test.
    let outcome = (|| -> Result<(Vec<String>, BackedUp), Box<dyn std::error::Error>> {
        let before = acked.at_least(BEFORE)?;
        let backed_up = store.backup(&dest)?;
        let now = acked.keys.lock().len();
        acked.at_least(now + WRITERS)?; // and they went on
        Ok((before, backed_up))
    })();
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.join().map_err(|_| "a writer panicked")??;
    }
    let (before, backed_up) = outcome?;
    let all: BTreeSet<String> = acked.keys.lock().iter().cloned().collect();
    drop(store);

    verified(&dest)?;
    let copy = store_builder(&clock, durability).open(&dest)?;
    let rows: BTreeSet<String> = orders(&copy)?.into_iter().map(|(key, _)| key).collect();
    for key in &before {
        let Begin::Replay(stored) = copy.begin(&scope(key), fp(key))? else {
            return Err(
                format!("{key} was acknowledged before the backup and is not in it").into(),
            );
        };
        assert_eq!(stored.body(), key.as_bytes());
        assert!(rows.contains(key), "{key}'s order row is missing");
    }
    // Whole pairs, and only acknowledged ones: each row's record replays, and there are as
    // many completed records as rows.
    for key in &rows {
        assert!(
            all.contains(key),
            "{key} is in the copy but was never acknowledged"
        );
        assert!(
            matches!(copy.begin(&scope(key), fp(key))?, Begin::Replay(_)),
            "{key} has a row but no completed record"
        );
    }
    let stats = copy.exact_stats()?;
    assert_eq!(stats.completed, rows.len() as u64, "{stats:?}");
    assert!(rows.len() >= before.len());
    assert_eq!(backed_up.business_rows, rows.len() as u64);
    assert_eq!(backed_up.records, stats.completed + stats.in_progress);
    assert!(stats.in_progress <= WRITERS as u64, "{stats:?}");
    assert_eq!(
        names_in(tmp.path())?,
        BTreeSet::from(["backup".to_owned(), "idem".to_owned()]),
        "nothing but the copy is left beside it"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode(&dest)?, 0o700);
        assert_eq!(mode(&dest.join("idemstore.redb"))?, 0o600);
    }
    Ok(())
}

#[test]
fn a_backup_under_load_holds_every_pair_acknowledged_before_it_with_the_log() -> TestResult {
    backup_under_load(Durability::Wal)
}

#[test]
fn a_backup_under_load_holds_every_pair_acknowledged_before_it_with_redb_commits() -> TestResult {
    backup_under_load(Durability::Redb)
}

/// A store with one pair, closed: for the refusals.
fn store_with_a_pair(dir: &Path) -> TestResult {
    let store = common::builder(&common::clock()).open(dir)?;
    let Begin::Claimed(claim) = store.begin(&scope("k"), fp("k"))? else {
        return Err("a new key is claimed".into());
    };
    claim.commit(|tx| {
        tx.insert(&ORDERS, "k", "paid")?;
        Ok(Response::new(201, "k"))
    })?;
    Ok(())
}

#[test]
fn a_destination_that_is_not_empty_is_refused_and_left_as_it_was() -> TestResult {
    let tmp = tempfile::tempdir()?;
    store_with_a_pair(&tmp.path().join("idem"))?;
    let store = common::builder(&common::clock()).open(tmp.path().join("idem"))?;
    let dest = tmp.path().join("backup");
    std::fs::create_dir(&dest)?;
    std::fs::write(dest.join("notes.txt"), b"keep me")?;
    let before = names_in(tmp.path())?;
    let refused = store
        .backup(&dest)
        .err()
        .ok_or("a non-empty destination was used")?;
    assert!(
        matches!(&refused, BackupError::DestinationNotEmpty { path } if *path == dest),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("is not empty"), "{refused}");
    assert_eq!(names_in(&dest)?, BTreeSet::from(["notes.txt".to_owned()]));
    assert_eq!(std::fs::read(dest.join("notes.txt"))?, b"keep me");
    assert_eq!(names_in(tmp.path())?, before, "nothing was left beside it");
    Ok(())
}

#[test]
fn a_destination_that_is_a_file_is_refused() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let store = common::builder(&common::clock()).open(tmp.path().join("idem"))?;
    let dest = tmp.path().join("backup");
    std::fs::write(&dest, b"a file")?;
    let refused = store
        .backup(&dest)
        .err()
        .ok_or("a file was used as the destination")?;
    assert!(
        matches!(&refused, BackupError::DestinationNotADirectory { .. }),
        "{refused:?}"
    );
    assert_eq!(std::fs::read(&dest)?, b"a file");
    assert_eq!(
        names_in(tmp.path())?,
        BTreeSet::from(["backup".to_owned(), "idem".to_owned()])
    );
    Ok(())
}

/// An existing empty directory takes the copy; missing parents are made.
#[test]
fn an_empty_directory_or_a_new_path_receives_the_copy() -> TestResult {
    let tmp = tempfile::tempdir()?;
    store_with_a_pair(&tmp.path().join("idem"))?;
    let store = common::builder(&common::clock()).open(tmp.path().join("idem"))?;
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty)?;
    let nested = tmp.path().join("a").join("b").join("backup");
    for dest in [&empty, &nested] {
        let backed_up = store.backup(dest)?;
        assert_eq!((backed_up.records, backed_up.business_rows), (1, 1));
        assert!(backed_up.bytes > 0);
        verified(dest)?;
    }
    drop(store);
    for dest in [&empty, &nested] {
        let copy = common::builder(&common::clock()).open(dest)?;
        assert!(matches!(
            copy.begin(&scope("k"), fp("k"))?,
            Begin::Replay(_)
        ));
        assert_eq!(common::order_count(&copy)?, 1);
    }
    Ok(())
}

/// A table in the file that the store did not register cannot be copied (its types are
/// unknown): refused by name, pointing at `Builder::table`, and nothing is written.
#[test]
fn a_table_the_store_did_not_register_is_refused_by_name() -> TestResult {
    let tmp = tempfile::tempdir()?;
    store_with_a_pair(&tmp.path().join("idem"))?;
    let store = Store::builder()
        .sweep(Sweep::Off)
        .open(tmp.path().join("idem"))?;
    let dest = tmp.path().join("backup");
    let refused = store
        .backup(&dest)
        .err()
        .ok_or("an unknown table was left out")?;
    assert!(
        matches!(&refused, BackupError::UnregisteredTable { name } if name == "orders"),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("Builder::table"), "{refused}");
    assert!(!dest.exists());
    assert_eq!(names_in(tmp.path())?, BTreeSet::from(["idem".to_owned()]));
    Ok(())
}

/// Messages committed with their pairs and not yet delivered are in the copy, and the copy's
/// next message does not take the seq of one of them.
#[test]
fn a_backup_carries_the_outbox_messages_pending() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let clock = common::clock();
    let store = common::builder(&clock).open(tmp.path().join("idem"))?;
    let publish = |store: &Store, key: &str| -> TestResult {
        // The copy is a restore: a new key there is a recovery, claimed all the same.
        let (Begin::Claimed(claim) | Begin::Recovered(claim)) =
            store.begin(&scope(key), fp(key))?
        else {
            return Err("a new key is claimed".into());
        };
        let row = key.to_owned();
        claim.commit(move |tx| {
            tx.insert(&ORDERS, row.as_str(), "paid")?;
            tx.publish("orders.placed", row.clone().into_bytes())?;
            tx.publish("orders.audit", row.clone().into_bytes())?;
            Ok(Response::new(201, row.clone().into_bytes()))
        })?;
        Ok(())
    };
    for key in ["m1", "m2", "m3"] {
        publish(&store, key)?;
    }
    let dest = tmp.path().join("backup");
    let backed_up = store.backup(&dest)?;
    assert_eq!(backed_up.messages, 6);
    drop(store);
    verified(&dest)?;
    let copy = common::builder(&clock).open(&dest)?;
    assert_eq!(copy.exact_stats()?.outbox_pending, 6);
    publish(&copy, "m4")?;
    assert_eq!(
        copy.exact_stats()?.outbox_pending,
        8,
        "new seqs, none reused"
    );
    Ok(())
}

const CHILD: &str = "IDEMSTORE_BACKUP_CHILD";

/// The child: commits pairs into a restored copy with the log, and exits without closing it,
/// so that they are in the copy's new log only (as after a crash).
#[test]
fn child_writes_to_a_restored_copy_and_exits() -> TestResult {
    let Ok(dir) = std::env::var(CHILD) else {
        return Ok(());
    };
    let store = restored_builder().open(&dir)?;
    for key in ["after-1", "after-2", "after-3"] {
        // In the copy's restore window: claimed, as a recovery.
        let Begin::Recovered(claim) = store.begin(&scope(key), fp(key))? else {
            return Err("a new key in a restored copy is a recovery".into());
        };
        let row = key.to_owned();
        claim.commit(move |tx| {
            tx.insert(&ORDERS, row.as_str(), "paid")?;
            Ok(Response::new(201, row.clone().into_bytes()))
        })?;
    }
    std::process::exit(0); // no drop: no checkpoint, as if killed
}

fn restored_builder() -> idemstore::Builder {
    Store::builder()
        .table(ORDERS)
        .sweep(Sweep::Off)
        .clock(ManualClock::new(Timestamp::from_millis(1_764_000_000_000)))
        .checkpoint_interval(Duration::from_secs(3600))
}

/// A copy starts a log of its own. The source's checkpoint named a log segment far into its
/// own log; a copy that kept that mark would, after a crash, skip its new log's first
/// segments and lose the writes they acknowledged.
#[test]
fn writes_to_a_restored_copy_survive_a_crash() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let source = tmp.path().join("idem");
    let store = restored_builder()
        .log_segment_bytes(64 * 1024)
        .checkpoint_bytes(64 * 1024)
        .open(&source)?;
    for i in 0..40 {
        let key = format!("before-{i}");
        let Begin::Claimed(claim) = store.begin(&scope(&key), fp(&key))? else {
            return Err("a new key is claimed".into());
        };
        let body = common::incompressible(8 * 1024);
        claim.commit(move |_| Ok(Response::new(201, body)))?;
    }
    let dest = tmp.path().join("backup");
    store.backup(&dest)?;
    drop(store);
    assert!(
        log_segment(&source.join("idemstore.redb"))?.is_some_and(|s| s > 1),
        "the source's checkpoint names a later segment, or this shows nothing"
    );
    let status = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            crate::child_test!("child_writes_to_a_restored_copy_and_exits").as_str(),
            "--nocapture",
        ])
        .env(CHILD, &dest)
        .status()?;
    assert!(status.success(), "the child failed");
    let copy = restored_builder().open(&dest)?;
    for key in ["after-1", "after-2", "after-3", "before-0", "before-39"] {
        assert!(
            matches!(copy.begin(&scope(key), fp(key))?, Begin::Replay(_)),
            "{key} was acknowledged and is lost"
        );
    }
    Ok(())
}

/// The log segment a store's last checkpoint names (`meta.log_segment`), read from its closed
/// file.
fn log_segment(db: &Path) -> Result<Option<u64>, Box<dyn std::error::Error>> {
    use idemstore::redb::{Database, ReadableDatabase, TableDefinition};
    let meta: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemstore.meta");
    let db = Database::open(db)?;
    let txn = db.begin_read()?;
    let table = txn.open_table(meta)?;
    let found = table.get(b"log_segment".as_slice())?;
    Ok(match found {
        Some(value) => Some(u64::from_le_bytes(value.value().try_into()?)),
        None => None,
    })
}
