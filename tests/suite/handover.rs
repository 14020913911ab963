//! The states a box-loss handover goes through that no single restore shows: a fenced box back
//! on its own directory after the new one closed cleanly, a second restore inside the first
//! one's window, a box whose clock reads 1970 at the restore, a broker that comes back
//! without its data, a restore killed at its take-over, and what a restore leaves on disk.
//! Each test is one of the seven ways an outside audit broke the protocol; each fails on the
//! code before writer epochs and restore lineage. On the in-memory replica; `box_loss.rs`
//! plays them with real processes and NATS, `handover_model.rs` explores them all.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::ship::{caught_up, keys, lose, pair, restore, shipping, state, until};
use common::{ORDERS, TTL, TestResult, builder, clock, fp, scope};
use idemstore::testing::{MemoryReplica, ReplicaFault};
use idemstore::{
    Begin, Guarantee, Lineage, ManualClock, ReplicaError, ReplicaSource, Response, RestoreError,
    ShipState, ShippedFrame, Shipping, SnapshotInfo, Standby, Store, Takeover, Timestamp,
    Unreachable, WriterIdentity,
};

const REFUSE: Shipping = Shipping::Sync(Unreachable::Refuse);

/// Whether a retry of `key` at `store` is answered as a recovery (the key may have run
/// elsewhere), not as a fresh claim.
fn recovered(store: &Store, key: &str) -> Result<bool, Box<dyn std::error::Error>> {
    Ok(match store.begin(&scope(key), fp(key))? {
        Begin::Recovered(_) => true,
        Begin::Claimed(_) => false,
        other => return Err(format!("{key}: neither claimed nor recovered: {other:?}").into()),
    })
}

fn replays(store: &Store, key: &str) -> Result<bool, Box<dyn std::error::Error>> {
    Ok(matches!(
        store.begin(&scope(key), fp(key))?,
        Begin::Replay(_)
    ))
}

/// Bug 1: box A is partitioned and acknowledges alone; B restores, takes over, ships with
/// `Sync(Refuse)` and is restarted cleanly, which releases the stream. A, back on its own
/// directory, must stay fenced (its epoch is below the stream's), so that the stream keeps B's
/// acknowledged pairs and B reopens. Before epochs, A's claim was accepted (the entry named no
/// one) and its catch-up snapshot erased B's frames.
#[test]
fn a_fenced_box_back_on_its_own_directory_never_takes_the_stream_back() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let a_dir = dir.path().join("a");
    let a = shipping(&clock, &replica, Shipping::Async).open(&a_dir)?;
    for key in keys("a", 3) {
        pair(&a, &key)?;
    }
    until("A to ship", || caught_up(&a))?;
    replica.cut_off(); // A is partitioned from the stream
    for key in keys("a-alone", 20) {
        pair(&a, &key)?;
    }

    let b_dir = dir.path().join("b");
    Store::restore(&replica.handle(), &b_dir, Takeover::Yes)?;
    assert_eq!(replica.epoch(), 1, "a take-over starts epoch 1");
    let b = shipping(&clock, &replica, REFUSE).open(&b_dir)?;
    let b_keys = keys("b", 3);
    for key in &b_keys {
        pair(&b, key)?;
    }
    drop(b); // a deploy: a clean close releases the writer, not the epoch
    drop(a);

    let a = shipping(&clock, &replica, Shipping::Async).open(&a_dir)?;
    until("A to find itself fenced", || {
        state(&a) == Some(ShipState::Fenced)
    })?;
    let error = a
        .stats()?
        .shipping
        .and_then(|s| s.last_error)
        .unwrap_or_default();
    assert!(error.contains("writer epoch 1"), "{error}");
    // Knowing it is fenced, it acknowledges nothing more, asynchronous or not: no restore of
    // the stream would know of it.
    assert!(pair(&a, "a-fenced").is_err());
    drop(a);

    let c = restore(&replica, &dir.path().join("c"), &clock)?;
    for key in &b_keys {
        assert!(replays(&c, key)?, "{key}, acknowledged by B, is lost");
    }
    drop(c);
    // C took the stream over: B is fenced now too, as it should be; before C, B reopened.
    assert_eq!(replica.epoch(), 2);
    Ok(())
}

/// B's clean close and reopen after a take-over: the same store claims its stream back.
#[test]
fn the_new_writer_reopens_after_its_clean_close() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    lost_after_one_pair(dir.path(), &clock, &replica)?;
    let b_dir = dir.path().join("b");
    Store::restore(&replica.handle(), &b_dir, Takeover::Yes)?;
    drop(shipping(&clock, &replica, REFUSE).open(&b_dir)?);
    let b = shipping(&clock, &replica, REFUSE).open(&b_dir)?;
    pair(&b, "b-0")?;
    assert!(replays(&b, "a-0")?);
    Ok(())
}

/// A (async) dies with unshipped acknowledgements; B restores (its window opens) and ships
/// with `Sync(Refuse)`, then closes cleanly. Returns the stream, A's lost keys but the first
/// (B answered that one as a recovery and completed it), and the clock.
fn restored_twice_setup(
    dir: &Path,
) -> Result<(MemoryReplica, Vec<String>, ManualClock), Box<dyn std::error::Error>> {
    let clock = clock();
    let replica = MemoryReplica::new();
    let a = shipping(&clock, &replica, Shipping::Async).open(dir.join("a"))?;
    pair(&a, "a-0")?;
    until("A to ship", || caught_up(&a))?;
    replica.set_fault(ReplicaFault::Down);
    let lost = keys("lost", 5);
    for key in &lost {
        pair(&a, key)?;
    }
    lose(a, &replica);
    replica.set_fault(ReplicaFault::None);

    let b_dir = dir.join("b");
    let restored = Store::restore(&replica.handle(), &b_dir, Takeover::Yes)?;
    assert_eq!(restored.guarantee, Guarantee::MayLag);
    let b = shipping(&clock, &replica, REFUSE).open(&b_dir)?;
    match b.begin(&scope(&lost[0]), fp(&lost[0]))? {
        Begin::Recovered(claim) => claim.commit(|tx| {
            tx.insert(&ORDERS, "lost-0", "order")?;
            Ok(Response::new(201, b"ok".to_vec()))
        })?,
        other => return Err(format!("B answered a lost key {other:?}, not a recovery").into()),
    };
    pair(&b, "b-0")?;
    until("B to ship", || caught_up(&b))?;
    drop(b);
    clock.advance(Duration::from_secs(60));
    Ok((replica, lost[1..].to_vec(), clock))
}

/// Bug 2: a second restore inside the first one's window keeps the window: B shipped
/// "complete" by its own mode, but it was inside a "may lag" window, and C inherits it.
#[test]
fn a_second_restore_inside_the_first_ones_window_answers_the_lost_keys_as_recoveries() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let (replica, lost, clock) = restored_twice_setup(dir.path())?;
    let restored = Store::restore(&replica.handle(), dir.path().join("c"), Takeover::Yes)?;
    assert_eq!(restored.guarantee, Guarantee::MayLag);
    let c = builder(&clock).open(dir.path().join("c"))?;
    for key in &lost {
        assert!(
            recovered(&c, key)?,
            "{key} was answered Claimed: a second charge"
        );
    }
    assert!(replays(&c, "lost-0")?);
    // The window is the first restore's: past its end, unknown keys are claims again.
    clock.advance(TTL);
    assert!(!recovered(&c, "never-seen")?);
    Ok(())
}

/// Bug 2, through a standby of B's stream.
#[test]
fn a_standby_of_a_restored_stream_keeps_its_window() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (replica, lost, clock) = restored_twice_setup(dir.path())?;
    let standby = Standby::follow(
        replica.handle(),
        dir.path().join("s"),
        Duration::from_millis(10),
    )?;
    standby.take_over().map_err(|e| e.to_string())?;
    let s = builder(&clock).open(dir.path().join("s"))?;
    for key in &lost {
        assert!(
            recovered(&s, key)?,
            "{key} was answered Claimed: a second charge"
        );
    }
    Ok(())
}

/// Bug 3: a replacement box whose clock reads 1970 restores and opens; its window starts at
/// the newest time the restored data holds, so once the clock is corrected the lost keys are
/// still recoveries (and the window still ends a window's length after that time).
#[test]
fn a_restore_on_a_box_whose_clock_reads_1970_keeps_its_window_once_the_clock_is_set() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let a = shipping(&clock, &replica, Shipping::Async).open(dir.path().join("a"))?;
    pair(&a, "a-0")?;
    until("A to ship", || caught_up(&a))?;
    replica.set_fault(ReplicaFault::Down);
    let lost = keys("lost", 3);
    for key in &lost {
        pair(&a, key)?;
    }
    lose(a, &replica);
    replica.set_fault(ReplicaFault::None);

    let new_box = ManualClock::new(Timestamp::from_millis(0));
    let b_dir = dir.path().join("b");
    Store::restore(&replica.handle(), &b_dir, Takeover::Yes)?;
    let b = builder(&new_box).open(&b_dir)?;
    new_box.set(idemstore::Clock::now(&clock));
    new_box.advance(Duration::from_secs(60));
    for key in &lost {
        assert!(
            recovered(&b, key)?,
            "{key} was answered Claimed once the clock was set"
        );
    }
    new_box.advance(TTL);
    assert!(!recovered(&b, "never-seen")?, "the window ends");
    Ok(())
}

/// Bug 4: the broker comes back without its data. A `Sync(Refuse)` store refuses while its
/// stream is gone, then claims it again, sends a snapshot of everything it holds and takes
/// writes again; a restore then holds every pair acknowledged before and after.
#[test]
fn a_broker_that_forgets_is_caught_up_with_a_snapshot_and_writes_resume() -> TestResult {
    for mode in [Shipping::Async, REFUSE] {
        let dir = tempfile::tempdir()?;
        let clock = clock();
        let replica = MemoryReplica::new();
        let store = shipping(&clock, &replica, mode).open(dir.path().join("a"))?;
        let mut acknowledged = keys("before", 3);
        for key in &acknowledged {
            pair(&store, key)?;
        }
        until("the store to ship", || caught_up(&store))?;
        let snapshots = store.stats()?.shipping.map_or(0, |s| s.snapshots);
        replica.forget();
        let mut i = 0;
        until("the store to take writes again", || {
            i += 1;
            let key = format!("after-{i}");
            let written = pair(&store, &key).is_ok();
            if written {
                acknowledged.push(key);
            }
            written && caught_up(&store)
        })
        .map_err(|e| format!("{e}: {:?}", store.stats().map(|s| s.shipping)))?;
        let shipping = store.stats()?.shipping.ok_or("no shipping stats")?;
        assert!(
            shipping.snapshots > snapshots,
            "{mode:?}: no catch-up snapshot"
        );
        assert_eq!(
            replica.epoch(),
            0,
            "a claim after a loss keeps the store's epoch"
        );
        drop(store);
        let restored = restore(&replica, &dir.path().join("r"), &clock)?;
        for key in &acknowledged {
            assert!(replays(&restored, key)?, "{mode:?}: {key} is lost");
        }
    }
    Ok(())
}

/// A source that records whether the destination existed when the take-over was asked, and
/// can fail after the take-over went through (a restore killed right after it).
struct Watching {
    inner: MemoryReplica,
    dest: PathBuf,
    seen: Arc<Mutex<Vec<bool>>>,
    die_after_take_over: bool,
}

impl ReplicaSource for Watching {
    fn fetch_snapshot(&self, file: &Path) -> Result<Option<SnapshotInfo>, ReplicaError> {
        self.inner.fetch_snapshot(file)
    }
    fn latest_snapshot(&self) -> Result<Option<SnapshotInfo>, ReplicaError> {
        self.inner.latest_snapshot()
    }
    fn frames_after(
        &self,
        after: u64,
        each: &mut dyn FnMut(ShippedFrame, Lineage) -> Result<(), ReplicaError>,
    ) -> Result<u64, ReplicaError> {
        self.inner.frames_after(after, each)
    }
    fn take_over(&self, me: &WriterIdentity, last: u64, known: u64) -> Result<u64, ReplicaError> {
        self.seen
            .lock()
            .map_err(|_| ReplicaError::Refused {
                detail: "poisoned".into(),
            })?
            .push(self.dest.exists());
        let epoch = self.inner.take_over(me, last, known)?;
        if self.die_after_take_over {
            return Err(ReplicaError::Unreachable {
                detail: "the restore's process died here (test)".into(),
            });
        }
        Ok(epoch)
    }
}

/// Bug 5: a restore takes the stream over before the store is at its destination, so a
/// restore killed at any step leaves nothing there (a supervisor restores again), and one
/// killed after the take-over restores again past it; the store then ships.
#[test]
fn a_restore_takes_over_before_it_places_the_store_and_a_killed_one_restores_again() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    lost_after_one_pair(dir.path(), &clock, &replica)?;
    let dest = dir.path().join("b");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let source = |die_after_take_over| Watching {
        inner: replica.handle(),
        dest: dest.clone(),
        seen: seen.clone(),
        die_after_take_over,
    };
    let killed = Store::restore(&source(true), &dest, Takeover::Yes);
    assert!(killed.is_err());
    assert!(
        !dest.exists(),
        "a restore killed at its take-over left a store behind"
    );
    assert_eq!(replica.epoch(), 1);
    Store::restore(&source(false), &dest, Takeover::Yes)?;
    assert_eq!(*seen.lock().map_err(|_| "poisoned")?, vec![false, false]);
    assert_eq!(
        replica.epoch(),
        2,
        "the second restore took over past the first"
    );
    let b = shipping(&clock, &replica, REFUSE).open(&dest)?;
    pair(&b, "b-0")?;
    assert!(replays(&b, "a-0")?);
    Ok(())
}

/// Bugs 6 and 7: a restored store's files are private whatever the umask; a failed restore
/// says to run it again (it never retries on its own); a killed restore's leftovers are
/// removed by the next one.
#[test]
fn a_restore_is_private_says_what_to_do_and_cleans_up_after_a_killed_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    lost_after_one_pair(dir.path(), &clock, &replica)?;

    replica.set_fault(ReplicaFault::Down);
    let dest = dir.path().join("b");
    let failed = Store::restore(&replica.handle(), &dest, Takeover::Yes);
    let Err(RestoreError::Replica(ReplicaError::Unreachable { .. })) = &failed else {
        panic!("expected an unreachable replica: {failed:?}");
    };
    let message = failed.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(!message.contains("ships again"), "{message}");
    assert!(message.contains("run it again"), "{message}");
    replica.set_fault(ReplicaFault::None);

    // What killed restores left: no process has these numbers (above the kernel's largest).
    let leftovers = [".b.backup-4194305-0", ".b.rebase-4194305", ".b.old-4194305"]
        .map(|name| dir.path().join(name));
    for leftover in &leftovers {
        std::fs::create_dir(leftover)?;
    }
    Store::restore(&replica.handle(), &dest, Takeover::Yes)?;
    for leftover in &leftovers {
        assert!(!leftover.exists(), "{} was left", leftover.display());
    }
    let mode = std::fs::metadata(dest.join("idemstore.redb"))?
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "the restored database is mode {mode:o}"
    );
    Ok(())
}

/// Box A, shipping synchronously under `dir`, acknowledges `a-0` and is lost.
fn lost_after_one_pair(dir: &Path, clock: &ManualClock, replica: &MemoryReplica) -> TestResult {
    let a = shipping(clock, replica, REFUSE).open(dir.join("a"))?;
    pair(&a, "a-0")?;
    lose(a, replica);
    Ok(())
}
