//! The log thread: appends and syncs groups while the writer executes the next ones.
//!
//! The writer hands over each group as it finishes (its encoded payload, the records it wrote,
//! and its jobs). The log thread takes every group waiting, writes them as **one** frame, syncs
//! it, and only then adds their records to the overlay and answers their jobs. Groups are
//! answered strictly in order, including groups that wrote nothing: their answers may rest on
//! an earlier group's writes, which must be durable first. There is never more than one
//! unsynced frame, which recovery relies on.
//!
//! If a write or sync fails, every group not yet durable fails, the store is poisoned, and
//! every later submission fails too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::error::StoreError;
use crate::wal::Log;
use crate::wal::format::FRAME_HEADER_LEN;

use super::counters::Counters;
use super::job::Job;
use super::overlay::Overlay;
use super::poison::Poison;

/// Payload bytes after which the log thread stops adding groups to a frame.
const FRAME_BYTES: usize = 64 * 1024 * 1024;

/// One group, handed from the writer to the log thread.
pub(crate) struct Submission {
    /// The group's encoded `Payload`, or `None` if it wrote nothing.
    pub(crate) payload: Option<Vec<u8>>,
    /// Its writes to the records table, for the overlay.
    pub(crate) records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Its jobs, answered once it is durable.
    pub(crate) jobs: Vec<Box<dyn Job>>,
}

enum Message {
    Group(Submission),
    /// Every frame up to `seq` is durable in redb: recycle segments.
    Checkpointed {
        seq: u64,
        keep_free: usize,
    },
}

#[derive(Debug, Default)]
struct State {
    /// Groups handed over by the writer.
    submitted: u64,
    /// Groups made durable (or answered with the failure).
    settled: u64,
    /// Sequence number of the last frame synced.
    last_seq: u64,
    failed: Option<StoreError>,
}

struct Shared {
    state: Mutex<State>,
    settled: Condvar,
    since_checkpoint: AtomicU64,
}

pub(crate) struct LogThread {
    sender: Option<Sender<Message>>,
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl LogThread {
    pub(crate) fn start(
        log: Log,
        overlay: Arc<Overlay>,
        counters: Arc<Counters>,
        poison: Arc<Poison>,
    ) -> std::io::Result<LogThread> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                last_seq: log.last_seq(),
                ..State::default()
            }),
            settled: Condvar::new(),
            since_checkpoint: AtomicU64::new(log.since_checkpoint()),
        });
        let (sender, receiver) = channel();
        let worker = Worker {
            log,
            overlay,
            counters,
            poison,
            shared: shared.clone(),
            frame: Vec::new(),
        };
        let handle = std::thread::Builder::new()
            .name("idemstore-log".into())
            .spawn(move || worker.run(receiver))?;
        Ok(LogThread {
            sender: Some(sender),
            shared,
            handle: Some(handle),
        })
    }

    /// Hands a group over. Its jobs are answered by the log thread.
    pub(crate) fn submit(&self, submission: Submission) {
        self.shared.state.lock().submitted += 1;
        let sent = self
            .sender
            .as_ref()
            .map(|s| s.send(Message::Group(submission)));
        if let Some(Err(unsent)) = sent {
            // The log thread is gone (it only stops when the writer drops it); answer here.
            if let Message::Group(submission) = unsent.0 {
                let mut state = self.shared.state.lock();
                state.settled += 1;
                let e = state.failed.clone().unwrap_or(StoreError::Closed);
                drop(state);
                for job in submission.jobs {
                    job.finish(Err(e.clone()));
                }
            }
        }
    }

    /// Waits until every group handed over is durable. Returns the last frame's sequence
    /// number, or the failure that stopped the log.
    pub(crate) fn wait_durable(&self) -> Result<u64, StoreError> {
        let mut state = self.shared.state.lock();
        while state.settled < state.submitted && state.failed.is_none() {
            self.shared.settled.wait(&mut state);
        }
        match &state.failed {
            Some(e) => Err(e.clone()),
            None => Ok(state.last_seq),
        }
    }

    /// Frame bytes written since the last checkpoint.
    pub(crate) fn since_checkpoint(&self) -> u64 {
        self.shared.since_checkpoint.load(Ordering::Relaxed)
    }

    /// Every frame up to `seq` is durable in redb.
    pub(crate) fn checkpointed(&self, seq: u64, keep_free: usize) {
        self.shared.since_checkpoint.store(0, Ordering::Relaxed);
        if let Some(sender) = &self.sender {
            let _ = sender.send(Message::Checkpointed { seq, keep_free });
        }
    }
}

impl Drop for LogThread {
    fn drop(&mut self) {
        self.sender = None;
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

struct Worker {
    log: Log,
    overlay: Arc<Overlay>,
    counters: Arc<Counters>,
    poison: Arc<Poison>,
    shared: Arc<Shared>,
    frame: Vec<u8>,
}

impl Worker {
    fn run(mut self, receiver: Receiver<Message>) {
        let mut batch: Vec<Submission> = Vec::new();
        while let Ok(first) = receiver.recv() {
            let mut next = Some(first);
            while let Some(message) = next.take() {
                match message {
                    Message::Checkpointed { seq, keep_free } => {
                        self.flush(&mut batch);
                        self.log.checkpointed(seq, keep_free);
                    }
                    Message::Group(submission) => {
                        batch.push(submission);
                        let bytes: usize = batch
                            .iter()
                            .filter_map(|s| s.payload.as_ref())
                            .map(Vec::len)
                            .sum();
                        if bytes < FRAME_BYTES {
                            next = receiver.try_recv().ok();
                        }
                    }
                }
            }
            self.flush(&mut batch);
        }
    }

    /// Writes the batch's groups as one frame, syncs it, then answers them in order.
    fn flush(&mut self, batch: &mut Vec<Submission>) {
        if batch.is_empty() {
            return;
        }
        let failed = self.shared.state.lock().failed.clone();
        let result = match failed {
            Some(e) => Err(e),
            None => self.write(batch),
        };
        let n = batch.len() as u64;
        match &result {
            Ok(_) => {
                self.overlay.add(
                    batch
                        .iter_mut()
                        .flat_map(|s| std::mem::take(&mut s.records)),
                );
            }
            Err(e) => self.poison.set(&e.to_string()),
        }
        {
            let mut state = self.shared.state.lock();
            state.settled += n;
            match &result {
                Ok(Some(seq)) => state.last_seq = *seq,
                Ok(None) => {}
                Err(e) => {
                    state.failed.get_or_insert_with(|| e.clone());
                }
            }
        }
        self.shared.settled.notify_all();
        let answer = result.map(|_| ());
        let jobs: Vec<Box<dyn Job>> = batch.drain(..).flat_map(|s| s.jobs).collect();
        Counters::add(&self.counters.requests, jobs.len() as u64);
        for job in jobs {
            job.finish(answer.clone());
        }
    }

    /// The frame for a batch: `varint(groups) ‖ payload ‖ payload ...`, which is the postcard
    /// encoding of a sequence of payloads. `Ok(None)` if no group wrote anything.
    fn write(&mut self, batch: &[Submission]) -> Result<Option<u64>, StoreError> {
        let payloads: Vec<&Vec<u8>> = batch.iter().filter_map(|s| s.payload.as_ref()).collect();
        if payloads.is_empty() {
            return Ok(None);
        }
        self.frame.clear();
        put_varint(&mut self.frame, payloads.len() as u64);
        for payload in payloads {
            self.frame.extend_from_slice(payload);
        }
        let seq = self
            .log
            .append(&self.frame)
            .map_err(|e| StoreError::OutcomeUnknown {
                cause: format!("writing the log failed: {e}").into(),
            })?;
        let written = (self.frame.len() + FRAME_HEADER_LEN) as u64;
        Counters::add(&self.counters.log_bytes, written);
        self.shared
            .since_checkpoint
            .fetch_add(written, Ordering::Relaxed);
        Ok(Some(seq))
    }
}

/// LEB128, as postcard encodes a sequence length.
fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_matches_postcards_sequence_length() -> Result<(), postcard::Error> {
        for n in [0u64, 1, 127, 128, 300, 16_384, u64::from(u32::MAX)] {
            let mut ours = Vec::new();
            put_varint(&mut ours, n);
            let theirs = postcard::to_stdvec(&n)?;
            assert_eq!(ours, theirs, "{n}");
        }
        Ok(())
    }
}
