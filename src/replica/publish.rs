//! Publishing frames: pipelined, deduplicated, and fenced against any other writer.
//!
//! A call sends every message of its frames, then awaits their acknowledgements in order:
//! one round trip for the batch (at most [`IN_FLIGHT`] messages or [`IN_FLIGHT_BYTES`] are
//! unacknowledged at a time). Each message is fenced so that it is stored only right after
//! this writer's own previous message:
//!
//! - the first carries `Nats-Expected-Last-Sequence`: the stream sequence of the last message
//!   this writer knows the stream holds (from its acknowledgements since its claim);
//! - each next one carries `Nats-Expected-Last-Msg-Id`: the id of the message before it.
//!
//! A take-over appends a marker, so every later message of the old writer is refused, and no
//! message of it can land after the marker (a plain sequence on each message could: one
//! message's refusal shifts the count by one). JetStream checks the message id against its
//! duplicate window *before* these expectations, so a re-send of a batch whose
//! acknowledgements were lost is acknowledged as duplicates and goes on where the stream is.
//!
//! When an expectation fails, the stream's last message says why. If this writer wrote it
//! (its claim's token), what this writer knew was behind (an acknowledgement lost, or a
//! re-send after the duplicate window): everything up to that message is stored, and the
//! call goes on after it. Anything else (a marker, another writer's frame) means another
//! writer has the stream: [`ReplicaError::OtherWriter`], naming it.

use std::collections::VecDeque;
use std::sync::Arc;

use async_nats::jetstream::Context;
use async_nats::jetstream::context::{PublishAckFuture, PublishErrorKind};

use super::bridge::Progress;
use super::connect::Link;
use super::errors::publish_failed;
use super::messages::{self, Kind, Outgoing};
use super::stream::{self, Missing};
use super::writer;
use crate::error::ReplicaError;
use crate::model::restore::Lineage;
use crate::wal::ship::ShippedFrame;

/// The most messages awaiting an acknowledgement (JetStream's client allows 5,000).
const IN_FLIGHT: usize = 256;
/// The most payload bytes awaiting an acknowledgement (at least one message).
const IN_FLIGHT_BYTES: usize = 16 << 20;
/// How many times one call finds the stream not where this writer thought, and goes on.
const ROUNDS: usize = 4;

/// How a round of sends ended early.
enum Stop {
    /// Message `at` (of the round) was refused by its fence; those before it are stored.
    Fenced {
        at: usize,
    },
    Failed(ReplicaError),
}

/// Publishes `frames` (see the module doc).
pub(super) async fn publish(
    link: Arc<Link>,
    js: Context,
    frames: Vec<ShippedFrame>,
    lineage: Lineage,
    progress: Progress,
) -> Result<(), ReplicaError> {
    let claimed = link.writer.lock().clone().ok_or_else(writer::not_claimed)?;
    let mut last_frame = claimed.last_frame;
    if frames.first().is_some_and(|f| f.seq > last_frame + 1) {
        // Perhaps a snapshot's commit went through unacknowledged: ask the stream.
        link.connected().await;
        last_frame = writer::refresh_last_frame(&link, &js).await?;
    }
    let fresh: Vec<ShippedFrame> = frames.into_iter().filter(|f| f.seq > last_frame).collect();
    let Some(first) = fresh.first() else {
        return Ok(()); // all already in the stream
    };
    link.connected().await;
    if first.seq != last_frame + 1 {
        return Err(ReplicaError::Refused {
            detail: format!(
                "frame {} does not follow the stream's last frame {last_frame}: frames {} to {} were never shipped (a snapshot must come first)",
                first.seq,
                last_frame + 1,
                first.seq - 1
            ),
        });
    }
    if let Some(pair) = fresh.windows(2).find(|w| w[1].seq != w[0].seq + 1) {
        return Err(ReplicaError::Refused {
            detail: format!(
                "frame {} follows frame {} in one batch: frames must be consecutive",
                pair[1].seq, pair[0].seq
            ),
        });
    }

    let out = messages::split(
        &fresh,
        &claimed.token,
        messages::chunk_size(link.client.max_payload()),
    );
    let mut from = 0;
    for _ in 0..ROUNDS {
        let last_seq = link.writer.lock().as_ref().map_or(0, |c| c.last_seq);
        match round(
            &link,
            &js,
            &fresh,
            &lineage,
            &claimed.token,
            &out[from..],
            last_seq,
            &progress,
        )
        .await
        {
            Ok(()) => return Ok(()),
            Err(Stop::Failed(e)) => return Err(e),
            Err(Stop::Fenced { at }) => {
                from = resume(&link, &js, &out, from + at, &claimed.token).await?;
                if from == out.len() {
                    return Ok(());
                }
            }
        }
    }
    Err(ReplicaError::Refused {
        detail: format!(
            "the stream {} kept ending elsewhere than this writer's last message; try again",
            link.names.stream
        ),
    })
}

/// Sends `out` fenced after `last_seq` and awaits every acknowledgement.
#[expect(
    clippy::too_many_arguments,
    reason = "one round's whole context, private"
)]
async fn round(
    link: &Link,
    js: &Context,
    frames: &[ShippedFrame],
    lineage: &Lineage,
    token: &str,
    out: &[Outgoing],
    last_seq: u64,
    progress: &Progress,
) -> Result<(), Stop> {
    let mut pending: VecDeque<(usize, PublishAckFuture)> = VecDeque::new();
    let mut pending_bytes = 0;
    for (k, message) in out.iter().enumerate() {
        while !pending.is_empty()
            && (pending.len() >= IN_FLIGHT || pending_bytes + message.bytes.len() > IN_FLIGHT_BYTES)
        {
            if let Some((j, ack)) = pending.pop_front() {
                pending_bytes -= out[j].bytes.len();
                settle(link, out, j, ack, progress).await?;
            }
        }
        let publish = messages::publish(message, frames, lineage, token);
        let publish = match k {
            0 => publish.expected_last_sequence(last_seq),
            _ => publish.expected_last_message_id(&out[k - 1].id),
        };
        let ack = js
            .send_publish(link.names.subject.clone(), publish)
            .await
            .map_err(|e| Stop::Failed(publish_failed(&link.client, &sending(link, message), &e)))?;
        pending_bytes += message.bytes.len();
        pending.push_back((k, ack));
    }
    while let Some((j, ack)) = pending.pop_front() {
        settle(link, out, j, ack, progress).await?;
    }
    Ok(())
}

/// Awaits message `j`'s acknowledgement and records it.
async fn settle(
    link: &Link,
    out: &[Outgoing],
    j: usize,
    ack: PublishAckFuture,
    progress: &Progress,
) -> Result<(), Stop> {
    match ack.await {
        Ok(ack) => {
            stored(link, &out[j], ack.sequence);
            progress.tick();
            Ok(())
        }
        Err(e)
            if matches!(
                e.kind(),
                PublishErrorKind::WrongLastSequence | PublishErrorKind::WrongLastMessageId
            ) =>
        {
            Err(Stop::Fenced { at: j })
        }
        Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
            Err(Stop::Failed(no_stream(link, &out[j]).await))
        }
        Err(e) => Err(Stop::Failed(publish_failed(
            &link.client,
            &sending(link, &out[j]),
            &e,
        ))),
    }
}

/// Records that the stream holds `message` at `at` (a duplicate's acknowledgement names
/// where the first copy is).
fn stored(link: &Link, message: &Outgoing, at: u64) {
    if let Some(claimed) = link.writer.lock().as_mut() {
        claimed.last_seq = claimed.last_seq.max(at);
        if message.part.completes() {
            claimed.last_frame = claimed.last_frame.max(message.frame);
        }
    }
}

/// A publish that found no stream: the broker lost it, or it is between leaders (a cluster's
/// election answers "no responders" too). Asked once: gone is [`ReplicaError::Lost`].
async fn no_stream(link: &Link, message: &Outgoing) -> ReplicaError {
    let js = async_nats::jetstream::new(link.client.clone());
    match stream::open(link, &js, Missing::Lost).await {
        Err(e @ ReplicaError::Lost { .. }) => e,
        _ => ReplicaError::Unreachable {
            detail: format!(
                "{}: no server answered for the stream",
                sending(link, message)
            ),
        },
    }
}

fn sending(link: &Link, message: &Outgoing) -> String {
    format!(
        "publishing frame {} to the stream {}",
        message.frame, link.names.stream
    )
}

/// After message `at` of `out` was refused by its fence: where to go on (an index into
/// `out`; `out.len()` when the stream holds them all), or who else writes the stream.
async fn resume(
    link: &Link,
    js: &Context,
    out: &[Outgoing],
    at: usize,
    token: &str,
) -> Result<usize, ReplicaError> {
    let log = stream::open(link, js, Missing::Lost).await?;
    let tail = stream::tail(link, &log).await?;
    let acknowledged = link.writer.lock().as_ref().map_or(0, |c| c.last_frame);
    let last = match &tail.last {
        Some((
            Kind::Frame {
                writer, seq, part, ..
            },
            _,
        )) if writer == token => Some((*seq, *part)),
        Some((Kind::Frame { .. }, _)) | Some((Kind::Marker { .. }, _)) => {
            return Err(writer::other_writer(link, js, tail.last.as_ref()).await);
        }
        // Emptied by a snapshot: whose, the writer entry says.
        None => {
            let snapshot = writer::still_writer(link, js).await?;
            writer::lost_below(link, snapshot.map_or(0, |s| s.seq), acknowledged)?;
            None
        }
    };
    if let Some((seq, _)) = last {
        let snapshot = writer::still_writer(link, js).await?;
        writer::lost_below(link, seq.max(snapshot.map_or(0, |s| s.seq)), acknowledged)?;
    }
    if let Some(claimed) = link.writer.lock().as_mut() {
        claimed.last_seq = tail.last_seq;
        if let Some((seq, part)) = last
            && part.completes()
        {
            claimed.last_frame = claimed.last_frame.max(seq);
        }
    }
    let Some((seq, part)) = last else {
        return Ok(at);
    };
    if let Some(j) = out.iter().position(|m| m.frame == seq && m.part == part) {
        for message in &out[..=j] {
            stored(link, message, 0);
        }
        return Ok(j + 1);
    }
    let first = out.first().map_or(0, |m| m.frame);
    let last_out = out.last().map_or(0, |m| m.frame);
    if seq < first {
        Ok(0)
    } else if seq > last_out {
        Ok(out.len())
    } else {
        // Frame `seq` was sent in other pieces (a server with another max_payload): send it
        // again whole from its first piece; a reader drops the torn prefix.
        Ok(out.iter().position(|m| m.frame == seq).unwrap_or(0))
    }
}
