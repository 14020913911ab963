//! A replica in memory, with the faults a network and a broker have: for tests of log
//! shipping that need a replica to go away, answer slowly, lose an acknowledgement, or come
//! back without its data, on demand.
//!
//! It is written from what JetStream documents, not from the shipper: a stream of messages
//! numbered from 1 that an append extends only if the stream still ends where the writer saw
//! it end (JetStream's expected last sequence), so that any other store's append fences the
//! writer; a writer entry changed only by compare-and-set on its revision (a key-value
//! bucket); a purge that drops the frames a snapshot covers; and a broker restarted without
//! its data, after which the stream and the entry are gone and a publish finds no stream.
//! Which store may do what is decided by `model::writer_epoch`, as in `replica::JetStream`.
//! The replica conformance suite (`tests/suite/replica_contract.rs`) runs on both.
//!
//! What it cannot show, the suite runs on JetStream only: chunked frames, the duplicate
//! window, a server that answers after its time limit. Clones share one stream.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::ReplicaError;
use crate::model::replica::{SnapshotInfo, StreamPosition, WriterIdentity};
use crate::model::restore::Lineage;
use crate::model::writer_epoch::{self, Claim, Refusal, Slot};
use crate::wal::ship::{Replica, ReplicaSource, ShippedFrame};

use self::log::{Log, Message};

mod log;

/// How the in-memory replica answers now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaFault {
    /// Every call works.
    None,
    /// Every call fails at once with `Unreachable` (the server is stopped).
    Down,
    /// Every call waits until the fault is lifted (a peer that stopped answering with the
    /// socket open), then fails with `Unreachable`. Bounded by `MemoryReplica::call_limit`.
    Silent,
    /// Publishes store their frames, then fail as if the acknowledgement were lost.
    LoseAcks,
}

/// What the broker keeps; `None` fields are absent (never created, or forgotten).
#[derive(Debug, Default)]
struct Broker {
    /// The stream: `None` until a claim creates it, and again after [`MemoryReplica::forget`].
    stream: Option<Log>,
    /// The writer entry and its revision.
    entry: Option<(Entry, u64)>,
    /// The revision the next change of the entry gets (kept across a forget, as a new
    /// bucket's revisions are not: what matters is that a change is seen).
    revisions: u64,
    fault: Option<ReplicaFault>,
    publishes: u64,
    /// Bumped by [`MemoryReplica::cut_off`]: handles that claimed before are fenced.
    generation: u64,
}

/// The writer entry: the rules' slot and the latest snapshot.
#[derive(Debug, Clone)]
struct Entry {
    slot: Slot<WriterIdentity>,
    snapshot: Option<(SnapshotInfo, Arc<Vec<u8>>)>,
}

/// What one handle claimed: as whom, at which epoch, where the stream ended (the expected
/// last sequence of its next append) and the generation.
#[derive(Debug, Clone)]
struct Claimed {
    me: WriterIdentity,
    epoch: u64,
    last_seq: u64,
    /// The last frame the stream held for this writer: below it later, the broker lost it.
    acknowledged: u64,
    generation: u64,
}

/// A stream in memory (see the module doc). Cloning it gives another handle to the same stream:
/// one per store that ships to it, one for a restore.
#[derive(Debug, Clone)]
pub struct MemoryReplica {
    shared: Arc<(Mutex<Broker>, Condvar)>,
    claimed: Arc<Mutex<Option<Claimed>>>,
    call_limit: Duration,
}

impl Default for MemoryReplica {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryReplica {
    /// An empty broker: no stream yet.
    pub fn new() -> Self {
        MemoryReplica {
            shared: Arc::new((Mutex::new(Broker::default()), Condvar::new())),
            claimed: Arc::new(Mutex::new(None)),
            call_limit: Duration::from_secs(5),
        }
    }

    /// Another handle to the same stream, as a second process would have (its own claim).
    pub fn handle(&self) -> Self {
        MemoryReplica {
            shared: self.shared.clone(),
            claimed: Arc::new(Mutex::new(None)),
            call_limit: self.call_limit,
        }
    }

    /// How long a call waits at most while the replica is [`ReplicaFault::Silent`].
    #[must_use]
    pub fn call_limit(mut self, limit: Duration) -> Self {
        self.call_limit = limit;
        self
    }

    /// Sets how the replica answers from now on.
    pub fn set_fault(&self, fault: ReplicaFault) {
        self.shared.0.lock().fault = Some(fault);
        self.shared.1.notify_all();
    }

    /// The frames the stream holds (after trimming), by sequence number.
    pub fn frame_seqs(&self) -> Vec<u64> {
        let broker = self.shared.0.lock();
        broker
            .stream
            .as_ref()
            .map(|log| log.frames().map(|(f, _)| f.seq).collect())
            .unwrap_or_default()
    }

    /// The frame the snapshot covers, if there is one.
    pub fn snapshot_seq(&self) -> Option<u64> {
        let broker = self.shared.0.lock();
        snapshot(&broker).map(|(info, _)| info.seq)
    }

    /// Publish calls answered so far.
    pub fn publishes(&self) -> u64 {
        self.shared.0.lock().publishes
    }

    /// The box that writes the stream is gone: every handle that claimed the stream so far is
    /// fenced off from now on (its threads may still run in a test; a lost box's do not),
    /// while the stream keeps its writer entry, so a restore takes it over as from a lost box.
    pub fn cut_off(&self) {
        self.shared.0.lock().generation += 1;
        self.shared.1.notify_all();
    }

    /// The broker restarted without its data (a replaced server, a wiped volume): the stream,
    /// its frames, its snapshot and the writer entry are gone. A handle that had claimed the
    /// stream finds no stream at its next publish ([`ReplicaError::Lost`]).
    pub fn forget(&self) {
        let mut broker = self.shared.0.lock();
        broker.stream = None;
        broker.entry = None;
        self.shared.1.notify_all();
    }

    /// The stream's writer now.
    pub fn writer(&self) -> Option<WriterIdentity> {
        self.shared
            .0
            .lock()
            .entry
            .as_ref()
            .and_then(|(e, _)| e.slot.writer.clone())
    }

    /// The stream's epoch now (0 for a stream never taken over, or with no entry).
    pub fn epoch(&self) -> u64 {
        self.shared
            .0
            .lock()
            .entry
            .as_ref()
            .map_or(0, |(e, _)| e.slot.epoch)
    }

    /// Waits out a fault: `Ok(broker)` if calls may proceed, else the failure.
    fn answer(&self) -> Result<parking_lot::MutexGuard<'_, Broker>, ReplicaError> {
        let (lock, changed) = &*self.shared;
        let mut broker = lock.lock();
        match broker.fault.unwrap_or(ReplicaFault::None) {
            ReplicaFault::Down => Err(unreachable("the replica is down")),
            ReplicaFault::Silent => {
                let deadline = std::time::Instant::now() + self.call_limit;
                while broker.fault == Some(ReplicaFault::Silent)
                    && std::time::Instant::now() < deadline
                {
                    changed.wait_until(&mut broker, deadline);
                }
                Err(unreachable(
                    "the replica did not answer within the time limit",
                ))
            }
            ReplicaFault::None | ReplicaFault::LoseAcks => Ok(broker),
        }
    }

    /// Whether this handle may append now: the stream exists and still ends where this
    /// handle saw it end, and the entry lets it (`writer_epoch::may_write`). Else why not.
    fn check_writer(&self, broker: &Broker) -> Result<Claimed, ReplicaError> {
        let claimed = self.claimed.lock().clone().ok_or_else(not_claimed)?;
        let Some(log) = &broker.stream else {
            return Err(lost("the stream does not exist (the broker lost it)"));
        };
        if claimed.generation != broker.generation {
            // Cut off: to the box, the broker has gone silent (a partition, or a box that is
            // gone), not another writer.
            return Err(unreachable("this handle's box was cut off from the stream"));
        }
        if log.last_seq() != claimed.last_seq {
            // Someone else appended (JetStream: wrong last sequence). Whose, the entry says.
            writer_epoch::may_write(slot(broker), &claimed.me, claimed.epoch).map_err(refusal)?;
            if log.last_epoch() > claimed.epoch {
                return Err(ReplicaError::Fenced {
                    by: None,
                    epoch: log.last_epoch(),
                });
            }
            return Err(ReplicaError::Refused {
                detail: "the stream no longer ends at this writer's last message".into(),
            });
        }
        if log.last_frame().unwrap_or(0).max(snapshot_seq(broker)) < claimed.acknowledged {
            return Err(lost(&format!(
                "the stream ends before frame {} it acknowledged",
                claimed.acknowledged
            )));
        }
        writer_epoch::may_write(slot(broker), &claimed.me, claimed.epoch).map_err(refusal)?;
        Ok(claimed)
    }

    fn update_claim(&self, last_seq: u64, acknowledged: u64) {
        if let Some(claimed) = self.claimed.lock().as_mut() {
            claimed.last_seq = last_seq;
            claimed.acknowledged = claimed.acknowledged.max(acknowledged);
        }
    }
}

fn slot(broker: &Broker) -> Option<&Slot<WriterIdentity>> {
    broker.entry.as_ref().map(|(e, _)| &e.slot)
}

fn snapshot(broker: &Broker) -> Option<&(SnapshotInfo, Arc<Vec<u8>>)> {
    broker.entry.as_ref().and_then(|(e, _)| e.snapshot.as_ref())
}

fn snapshot_seq(broker: &Broker) -> u64 {
    snapshot(broker).map_or(0, |(info, _)| info.seq)
}

/// The stream's last frame, in messages or in the snapshot.
fn last_frame(broker: &Broker) -> u64 {
    broker
        .stream
        .as_ref()
        .and_then(Log::last_frame)
        .unwrap_or(0)
        .max(snapshot_seq(broker))
}

/// Writes the entry by compare-and-set on `over` (its revision when read).
fn write_entry(broker: &mut Broker, entry: Entry, over: Option<u64>) {
    let current = broker.entry.as_ref().map(|(_, r)| *r);
    assert_eq!(
        current, over,
        "the entry changed under a compare-and-set that holds the broker's lock"
    );
    broker.revisions += 1;
    broker.entry = Some((entry, broker.revisions));
}

fn refusal(r: Refusal<WriterIdentity>) -> ReplicaError {
    match r {
        Refusal::Fenced { by, epoch } => ReplicaError::Fenced { by, epoch },
        Refusal::OtherWriter(holder) => ReplicaError::OtherWriter { holder },
        Refusal::NotClaimed => not_claimed(),
        Refusal::Lost => lost("the writer entry is gone, or older than this writer's epoch"),
    }
}

fn lost(detail: &str) -> ReplicaError {
    ReplicaError::Lost {
        detail: detail.into(),
    }
}

fn not_claimed() -> ReplicaError {
    ReplicaError::Refused {
        detail: "this replica has not claimed the stream (call claim first)".into(),
    }
}

fn unreachable(detail: &str) -> ReplicaError {
    ReplicaError::Unreachable {
        detail: detail.into(),
    }
}

impl Replica for MemoryReplica {
    fn claim(&self, me: &WriterIdentity, epoch: u64) -> Result<StreamPosition, ReplicaError> {
        let mut broker = self.answer()?;
        // A handle cut off ([`MemoryReplica::cut_off`]) stays cut off: its box is lost, and
        // the shipper threads a test leaves running must not claim the stream back (they
        // could, before a restore took it over, as the writer the entry still names).
        let cut = self
            .claimed
            .lock()
            .as_ref()
            .is_some_and(|old| old.generation != broker.generation);
        if cut {
            return Err(unreachable("this handle's box was cut off from the stream"));
        }
        let log_epoch = broker.stream.as_ref().map_or(0, Log::last_epoch);
        if log_epoch > epoch {
            // A take-over's marker, before its entry is written.
            return Err(ReplicaError::Fenced {
                by: None,
                epoch: log_epoch,
            });
        }
        match writer_epoch::claim(slot(&broker), me, epoch) {
            Claim::Take => {}
            Claim::Fenced { by, epoch } => return Err(ReplicaError::Fenced { by, epoch }),
            Claim::OtherWriter(holder) => return Err(ReplicaError::OtherWriter { holder }),
        }
        let broker = &mut *broker;
        let log = broker.stream.get_or_insert_with(|| Log {
            messages: Vec::new(),
            first: 1,
        });
        let last_seq = log.last_seq();
        let kept = broker.entry.as_ref().and_then(|(e, _)| e.snapshot.clone());
        let over = broker.entry.as_ref().map(|(_, r)| *r);
        write_entry(
            broker,
            Entry {
                slot: writer_epoch::claimed(me, epoch),
                snapshot: kept,
            },
            over,
        );
        let last = last_frame(broker);
        *self.claimed.lock() = Some(Claimed {
            me: me.clone(),
            epoch,
            last_seq,
            acknowledged: last,
            generation: broker.generation,
        });
        Ok(StreamPosition {
            last_frame: last,
            snapshot: snapshot(broker).map(|(i, _)| i.seq),
        })
    }

    fn publish(&self, frames: &[ShippedFrame], lineage: &Lineage) -> Result<(), ReplicaError> {
        let mut broker = self.answer()?;
        broker.publishes += 1;
        let claimed = self.check_writer(&broker)?;
        assert_eq!(
            lineage.epoch, claimed.epoch,
            "frames carry their writer's epoch"
        );
        let mut last = last_frame(&broker);
        let log = broker.stream.as_mut().ok_or_else(|| lost("no stream"))?;
        for frame in frames {
            if frame.seq <= last {
                continue; // a re-send: stored once
            }
            if frame.seq != last + 1 {
                return Err(ReplicaError::Refused {
                    detail: format!("frame {} after frame {last}: not consecutive", frame.seq),
                });
            }
            log.append(Message::Frame(frame.clone(), *lineage));
            last = frame.seq;
        }
        let last_seq = log.last_seq();
        let fault = broker.fault;
        drop(broker);
        self.update_claim(last_seq, last);
        if fault == Some(ReplicaFault::LoseAcks) {
            return Err(unreachable("the acknowledgement was lost"));
        }
        Ok(())
    }

    fn snapshot(&self, seq: u64, file: &Path, lineage: &Lineage) -> Result<(), ReplicaError> {
        let bytes = std::fs::read(file).map_err(|e| ReplicaError::Refused {
            detail: format!("reading the snapshot {}: {e}", file.display()),
        })?;
        let mut broker = self.answer()?;
        // A snapshot's commit is a compare-and-set of the entry: it needs the entry to name
        // this writer at its epoch, not the stream to end where it saw it.
        let claimed = self.claimed.lock().clone().ok_or_else(not_claimed)?;
        if broker.stream.is_none() {
            return Err(lost("the stream does not exist (the broker lost it)"));
        }
        if claimed.generation != broker.generation {
            // Cut off: to the box, the broker has gone silent (a partition, or a box that is
            // gone), not another writer.
            return Err(unreachable("this handle's box was cut off from the stream"));
        }
        writer_epoch::may_write(slot(&broker), &claimed.me, claimed.epoch).map_err(refusal)?;
        if snapshot_seq(&broker) > seq {
            return Err(ReplicaError::Refused {
                detail: format!(
                    "the stream has a snapshot of frame {}, past frame {seq}",
                    snapshot_seq(&broker)
                ),
            });
        }
        let (mut entry, revision) = broker.entry.clone().ok_or_else(|| lost("no entry"))?;
        let info = SnapshotInfo {
            seq,
            lineage: *lineage,
            bytes: bytes.len() as u64,
        };
        entry.snapshot = Some((info, Arc::new(bytes)));
        write_entry(&mut broker, entry, Some(revision));
        let log = broker.stream.as_mut().ok_or_else(|| lost("no stream"))?;
        log.purge_through(seq);
        drop(broker);
        let last_seq = self.claimed.lock().as_ref().map_or(0, |c| c.last_seq);
        self.update_claim(last_seq, seq);
        Ok(())
    }

    fn release(&self, me: &WriterIdentity) -> Result<(), ReplicaError> {
        let mut broker = self.answer()?;
        let Some(claimed) = self.claimed.lock().clone() else {
            return Ok(());
        };
        if claimed.generation != broker.generation {
            return Ok(());
        }
        if let Some((entry, revision)) = broker.entry.clone()
            && let Some(slot) = writer_epoch::released(&entry.slot, me, claimed.epoch)
        {
            write_entry(&mut broker, Entry { slot, ..entry }, Some(revision));
        }
        Ok(())
    }
}

impl ReplicaSource for MemoryReplica {
    fn fetch_snapshot(&self, file: &Path) -> Result<Option<SnapshotInfo>, ReplicaError> {
        let broker = self.answer()?;
        let Some((info, bytes)) = snapshot(&broker).cloned() else {
            return Ok(None);
        };
        drop(broker);
        let mut out = crate::storage::create_private(file).map_err(|e| ReplicaError::Refused {
            detail: format!("creating {}: {e}", file.display()),
        })?;
        std::io::Write::write_all(&mut out, &bytes).map_err(|e| ReplicaError::Refused {
            detail: format!("writing {}: {e}", file.display()),
        })?;
        Ok(Some(info))
    }

    fn latest_snapshot(&self) -> Result<Option<SnapshotInfo>, ReplicaError> {
        Ok(snapshot(&*self.answer()?).map(|(info, _)| *info))
    }

    fn frames_after(
        &self,
        after: u64,
        each: &mut dyn FnMut(ShippedFrame, Lineage) -> Result<(), ReplicaError>,
    ) -> Result<u64, ReplicaError> {
        let frames: Vec<(ShippedFrame, Lineage)> = {
            let broker = self.answer()?;
            let log = broker
                .stream
                .as_ref()
                .ok_or_else(|| ReplicaError::Refused {
                    detail: "the stream does not exist: nothing was ever shipped to it".into(),
                })?;
            log.frames()
                .filter(|(f, _)| f.seq > after)
                .map(|(f, l)| (f.clone(), *l))
                .collect()
        };
        let mut last = after;
        for (frame, lineage) in frames {
            if frame.seq != last + 1 {
                return Err(ReplicaError::Corrupt {
                    detail: format!("frames {} ..= {} are missing", last + 1, frame.seq - 1),
                });
            }
            last = frame.seq;
            each(frame, lineage)?;
        }
        Ok(last)
    }

    fn take_over(&self, me: &WriterIdentity, last: u64, known: u64) -> Result<u64, ReplicaError> {
        let mut broker = self.answer()?;
        let now = last_frame(&broker);
        if now > last {
            return Err(ReplicaError::Moved { read: last, now });
        }
        if now < last {
            return Err(ReplicaError::Corrupt {
                detail: format!(
                    "the stream ends at frame {now}, before frame {last} that the restore read"
                ),
            });
        }
        let broker = &mut *broker;
        let log = broker.stream.get_or_insert_with(|| Log {
            messages: Vec::new(),
            first: 1,
        });
        let known = known.max(log.last_epoch());
        let slot = writer_epoch::taken_over(slot(broker), me, known);
        let epoch = slot.epoch;
        if let Some(log) = broker.stream.as_mut() {
            log.append(Message::Marker { epoch });
        }
        let (kept, over) = match &broker.entry {
            Some((e, r)) => (e.snapshot.clone(), Some(*r)),
            None => (None, None),
        };
        write_entry(
            broker,
            Entry {
                slot,
                snapshot: kept,
            },
            over,
        );
        // Whatever this handle claimed before is over: the stream has a new writer.
        *self.claimed.lock() = None;
        Ok(epoch)
    }
}
