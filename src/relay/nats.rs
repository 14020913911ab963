//! The JetStream sink (feature `nats`): exactly once in the stream, by message id.

use std::fmt;

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};

use super::sink::{Sink, Unavailable};
use crate::error::BoxError;
use crate::model::message::Message;

/// Publishes each message to JetStream with the `Nats-Msg-Id` header set to its stable id,
/// and counts it delivered only once the stream has acknowledged it. JetStream drops a
/// message whose id it has seen within the stream's duplicate window (two minutes by
/// default), so the relay's redeliveries (after a crash between the stream's ack and the
/// outbox's settlement, or after a timed-out attempt that did arrive) leave one copy in the
/// stream. Keep the window longer than the relay's longest retry backoff.
pub struct JetStreamSink {
    context: Context,
}

impl JetStreamSink {
    /// A sink publishing through `context` (`async_nats::jetstream::new(client)`). The subjects
    /// must belong to a stream; a message to a subject no stream takes fails its attempt.
    pub fn new(context: Context) -> Self {
        JetStreamSink { context }
    }
}

impl fmt::Debug for JetStreamSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamSink").finish_non_exhaustive()
    }
}

impl Sink for JetStreamSink {
    async fn deliver(&self, message: &Message) -> Result<(), BoxError> {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", message.id.as_str());
        let ack = self
            .context
            .publish_with_headers(
                message.subject.clone(),
                headers,
                message.payload.clone().into(),
            )
            .await
            .map_err(classify)?;
        ack.await.map_err(classify)?;
        Ok(())
    }
}

/// The server not answering, the connection broken, the stream full of unacked messages: an
/// outage, which the relay waits out without counting attempts. No stream for the subject, a
/// payload over the server's limit, anything else: a failure of this message, retried and, if
/// it persists, dead-lettered (and retried from there once the stream is fixed).
fn classify(error: PublishError) -> BoxError {
    match error.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::BrokenPipe
        | PublishErrorKind::MaxAckPending => Box::new(Unavailable::new(error)),
        _ => Box::new(error),
    }
}
