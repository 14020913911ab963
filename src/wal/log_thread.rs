//! The log thread: appends and syncs groups while the writer executes the next ones.
//!
//! The writer hands over each group as it finishes: its encoded payload and a *ticket*, which
//! the log does not look into (for the engine: the records the group wrote and its requests).
//! The log thread takes every group waiting, writes them as **one** frame, syncs it, and only
//! then hands the tickets, in order, to the `on_durable` callback given at start. Groups are
//! settled strictly in order, including groups that wrote nothing: their answers may rest on
//! an earlier group's writes, which must be durable first. There is never more than one
//! unsynced frame, which recovery relies on.
//!
//! When there is nothing to overlap (the log thread is idle and no other request is waiting),
//! the writer appends the group itself: handing it over would only add a thread hop to the
//! latency of a lone client.
//!
//! Two kinds of failure, which the writer handles differently:
//! - A frame refused before its sync (a full disk): those groups and every group after them
//!   fail with [`StoreError::NotWritten`] (later groups may rest on the refused ones). The
//!   writer rebuilds its transaction without them and [`resume`s](LogThread::resume) the log.
//! - A failed sync: the frame's outcome is unknown ([`StoreError::OutcomeUnknown`]), and the
//!   log takes nothing more; the writer recovers from the log's files and starts a new one.
//!
//! Either way the failed groups' tickets wait for the writer
//! ([`LogThread::take_unanswered`]), which answers them once it has recovered.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::error::StoreError;

use super::format::FRAME_HEADER_LEN;
use super::log::{AppendError, Log};
use super::ship::{NotShipped, ShippedFrame, Shipper};

/// What a store does after its replica failed to acknowledge a synchronous frame.
const SHIP_RECOVERY: &str = "The store refuses writes until the replica answers and holds the frame, then recovers in place; retry after that";

/// One group, handed from the writer to the log.
pub(crate) struct Submission<T> {
    /// The group's encoded payload, or `None` if it wrote nothing. Shared with the writer,
    /// which keeps it until the epoch is published, to rebuild the epoch after a failure.
    pub(crate) payload: Option<Arc<Vec<u8>>>,
    /// What the caller settles once the group is durable.
    pub(crate) ticket: T,
}

/// Called with the tickets of groups made durable, in order, before anything else is settled.
pub(crate) type OnDurable<T> = Box<dyn Fn(Vec<T>) + Send + Sync>;

/// Whether the writer has other work that a hand-off would let it overlap with the sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handoff {
    /// More requests are waiting: give the group to the log thread and go on.
    Overlap,
    /// Nothing else to do: append on this thread if the log thread is idle.
    Inline,
}

/// Why groups handed to the log did not all become durable.
#[derive(Debug, Clone)]
pub(crate) struct LogFailure {
    /// The number (counted from 0 since the log thread started) of the first group that failed;
    /// every group from it on failed too.
    pub(crate) first: u64,
    /// What each of them was answered.
    pub(crate) error: StoreError,
    /// Whether anything of them may be on disk.
    pub(crate) outcome: FailedOutcome,
    /// For [`FailedOutcome::Unknown`]: the frame whose sync failed, as it was written. The
    /// file's bytes cannot be trusted to say whether it is durable, so this copy is the only
    /// one a recovery may use.
    pub(crate) unsynced: Option<Unsynced>,
}

/// A frame whose sync failed, kept in memory.
#[derive(Debug, Clone)]
pub(crate) struct Unsynced {
    pub(crate) seq: u64,
    /// The frame's payload (`varint(groups) ‖ payload ...`, as recovery hands a frame over).
    pub(crate) payload: Arc<Vec<u8>>,
}

/// Whether a failed frame may have reached the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FailedOutcome {
    /// Refused before its sync: nothing of it is durable; the log can go on.
    NotWritten,
    /// Its sync failed: it may or may not be durable; the log must not be used again.
    Unknown,
}

struct State<T> {
    /// Groups handed over by the writer.
    submitted: u64,
    /// Groups made durable (or answered with the failure).
    settled: u64,
    /// Sequence number of the last frame synced.
    last_seq: u64,
    failed: Option<LogFailure>,
    /// Tickets of groups that failed: the writer answers them once it has rebuilt its epoch
    /// or recovered, so that whoever hears of the failure and retries finds the log taking
    /// groups again, and whoever hears "outcome unknown" reads the recovered state, never the
    /// one before.
    unanswered: Vec<T>,
}

/// What the log thread and the writer's inline path share.
struct Core<T> {
    log: Mutex<Log>,
    state: Mutex<State<T>>,
    settled: Condvar,
    since_checkpoint: AtomicU64,
    /// Frame bytes appended, headers included: a counter the caller owns (and reads live).
    written: Arc<AtomicU64>,
    on_durable: OnDurable<T>,
    /// Payload bytes after which the thread stops adding groups to a frame (the memory
    /// budget's share; a single group larger than it is a frame of its own).
    frame_bytes: u64,
    /// Where every synced frame goes next, if the log is shipped.
    shipper: Option<Arc<Shipper>>,
}

pub(crate) struct LogThread<T> {
    sender: Option<Sender<Submission<T>>>,
    core: Arc<Core<T>>,
    handle: Option<JoinHandle<()>>,
}

impl<T: Send + 'static> LogThread<T> {
    /// Starts the thread. `written` counts the frame bytes it appends (it is the caller's, so
    /// that it outlives this log and is read without asking it). A frame takes groups until
    /// their payloads pass `frame_bytes`.
    pub(crate) fn start(
        log: Log,
        on_durable: OnDurable<T>,
        written: Arc<AtomicU64>,
        frame_bytes: u64,
        shipper: Option<Arc<Shipper>>,
    ) -> std::io::Result<LogThread<T>> {
        let core = Arc::new(Core {
            state: Mutex::new(State {
                submitted: 0,
                settled: 0,
                last_seq: log.last_seq(),
                failed: None,
                unanswered: Vec::new(),
            }),
            since_checkpoint: AtomicU64::new(log.since_checkpoint()),
            written,
            log: Mutex::new(log),
            settled: Condvar::new(),
            on_durable,
            frame_bytes,
            shipper,
        });
        let (sender, receiver) = channel();
        let worker = core.clone();
        let handle = std::thread::Builder::new()
            .name("idemstore-log".into())
            .spawn(move || run(&worker, &receiver))?;
        Ok(LogThread {
            sender: Some(sender),
            core,
            handle: Some(handle),
        })
    }

    /// Makes a group durable and answers it: here when nothing else is waiting and the log
    /// thread is idle, else on the log thread.
    pub(crate) fn submit(&self, submission: Submission<T>, handoff: Handoff) {
        let idle = {
            let mut state = self.core.state.lock();
            let idle = state.settled == state.submitted;
            state.submitted += 1;
            idle
        };
        if handoff == Handoff::Inline && idle {
            // Every earlier group is settled, so answering this one now keeps the order.
            flush(&self.core, &mut vec![submission]);
            return;
        }
        let sent = self.sender.as_ref().map(|s| s.send(submission));
        if let Some(Err(unsent)) = sent {
            // The log thread is gone (it only stops when the writer drops it): settle here.
            flush(&self.core, &mut vec![unsent.0]);
        }
    }

    /// The number the next group handed over will get (see [`LogFailure::first`]).
    pub(crate) fn next_number(&self) -> u64 {
        self.core.state.lock().submitted
    }

    /// Waits until every group handed over is settled. Returns the last frame's sequence
    /// number, or the failure that stopped the log.
    pub(crate) fn wait_durable(&self) -> Result<u64, LogFailure> {
        let mut state = self.core.state.lock();
        while state.settled < state.submitted {
            self.core.settled.wait(&mut state);
        }
        match &state.failed {
            Some(failure) => Err(failure.clone()),
            None => Ok(state.last_seq),
        }
    }

    /// Whether a failure stopped the log (the writer's cue to stop adding groups to an epoch).
    pub(crate) fn failed(&self) -> bool {
        self.core.state.lock().failed.is_some()
    }

    /// The tickets of groups that failed, for the writer to answer once it has recovered.
    pub(crate) fn take_unanswered(&self) -> Vec<T> {
        std::mem::take(&mut self.core.state.lock().unanswered)
    }

    /// After a failure that wrote nothing, once the writer has rebuilt its transaction without
    /// the failed groups: take groups again. Call after [`LogThread::wait_durable`], with no
    /// group in flight. A failure of unknown outcome stays: that log is done.
    pub(crate) fn resume(&self) {
        let mut state = self.core.state.lock();
        if state
            .failed
            .as_ref()
            .is_some_and(|f| f.outcome == FailedOutcome::NotWritten)
        {
            state.failed = None;
        }
    }

    /// Frame bytes written since the last checkpoint.
    pub(crate) fn since_checkpoint(&self) -> u64 {
        self.core.since_checkpoint.load(Ordering::Relaxed)
    }

    /// The segment the next frame goes to (see [`Log::next_frame_segment`]). Called by the
    /// writer after `wait_durable`, so no group is in flight.
    pub(crate) fn next_frame_segment(&self) -> u64 {
        self.core.log.lock().next_frame_segment()
    }

    /// Every frame up to `seq` is durable in redb: reuse or delete the segments before it.
    /// Called by the writer after `wait_durable`, so no group is in flight.
    pub(crate) fn checkpointed(&self, seq: u64, keep_free: usize) {
        self.core.since_checkpoint.store(0, Ordering::Relaxed);
        self.core.log.lock().checkpointed(seq, keep_free);
    }
}

impl<T> Drop for LogThread<T> {
    fn drop(&mut self) {
        self.sender = None;
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// The log thread's loop: take everything waiting, one frame, one sync, answer in order.
fn run<T>(core: &Core<T>, receiver: &Receiver<Submission<T>>) {
    let mut batch: Vec<Submission<T>> = Vec::new();
    while let Ok(first) = receiver.recv() {
        let mut bytes = 0;
        let mut next = Some(first);
        while let Some(submission) = next.take() {
            bytes += submission.payload.as_ref().map_or(0, |p| p.len() as u64);
            batch.push(submission);
            if bytes < core.frame_bytes {
                next = receiver.try_recv().ok();
            }
        }
        flush(core, &mut batch);
    }
}

/// Writes the batch's groups as one frame, syncs it, then settles their tickets in order.
fn flush<T>(core: &Core<T>, batch: &mut Vec<Submission<T>>) {
    if batch.is_empty() {
        return;
    }
    let batch_len = batch.len() as u64;
    let failed = core.state.lock().failed.clone();
    let result = match failed {
        // Only the first failure keeps its frame: nothing is written after it.
        Some(failure) => Err((failure.error, failure.outcome, None)),
        None => write(core, batch),
    };
    let tickets: Vec<T> = batch.drain(..).map(|s| s.ticket).collect();
    let mut state = core.state.lock();
    let first = state.settled;
    let (error, outcome, unsynced) = match result {
        Ok(seq) => {
            // The groups are answered now, on the word of this frame's sync: every frame before
            // it must have been settled already, or an answer could rest on one not durable.
            assert!(
                seq.is_none_or(|seq| seq > state.last_seq),
                "log frame {seq:?} settled after frame {}: frames settle in order",
                state.last_seq
            );
            drop(state);
            // Settled (records visible, requests answered) before the writer, which waits for
            // `settled`, may publish the epoch and clear what these groups added.
            (core.on_durable)(tickets);
            let mut state = core.state.lock();
            state.settled += batch_len;
            if let Some(seq) = seq {
                state.last_seq = seq;
            }
            drop(state);
            core.settled.notify_all();
            return;
        }
        Err(failed) => failed,
    };
    // One critical section: whoever sees these groups settled also finds their tickets.
    // Answered by the writer once it has rebuilt or recovered: a caller that retries at once
    // must find the log taking groups again, and read the state after the recovery.
    state.settled += batch_len;
    state.failed.get_or_insert_with(|| LogFailure {
        first,
        error,
        outcome,
        unsynced,
    });
    state.unanswered.extend(tickets);
    drop(state);
    core.settled.notify_all();
}

/// Appends the frame for a batch: `varint(groups) ‖ payload ‖ payload ...`, which is the
/// postcard encoding of a sequence of payloads. `Ok(None)` if no group wrote anything.
fn write<T>(
    core: &Core<T>,
    batch: &[Submission<T>],
) -> Result<Option<u64>, (StoreError, FailedOutcome, Option<Unsynced>)> {
    let payloads: Vec<&Arc<Vec<u8>>> = batch.iter().filter_map(|s| s.payload.as_ref()).collect();
    if payloads.is_empty() {
        return Ok(None);
    }
    let len = payloads.iter().map(|p| p.len()).sum::<usize>() + 10;
    let mut frame = Vec::with_capacity(len);
    put_varint(&mut frame, payloads.len() as u64);
    for payload in payloads {
        frame.extend_from_slice(payload);
    }
    let appended = core.log.lock().append(&frame);
    let seq = match appended {
        Ok(seq) => seq,
        Err(AppendError::NotWritten(source)) => {
            return Err((
                StoreError::not_written("writing the log", &source),
                FailedOutcome::NotWritten,
                None,
            ));
        }
        Err(AppendError::Unknown { error, seq }) => {
            return Err((
                StoreError::outcome_unknown("syncing the log", &error),
                FailedOutcome::Unknown,
                Some(Unsynced {
                    seq,
                    payload: Arc::new(frame),
                }),
            ));
        }
    };
    let written = (frame.len() + FRAME_HEADER_LEN) as u64;
    core.written.fetch_add(written, Ordering::Relaxed);
    core.since_checkpoint.fetch_add(written, Ordering::Relaxed);
    if let Some(shipper) = &core.shipper {
        let payload = Arc::new(frame);
        let shipped = shipper.frame(ShippedFrame {
            seq,
            payload: payload.clone(),
        });
        if let Err(NotShipped(error)) = shipped {
            // Synced here, not acknowledged there: not durable as a synchronous store means
            // it. Handled as a failed sync (the store restores in place from this copy, once
            // the replica has it), so nothing of it is seen before the replica holds it.
            return Err((
                // `NotConnected`: what the HTTP layer (and any caller) can tell a replica's
                // absence by, as it tells a full disk by `StorageFull`.
                StoreError::OutcomeUnknown {
                    kind: Some(std::io::ErrorKind::NotConnected),
                    cause: format!(
                        "the frame was synced locally, but the replica did not acknowledge it: {error}"
                    )
                    .into(),
                    recovery: SHIP_RECOVERY,
                },
                FailedOutcome::Unknown,
                Some(Unsynced { seq, payload }),
            ));
        }
    }
    Ok(Some(seq))
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
