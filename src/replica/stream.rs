//! The log stream: opened (or created), its messages read one at a time, where it ends, and
//! where the frames after a given one begin.

use std::time::Duration;

use async_nats::jetstream::Context;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::{GetStreamError, GetStreamErrorKind};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{
    Config, DirectGetErrorKind, LastRawMessageErrorKind, StorageType, Stream,
};

use super::connect::Link;
use super::errors::failed;
use super::messages::{self, Kind};
use crate::error::ReplicaError;

/// How long the stream remembers a message id to drop a re-send of it (JetStream's default).
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How often reading the stream's end is tried again when the stream changes under it.
const TAIL_TRIES: usize = 3;

/// Whether a missing stream is created or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Missing {
    /// Create it (a writer's first claim, a take-over).
    Create,
    /// Refuse, naming it (a restore: there is nothing to read).
    Refuse,
    /// The broker lost it ([`ReplicaError::Lost`]): a writer that claimed it finds it gone.
    Lost,
}

/// Whether `error` says the stream does not exist.
pub(super) fn not_found(error: &GetStreamError) -> bool {
    matches!(error.kind(), GetStreamErrorKind::JetStream(e) if e.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

/// After a bucket `name` failed to open with `opened`: `Ok` if its stream `stream` is
/// really absent (the bucket may be made), else the opening's failure.
pub(super) async fn bucket_absent<E: std::error::Error + 'static>(
    link: &Link,
    js: &Context,
    stream: &str,
    name: &str,
    opened: &E,
) -> Result<(), ReplicaError> {
    match js.get_stream(stream).await {
        Err(e) if not_found(&e) => Ok(()),
        _ => Err(failed(
            &link.client,
            &format!("opening the bucket {name}"),
            opened,
        )),
    }
}

/// The log stream; created if `missing` says so.
pub(super) async fn open(
    link: &Link,
    js: &Context,
    missing: Missing,
) -> Result<Stream, ReplicaError> {
    let name = &link.names.stream;
    match js.get_stream(name).await {
        Ok(stream) => return Ok(stream),
        Err(e) if not_found(&e) && missing == Missing::Create => {}
        Err(e) if not_found(&e) && missing == Missing::Lost => {
            return Err(ReplicaError::Lost {
                detail: format!("the stream {name} is gone from NATS at {}", link.url),
            });
        }
        Err(e) if not_found(&e) => {
            return Err(ReplicaError::Refused {
                detail: format!(
                    "the stream {name} does not exist on NATS at {}: nothing was ever shipped under the name {:?} (check the name and the server)",
                    link.url, link.names.store
                ),
            });
        }
        Err(e) => {
            return Err(failed(
                &link.client,
                &format!("opening the stream {name}"),
                &e,
            ));
        }
    }
    let config = Config {
        name: name.clone(),
        description: Some(format!(
            "idemstore write-ahead log of the store {:?}: frames and take-over markers",
            link.names.store
        )),
        subjects: vec![link.names.subject.clone()],
        storage: StorageType::File,
        duplicate_window: DUPLICATE_WINDOW,
        allow_direct: true,
        deny_delete: true,
        num_replicas: link.replicas,
        ..Default::default()
    };
    js.create_stream(config)
        .await
        .map_err(|e| failed(&link.client, &format!("creating the stream {name}"), &e))
}

/// The message at stream sequence `at`; `None` if the stream does not hold it (purged).
pub(super) async fn message(
    link: &Link,
    stream: &Stream,
    at: u64,
) -> Result<Option<StreamMessage>, ReplicaError> {
    let what = || format!("reading message {at} of the stream {}", link.names.stream);
    if stream.cached_info().config.allow_direct {
        match stream.direct_get(at).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == DirectGetErrorKind::NotFound => Ok(None),
            Err(e) => Err(failed(&link.client, &what(), &e)),
        }
    } else {
        match stream.get_raw_message(at).await {
            Ok(message) => Ok(Some(message)),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(failed(&link.client, &what(), &e)),
        }
    }
}

/// The message at `at`, which the stream must hold.
pub(super) async fn held(
    link: &Link,
    stream: &Stream,
    at: u64,
) -> Result<(Kind, StreamMessage), ReplicaError> {
    let name = &link.names.stream;
    let message = message(link, stream, at).await?.ok_or_else(|| ReplicaError::Corrupt {
        detail: format!(
            "message {at} of the stream {name} is gone while it was being read (a snapshot purged it meanwhile?); read again"
        ),
    })?;
    Ok((messages::parse(name, at, &message)?, message))
}

/// Where the stream ends.
#[derive(Debug, Clone)]
pub(super) struct Tail {
    /// The stream's first sequence still held (its last + 1 when it holds none).
    pub(super) first_seq: u64,
    /// The sequence of the last message ever stored (0 if none; kept after a purge).
    pub(super) last_seq: u64,
    /// The last complete frame in the stream's messages (what a marker follows, if a marker
    /// is last); 0 if it holds none.
    pub(super) last_frame: u64,
    /// The last message, if the stream holds any.
    pub(super) last: Option<(Kind, StreamMessage)>,
}

/// Where the stream ends now.
pub(super) async fn tail(link: &Link, stream: &Stream) -> Result<Tail, ReplicaError> {
    let name = &link.names.stream;
    for _ in 0..TAIL_TRIES {
        let info = stream.get_info().await.map_err(|e| {
            failed(
                &link.client,
                &format!("reading the state of the stream {name}"),
                &e,
            )
        })?;
        let state = info.state;
        if state.messages == 0 {
            return Ok(Tail {
                first_seq: state.first_sequence,
                last_seq: state.last_sequence,
                last_frame: 0,
                last: None,
            });
        }
        let Some(message) = message(link, stream, state.last_sequence).await? else {
            continue; // purged between the two reads
        };
        let kind = messages::parse(name, state.last_sequence, &message)?;
        let last_frame = match &kind {
            Kind::Frame { seq, part, .. } if part.completes() => *seq,
            // A frame torn by its writer's crash: the one before it is the last complete.
            Kind::Frame { seq, .. } => seq.saturating_sub(1),
            Kind::Marker { after, .. } => *after,
        };
        return Ok(Tail {
            first_seq: state.first_sequence,
            last_seq: state.last_sequence,
            last_frame,
            last: Some((kind, message)),
        });
    }
    Err(ReplicaError::Refused {
        detail: format!("the stream {name} kept changing while its end was read; try again"),
    })
}

/// The stream sequence of the first message that belongs to a frame after `frame` (or is a
/// marker after one), found by bisection: a message's frame never decreases along the
/// stream. `tail.last_seq + 1` if every message is at or before `frame`.
pub(super) async fn first_after(
    link: &Link,
    stream: &Stream,
    tail: &Tail,
    frame: u64,
) -> Result<u64, ReplicaError> {
    let (mut low, mut high) = (tail.first_seq, tail.last_seq + 1);
    if tail.last.is_none() {
        return Ok(high);
    }
    // Invariant: every message before `low` is at or before `frame`; `high` and every
    // message after it are past `frame` (or beyond the tail).
    while low < high {
        let middle = low + (high - low) / 2;
        let (kind, _) = held(link, stream, middle).await?;
        if kind.frame() > frame {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Ok(low)
}
