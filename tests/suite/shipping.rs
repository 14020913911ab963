//! Log shipping against a replica in memory whose faults the tests choose: every acknowledged
//! pair survives the loss of the box in both modes; a synchronous store refuses (or falls back)
//! while the replica is away and never shows a frame the replica lacks; an outage longer than
//! the queue is healed by a snapshot; snapshots trim the stream; one writer per stream.
//! `tests/suite/box_loss.rs` plays the same with real processes and a real NATS.

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::ship::{
    all_replay, caught_up, first_snapshot, keys, lose, pair, pair_with, restore, shipped_all,
    shipping, state, until,
};
use common::{TestResult, builder, clock, fp, order_count, scope};
use idemstore::testing::{MemoryReplica, ReplicaFault};
use idemstore::{
    Begin, Lineage, ManualClock, OpenError, Replica, ReplicaError, ReplicaSource, ShipState,
    ShippedFrame, Shipping, SnapshotInfo, Store, StoreError, StreamPosition, Takeover, Unreachable,
    WriterIdentity,
};

#[test]
fn async_shipping_restores_every_acknowledged_pair_after_the_box_is_lost() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let store = shipping(&clock, &replica, Shipping::Async).open(dir.path().join("old"))?;
    let keys = keys("a", 200);
    for key in &keys {
        pair(&store, key)?;
    }
    until("the replica to hold every frame", || caught_up(&store))?;
    let durable = store
        .stats()?
        .shipping
        .ok_or("no shipping stats")?
        .durable_frame;
    lose(store, &replica);

    let restored = Store::restore(&replica.handle(), dir.path().join("new"), Takeover::Yes)?;
    assert_eq!(restored.last_frame, durable);
    assert!(restored.took_over);
    let store = builder(&clock).open(dir.path().join("new"))?;
    all_replay(&store, &keys)
}

/// A replica whose first claim waits until the test opens the gate: a store that is still
/// claiming its stream (or sending the snapshot a new stream begins with) when it is closed.
struct GatedClaim {
    inner: MemoryReplica,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl Replica for GatedClaim {
    fn claim(&self, me: &WriterIdentity, epoch: u64) -> Result<StreamPosition, ReplicaError> {
        let (open, opened) = &*self.gate;
        let mut open = open.lock().map_err(|_| ReplicaError::Refused {
            detail: "gate poisoned".into(),
        })?;
        while !*open {
            open = opened.wait(open).map_err(|_| ReplicaError::Refused {
                detail: "gate poisoned".into(),
            })?;
        }
        drop(open);
        self.inner.claim(me, epoch)
    }
    fn publish(&self, frames: &[ShippedFrame], lineage: &Lineage) -> Result<(), ReplicaError> {
        self.inner.publish(frames, lineage)
    }
    fn snapshot(&self, seq: u64, file: &Path, lineage: &Lineage) -> Result<(), ReplicaError> {
        self.inner.snapshot(seq, file, lineage)
    }
    fn release(&self, me: &WriterIdentity) -> Result<(), ReplicaError> {
        self.inner.release(me)
    }
}

/// A clean close right after the writes (as a short-lived tool, or a test, does) ships them
/// even though the stream was not claimed yet when the close began: the close waits for the
/// claim and the first snapshot, within the acknowledgement limit.
#[test]
fn a_store_closed_before_its_stream_is_claimed_ships_its_writes_on_close() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let gated = GatedClaim {
        inner: replica.handle(),
        gate: gate.clone(),
    };
    let store = builder(&clock)
        .ship(gated, Shipping::Async)
        .ship_timeouts(Duration::from_secs(30), Duration::from_secs(30))
        .open(dir.path().join("old"))?;
    let keys = keys("c", 20);
    for key in &keys {
        pair(&store, key)?;
    }
    assert_eq!(state(&store), Some(ShipState::Claiming));
    // The gate opens once the close has begun; the close must wait for what follows.
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let (open, opened) = &*gate;
        if let Ok(mut open) = open.lock() {
            *open = true;
        }
        opened.notify_all();
    });
    drop(store);
    opener.join().map_err(|_| "the gate opener panicked")?;

    let store = restore(&replica, &dir.path().join("new"), &clock)?;
    all_replay(&store, &keys)
}

/// Keys as users send them (random UUIDs), over more than a whole TTL, with eviction running
/// in bounded passes and snapshots taken meanwhile: the restored store holds exactly what the
/// lost one held, record for record (the live ones, and none of the evicted ones).
#[test]
fn random_keys_over_a_ttl_with_eviction_restore_record_for_record() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let primary = shipping(&clock, &replica, Shipping::Async)
        .ship_snapshot_bytes(64 << 10)
        .open(dir.path().join("old"))?;
    let body = common::incompressible(1 << 10);
    let mut rng = idemstore::testing::Rng::new(31);
    let mut keys = Vec::new();
    let (mut evicted, mut passes) = (0, 0);
    for _ in 0..8 {
        for _ in 0..150 {
            let (a, b) = (rng.next_u64(), rng.next_u64());
            let key = format!(
                "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
                a >> 32,
                (a >> 16) & 0xffff,
                a & 0xfff,
                (b >> 48) | 0x8000,
                b & 0xffff_ffff_ffff
            );
            pair_with(&primary, &key, &body)?;
            keys.push(key);
        }
        clock.advance(common::TTL / 3);
        loop {
            let pass = primary.evict_expired(64)?;
            passes += 1;
            evicted += pass.removed;
            if pass.backlog == idemstore::Backlog::Empty {
                break;
            }
        }
    }
    until("the replica to hold every frame", || caught_up(&primary))?;
    let snapshots = primary.stats()?.shipping.ok_or("no stats")?.snapshots;
    let expected: Vec<_> = keys
        .iter()
        .map(|key| primary.get(&scope(key)))
        .collect::<Result<_, _>>()?;
    let live = expected.iter().filter(|r| r.is_some()).count();
    assert!(evicted > 0 && live > 0, "{evicted} evicted, {live} live");
    assert!(passes > 8, "bounded passes: {passes}");
    assert!(
        snapshots >= 2,
        "snapshots taken while evicting: {snapshots}"
    );
    lose(primary, &replica);

    let store = restore(&replica, &dir.path().join("new"), &clock)?;
    for (key, want) in keys.iter().zip(&expected) {
        assert_eq!(&store.get(&scope(key))?, want, "{key}");
    }
    Ok(())
}

/// A snapshot that cannot be made here (its directory cannot be written: a full disk, here a
/// file in its way) is not the replica's fault: a synchronous store that refuses while the
/// replica is away goes on taking writes, frames go on shipping, the failure is counted and
/// named, and the snapshot is made once the way is clear.
#[test]
fn a_snapshot_that_cannot_be_made_here_does_not_stop_a_synchronous_store() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let path = dir.path().join("old");
    let store = shipping(&clock, &replica, Shipping::Sync(Unreachable::Refuse))
        .ship_snapshot_bytes(64 << 10)
        .open(&path)?;
    pair(&store, "first")?;
    until("the first snapshot", || caught_up(&store))?;
    let stats = |store: &Store| store.stats().ok().and_then(|s| s.shipping);
    let before = stats(&store).ok_or("no stats")?.snapshots;
    // The snapshot's directory cannot be made while a file stands where it goes.
    let blocker = path.join("ship-snapshot");
    std::fs::write(&blocker, b"in the way")?;
    let body = common::incompressible(4 << 10);
    let mut keys = vec!["first".to_owned()];
    for i in 0.. {
        let key = format!("w-{i}");
        pair_with(&store, &key, &body)?;
        keys.push(key);
        if stats(&store).is_some_and(|s| s.snapshot_failures > 0) || i == 400 {
            break;
        }
    }
    let failing = stats(&store).ok_or("no stats")?;
    assert!(failing.snapshot_failures > 0, "{failing:?}");
    let error = failing.snapshot_error.clone().unwrap_or_default();
    assert!(error.contains("ship-snapshot"), "{error}");
    // Writes go on, each acknowledged by the replica.
    for i in 0..20 {
        let key = format!("after-{i}");
        pair_with(&store, &key, &body)?;
        keys.push(key);
        let now = stats(&store).ok_or("no stats")?;
        assert_eq!(now.state, ShipState::Shipping, "{now:?}");
        assert_eq!(now.lag_frames, 0, "{now:?}");
    }
    std::fs::remove_file(&blocker)?;
    until("the snapshot to be made", || {
        stats(&store).is_some_and(|s| s.snapshots > before && s.snapshot_error.is_none())
    })?;
    lose(store, &replica);
    let store = restore(&replica, &dir.path().join("new"), &clock)?;
    all_replay(&store, &keys)
}

#[test]
fn a_synchronous_store_refuses_writes_while_the_replica_is_down_and_resumes_after() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let store = shipping(&clock, &replica, Shipping::Sync(Unreachable::Refuse))
        .ship_timeouts(Duration::from_millis(500), Duration::from_secs(10))
        .open(dir.path().join("s"))?;
    pair(&store, "before")?;
    assert!(
        caught_up(&store),
        "a synchronous pair is shipped when it is answered"
    );
    let rows = order_count(&store)?;

    replica.set_fault(ReplicaFault::Down);
    // The first write after the outage may be the one that finds it (its frame was synced
    // locally and not acknowledged: outcome unknown); every later one is refused up front.
    let mut refused = 0;
    for i in 0..5 {
        match pair(&store, &format!("during-{i}")) {
            Ok(()) => return Err("a write was acknowledged while the replica was down".into()),
            Err(e) => {
                let e = e
                    .downcast::<idemstore::Error>()
                    .map(|e| e.to_string())
                    .unwrap_or_else(|e| e.to_string());
                assert!(e.contains("replica"), "the error names the replica: {e}");
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 5);

    replica.set_fault(ReplicaFault::None);
    until("writes to be taken again", || {
        pair(&store, "after-probe").is_ok()
    })?;
    pair(&store, "after")?;
    assert!(caught_up(&store));
    // Nothing refused left a row behind.
    assert_eq!(order_count(&store)?, rows + 2);
    Ok(())
}

#[test]
fn a_lost_acknowledgement_is_outcome_unknown_and_the_pair_appears_once_after_the_replica_returns()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let store = shipping(&clock, &replica, Shipping::Sync(Unreachable::Refuse))
        .open(dir.path().join("s"))?;
    pair(&store, "k0")?;
    replica.set_fault(ReplicaFault::LoseAcks);
    let lost = pair(&store, "k1").expect_err("the acknowledgement was lost");
    let unknown = lost
        .downcast_ref::<StoreError>()
        .is_some_and(|e| matches!(e, StoreError::OutcomeUnknown { .. }));
    assert!(unknown, "outcome unknown, got {lost:?}");
    // Not visible while the replica has not acknowledged it (the replica does hold the frame:
    // only its acknowledgement was lost).
    assert!(store.get(&scope("k1"))?.is_none());
    replica.set_fault(ReplicaFault::None);
    until("the store to heal", || {
        store.stats().is_ok_and(|s| s.poisoned.is_none()) && caught_up(&store)
    })?;
    // The frame that lost its acknowledgement was k1's claim: it is in progress now, on the
    // replica as here, and its lease runs out like any abandoned claim's.
    assert!(matches!(
        store.begin(&scope("k1"), fp("k1"))?,
        Begin::InProgress { .. }
    ));
    clock.advance(common::LEASE + Duration::from_secs(1));
    pair(&store, "k1")?;
    match store.begin(&scope("k1"), fp("k1"))? {
        Begin::Replay(r) => assert_eq!(r.status(), 201),
        other => return Err(format!("expected k1 to replay, got {other:?}").into()),
    }
    assert_eq!(order_count(&store)?, 2);
    lose(store, &replica);
    let store = restore(&replica, &dir.path().join("new"), &clock)?;
    all_replay(&store, &["k0".into(), "k1".into()])
}

#[test]
fn a_synchronous_store_that_falls_back_stays_available_and_catches_up() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let store = shipping(&clock, &replica, Shipping::Sync(Unreachable::FallBack))
        .ship_timeouts(Duration::from_millis(200), Duration::from_secs(10))
        .open(dir.path().join("s"))?;
    replica.set_fault(ReplicaFault::Down);
    let keys = keys("f", 20);
    for key in &keys {
        pair(&store, key)?;
    }
    assert_eq!(state(&store), Some(ShipState::Unreachable));
    replica.set_fault(ReplicaFault::None);
    until("the replica to catch up", || caught_up(&store))?;
    lose(store, &replica);
    let store = restore(&replica, &dir.path().join("new"), &clock)?;
    all_replay(&store, &keys)
}

#[test]
fn an_outage_longer_than_the_queue_is_healed_by_a_snapshot() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    // The smallest budget: a queue of 512 KiB, which 64 responses of 16 KiB outgrow.
    let store = shipping(&clock, &replica, Shipping::Async)
        .memory_budget(4 << 20)
        .open(dir.path().join("s"))?;
    pair(&store, "first")?;
    until("the first frame to ship", || caught_up(&store))?;
    replica.set_fault(ReplicaFault::Down);
    let body = common::incompressible(16 << 10);
    let mut keys = keys("o", 64);
    for key in &keys {
        pair_with(&store, key, &body)?;
    }
    let during = store.stats()?.shipping.ok_or("no shipping stats")?;
    assert!(during.overflows >= 1, "the queue overflowed: {during:?}");
    assert!(during.lag_frames > 0);
    replica.set_fault(ReplicaFault::None);
    until("a snapshot to catch the replica up", || caught_up(&store))?;
    let after = store.stats()?.shipping.ok_or("no shipping stats")?;
    assert!(after.snapshots >= 1, "{after:?}");
    keys.push("first".into());
    lose(store, &replica);
    let store = restore(&replica, &dir.path().join("new"), &clock)?;
    all_replay(&store, &keys)
}

#[test]
fn snapshots_trim_the_stream_and_a_restore_replays_only_the_tail() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let store = shipping(&clock, &replica, Shipping::Async)
        .ship_snapshot_bytes(64 << 10)
        .open(dir.path().join("s"))?;
    let body = common::incompressible(4 << 10);
    let keys = keys("t", 100);
    for key in &keys {
        pair_with(&store, key, &body)?;
    }
    until("a snapshot", || {
        store
            .stats()
            .ok()
            .and_then(|s| s.shipping)
            .is_some_and(|s| s.snapshots >= 1)
    })?;
    until("the replica to hold every frame", || caught_up(&store))?;
    // Lost first: a snapshot that falls due may still be on its way until then.
    lose(store, &replica);
    let snapshot = replica.snapshot_seq().ok_or("no snapshot")?;
    assert!(
        replica.frame_seqs().iter().all(|&seq| seq > snapshot),
        "frames at or before the snapshot are trimmed"
    );
    let restored = Store::restore(&replica.handle(), dir.path().join("new"), Takeover::Yes)?;
    assert_eq!(restored.snapshot, snapshot);
    let store = builder(&clock).open(dir.path().join("new"))?;
    all_replay(&store, &keys)
}

#[test]
fn a_second_store_shipping_to_the_stream_is_refused_naming_the_first() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let first = shipping(&clock, &replica, Shipping::Async).open(dir.path().join("first"))?;
    pair(&first, "k")?;
    until("the first store to ship", || caught_up(&first))?;
    let second = shipping(&clock, &replica, Shipping::Sync(Unreachable::Refuse))
        .open(dir.path().join("second"));
    match second {
        Err(OpenError::Replica { source }) => {
            let message = source.to_string();
            assert!(
                message.contains("first"),
                "names the first store: {message}"
            );
        }
        Err(e) => return Err(format!("expected a replica refusal, got {e}").into()),
        Ok(_) => return Err("a second writer was let in".into()),
    }
    // An asynchronous second store opens, but ships nothing and says why.
    let second =
        shipping(&clock, &replica, Shipping::Async).open(dir.path().join("second-async"))?;
    until("the second store to be fenced", || {
        state(&second) == Some(ShipState::Fenced)
    })?;
    let error = second
        .stats()?
        .shipping
        .and_then(|s| s.last_error)
        .unwrap_or_default();
    assert!(error.contains("first"), "{error}");
    Ok(())
}

#[test]
fn a_restore_that_takes_the_stream_over_fences_the_old_writer() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let old = shipping(&clock, &replica, Shipping::Async).open(dir.path().join("old"))?;
    pair(&old, "k0")?;
    until("the old store to ship", || caught_up(&old))?;
    // The old box is cut off, not dead: it comes back after the restore.
    Store::restore(&replica.handle(), dir.path().join("new"), Takeover::Yes)?;
    pair(&old, "k1")?;
    until("the old store to be fenced", || {
        state(&old) == Some(ShipState::Fenced)
    })?;
    assert!(!replica.frame_seqs().is_empty());
    // The new store ships on from where the restore ended.
    let new = shipping(&clock, &replica, Shipping::Sync(Unreachable::Refuse))
        .open(dir.path().join("new"))?;
    pair(&new, "k2")?;
    drop(new);
    let again = restore(&replica, &dir.path().join("again"), &clock)?;
    all_replay(&again, &["k0".into(), "k2".into()])?;
    assert!(matches!(
        again.begin(&scope("k1"), fp("k1"))?,
        Begin::Claimed(_) | Begin::Recovered(_)
    ));
    Ok(())
}

#[test]
fn a_store_reopened_after_an_outage_catches_the_replica_up_with_a_snapshot() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let path = dir.path().join("s");
    let store = shipping(&clock, &replica, Shipping::Async).open(&path)?;
    pair(&store, "k0")?;
    until("k0 to ship", || caught_up(&store))?;
    replica.set_fault(ReplicaFault::Down);
    let keys = keys("r", 10);
    for key in &keys {
        pair(&store, key)?;
    }
    drop(store); // the queue dies with the process
    replica.set_fault(ReplicaFault::None);
    let store = shipping(&clock, &replica, Shipping::Sync(Unreachable::Refuse)).open(&path)?;
    // A synchronous open waits until the replica holds everything.
    assert!(caught_up(&store));
    assert!(store.stats()?.shipping.ok_or("no stats")?.snapshots >= 1);
    drop(store);
    let store = restore(&replica, &dir.path().join("new"), &clock)?;
    let mut all = keys;
    all.push("k0".into());
    all_replay(&store, &all)
}

#[test]
fn shipping_needs_the_log() {
    let clock = clock();
    let dir = tempfile::tempdir().expect("tempdir");
    let opened = builder(&clock)
        .durability(idemstore::Durability::Redb)
        .ship(MemoryReplica::new(), Shipping::Async)
        .open(dir.path().join("s"));
    assert!(matches!(
        opened,
        Err(OpenError::InvalidConfig {
            setting: "ship",
            ..
        })
    ));
}

/// An open of a directory a standby follows into is refused, naming this process, and
/// changes nothing there.
fn refused_while_followed(dir: &Path, clock: &ManualClock) -> TestResult {
    match builder(clock).open(dir) {
        Err(OpenError::AlreadyOpen { holder, .. }) => {
            assert!(
                matches!(holder, idemstore::Holder::Process { pid, .. } if pid == std::process::id()),
                "{holder:?}"
            );
            Ok(())
        }
        Err(other) => Err(format!("expected AlreadyOpen, got {other}").into()),
        Ok(_) => Err("a store opened the directory a standby follows into".into()),
    }
}

#[test]
fn a_standby_follows_the_stream_and_takes_over_with_a_short_tail() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let primary = first_snapshot(
        shipping(&clock, &replica, Shipping::Async).ship_snapshot_bytes(64 << 10),
        &dir,
        &replica,
    )?;
    let standby = idemstore::Standby::follow(
        replica.handle(),
        dir.path().join("standby"),
        Duration::from_millis(5),
    )?;
    refused_while_followed(&dir.path().join("standby"), &clock)?;
    // Opens race the standby's rebases for the directory: every one is refused, even while a
    // rebuilt directory is swapped in.
    let racing = Arc::new(AtomicBool::new(true));
    let racer = {
        let (racing, path, clock) = (racing.clone(), dir.path().join("standby"), clock.clone());
        std::thread::spawn(move || {
            let mut tries = 0u64;
            while racing.load(Ordering::SeqCst) {
                refused_while_followed(&path, &clock).map_err(|e| e.to_string())?;
                tries += 1;
            }
            Ok::<u64, String>(tries)
        })
    };
    let body = common::incompressible(4 << 10);
    let mut keys = keys("s", 100);
    for key in &keys {
        pair_with(&primary, key, &body)?;
    }
    let durable = shipped_all(&primary)?;
    until("the standby to follow", || {
        standby.status().last_frame == durable
    })?;
    let status = standby.status();
    assert!(
        status.rebases >= 1,
        "newer snapshots rebased it: {status:?}"
    );
    assert!(
        status.tail_frames < durable - 1,
        "the tail is shorter than the whole log: {status:?}"
    );
    racing.store(false, Ordering::SeqCst);
    let tries = racer.join().map_err(|_| "the racer panicked")??;
    assert!(tries > 0);
    lose(primary, &replica);
    let took = standby.take_over()?;
    assert!(took.took_over);
    assert_eq!(took.last_frame, durable);
    let store = builder(&clock).open(dir.path().join("standby"))?;
    keys.push("first".into());
    all_replay(&store, &keys)
}

/// A source with the faults a standby meets: once `cut` is armed, its next read of frames
/// breaks off after `CUT` frames (a link that fails part way through a step; `cuts` counts
/// them); while `moving` is set, take-overs are refused as `Moved` (the old store still ships:
/// a box cut off from its clients, not from NATS).
#[derive(Clone)]
struct FaultySource {
    inner: MemoryReplica,
    cut: Arc<AtomicBool>,
    cuts: Arc<AtomicU64>,
    moving: Arc<AtomicBool>,
}

const CUT: u64 = 3;

impl FaultySource {
    fn new(replica: &MemoryReplica) -> FaultySource {
        FaultySource {
            inner: replica.handle(),
            cut: Arc::new(AtomicBool::new(false)),
            cuts: Arc::new(AtomicU64::new(0)),
            moving: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl ReplicaSource for FaultySource {
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
        if !self.cut.load(Ordering::SeqCst) {
            return self.inner.frames_after(after, each);
        }
        // Cut once a frame past the first CUT arrives; a shorter read leaves it armed.
        let mut passed = 0;
        self.inner.frames_after(after, &mut |frame, guarantee| {
            if passed == CUT {
                self.cut.store(false, Ordering::SeqCst);
                self.cuts.fetch_add(1, Ordering::SeqCst);
                return Err(ReplicaError::Unreachable {
                    detail: "the link broke part way (test)".into(),
                });
            }
            passed += 1;
            each(frame, guarantee)
        })
    }
    fn take_over(&self, me: &WriterIdentity, last: u64, known: u64) -> Result<u64, ReplicaError> {
        if self.moving.load(Ordering::SeqCst) {
            return Err(ReplicaError::Moved {
                read: last,
                now: last + 1,
            });
        }
        self.inner.take_over(me, last, known)
    }
}

/// A standby step whose read breaks off part way has written some frames to its log: the next
/// step goes on from the last frame the standby counted, not from the end of the file, and
/// the standby's log stays one whole chain that a take-over replays.
#[test]
fn a_standby_step_cut_off_part_way_leaves_a_log_the_next_step_continues() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let primary = first_snapshot(shipping(&clock, &replica, Shipping::Async), &dir, &replica)?;
    let source = FaultySource::new(&replica);
    let (armed, cuts) = (source.cut.clone(), source.cuts.clone());
    let standby =
        idemstore::Standby::follow(source, dir.path().join("standby"), Duration::from_millis(5))?;
    let mut keys = keys("k", 20);
    let (before, after) = keys.split_at(10);
    for key in before {
        pair(&primary, key)?;
    }
    let durable = shipped_all(&primary)?;
    until("the standby to follow", || {
        standby.status().last_frame == durable
    })?;
    // A read breaks off after CUT frames of the ten that follow.
    let counted = standby.status().last_frame;
    armed.store(true, Ordering::SeqCst);
    for key in after {
        pair(&primary, key)?;
    }
    shipped_all(&primary)?;
    until("a read to break off", || cuts.load(Ordering::SeqCst) == 1)?;
    let durable = primary.stats()?.shipping.ok_or("no stats")?.durable_frame;
    assert!(durable >= counted + 2 * CUT, "enough frames to cut into");
    until("the standby to follow past the cut", || {
        standby.status().last_frame == durable
    })?;
    lose(primary, &replica);
    let took = standby.take_over()?;
    assert_eq!(took.last_frame, durable);
    let store = builder(&clock).open(dir.path().join("standby"))?;
    keys.push("first".into());
    all_replay(&store, &keys)
}

/// A take-over refused because the old store still ships gives the standby back, following
/// again with its directory whole and locked; once the old store stops, it takes over.
#[test]
fn a_refused_take_over_gives_the_standby_back_still_following() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let replica = MemoryReplica::new();
    let primary = first_snapshot(shipping(&clock, &replica, Shipping::Async), &dir, &replica)?;
    let source = FaultySource::new(&replica);
    let moving = source.moving.clone();
    moving.store(true, Ordering::SeqCst);
    let path = dir.path().join("standby");
    let standby = idemstore::Standby::follow(source, &path, Duration::from_millis(5))?;
    let mut keys = keys("m", 10);
    for key in &keys {
        pair(&primary, key)?;
    }
    shipped_all(&primary)?;
    let refused = standby
        .take_over()
        .err()
        .ok_or("the take-over went through")?;
    assert!(
        matches!(
            refused.error,
            idemstore::RestoreError::Replica(ReplicaError::Moved { .. })
        ),
        "{refused}"
    );
    let standby = refused.standby;
    refused_while_followed(&path, &clock)?;
    // It follows again: the old store's later writes reach it.
    for key in ["late-1", "late-2"] {
        pair(&primary, key)?;
        keys.push(key.to_owned());
    }
    let durable = shipped_all(&primary)?;
    until("the standby to follow again", || {
        standby.status().last_frame == durable
    })?;
    lose(primary, &replica);
    moving.store(false, Ordering::SeqCst);
    let took = standby.take_over()?;
    assert!(took.took_over);
    assert_eq!(took.last_frame, durable);
    let store = builder(&clock).open(&path)?;
    keys.push("first".into());
    all_replay(&store, &keys)
}

#[test]
fn a_silent_replica_bounds_a_synchronous_write_by_the_acknowledgement_limit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    // The replica holds every call as long as the fault lasts, up to a minute.
    let replica = MemoryReplica::new().call_limit(Duration::from_secs(60));
    let store = shipping(&clock, &replica, Shipping::Sync(Unreachable::Refuse))
        .ship_timeouts(Duration::from_millis(300), Duration::from_secs(10))
        .open(dir.path().join("s"))?;
    pair(&store, "k0")?;
    replica.set_fault(ReplicaFault::Silent);
    let started = Instant::now();
    let answered = pair(&store, "k1");
    let took = started.elapsed();
    assert!(
        answered.is_err(),
        "not acknowledged while the replica is silent"
    );
    assert!(
        took < Duration::from_secs(5),
        "the write waited {took:?}, past its limit of 300 ms"
    );
    // Later writes are refused at once, without waiting again.
    let started = Instant::now();
    assert!(pair(&store, "k2").is_err());
    assert!(started.elapsed() < Duration::from_secs(1));
    replica.set_fault(ReplicaFault::None);
    until("writes to be taken again", || pair(&store, "k3").is_ok())?;
    assert!(caught_up(&store));
    Ok(())
}

/// Two faults at once: a log sync fails while the replica is down. The store must heal from
/// its own fault without making the frame visible before the replica holds it, catch the
/// replica up once it returns, and lose nothing acknowledged: neither in a crash image of the
/// disk nor in a restore from the replica.
#[test]
fn a_failed_log_sync_while_the_replica_is_down_loses_nothing_acknowledged_anywhere() -> TestResult {
    use idemstore::testing::{FaultPlan, SimDisk, Tear};
    let dir = tempfile::tempdir()?;
    let disk = SimDisk::new();
    let clock = clock();
    let replica = MemoryReplica::new();
    let open = |disk: &SimDisk| {
        shipping(&clock, &replica, Shipping::Sync(Unreachable::Refuse))
            .ship_timeouts(Duration::from_millis(300), Duration::from_secs(10))
            .checkpoint_interval(Duration::from_secs(3600))
            .open_simulated(disk)
    };
    let store = open(&disk)?;
    let mut acknowledged = keys("a", 5);
    for key in &acknowledged {
        pair(&store, key)?;
    }
    disk.plan(FaultPlan {
        fail_sync: Some(disk.counters().syncs() + 1),
        ..FaultPlan::default()
    });
    replica.set_fault(ReplicaFault::Down);
    assert!(pair(&store, "unknown").is_err(), "its sync failed");
    // While the replica is away, nothing is acknowledged, however often the store is asked.
    for i in 0..5 {
        let _ = store.reopen();
        assert!(pair(&store, &format!("during-{i}")).is_err());
    }
    replica.set_fault(ReplicaFault::None);
    until("the store to take writes again", || {
        let _ = store.reopen();
        pair(&store, "after-0").is_ok()
    })?;
    acknowledged.push("after-0".into());
    for key in keys("after", 3).into_iter().skip(1) {
        pair(&store, &key)?;
        acknowledged.push(key);
    }
    assert!(caught_up(&store));

    // The power goes: what the disk synced survives, and the process writes nothing more
    // (a clean close would seal a partition and ship it past the image).
    let image = disk.crash_image(Tear::Drop);
    lose(store, &replica);
    let reopened = open(&image)?;
    for key in &acknowledged {
        assert!(
            matches!(reopened.begin(&scope(key), fp(key))?, Begin::Replay(_)),
            "{key} is lost on the disk"
        );
    }
    drop(reopened);
    // The box goes: what the replica holds survives.
    let restored = restore(&replica, &dir.path().join("new"), &clock)?;
    for key in &acknowledged {
        assert!(
            matches!(restored.begin(&scope(key), fp(key))?, Begin::Replay(_)),
            "{key} is lost on the replica"
        );
    }
    Ok(())
}

/// While a synchronous store waits for its replica to acknowledge a frame, it refuses writes
/// but still serves reads: `Store::read` sees every acknowledged pair's row, even those that
/// shared an epoch with the frame that was not acknowledged.
#[test]
fn reads_see_every_acknowledged_write_while_a_synchronous_store_waits_for_its_replica() -> TestResult
{
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    for round in 0..3 {
        let dir = tempfile::tempdir()?;
        let clock = clock();
        let replica = MemoryReplica::new();
        let store = shipping(&clock, &replica, Shipping::Sync(Unreachable::Refuse))
            .ship_timeouts(Duration::from_millis(200), Duration::from_secs(10))
            .open(dir.path().join("s"))?;
        let stop = Arc::new(AtomicBool::new(false));
        // Writers keep the epoch busy, so acknowledged groups share it with the frame that
        // the replica will not acknowledge.
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (store, stop) = (store.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut acked = Vec::new();
                    for i in 0.. {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let key = format!("r{round}-w{w}-{i}");
                        if pair(&store, &key).is_ok() {
                            acked.push(key);
                        }
                    }
                    acked
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(30));
        replica.set_fault(ReplicaFault::Down);
        until("the store to refuse writes", || {
            store.stats().is_ok_and(|s| s.poisoned.is_some())
        })?;
        stop.store(true, Ordering::SeqCst);
        let mut acked = Vec::new();
        for writer in writers {
            acked.extend(writer.join().map_err(|_| "a writer panicked")?);
        }
        assert!(!acked.is_empty());
        let rows = common::orders(&store)?;
        for key in &acked {
            assert!(
                rows.iter().any(|(k, _)| k == key),
                "round {round}: {key}'s row is not read"
            );
            assert!(
                store.get(&scope(key))?.is_some(),
                "round {round}: {key} is not found"
            );
        }
        replica.set_fault(ReplicaFault::None);
        until("the store to heal", || {
            store.stats().is_ok_and(|s| s.poisoned.is_none()) && caught_up(&store)
        })?;
        lose(store, &replica);
        let restored = restore(&replica, &dir.path().join("new"), &clock)?;
        for key in &acked {
            assert!(
                matches!(restored.begin(&scope(key), fp(key))?, Begin::Replay(_)),
                "{key}"
            );
        }
    }
    Ok(())
}
