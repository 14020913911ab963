//! Outbox messages: what a commit publishes, and what the relay could not deliver.
//!
//! A message is recorded by [`Tx::publish`](crate::Tx::publish) in the same transaction as the
//! commit's business rows and completed record, so the three are kept or lost together. Its
//! **id** is fixed at that moment and is the same on every delivery attempt: a broker that
//! deduplicates by id (JetStream's `Nats-Msg-Id`) turns the relay's at-least-once delivery
//! into exactly once in the stream.

use serde::{Deserialize, Serialize};

use crate::model::clock::Timestamp;

/// The longest subject a message may have, in bytes.
pub const MAX_SUBJECT_LEN: usize = 256;
/// The largest payload a message may carry, in bytes (NATS's default `max_payload` is 1 MiB).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
/// The most messages one commit may publish.
pub const MAX_MESSAGES_PER_COMMIT: usize = 1024;

/// A message in the outbox: committed, not yet delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Message {
    /// Its place in commit order (unique for the life of the store).
    pub seq: u64,
    /// The stable id: the claim's `downstream_key()`, a dash, and the message's index in its
    /// commit (`"3f2a...-0"`). The same on every delivery attempt.
    pub id: String,
    /// Where it goes (a NATS subject, a topic).
    pub subject: String,
    /// What it carries.
    pub payload: Vec<u8>,
    /// When the commit that recorded it ran, by the store's clock.
    pub committed_at: Timestamp,
}

/// A message the relay gave up on after its configured number of attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The message, as committed (its `seq` is its old place in the outbox).
    pub message: Message,
    /// Delivery attempts made.
    pub attempts: u32,
    /// The sink's error on the last attempt.
    pub last_error: String,
    /// When it was moved here.
    pub dead_at: Timestamp,
}

/// Why a message was refused by `Tx::publish`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// The subject is empty, too long, or has whitespace or control characters.
    #[error(
        "subject {subject:?} is invalid: {reason}; use 1 to {MAX_SUBJECT_LEN} bytes, no whitespace or control characters"
    )]
    BadSubject {
        /// The subject given (truncated to 64 characters).
        subject: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The payload is over [`MAX_PAYLOAD_BYTES`].
    #[error(
        "the payload is {len} bytes, over the limit of {MAX_PAYLOAD_BYTES}; publish a reference"
    )]
    PayloadTooLarge {
        /// Its length.
        len: usize,
    },
    /// One commit published more than [`MAX_MESSAGES_PER_COMMIT`] messages.
    #[error("a commit may publish at most {MAX_MESSAGES_PER_COMMIT} messages; split the work")]
    TooMany,
    /// `publish` was called outside a commit (in `Store::write`): a message needs the claim's
    /// stable id.
    #[error(
        "publish needs a commit of a claim (Claim::commit or Store::execute), whose key gives the message a stable id; Store::write has none"
    )]
    NotInCommit,
}

/// Checks a subject: 1 to 256 bytes, no whitespace or control characters.
pub(crate) fn check_subject(subject: &str) -> Result<(), MessageError> {
    let bad = |reason| MessageError::BadSubject {
        subject: subject.chars().take(64).collect(),
        reason,
    };
    if subject.is_empty() {
        return Err(bad("empty"));
    }
    if subject.len() > MAX_SUBJECT_LEN {
        return Err(bad("too long"));
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("whitespace or control character"));
    }
    Ok(())
}

/// The messages one commit publishes, checked and numbered as they come: the one place both
/// backends (the local `Tx` and PostgreSQL's `PgTx`) validate and name a message, so that
/// the same call is refused, or gets the same id, on either.
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// `(id, subject, payload)` in publishing order.
    messages: Vec<(String, String, Vec<u8>)>,
}

impl Published {
    /// Checks a message and adds it; its id is `id_prefix` (the claim's downstream key), a
    /// dash, and its index in this commit.
    pub(crate) fn add(
        &mut self,
        id_prefix: &str,
        subject: &str,
        payload: Vec<u8>,
    ) -> Result<String, MessageError> {
        check_subject(subject)?;
        if payload.len() > MAX_PAYLOAD_BYTES {
            return Err(MessageError::PayloadTooLarge { len: payload.len() });
        }
        if self.messages.len() >= MAX_MESSAGES_PER_COMMIT {
            return Err(MessageError::TooMany);
        }
        let id = format!("{id_prefix}-{}", self.messages.len());
        self.messages
            .push((id.clone(), subject.to_owned(), payload));
        Ok(id)
    }

    /// The messages added, leaving none.
    pub(crate) fn take(&mut self) -> Vec<(String, String, Vec<u8>)> {
        std::mem::take(&mut self.messages)
    }
}

/// What the outbox table stores for a message (its seq is the key).
#[derive(Serialize, Deserialize)]
struct Stored<'a> {
    #[serde(borrow)]
    id: &'a str,
    #[serde(borrow)]
    subject: &'a str,
    #[serde(with = "serde_bytes_compat", borrow)]
    payload: &'a [u8],
    committed_at: u64,
}

/// What the dead-letter table stores (its seq is the key).
#[derive(Serialize, Deserialize)]
struct StoredDead<'a> {
    #[serde(borrow)]
    message: Stored<'a>,
    attempts: u32,
    #[serde(borrow)]
    last_error: &'a str,
    dead_at: u64,
}

/// `&[u8]` as postcard bytes (one length, then the bytes), not a sequence of u8.
mod serde_bytes_compat {
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &&[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<&'de [u8], D::Error> {
        <&[u8] as serde::Deserialize>::deserialize(d)
    }
}

/// The key of a message in the outbox and dead-letter tables: its seq, big-endian, so that
/// redb's byte order is commit order.
pub(crate) fn message_key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

impl Message {
    pub(crate) fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(&self.stored()).unwrap_or_default()
    }

    fn stored(&self) -> Stored<'_> {
        Stored {
            id: &self.id,
            subject: &self.subject,
            payload: &self.payload,
            committed_at: self.committed_at.as_millis(),
        }
    }

    /// Decodes a stored message; `None` if the bytes are not one.
    pub(crate) fn decode(key: &[u8], bytes: &[u8]) -> Option<Message> {
        let seq = u64::from_be_bytes(key.try_into().ok()?);
        let stored: Stored<'_> = postcard::from_bytes(bytes).ok()?;
        Some(Message::from_stored(seq, stored))
    }

    fn from_stored(seq: u64, s: Stored<'_>) -> Message {
        Message {
            seq,
            id: s.id.to_owned(),
            subject: s.subject.to_owned(),
            payload: s.payload.to_vec(),
            committed_at: Timestamp::from_millis(s.committed_at),
        }
    }
}

impl DeadLetter {
    #[cfg_attr(
        not(any(feature = "tokio", test)),
        expect(dead_code, reason = "the relay (feature tokio) writes dead letters")
    )]
    pub(crate) fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(&StoredDead {
            message: self.message.stored(),
            attempts: self.attempts,
            last_error: &self.last_error,
            dead_at: self.dead_at.as_millis(),
        })
        .unwrap_or_default()
    }

    pub(crate) fn decode(key: &[u8], bytes: &[u8]) -> Option<DeadLetter> {
        let seq = u64::from_be_bytes(key.try_into().ok()?);
        let stored: StoredDead<'_> = postcard::from_bytes(bytes).ok()?;
        Some(DeadLetter {
            message: Message::from_stored(seq, stored.message),
            attempts: stored.attempts,
            last_error: stored.last_error.to_owned(),
            dead_at: Timestamp::from_millis(stored.dead_at),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_dead_letters_round_trip() {
        let message = Message {
            seq: 7,
            id: "abc-0".into(),
            subject: "charges.created".into(),
            payload: vec![0, 1, 255],
            committed_at: Timestamp::from_millis(42),
        };
        let key = message_key(7);
        assert_eq!(
            Message::decode(&key, &message.encode()),
            Some(message.clone())
        );
        let dead = DeadLetter {
            message,
            attempts: 5,
            last_error: "refused".into(),
            dead_at: Timestamp::from_millis(99),
        };
        assert_eq!(DeadLetter::decode(&key, &dead.encode()), Some(dead));
        assert_eq!(Message::decode(&key, b"\xff\xff"), None);
    }

    #[test]
    fn subjects_are_checked() {
        assert!(check_subject("charges.created").is_ok());
        for bad in ["", "a b", "a\nb", &"x".repeat(MAX_SUBJECT_LEN + 1)] {
            assert!(check_subject(bad).is_err(), "{bad:?}");
        }
    }
}
