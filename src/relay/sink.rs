//! Where the relay delivers messages.

use std::future::Future;

use crate::error::BoxError;
use crate::model::message::Message;

/// A destination for outbox messages: a broker, a webhook, a test double.
///
/// `deliver` returns `Ok` once the destination has durably accepted the message (for a broker,
/// after its acknowledgement): the relay then deletes it from the outbox. An error, a panic
/// or a timeout ([`RelayConfig::attempt_timeout`](super::RelayConfig::attempt_timeout)) is a
/// failed attempt, retried later. A message may be delivered more than once (after a crash
/// between delivery and deletion, or a timeout of an attempt that did arrive): deduplicate on
/// [`Message::id`], which is the same every time.
pub trait Sink: Send + Sync + 'static {
    /// Delivers one message.
    fn deliver(&self, message: &Message) -> impl Future<Output = Result<(), BoxError>> + Send;
}
