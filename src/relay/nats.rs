//! The JetStream sink (feature `nats`): exactly once in the stream, by message id.

use std::fmt;

use async_nats::HeaderMap;
use async_nats::jetstream::Context;
use async_nats::jetstream::context::PublishError;

use super::sink::{Sink, Unavailable};
use crate::error::BoxError;
use crate::model::message::Message;

/// Publishes each message to JetStream with the `Nats-Msg-Id` header set to its stable id,
/// and counts it delivered only once the stream has acknowledged it. JetStream drops a
/// message whose id it has seen within the stream's duplicate window (two minutes by
/// default), so the relay's redeliveries (after a crash between the stream's ack and the
/// outbox's settlement, after a timed-out attempt that did arrive, after a settlement that
/// failed, around a PostgreSQL take-over) leave one copy in the stream. **Exactly once holds
/// within that window**: keep it longer than the longest of the relay's retry backoff, an
/// outage of the store the relay settles into, and a restart of the service. A redelivery
/// after the window is stored twice, with the same `Nats-Msg-Id`; a consumer that applies
/// through the inbox ([`Store::consume`](crate::Store::consume)) still applies it once.
pub struct JetStreamSink {
    context: Context,
}

impl JetStreamSink {
    /// A sink publishing through `context` (`async_nats::jetstream::new(client)`). The subjects
    /// must belong to a stream: while no stream takes a message's subject, delivery pauses
    /// (see the classification below).
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

/// What is the stream's fault and what is the message's. An outage, which the relay waits
/// out without counting attempts: the server not answering (`TimedOut`), the connection
/// broken (`BrokenPipe`), the stream full of unacked messages (`MaxAckPending`), and no
/// stream answering for the subject (`StreamNotFound`: "no responders", which JetStream also
/// says while a stream has no leader; a subject no stream takes at all stops delivery until
/// one does, with the error in [`RelayStats::last_error`](super::RelayStats)). A failure of
/// this message, retried and, if it persists, dead-lettered: a payload over the server's
/// limit, and anything else the server refuses (a full stream that discards new messages).
fn classify(error: PublishError) -> BoxError {
    if crate::replica::outage(&error.kind()) {
        Box::new(Unavailable::new(error))
    } else {
        Box::new(error)
    }
}
