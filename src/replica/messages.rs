//! The log stream's messages: frames (whole, or in chunks) and take-over markers.
//!
//! ```text
//! frame    headers  Nats-Msg-Id: <writer token>:<seq>[:<i>/<n>]   (dedup of a re-send)
//!                   Idemstore-Seq: <seq>
//!                   Idemstore-Guarantee: complete | may-lag
//!                   Idemstore-Writer: <writer token>                 (the claim that wrote it)
//!                   Idemstore-Chunk: <i>/<n>                         (only when split; 1-based)
//!          payload  the frame's payload, or its i-th piece
//! marker   headers  Idemstore-Takeover: <the last frame the restore read>
//!                   Nats-Msg-Id: takeover:<nanoseconds>
//!          payload  the new writer's identity, JSON
//! ```
//!
//! A frame larger than one message (the server's `max_payload`, 1 MiB by default, less room
//! for headers) is split into `n` consecutive chunk messages; a reader joins them. A chunk
//! `1/n` starts the frame afresh, so an attempt torn by a crash and sent again from its first
//! chunk leaves a prefix the reader drops.

use std::ops::Range;

use async_nats::jetstream::message::PublishMessage as Publish;
use async_nats::jetstream::message::StreamMessage;
use async_nats::{HeaderMap, HeaderValue};

use crate::error::ReplicaError;
use crate::model::clock::Timestamp;
use crate::model::replica::{Guarantee, WriterIdentity};
use crate::model::restore::Lineage;
use crate::wal::ship::ShippedFrame;

pub(super) const SEQ: &str = "Idemstore-Seq";
pub(super) const GUARANTEE: &str = "Idemstore-Guarantee";
pub(super) const WRITER: &str = "Idemstore-Writer";
pub(super) const CHUNK: &str = "Idemstore-Chunk";
pub(super) const TAKEOVER: &str = "Idemstore-Takeover";
/// The writer epoch of a frame's store, or the one a take-over's marker starts (absent in
/// streams written before epochs: 0).
pub(super) const EPOCH: &str = "Idemstore-Epoch";
/// The end of the restore window the frame's store was inside, in ms since the epoch.
pub(super) const WINDOW_END: &str = "Idemstore-Window-End";
/// The frame's store's clock when it shipped the frame, in ms since the epoch.
pub(super) const NEWEST: &str = "Idemstore-Newest";

/// Room left in each message for its headers (ours take under 300 bytes).
const HEADER_ROOM: usize = 4096;

/// Which part of a frame a message holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// All of it.
    Whole,
    /// Piece `index` (1-based) of `count`.
    Chunk { index: u32, count: u32 },
}

impl Part {
    /// Whether the frame is complete with this message.
    pub(super) fn completes(self) -> bool {
        match self {
            Part::Whole => true,
            Part::Chunk { index, count } => index == count,
        }
    }
}

/// What one message of the log stream is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Kind {
    /// A frame, or a piece of one.
    Frame {
        seq: u64,
        part: Part,
        /// What its store was: epoch, guarantee, window, time.
        lineage: Lineage,
        /// The claim that wrote it (see `writer.rs`).
        writer: String,
    },
    /// A take-over: the stream goes on after frame `after` with another writer, at `epoch`.
    Marker { after: u64, epoch: u64 },
}

impl Kind {
    /// The frame this message belongs to, or follows (a marker): never decreases along the
    /// stream, which is what lets a snapshot find where to purge by bisection.
    pub(super) fn frame(&self) -> u64 {
        match self {
            Kind::Frame { seq, .. } => *seq,
            Kind::Marker { after, .. } => *after,
        }
    }

    /// The writer epoch the message carries.
    pub(super) fn epoch(&self) -> u64 {
        match self {
            Kind::Frame { lineage, .. } => lineage.epoch,
            Kind::Marker { epoch, .. } => *epoch,
        }
    }
}

/// What the message at stream sequence `at` of `stream` is.
pub(super) fn parse(stream: &str, at: u64, message: &StreamMessage) -> Result<Kind, ReplicaError> {
    let header = |name: &str| message.headers.get(name).map(|v| v.as_str());
    let bad = |what: &str| ReplicaError::Corrupt {
        detail: format!("message {at} of stream {stream} {what}"),
    };
    let number = |name: &str, what: &str| -> Result<Option<u64>, ReplicaError> {
        header(name)
            .map(|text| text.parse().map_err(|_| bad(what)))
            .transpose()
    };
    let epoch = number(EPOCH, "has an unreadable writer epoch")?.unwrap_or(0);
    if let Some(after) = header(TAKEOVER) {
        let after = after
            .parse()
            .map_err(|_| bad("is a take-over marker with an unreadable frame number"))?;
        return Ok(Kind::Marker { after, epoch });
    }
    let seq: u64 = header(SEQ)
        .ok_or_else(|| bad("is neither a frame nor a take-over marker"))?
        .parse()
        .map_err(|_| bad("has an unreadable frame number"))?;
    let guarantee = header(GUARANTEE)
        .and_then(Guarantee::parse)
        .ok_or_else(|| bad("has no readable guarantee"))?;
    let lineage = Lineage {
        epoch,
        guarantee,
        window_end: number(WINDOW_END, "has an unreadable window end")?.map(Timestamp::from_millis),
        newest: Timestamp::from_millis(number(NEWEST, "has an unreadable time")?.unwrap_or(0)),
    };
    let writer = header(WRITER)
        .ok_or_else(|| bad("names no writer"))?
        .to_owned();
    let part = match header(CHUNK) {
        None => Part::Whole,
        Some(text) => {
            let parsed = text
                .split_once('/')
                .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
            match parsed {
                Some((index, count)) if index >= 1 && index <= count => {
                    Part::Chunk { index, count }
                }
                _ => return Err(bad("has an unreadable chunk number")),
            }
        }
    };
    Ok(Kind::Frame {
        seq,
        part,
        lineage,
        writer,
    })
}

/// The largest payload of one message when the server takes at most `max_payload` bytes.
pub(super) fn chunk_size(max_payload: usize) -> usize {
    max_payload.saturating_sub(HEADER_ROOM).max(1024)
}

/// One message to send: a frame, or a piece of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Outgoing {
    /// Which of the call's frames.
    pub(super) index: usize,
    /// That frame's sequence number.
    pub(super) frame: u64,
    pub(super) part: Part,
    /// The bytes of the frame's payload it carries.
    pub(super) bytes: Range<usize>,
    /// Its `Nats-Msg-Id`.
    pub(super) id: String,
}

/// The messages that carry `frames`, in order, each at most `chunk` bytes of payload.
pub(super) fn split(frames: &[ShippedFrame], token: &str, chunk: usize) -> Vec<Outgoing> {
    assert!(chunk > 0, "a chunk holds at least one byte");
    let mut out = Vec::with_capacity(frames.len());
    for (index, frame) in frames.iter().enumerate() {
        let len = frame.payload.len();
        if len <= chunk {
            out.push(Outgoing {
                index,
                frame: frame.seq,
                part: Part::Whole,
                bytes: 0..len,
                id: format!("{token}:{}", frame.seq),
            });
            continue;
        }
        let count = len.div_ceil(chunk);
        let count_u32 = u32::try_from(count).unwrap_or(u32::MAX);
        for i in 0..count {
            let index_u32 = u32::try_from(i + 1).unwrap_or(u32::MAX);
            out.push(Outgoing {
                index,
                frame: frame.seq,
                part: Part::Chunk {
                    index: index_u32,
                    count: count_u32,
                },
                bytes: i * chunk..((i + 1) * chunk).min(len),
                id: format!("{token}:{}:{}/{count}", frame.seq, i + 1),
            });
        }
    }
    out
}

/// The message `out` of `frames` as it is published (without its fencing header).
pub(super) fn publish(
    out: &Outgoing,
    frames: &[ShippedFrame],
    lineage: &Lineage,
    token: &str,
) -> Publish {
    let mut headers = HeaderMap::new();
    headers.insert(SEQ, HeaderValue::from(out.frame));
    headers.insert(GUARANTEE, lineage.guarantee.as_str());
    headers.insert(EPOCH, HeaderValue::from(lineage.epoch));
    if let Some(end) = lineage.window_end {
        headers.insert(WINDOW_END, HeaderValue::from(end.as_millis()));
    }
    headers.insert(NEWEST, HeaderValue::from(lineage.newest.as_millis()));
    headers.insert(WRITER, token);
    if let Part::Chunk { index, count } = out.part {
        headers.insert(CHUNK, format!("{index}/{count}").as_str());
    }
    let payload = frames[out.index].payload[out.bytes.clone()].to_vec();
    Publish::build()
        .payload(payload.into())
        .headers(headers)
        .message_id(&out.id)
}

/// The take-over marker after frame `after`, by `me`.
pub(super) fn marker(after: u64, epoch: u64, me: &WriterIdentity) -> Result<Publish, ReplicaError> {
    let identity = serde_json::to_vec(me).map_err(|e| ReplicaError::Refused {
        detail: format!("could not write the new writer's identity: {e}"),
    })?;
    let nanos = super::unix_nanos();
    let mut headers = HeaderMap::new();
    headers.insert(TAKEOVER, HeaderValue::from(after));
    headers.insert(EPOCH, HeaderValue::from(epoch));
    Ok(Publish::build()
        .payload(identity.into())
        .headers(headers)
        .message_id(format!("takeover:{nanos}")))
}

/// The identity a marker's payload names, if it is readable.
pub(super) fn marker_identity(message: &StreamMessage) -> Option<WriterIdentity> {
    serde_json::from_slice(&message.payload).ok()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn frame(seq: u64, len: usize) -> ShippedFrame {
        ShippedFrame {
            seq,
            payload: Arc::new(vec![seq as u8; len]),
        }
    }

    #[test]
    fn a_large_frame_is_split_into_consecutive_chunks_that_cover_it() {
        let frames = [frame(7, 10), frame(8, 25), frame(9, 20)];
        let out = split(&frames, "t", 10);
        let parts: Vec<_> = out
            .iter()
            .map(|o| (o.frame, o.part, o.bytes.clone()))
            .collect();
        assert_eq!(
            parts,
            vec![
                (7, Part::Whole, 0..10),
                (8, Part::Chunk { index: 1, count: 3 }, 0..10),
                (8, Part::Chunk { index: 2, count: 3 }, 10..20),
                (8, Part::Chunk { index: 3, count: 3 }, 20..25),
                (9, Part::Chunk { index: 1, count: 2 }, 0..10),
                (9, Part::Chunk { index: 2, count: 2 }, 10..20),
            ]
        );
        assert_eq!(out[2].id, "t:8:2/3");
        assert_eq!(out[0].id, "t:7");
        assert!(out.iter().filter(|o| o.part.completes()).count() == 3);
    }

    #[test]
    fn the_chunk_size_leaves_room_for_headers() {
        assert_eq!(chunk_size(1 << 20), (1 << 20) - HEADER_ROOM);
        assert_eq!(chunk_size(100), 1024);
    }
}
