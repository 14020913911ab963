//! The replica's contract, one suite on both replicas: the in-memory one
//! (`idemstore::testing::MemoryReplica`) and real JetStream (`idemstore::replica::JetStream`,
//! feature `nats`). Each case is written once, against the `Replica` and `ReplicaSource`
//! traits, and runs on each (`memory::*`, `jetstream::*`).
//!
//! Why: the shipper, the restore and the handover tests run on the in-memory replica. It is
//! worth what it agrees with JetStream on, so what the shipper relies on is stated here, once,
//! and the same assertions hold on the real server: frames in order and once (JetStream's
//! expected last sequence and duplicate window), one writer per stream and the take-over that
//! fences the old one (the writer entry's compare-and-set on its KV revision), snapshots that
//! purge the frames they cover, a broker restarted without its data, a second writer.
//!
//! "Restarted without its data" on JetStream is the stream and both buckets deleted under the
//! store: what a client sees of a server whose volume was wiped. A real `nats-server` killed and
//! started empty is `tests/suite/box_handover.rs`. What the in-memory replica cannot show (chunks
//! of a frame larger than a message, lost acknowledgements through a proxy, a gap appended by
//! hand, calls bounded when the server is silent) stays in `tests/suite/replica_jetstream.rs`.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use idemstore::testing::MemoryReplica;
use idemstore::{
    Guarantee, Lineage, Replica, ReplicaError, ReplicaSource, ShippedFrame, SnapshotInfo,
};

use common::TestResult;
use common::frames::{frame, frames, store};

/// A broker holding one stream, with handles to it.
trait Broker {
    type Handle: Replica + ReplicaSource;
    /// A new handle (a new connection) to the stream: one per store, one per restore.
    fn handle(&self) -> Result<Self::Handle, ReplicaError>;
    /// The broker comes back without its data: the stream, its entry and its snapshots go.
    fn forget(&self);
}

struct Memory(MemoryReplica);

impl Broker for Memory {
    type Handle = MemoryReplica;
    fn handle(&self) -> Result<MemoryReplica, ReplicaError> {
        Ok(self.0.handle())
    }
    fn forget(&self) {
        self.0.forget();
    }
}

/// A stream of the test's own on the machine's NATS, deleted at the end.
#[cfg(feature = "nats")]
struct Nats {
    name: String,
}

#[cfg(feature = "nats")]
impl Nats {
    fn new() -> Nats {
        // Fails, saying how to start NATS, if it is unreachable: never a skip.
        common::nats::require();
        Nats {
            name: common::nats::unique("rc"),
        }
    }
}

#[cfg(feature = "nats")]
impl Broker for Nats {
    type Handle = idemstore::replica::JetStream;
    fn handle(&self) -> Result<Self::Handle, ReplicaError> {
        idemstore::replica::JetStream::connect(&common::nats::url(), &self.name)
    }
    fn forget(&self) {
        common::nats::drop_replica(&self.name);
    }
}

#[cfg(feature = "nats")]
impl Drop for Nats {
    fn drop(&mut self) {
        common::nats::drop_replica(&self.name);
    }
}

/// Each case as a test on each replica.
macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(#[test]
            fn $case() -> super::TestResult {
                super::$case(&super::Memory(idemstore::testing::MemoryReplica::new()))
            })*
        }
        #[cfg(feature = "nats")]
        mod jetstream {
            $(#[test]
            fn $case() -> super::TestResult {
                super::$case(&super::Nats::new())
            })*
        }
    };
}

contract!(
    frames_published_in_batches_read_back_in_order,
    frames_sent_again_are_stored_once,
    a_second_store_is_refused_with_the_first_named,
    a_release_by_a_store_that_is_not_the_writer_changes_nothing,
    the_same_store_claims_its_stream_back_after_a_crash,
    a_take_over_fences_the_old_writer_off_through_a_clean_close,
    a_take_over_after_the_stream_moved_on_is_refused_as_moved,
    of_two_take_overs_from_one_read_only_one_wins,
    a_snapshot_round_trips_private_and_purges_the_frames_it_covers,
    a_stream_without_a_snapshot_fetches_none,
    a_read_of_a_stream_that_does_not_exist_is_refused,
    a_broker_that_forgets_is_lost_to_its_writer_which_claims_and_catches_up,
    a_take_over_of_a_forgotten_stream_starts_past_the_epoch_the_restore_knows,
);

fn complete() -> Lineage {
    Lineage::of(Guarantee::Complete)
}

/// A lineage at `epoch`.
fn at(epoch: u64) -> Lineage {
    let mut lineage = complete();
    lineage.epoch = epoch;
    lineage
}

/// Every frame after `after`, as `frames_after` gives them, and the last frame it returns.
fn read_after(
    source: &impl ReplicaSource,
    after: u64,
) -> Result<(Vec<(ShippedFrame, Lineage)>, u64), ReplicaError> {
    let mut read = Vec::new();
    let last = source.frames_after(after, &mut |frame, lineage| {
        read.push((frame, lineage));
        Ok(())
    })?;
    Ok((read, last))
}

fn seqs(read: &[(ShippedFrame, Lineage)]) -> Vec<u64> {
    read.iter().map(|(f, _)| f.seq).collect()
}

fn frames_after(source: &impl ReplicaSource, after: u64) -> Result<Vec<u64>, ReplicaError> {
    Ok(seqs(&read_after(source, after)?.0))
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

fn frames_published_in_batches_read_back_in_order(broker: &impl Broker) -> TestResult {
    let replica = broker.handle()?;
    let position = replica.claim(&store("/stores/a", 1), 0)?;
    assert_eq!((position.last_frame, position.snapshot), (0, None));

    replica.publish(&frames(1..=3), &complete())?;
    replica.publish(&frames(4..=5), &Lineage::of(Guarantee::MayLag))?;
    replica.publish(&[], &Lineage::of(Guarantee::MayLag))?;

    let (read, last) = read_after(&replica, 0)?;
    assert_eq!(last, 5);
    assert_eq!(
        read.iter().map(|(f, _)| f.clone()).collect::<Vec<_>>(),
        frames(1..=5)
    );
    let guarantees: Vec<Guarantee> = read.iter().map(|(_, g)| g.guarantee).collect();
    assert_eq!(
        guarantees,
        [[Guarantee::Complete; 3].as_slice(), &[Guarantee::MayLag; 2]].concat()
    );

    // From the middle, and past the end.
    let (read, last) = read_after(&replica, 3)?;
    assert_eq!((seqs(&read), last), (vec![4, 5], 5));
    let (read, last) = read_after(&replica, 9)?;
    assert_eq!((seqs(&read), last), (vec![], 9));

    // A restore's handle, which never claimed, reads the same.
    assert_eq!(frames_after(&broker.handle()?, 0)?, vec![1, 2, 3, 4, 5]);
    Ok(())
}

fn frames_sent_again_are_stored_once(broker: &impl Broker) -> TestResult {
    let replica = broker.handle()?;
    replica.claim(&store("/stores/a", 1), 0)?;
    replica.publish(&frames(1..=3), &complete())?;
    // Overlapping batches: what the stream holds is acknowledged again, not stored again.
    replica.publish(&frames(2..=5), &complete())?;
    replica.publish(&frames(1..=5), &complete())?;
    assert_eq!(frames_after(&broker.handle()?, 0)?, vec![1, 2, 3, 4, 5]);

    // The same store after a restart sends its unacknowledged tail again.
    drop(replica);
    let restarted = broker.handle()?;
    assert_eq!(restarted.claim(&store("/stores/a", 2), 0)?.last_frame, 5);
    restarted.publish(&frames(3..=7), &complete())?;
    let (read, last) = read_after(&restarted, 0)?;
    assert_eq!((seqs(&read), last), ((1..=7).collect(), 7));
    Ok(())
}

fn a_second_store_is_refused_with_the_first_named(broker: &impl Broker) -> TestResult {
    let first = broker.handle()?;
    let a = store("/stores/a", 1);
    first.claim(&a, 0)?;

    let second = broker.handle()?;
    let refused = second.claim(&store("/stores/b", 2), 0);
    let Err(ReplicaError::OtherWriter { holder }) = &refused else {
        panic!("a second store claimed the stream: {refused:?}");
    };
    assert_eq!(holder, &a);
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("/stores/a") && message.contains("test-host"),
        "{message}"
    );

    // A clean close lets the writer go, not the stream: another store is still refused (it
    // would write over the first one's history), naming the last writer; only a take-over
    // gives it the stream. The first store claims it back, and its frames follow.
    first.publish(&frames(1..=2), &complete())?;
    first.release(&a)?;
    let refused = second.claim(&store("/stores/b", 2), 0);
    let Err(ReplicaError::Fenced {
        by: Some(by),
        epoch: 0,
    }) = &refused
    else {
        panic!("a released stream was claimed by another store: {refused:?}");
    };
    assert_eq!(by, &a);
    let back = broker.handle()?;
    assert_eq!(back.claim(&store("/stores/a", 3), 0)?.last_frame, 2);
    back.publish(&frames(3..=3), &complete())?;
    assert_eq!(frames_after(&back, 0)?, vec![1, 2, 3]);
    Ok(())
}

fn a_release_by_a_store_that_is_not_the_writer_changes_nothing(broker: &impl Broker) -> TestResult {
    let writer = broker.handle()?;
    let a = store("/stores/a", 1);
    writer.claim(&a, 0)?;
    writer.publish(&frames(1..=1), &complete())?;

    // Another store's handle, which never claimed, releases: the writer stays the writer.
    broker.handle()?.release(&store("/stores/b", 2))?;
    writer.publish(&frames(2..=2), &complete())?;
    let refused = broker.handle()?.claim(&store("/stores/b", 2), 0);
    assert!(
        matches!(&refused, Err(ReplicaError::OtherWriter { holder }) if holder == &a),
        "{refused:?}"
    );
    assert_eq!(frames_after(&writer, 0)?, vec![1, 2]);
    Ok(())
}

fn the_same_store_claims_its_stream_back_after_a_crash(broker: &impl Broker) -> TestResult {
    let crashed = broker.handle()?;
    crashed.claim(&store("/stores/a", 1), 0)?;
    crashed.publish(&frames(1..=3), &complete())?;
    drop(crashed); // no release: the process died

    let restarted = broker.handle()?;
    let position = restarted.claim(&store("/stores/a", 2), 0)?;
    assert_eq!((position.last_frame, position.snapshot), (3, None));
    restarted.publish(&frames(4..=4), &complete())?;
    assert_eq!(frames_after(&restarted, 0)?, vec![1, 2, 3, 4]);
    Ok(())
}

fn a_take_over_fences_the_old_writer_off_through_a_clean_close(broker: &impl Broker) -> TestResult {
    let old = broker.handle()?;
    let a = store("/stores/a", 1);
    old.claim(&a, 0)?;
    old.publish(&frames(1..=3), &complete())?;

    // A restore on another box reads the stream and takes it over: the next epoch.
    let restore = broker.handle()?;
    let b = store("/restored/b", 7);
    let (_, last) = read_after(&restore, 0)?;
    assert_eq!(last, 3);
    assert_eq!(restore.take_over(&b, last, 0)?, 1);

    // The old writer's next frame is refused, naming the new one and its epoch.
    let fenced = old.publish(&frames(4..=5), &complete());
    let Err(ReplicaError::Fenced {
        by: Some(holder),
        epoch: 1,
    }) = &fenced
    else {
        panic!("the old writer was not fenced off: {fenced:?}");
    };
    assert_eq!(holder, &b);
    // So are its claim at its old epoch and its catch-up snapshot.
    let claimed = broker.handle()?.claim(&a, 0);
    assert!(
        matches!(claimed, Err(ReplicaError::Fenced { epoch: 1, .. })),
        "{claimed:?}"
    );
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("old.redb");
    write_file(&file, b"the old box's database")?;
    let snapshot = old.snapshot(3, &file, &complete());
    assert!(
        matches!(snapshot, Err(ReplicaError::Fenced { epoch: 1, .. })),
        "{snapshot:?}"
    );

    // The new writer claims at the new epoch and goes on after the frames it read.
    assert_eq!(restore.claim(&b, 1)?.last_frame, 3);
    let new_four = ShippedFrame {
        seq: 4,
        payload: Arc::new(b"frame 4 of the restored store".to_vec()),
    };
    restore.publish(std::slice::from_ref(&new_four), &at(1))?;
    let again = old.publish(&frames(4..=5), &complete());
    assert!(
        matches!(again, Err(ReplicaError::Fenced { epoch: 1, .. })),
        "{again:?}"
    );
    // A clean close of the new writer lets it go, never the epoch: the old one stays out, on
    // a new connection as on its old one.
    restore.release(&b)?;
    for claimed in [broker.handle()?.claim(&a, 0), old.claim(&a, 0)] {
        assert!(
            matches!(claimed, Err(ReplicaError::Fenced { epoch: 1, .. })),
            "{claimed:?}"
        );
    }

    let (read, last) = read_after(&broker.handle()?, 0)?;
    assert_eq!((seqs(&read), last), (vec![1, 2, 3, 4], 4));
    assert_eq!(read.last().map(|(f, _)| f), Some(&new_four));
    let epochs: Vec<u64> = read.iter().map(|(_, l)| l.epoch).collect();
    assert_eq!(
        epochs,
        vec![0, 0, 0, 1],
        "frames carry their writer's epoch"
    );
    Ok(())
}

fn a_take_over_after_the_stream_moved_on_is_refused_as_moved(broker: &impl Broker) -> TestResult {
    let old = broker.handle()?;
    old.claim(&store("/stores/a", 1), 0)?;
    old.publish(&frames(1..=3), &complete())?;

    let restore = broker.handle()?;
    let moved = restore.take_over(&store("/restored/b", 7), 2, 0);
    assert!(
        matches!(moved, Err(ReplicaError::Moved { read: 2, now: 3 })),
        "{moved:?}"
    );
    // Nothing changed: the old writer goes on.
    old.publish(&frames(4..=4), &complete())?;
    assert_eq!(frames_after(&old, 0)?, vec![1, 2, 3, 4]);
    Ok(())
}

fn of_two_take_overs_from_one_read_only_one_wins(broker: &impl Broker) -> TestResult {
    let old = broker.handle()?;
    old.claim(&store("/stores/a", 1), 0)?;
    old.publish(&frames(1..=2), &complete())?;

    // Two restores read the same stream; the first to take it over wins the epoch.
    let (b, c) = (store("/restored/b", 7), store("/restored/c", 8));
    let (first, second) = (broker.handle()?, broker.handle()?);
    assert_eq!(read_after(&first, 0)?.1, 2);
    assert_eq!(read_after(&second, 0)?.1, 2);
    assert_eq!(first.take_over(&b, 2, 0)?, 1);
    first.claim(&b, 1)?;
    first.publish(&frames(3..=3), &at(1))?;

    // The second read a stream that has moved on since: refused, and the winner goes on.
    let lost = second.take_over(&c, 2, 0);
    assert!(
        matches!(lost, Err(ReplicaError::Moved { read: 2, now: 3 })),
        "{lost:?}"
    );
    first.publish(&frames(4..=4), &at(1))?;
    assert_eq!(frames_after(&first, 0)?, vec![1, 2, 3, 4]);
    Ok(())
}

fn a_snapshot_round_trips_private_and_purges_the_frames_it_covers(
    broker: &impl Broker,
) -> TestResult {
    let dir = tempfile::tempdir()?;
    let replica = broker.handle()?;
    replica.claim(&store("/stores/a", 1), 0)?;
    replica.publish(&frames(1..=5), &Lineage::of(Guarantee::MayLag))?;

    // Larger than one NATS message: JetStream keeps the object in chunks.
    let database = common::incompressible((2 << 20) + 5);
    let file = dir.path().join("snapshot-3.redb");
    write_file(&file, &database)?;
    replica.snapshot(3, &file, &Lineage::of(Guarantee::MayLag))?;

    let fetched = dir.path().join("fetched.redb");
    let info = broker.handle()?.fetch_snapshot(&fetched)?;
    assert_eq!(
        info,
        Some(SnapshotInfo {
            seq: 3,
            lineage: Lineage::of(Guarantee::MayLag),
            bytes: database.len() as u64,
        })
    );
    assert!(
        std::fs::read(&fetched)? == database,
        "the snapshot's bytes differ"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&fetched)?.permissions().mode() & 0o777;
        assert_eq!(
            mode, 0o600,
            "a fetched snapshot is the store's data: private"
        );
    }
    assert_eq!(broker.handle()?.latest_snapshot()?, info);

    // Frames 1..=3 are purged, 4 and 5 kept; a read from before the snapshot finds the gap.
    let (read, last) = read_after(&replica, 3)?;
    assert_eq!((seqs(&read), last), (vec![4, 5], 5));
    let without = read_after(&replica, 0);
    assert!(
        matches!(without, Err(ReplicaError::Corrupt { .. })),
        "{without:?}"
    );

    // A newer snapshot replaces it, and a claim reports it.
    replica.publish(&frames(6..=6), &complete())?;
    let file = dir.path().join("snapshot-6.redb");
    write_file(&file, b"the database at frame 6")?;
    replica.snapshot(6, &file, &complete())?;
    let fetched = dir.path().join("fetched-6.redb");
    let info = broker.handle()?.fetch_snapshot(&fetched)?;
    assert_eq!(
        info.map(|i| (i.seq, i.lineage.guarantee)),
        Some((6, Guarantee::Complete))
    );
    assert_eq!(std::fs::read(&fetched)?, b"the database at frame 6");
    assert_eq!(frames_after(&replica, 6)?, Vec::<u64>::new());
    let position = broker.handle()?.claim(&store("/stores/a", 2), 0)?;
    assert_eq!((position.last_frame, position.snapshot), (6, Some(6)));
    Ok(())
}

fn a_stream_without_a_snapshot_fetches_none(broker: &impl Broker) -> TestResult {
    let replica = broker.handle()?;
    replica.claim(&store("/stores/a", 1), 0)?;
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("none.redb");
    assert_eq!(replica.fetch_snapshot(&file)?, None);
    assert_eq!(replica.latest_snapshot()?, None);
    assert!(!file.exists());
    Ok(())
}

fn a_read_of_a_stream_that_does_not_exist_is_refused(broker: &impl Broker) -> TestResult {
    // A restore from a stream no store ever shipped to (a wrong name, a broker that lost it)
    // must fail, not restore an empty store that then answers every lost key `Claimed`.
    let replica = broker.handle()?;
    let missing = read_after(&replica, 0);
    let Err(ReplicaError::Refused { detail }) = &missing else {
        panic!("a stream that does not exist was read: {missing:?}");
    };
    assert!(detail.contains("does not exist"), "{detail}");
    Ok(())
}

fn a_broker_that_forgets_is_lost_to_its_writer_which_claims_and_catches_up(
    broker: &impl Broker,
) -> TestResult {
    let writer = broker.handle()?;
    let a = store("/stores/a", 1);
    writer.claim(&a, 0)?;
    writer.publish(&frames(1..=3), &complete())?;

    broker.forget();
    // Its own kind of error, on the handle that had claimed: the frames it acknowledged are gone.
    let lost = writer.publish(&frames(4..=4), &complete());
    assert!(matches!(lost, Err(ReplicaError::Lost { .. })), "{lost:?}");

    // The writer claims again: an empty stream, no snapshot. It catches up with a snapshot of
    // everything it has, and ships on from there.
    let position = writer.claim(&a, 0)?;
    assert_eq!((position.last_frame, position.snapshot), (0, None));
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("catch-up.redb");
    write_file(&file, b"the database at frame 4")?;
    writer.snapshot(4, &file, &complete())?;
    writer.publish(&frames(5..=5), &complete())?;

    let restore = broker.handle()?;
    let info = restore.fetch_snapshot(&dir.path().join("restored.redb"))?;
    assert_eq!(info.map(|i| i.seq), Some(4));
    assert_eq!(read_after(&restore, 4)?, (vec![(frame(5), complete())], 5));
    Ok(())
}

fn a_take_over_of_a_forgotten_stream_starts_past_the_epoch_the_restore_knows(
    broker: &impl Broker,
) -> TestResult {
    let old = broker.handle()?;
    old.claim(&store("/stores/a", 1), 0)?;
    old.publish(&frames(1..=1), &complete())?;
    let b = store("/restored/b", 7);
    let second = broker.handle()?;
    assert_eq!(second.take_over(&b, 1, 0)?, 1);

    // The broker forgets the entry that said epoch 1. A restore that knows epoch 1 (from the
    // snapshot's metadata) takes the empty stream over at 2, never at 1 again ...
    broker.forget();
    let c = store("/restored/c", 8);
    let third = broker.handle()?;
    assert_eq!(third.take_over(&c, 0, 1)?, 2);
    // ... so the store restored at epoch 1 is fenced off by it, and the one at 0 as well.
    for (who, epoch) in [(&b, 1), (&store("/stores/a", 1), 0)] {
        let claimed = broker.handle()?.claim(who, epoch);
        assert!(
            matches!(claimed, Err(ReplicaError::Fenced { epoch: 2, .. })),
            "{claimed:?}"
        );
    }
    third.claim(&c, 2)?;
    third.publish(&frames(1..=1), &at(2))?;
    assert_eq!(frames_after(&third, 0)?, vec![1]);
    Ok(())
}
