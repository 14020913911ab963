//! Where the relay delivers messages.

use std::fmt;
use std::future::Future;

use crate::error::BoxError;
use crate::model::message::Message;

/// A destination for outbox messages: a broker, a webhook, a test double.
///
/// `deliver` returns `Ok` once the destination has durably accepted the message (for a broker,
/// after its acknowledgement): the relay then deletes it from the outbox. An error or a panic
/// is a failed attempt of that message, retried later and counted towards
/// [`RelayConfig::max_attempts`](super::RelayConfig::max_attempts). An error that is an
/// [`Unavailable`], or no answer within
/// [`RelayConfig::attempt_timeout`](super::RelayConfig::attempt_timeout), says the
/// destination as a whole is down: delivery pauses, and nothing is counted. A message may
/// be delivered more than once (after a crash between delivery and deletion, or a timeout of
/// an attempt that did arrive): deduplicate on [`Message::id`], which is the same every time.
pub trait Sink: Send + Sync + 'static {
    /// Delivers one message.
    fn deliver(&self, message: &Message) -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// The error a [`Sink`] returns when the destination itself cannot take anything right now
/// (the connection is lost, the broker does not answer), as opposed to refusing this message.
///
/// The relay does not count such an attempt against the message's
/// [`max_attempts`](super::RelayConfig::max_attempts): an outage of the broker, however long,
/// sends nothing to the dead letters and keeps every subject in order. It pauses all delivery
/// instead, backing off from `first_backoff` to `max_backoff`, and then tries the same message
/// again. Return it only for what is not the message's fault, or a poison message would be
/// retried forever.
///
/// ```
/// # use idemstore::relay::Unavailable;
/// # fn send() -> Result<(), std::io::Error> { Ok(()) }
/// # fn deliver() -> Result<(), idemstore::BoxError> {
/// send().map_err(|e| Unavailable::new(e))?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Unavailable(BoxError);

impl Unavailable {
    /// Wraps what went wrong.
    pub fn new(error: impl Into<BoxError>) -> Self {
        Unavailable(error.into())
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the destination is unavailable: {}", self.0)
    }
}

impl std::error::Error for Unavailable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}
