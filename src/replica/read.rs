//! Reading the frames back (a restore, a standby's poll): every message from the first one
//! past the frame asked for (found by a binary search) to the stream's last as the read
//! begins, by direct gets (a few ahead), joined into frames and checked to follow on from one
//! another.
//!
//! The reader runs on the replica's runtime; the caller's callback runs on the caller's
//! thread, so frames cross over a channel, a few at a time (each carries a permit the caller
//! gives back once its callback returned, which keeps the reader at most a few frames ahead).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::Sender;

use async_nats::jetstream::Context;
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::bridge::Progress;
use super::connect::Link;
use super::messages::{Kind, Part};
use super::stream::{self, Missing};
use crate::error::ReplicaError;
use crate::model::restore::Lineage;
use crate::wal::ship::ShippedFrame;

/// How many messages are requested ahead of the one being joined.
const AHEAD: usize = 8;
/// How many frames may wait for the caller's callback.
pub(super) const WAITING: usize = 4;

/// What the reader hands the caller.
pub(super) enum Item {
    /// A frame to call back with; the permit goes back once the callback returned.
    Frame(ShippedFrame, Lineage, OwnedSemaphorePermit),
    /// The read ended: the stream's last frame, or why it failed.
    Done(Result<u64, ReplicaError>),
}

/// Reads every frame after `after` (see the module doc) and sends it to `tx`.
pub(super) async fn read(
    link: Arc<Link>,
    js: Context,
    after: u64,
    tx: Sender<Item>,
    permits: Arc<Semaphore>,
    progress: Progress,
) {
    let done = frames(&link, &js, after, &tx, permits, &progress).await;
    let _ = tx.send(Item::Done(done));
}

async fn frames(
    link: &Arc<Link>,
    js: &Context,
    after: u64,
    tx: &Sender<Item>,
    permits: Arc<Semaphore>,
    progress: &Progress,
) -> Result<u64, ReplicaError> {
    link.connected().await;
    let log = stream::open(link, js, Missing::Refuse).await?;
    let tail = stream::tail(link, &log).await?;
    let mut joiner = Joiner::new(&link.names.stream, after);
    if tail.last.is_none() {
        return Ok(joiner.finish());
    }
    // Straight to the first message past `after` (a binary search by direct gets): a standby
    // that asks every poll must not read the whole tail again each time.
    let start = match after {
        0 => tail.first_seq,
        _ => stream::first_after(link, &log, &tail, after).await?,
    };
    let mut ahead = Ahead::default();
    let mut next = start;
    for at in start..=tail.last_seq {
        while next <= tail.last_seq && ahead.0.len() < AHEAD {
            ahead.0.push_back(fetch(link, &log, next));
            next += 1;
        }
        let (kind, message) = match ahead.0.pop_front() {
            Some(fetching) => fetching.await.unwrap_or_else(|e| {
                Err(ReplicaError::Unreachable {
                    detail: format!("reading message {at}: {e}"),
                })
            })?,
            None => break,
        };
        progress.tick();
        if let Some((frame, lineage)) = joiner.push(at, kind, &message.payload)? {
            let permit =
                permits
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| ReplicaError::Unreachable {
                        detail: "the restore stopped reading".to_owned(),
                    })?;
            if tx.send(Item::Frame(frame, lineage, permit)).is_err() {
                return Ok(joiner.finish()); // the caller stopped waiting
            }
        }
    }
    Ok(joiner.finish())
}

/// Fetches message `at`, which the stream must hold, on a task of its own.
fn fetch(
    link: &Arc<Link>,
    log: &Stream,
    at: u64,
) -> tokio::task::JoinHandle<Result<(Kind, StreamMessage), ReplicaError>> {
    let (link, log) = (link.clone(), log.clone());
    tokio::spawn(async move { stream::held(&link, &log, at).await })
}

/// The fetches under way, aborted if the read stops.
#[derive(Default)]
struct Ahead(VecDeque<tokio::task::JoinHandle<Result<(Kind, StreamMessage), ReplicaError>>>);

impl Drop for Ahead {
    fn drop(&mut self) {
        for fetching in &self.0 {
            fetching.abort();
        }
    }
}

/// Joins messages into frames and checks that they follow on (a pure state machine).
#[derive(Debug)]
pub(super) struct Joiner {
    stream: String,
    after: u64,
    /// The last complete frame seen.
    last: Option<u64>,
    /// A chunked frame being joined: its number, the next chunk expected, the chunk count,
    /// its lineage and its bytes so far.
    partial: Option<Partial>,
}

#[derive(Debug)]
struct Partial {
    seq: u64,
    next: u32,
    count: u32,
    lineage: Lineage,
    bytes: Vec<u8>,
}

impl Joiner {
    pub(super) fn new(stream: &str, after: u64) -> Joiner {
        Joiner {
            stream: stream.to_owned(),
            after,
            last: None,
            partial: None,
        }
    }

    /// Takes the message at `at`; returns the frame it completes, if the caller wants it
    /// (after `after`, and not a duplicate).
    pub(super) fn push(
        &mut self,
        at: u64,
        kind: Kind,
        payload: &[u8],
    ) -> Result<Option<(ShippedFrame, Lineage)>, ReplicaError> {
        let (seq, part, lineage) = match kind {
            Kind::Marker { .. } => {
                self.partial = None; // a frame its writer never finished
                return Ok(None);
            }
            Kind::Frame {
                seq, part, lineage, ..
            } => (seq, part, lineage),
        };
        let (whole, lineage) = match part {
            Part::Whole => {
                self.partial = None; // a torn chunked attempt, sent again whole
                (payload.to_vec(), lineage)
            }
            Part::Chunk { index: 1, count } => {
                // A first chunk starts the frame afresh: a torn attempt's prefix is dropped.
                self.partial = (count > 1).then(|| Partial {
                    seq,
                    next: 2,
                    count,
                    lineage,
                    bytes: payload.to_vec(),
                });
                if self.partial.is_some() {
                    return Ok(None);
                }
                (payload.to_vec(), lineage)
            }
            Part::Chunk { index, count } => {
                let Some(partial) = self
                    .partial
                    .as_mut()
                    .filter(|p| p.seq == seq && p.next == index && p.count == count)
                else {
                    return Err(ReplicaError::Corrupt {
                        detail: format!(
                            "message {at} of the stream {} is chunk {index}/{count} of frame {seq}, which does not follow the message before it",
                            self.stream
                        ),
                    });
                };
                partial.bytes.extend_from_slice(payload);
                partial.next += 1;
                if index < count {
                    return Ok(None);
                }
                match self.partial.take() {
                    Some(joined) => (joined.bytes, joined.lineage),
                    None => (Vec::new(), lineage), // just matched: always there
                }
            }
        };
        self.complete(seq, lineage, whole)
    }

    fn complete(
        &mut self,
        seq: u64,
        lineage: Lineage,
        payload: Vec<u8>,
    ) -> Result<Option<(ShippedFrame, Lineage)>, ReplicaError> {
        let needed = self.last.unwrap_or(0).max(self.after) + 1;
        if seq > needed {
            return Err(ReplicaError::Corrupt {
                detail: format!(
                    "the stream {} lacks frames {needed} to {}: it goes on at frame {seq}",
                    self.stream,
                    seq - 1
                ),
            });
        }
        self.last = Some(self.last.map_or(seq, |last| last.max(seq)));
        if seq < needed {
            return Ok(None); // at or before `after`, or a duplicate
        }
        let frame = ShippedFrame {
            seq,
            payload: Arc::new(payload),
        };
        Ok(Some((frame, lineage)))
    }

    /// The stream's last frame, or `after` if it is further.
    pub(super) fn finish(&self) -> u64 {
        self.last.unwrap_or(0).max(self.after)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: u64, part: Part) -> Kind {
        Kind::Frame {
            seq,
            part,
            lineage: Lineage::of(crate::model::replica::Guarantee::Complete),
            writer: "w".to_owned(),
        }
    }

    fn seqs(joiner: &mut Joiner, kinds: Vec<Kind>) -> Result<Vec<u64>, ReplicaError> {
        let mut out = Vec::new();
        for (at, kind) in kinds.into_iter().enumerate() {
            if let Some((frame, _)) = joiner.push(at as u64 + 1, kind, b"x")? {
                out.push(frame.seq);
            }
        }
        Ok(out)
    }

    #[test]
    fn frames_after_the_start_are_given_in_order_skipping_markers() -> Result<(), ReplicaError> {
        let mut joiner = Joiner::new("S", 2);
        let kinds = vec![
            frame(1, Part::Whole),
            frame(2, Part::Whole),
            Kind::Marker { after: 2, epoch: 1 },
            frame(3, Part::Chunk { index: 1, count: 2 }),
            frame(3, Part::Chunk { index: 2, count: 2 }),
            frame(4, Part::Whole),
        ];
        assert_eq!(seqs(&mut joiner, kinds)?, vec![3, 4]);
        assert_eq!(joiner.finish(), 4);
        Ok(())
    }

    #[test]
    fn a_torn_chunked_attempt_is_dropped_when_sent_again() -> Result<(), ReplicaError> {
        let mut joiner = Joiner::new("S", 0);
        let kinds = vec![
            frame(1, Part::Chunk { index: 1, count: 3 }),
            frame(1, Part::Chunk { index: 2, count: 3 }),
            frame(1, Part::Chunk { index: 1, count: 3 }),
            frame(1, Part::Chunk { index: 2, count: 3 }),
            frame(1, Part::Chunk { index: 3, count: 3 }),
        ];
        assert_eq!(seqs(&mut joiner, kinds)?, vec![1]);
        Ok(())
    }

    #[test]
    fn a_gap_names_the_missing_frames() {
        let mut joiner = Joiner::new("S", 0);
        let kinds = vec![frame(1, Part::Whole), frame(4, Part::Whole)];
        let Err(ReplicaError::Corrupt { detail }) = seqs(&mut joiner, kinds) else {
            panic!("a gap was accepted");
        };
        assert!(detail.contains("frames 2 to 3"), "{detail}");
    }

    #[test]
    fn a_stream_that_starts_late_is_a_gap_unless_a_snapshot_covers_it() -> Result<(), ReplicaError>
    {
        let kinds = || vec![frame(5, Part::Whole), frame(6, Part::Whole)];
        assert!(seqs(&mut Joiner::new("S", 0), kinds()).is_err());
        assert_eq!(seqs(&mut Joiner::new("S", 4), kinds())?, vec![5, 6]);
        Ok(())
    }
}
