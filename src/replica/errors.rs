//! What a NATS failure means for the store: [`ReplicaError::Unreachable`] when the server did
//! not answer (a time-out, no connection, no responder: shipping tries again), and
//! [`ReplicaError::Refused`] when it answered no.

use std::error::Error as StdError;
use std::fmt::Display;
use std::time::Duration;

use async_nats::Client;
use async_nats::connection::State;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};

use crate::error::ReplicaError;

/// A failure of `what`, classified: a server's error answer anywhere in the chain is a
/// refusal; a time-out, a broken or absent connection, or a request nobody answered is
/// unreachable; anything else is a refusal unless the connection is down.
pub(super) fn failed(
    client: &Client,
    what: &str,
    error: &(dyn StdError + 'static),
) -> ReplicaError {
    let detail = format!("{what}: {error}");
    if answered(error) {
        return ReplicaError::Refused { detail };
    }
    if silent(error) || client.connection_state() != State::Connected {
        return ReplicaError::Unreachable { detail };
    }
    ReplicaError::Refused { detail }
}

/// Whether a publish failed because JetStream is away rather than because of the message:
/// the server not answering, the connection broken, the stream full of unacknowledged
/// messages, or no stream answering for the subject. The log shipped here and the outbox's
/// relay (`relay::JetStreamSink`) draw the same line.
pub(crate) fn outage(kind: &PublishErrorKind) -> bool {
    matches!(
        kind,
        PublishErrorKind::TimedOut
            | PublishErrorKind::BrokenPipe
            | PublishErrorKind::MaxAckPending
            | PublishErrorKind::StreamNotFound
    )
}

/// A publish's failure other than a fencing one (the callers handle those).
pub(super) fn publish_failed(client: &Client, what: &str, error: &PublishError) -> ReplicaError {
    if outage(&error.kind()) {
        return ReplicaError::Unreachable {
            detail: format!("{what}: {error}"),
        };
    }
    failed(client, what, error)
}

/// A call that did not answer within its limit.
pub(super) fn timed_out(client: &Client, url: &str, what: &str, limit: Duration) -> ReplicaError {
    let detail = match client.connection_state() {
        State::Connected => format!("{what}: NATS at {url} did not answer within {limit:?}"),
        state => format!("{what}: not connected to NATS at {url} ({state}) within {limit:?}"),
    };
    ReplicaError::Unreachable { detail }
}

/// The replica's runtime stopped under a call.
pub(super) fn stopped(what: &str) -> ReplicaError {
    ReplicaError::Unreachable {
        detail: format!("{what}: the replica's runtime stopped"),
    }
}

/// A message the stream should not hold.
pub(super) fn corrupt(detail: impl Display) -> ReplicaError {
    ReplicaError::Corrupt {
        detail: detail.to_string(),
    }
}

/// Whether the server answered: one of JetStream's error responses is in the chain.
fn answered(error: &(dyn StdError + 'static)) -> bool {
    sources(error).any(|e| e.downcast_ref::<async_nats::jetstream::Error>().is_some())
}

/// Whether nobody answered: a time-out, a lost connection or no responder, by the client's
/// own error kinds, or in the words of errors that keep only their text.
fn silent(error: &(dyn StdError + 'static)) -> bool {
    use async_nats::jetstream::context::RequestErrorKind as JsRequest;
    sources(error).any(|e| {
        if let Some(e) = e.downcast_ref::<async_nats::jetstream::context::RequestError>() {
            return matches!(e.kind(), JsRequest::TimedOut | JsRequest::NoResponders);
        }
        if let Some(e) = e.downcast_ref::<async_nats::RequestError>() {
            return matches!(
                e.kind(),
                async_nats::RequestErrorKind::TimedOut | async_nats::RequestErrorKind::NoResponders
            );
        }
        if let Some(e) = e.downcast_ref::<PublishError>() {
            return matches!(
                e.kind(),
                PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe
            );
        }
        let text = e.to_string();
        text.contains("timed out") || text.contains("no responders") || text.contains("broken pipe")
    })
}

fn sources<'a>(
    error: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    std::iter::successors(Some(error), |e: &&'a (dyn StdError + 'static)| {
        (*e).source()
    })
    .take(16)
}
