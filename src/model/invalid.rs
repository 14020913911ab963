//! Values that are not valid: scopes, fingerprints, responses, records read back, settings,
//! and the reason a claim went stale. Each is raised by the value's own constructor or check in
//! `model`, so it lives here, below `error`; `error` re-exports it beside the operations' errors.

use std::fmt;

use crate::model::scope::ScopePart;

/// A scope part is not acceptable. Nothing was read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The part is empty.
    #[error("the {part} is empty; send a non-empty value")]
    Empty {
        /// Which part.
        part: ScopePart,
    },
    /// The part is longer than allowed.
    #[error("the {part} is {len} bytes long, over the limit of {max}; shorten it (a UUID is 36)")]
    TooLong {
        /// Which part.
        part: ScopePart,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The part holds a character it may not.
    #[error(
        "the {part} holds {character:?} at byte {index}; keys take printable ASCII (space to '~'), tenants and operations take text without control characters"
    )]
    ForbiddenCharacter {
        /// Which part.
        part: ScopePart,
        /// Byte offset of the character.
        index: usize,
        /// The character.
        character: char,
    },
    /// Bytes given to `Scope::decode` are not an encoded scope.
    #[error("{len} bytes are not an encoded scope; pass only bytes produced by Scope::encode")]
    Malformed {
        /// How many bytes were given.
        len: usize,
    },
}

impl ScopeError {
    /// The part the error is about (`None` for bytes that are not an encoded scope), so that a
    /// caller can tell a client's bad key from its own bad tenant or operation.
    pub fn part(&self) -> Option<ScopePart> {
        match self {
            ScopeError::Empty { part }
            | ScopeError::TooLong { part, .. }
            | ScopeError::ForbiddenCharacter { part, .. } => Some(*part),
            ScopeError::Malformed { .. } => None,
        }
    }
}

/// A fingerprint could not be made or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// serde could not encode the command.
    #[error(
        "the command could not be encoded for fingerprinting ({message}); fingerprint a plain data type (structs, enums, BTreeMap, Vec)"
    )]
    Encode {
        /// serde's message.
        message: String,
    },
    /// A fingerprint must be exactly 32 bytes.
    #[error("a fingerprint is 32 bytes, got {len}; pass the output of Fingerprint::as_bytes")]
    WrongLength {
        /// The length given.
        len: usize,
    },
}

/// A response does not fit the store's limits. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// The encoded response is larger than `Builder::max_response_bytes`.
    #[error(
        "the response is {size} bytes, over the store's limit of {max}; store a reference to the result instead of the result, or raise Builder::max_response_bytes"
    )]
    TooLarge {
        /// Its encoded size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Too many headers.
    #[error(
        "the response has {count} headers, over the limit of {max}; keep only those a replay needs"
    )]
    TooManyHeaders {
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A header name is empty or too long.
    #[error("header name {name:?} is empty or longer than {max} bytes")]
    BadHeaderName {
        /// The name (first 64 characters).
        name: String,
        /// The limit.
        max: usize,
    },
    /// A header value is too long.
    #[error("header {name} is {len} bytes, over the limit of {max}")]
    HeaderValueTooLong {
        /// The header's name.
        name: String,
        /// The value's length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// A stored record's bytes are not a record this build can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CorruptRecord {
    /// The version byte is unknown.
    #[error(
        "unknown record format version {version}; it was written by a newer idemstore: open the store with that version"
    )]
    UnknownVersion {
        /// The version found.
        version: u8,
    },
    /// The record ends inside a field.
    #[error("truncated in field {field} at byte {at}")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Its offset.
        at: usize,
    },
    /// The record has bytes after its end.
    #[error("{extra} unexpected bytes after the end of the record")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// A field holds a value it never takes.
    #[error("field {field} is invalid: {detail}")]
    BadField {
        /// The field.
        field: &'static str,
        /// What is wrong.
        detail: String,
    },
}

/// Why a claim no longer holds its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StaleReason {
    /// The record is gone: the claim was released, or the record was evicted.
    Gone,
    /// The lease expired and another attempt took the scope over with a newer fence.
    TakenOver {
        /// The fence of the attempt that holds it now.
        current_fence: u64,
    },
    /// The record is already completed.
    AlreadyCompleted,
}

impl fmt::Display for StaleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StaleReason::Gone => f.write_str("its record was released or evicted"),
            StaleReason::TakenOver { current_fence } => write!(
                f,
                "its lease expired and attempt with fence {current_fence} took the key over"
            ),
            StaleReason::AlreadyCompleted => f.write_str("the key is already completed"),
        }
    }
}

/// A setting is out of its range ([`OpenError::InvalidConfig`](crate::OpenError::InvalidConfig)
/// carries it to the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidSetting {
    pub(crate) setting: &'static str,
    pub(crate) reason: String,
}
