//! A replica in memory, with the faults a network has: for tests of log shipping that need a
//! replica to go away, answer slowly, or lose an acknowledgement, on demand.
//!
//! It keeps the same rules a real one must (`replica::JetStream` keeps them in NATS): frames
//! in order and consecutive, a re-sent frame stored once, one writer, and a take-over that
//! fences the old writer off. Clones share one stream.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::error::ReplicaError;
use crate::model::replica::{Guarantee, SnapshotInfo, StreamPosition, WriterIdentity};
use crate::wal::ship::{Replica, ReplicaSource, ShippedFrame};

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

#[derive(Debug)]
struct Stream {
    frames: Vec<(ShippedFrame, Guarantee)>,
    snapshot: Option<(SnapshotInfo, Vec<u8>)>,
    writer: Option<WriterIdentity>,
    /// Bumped by a take-over: a writer that claimed in an earlier generation is fenced.
    generation: u64,
    fault: ReplicaFault,
    publishes: u64,
}

/// A stream in memory (see the module doc). Cloning it gives another handle to the same stream:
/// one per store that ships to it, one for a restore.
#[derive(Debug, Clone)]
pub struct MemoryReplica {
    shared: Arc<(Mutex<Stream>, Condvar)>,
    /// The generation this handle claimed in.
    claimed: Arc<Mutex<Option<u64>>>,
    call_limit: Duration,
}

impl Default for MemoryReplica {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryReplica {
    /// An empty stream.
    pub fn new() -> Self {
        MemoryReplica {
            shared: Arc::new((
                Mutex::new(Stream {
                    frames: Vec::new(),
                    snapshot: None,
                    writer: None,
                    generation: 0,
                    fault: ReplicaFault::None,
                    publishes: 0,
                }),
                Condvar::new(),
            )),
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
        self.shared.0.lock().fault = fault;
        self.shared.1.notify_all();
    }

    /// The frames the stream holds (after trimming), by sequence number.
    pub fn frame_seqs(&self) -> Vec<u64> {
        self.shared
            .0
            .lock()
            .frames
            .iter()
            .map(|(f, _)| f.seq)
            .collect()
    }

    /// The frame the snapshot covers, if there is one.
    pub fn snapshot_seq(&self) -> Option<u64> {
        self.shared.0.lock().snapshot.as_ref().map(|(i, _)| i.seq)
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

    /// The stream's writer now.
    pub fn writer(&self) -> Option<WriterIdentity> {
        self.shared.0.lock().writer.clone()
    }

    /// Waits out a fault: `Ok(stream)` if calls may proceed, else the failure.
    fn answer(&self) -> Result<parking_lot::MutexGuard<'_, Stream>, ReplicaError> {
        let (lock, changed) = &*self.shared;
        let mut stream = lock.lock();
        match stream.fault {
            ReplicaFault::Down => Err(unreachable("the replica is down")),
            ReplicaFault::Silent => {
                let deadline = std::time::Instant::now() + self.call_limit;
                while stream.fault == ReplicaFault::Silent && std::time::Instant::now() < deadline {
                    changed.wait_until(&mut stream, deadline);
                }
                Err(unreachable(
                    "the replica did not answer within the time limit",
                ))
            }
            ReplicaFault::None | ReplicaFault::LoseAcks => Ok(stream),
        }
    }

    fn last(stream: &Stream) -> u64 {
        stream
            .frames
            .last()
            .map(|(f, _)| f.seq)
            .or(stream.snapshot.as_ref().map(|(i, _)| i.seq))
            .unwrap_or(0)
    }

    /// Fenced off if someone took the stream over since this handle claimed it.
    fn check_writer(&self, stream: &Stream) -> Result<(), ReplicaError> {
        let claimed = *self.claimed.lock();
        if claimed != Some(stream.generation) {
            return Err(ReplicaError::OtherWriter {
                holder: stream.writer.clone().unwrap_or_else(unknown_writer),
            });
        }
        Ok(())
    }
}

fn unreachable(detail: &str) -> ReplicaError {
    ReplicaError::Unreachable {
        detail: detail.into(),
    }
}

fn unknown_writer() -> WriterIdentity {
    WriterIdentity {
        host: "unknown".into(),
        pid: 0,
        dir: "unknown".into(),
    }
}

impl Replica for MemoryReplica {
    fn claim(&self, me: &WriterIdentity) -> Result<StreamPosition, ReplicaError> {
        let mut stream = self.answer()?;
        match &stream.writer {
            Some(holder) if !holder.same_store(me) => {
                return Err(ReplicaError::OtherWriter {
                    holder: holder.clone(),
                });
            }
            _ => {}
        }
        stream.writer = Some(me.clone());
        *self.claimed.lock() = Some(stream.generation);
        Ok(StreamPosition {
            last_frame: Self::last(&stream),
            snapshot: stream.snapshot.as_ref().map(|(i, _)| i.seq),
        })
    }

    fn publish(&self, frames: &[ShippedFrame], guarantee: Guarantee) -> Result<(), ReplicaError> {
        let mut stream = self.answer()?;
        self.check_writer(&stream)?;
        stream.publishes += 1;
        for frame in frames {
            let last = Self::last(&stream);
            if frame.seq <= last {
                continue; // a re-send: stored once
            }
            if frame.seq != last + 1 {
                return Err(ReplicaError::Refused {
                    detail: format!("frame {} after frame {last}: not consecutive", frame.seq),
                });
            }
            stream.frames.push((frame.clone(), guarantee));
        }
        if stream.fault == ReplicaFault::LoseAcks {
            return Err(unreachable("the acknowledgement was lost"));
        }
        Ok(())
    }

    fn snapshot(&self, seq: u64, file: &Path, guarantee: Guarantee) -> Result<(), ReplicaError> {
        let bytes = std::fs::read(file).map_err(|e| ReplicaError::Refused {
            detail: format!("reading the snapshot {}: {e}", file.display()),
        })?;
        let mut stream = self.answer()?;
        self.check_writer(&stream)?;
        let info = SnapshotInfo {
            seq,
            guarantee,
            bytes: bytes.len() as u64,
        };
        stream.snapshot = Some((info, bytes));
        stream.frames.retain(|(f, _)| f.seq > seq);
        Ok(())
    }

    fn release(&self, me: &WriterIdentity) -> Result<(), ReplicaError> {
        let mut stream = self.answer()?;
        if stream.writer.as_ref() == Some(me) && *self.claimed.lock() == Some(stream.generation) {
            stream.writer = None;
        }
        Ok(())
    }
}

impl ReplicaSource for MemoryReplica {
    fn fetch_snapshot(&self, file: &Path) -> Result<Option<SnapshotInfo>, ReplicaError> {
        let stream = self.answer()?;
        let Some((info, bytes)) = &stream.snapshot else {
            return Ok(None);
        };
        std::fs::write(file, bytes).map_err(|e| ReplicaError::Refused {
            detail: format!("writing {}: {e}", file.display()),
        })?;
        Ok(Some(*info))
    }

    fn latest_snapshot(&self) -> Result<Option<SnapshotInfo>, ReplicaError> {
        Ok(self.answer()?.snapshot.as_ref().map(|(info, _)| *info))
    }

    fn frames_after(
        &self,
        after: u64,
        each: &mut dyn FnMut(ShippedFrame, Guarantee) -> Result<(), ReplicaError>,
    ) -> Result<u64, ReplicaError> {
        let frames: Vec<(ShippedFrame, Guarantee)> = {
            let stream = self.answer()?;
            stream
                .frames
                .iter()
                .filter(|(f, _)| f.seq > after)
                .cloned()
                .collect()
        };
        let mut last = after;
        for (frame, guarantee) in frames {
            if frame.seq != last + 1 {
                return Err(ReplicaError::Corrupt {
                    detail: format!("frames {} ..= {} are missing", last + 1, frame.seq - 1),
                });
            }
            last = frame.seq;
            each(frame, guarantee)?;
        }
        Ok(last)
    }

    fn take_over(&self, me: &WriterIdentity, last: u64) -> Result<(), ReplicaError> {
        let mut stream = self.answer()?;
        let now = Self::last(&stream);
        if now != last {
            return Err(ReplicaError::Moved { read: last, now });
        }
        stream.generation += 1;
        stream.writer = Some(me.clone());
        Ok(())
    }
}
