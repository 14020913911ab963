//! The identity of one logical mutation: `(tenant, operation, key)`.
//!
//! This module owns validation and the byte encoding used as the records table's key. It must
//! never accept a part that could make two different scopes encode to the same bytes.

use crate::model::claim::REQUEST_ORIGIN;
use crate::model::fingerprint::Fingerprint;
use crate::model::hex::hex;
use crate::model::limits::{MAX_KEY_LEN, MAX_OPERATION_LEN, MAX_TENANT_LEN};
use std::fmt;

use crate::model::invalid::ScopeError;

/// Which part of a [`Scope`] an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScopePart {
    /// The authenticated caller the key belongs to.
    Tenant,
    /// The kind of mutation (`create_charge`, `POST /orders`, ...).
    Operation,
    /// The client's idempotency key.
    Key,
}

impl fmt::Display for ScopePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScopePart::Tenant => "tenant",
            ScopePart::Operation => "operation",
            ScopePart::Key => "idempotency key",
        })
    }
}

/// A validated `(tenant, operation, key)` triple.
///
/// The tenant must come from the caller's authentication, never from the request body: two
/// tenants using the same key never see or collide with each other's records.
///
/// Rules:
/// - tenant: 1..=128 bytes of UTF-8 without control characters;
/// - operation: 1..=128 bytes of UTF-8 without control characters;
/// - key: 1..=255 bytes of printable ASCII (`0x20..=0x7E`), the character set of an
///   RFC 8941 string, so that a key read from an `Idempotency-Key` header round-trips.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    /// The encoded form, kept so that lookups do not re-encode (see [`Scope::encode`]).
    encoded: Box<[u8]>,
    tenant_len: u8,
    operation_len: u8,
}

/// Whether the debug spans that name a scope are worth building: a `tracing` subscriber takes
/// debug spans. Building one checks the three parts' UTF-8 again, about a thousand
/// instructions a request, and `tracing` builds a span's fields even without a subscriber when
/// its `log` feature is on (axum's default features turn it on), to offer them to `log`.
pub(crate) fn spans_wanted() -> bool {
    tracing::enabled!(tracing::Level::DEBUG)
}

/// The domain of the hash that makes a downstream key (and outbox message ids) from the
/// request: every operation this build begins.
const DOWNSTREAM_REQUEST_CONTEXT: &str =
    "idemstore 2026-12 downstream idempotency key v2 (request)";
/// The domain of the hash that made a downstream key from the first attempt's fence: the
/// operations earlier builds began, which keep it.
const DOWNSTREAM_FENCE_CONTEXT: &str = "idemstore 2026-11 downstream idempotency key v1";

impl Scope {
    /// The key a claim passes downstream, and the prefix of its outbox messages' ids: 32 hex
    /// digits of a hash.
    ///
    /// For every operation this build begins (`origin_fence` is
    /// [`REQUEST_ORIGIN`](crate::model::claim::REQUEST_ORIGIN)), a hash of the request's
    /// fingerprint and the scope, and nothing a store keeps: the same for every attempt,
    /// take-overs included, and the same on any store, so a store restored from a copy that
    /// lacks the operation derives the key the old store's attempt passed downstream, and its
    /// recovery finds what that attempt did. The trade-off: the same request on the same key
    /// gets the same key again after a release, a `forget` or its TTL, so downstream
    /// deduplicates it against the earlier attempt (a downstream that stored a failure under
    /// the key answers it again); another request on the key gets another key. A key that
    /// changed after a release (from the next fence, say) would differ between the old store
    /// and a restored one, which is the second charge this prevents.
    ///
    /// For an operation an earlier build began, whose record carries its first attempt's fence
    /// as the origin, the hash of the scope and that fence, as that build derived it: a
    /// take-over after an upgrade keeps the key its first attempt used.
    pub(crate) fn downstream_key(&self, fingerprint: &Fingerprint, origin_fence: u64) -> String {
        let hash = if origin_fence == REQUEST_ORIGIN {
            // The fingerprint first: it has a fixed length, so the bytes hashed are injective.
            let mut hasher = blake3::Hasher::new_derive_key(DOWNSTREAM_REQUEST_CONTEXT);
            hasher.update(fingerprint.as_bytes());
            hasher.update(self.encode());
            hasher.finalize()
        } else {
            let mut hasher = blake3::Hasher::new_derive_key(DOWNSTREAM_FENCE_CONTEXT);
            hasher.update(self.encode());
            hasher.update(&origin_fence.to_le_bytes());
            hasher.finalize()
        };
        hex(&hash.as_bytes()[..16])
    }

    /// Validates the three parts and builds a scope.
    ///
    /// # Errors
    /// [`ScopeError`] naming the part that is empty, too long or holds a forbidden character.
    pub fn new(
        tenant: impl AsRef<str>,
        operation: impl AsRef<str>,
        key: impl AsRef<str>,
    ) -> Result<Self, ScopeError> {
        let (tenant, operation, key) = (tenant.as_ref(), operation.as_ref(), key.as_ref());
        check_text(ScopePart::Tenant, tenant, MAX_TENANT_LEN)?;
        check_text(ScopePart::Operation, operation, MAX_OPERATION_LEN)?;
        check_key(key)?;
        let mut encoded = Vec::with_capacity(2 + tenant.len() + operation.len() + key.len());
        // Lengths fit in a byte: checked above against limits below 256.
        encoded.push(tenant.len() as u8);
        encoded.extend_from_slice(tenant.as_bytes());
        encoded.push(operation.len() as u8);
        encoded.extend_from_slice(operation.as_bytes());
        encoded.extend_from_slice(key.as_bytes());
        Ok(Scope {
            encoded: encoded.into_boxed_slice(),
            tenant_len: tenant.len() as u8,
            operation_len: operation.len() as u8,
        })
    }

    /// The tenant this scope belongs to.
    pub fn tenant(&self) -> &str {
        self.text(1, self.tenant_len)
    }

    /// The operation name.
    pub fn operation(&self) -> &str {
        self.text(2 + usize::from(self.tenant_len), self.operation_len)
    }

    /// The client's idempotency key.
    pub fn key(&self) -> &str {
        let start = 2 + usize::from(self.tenant_len) + usize::from(self.operation_len);
        std::str::from_utf8(&self.encoded[start..]).unwrap_or_default()
    }

    /// The byte encoding used as the records table key:
    /// `tenant_len: u8 ‖ tenant ‖ operation_len: u8 ‖ operation ‖ key`.
    ///
    /// The length prefixes make the encoding injective: no two scopes share bytes, whatever
    /// characters their parts hold. See `docs/design.md`.
    pub fn encode(&self) -> &[u8] {
        &self.encoded
    }

    /// Rebuilds a scope from [`Scope::encode`]'s output, validating it again.
    ///
    /// # Errors
    /// [`ScopeError::Malformed`] if the bytes are not an encoded scope.
    pub fn decode(bytes: &[u8]) -> Result<Self, ScopeError> {
        let malformed = || ScopeError::Malformed { len: bytes.len() };
        let (&tenant_len, rest) = bytes.split_first().ok_or_else(malformed)?;
        let tenant = rest.get(..usize::from(tenant_len)).ok_or_else(malformed)?;
        let rest = &rest[usize::from(tenant_len)..];
        let (&operation_len, rest) = rest.split_first().ok_or_else(malformed)?;
        let operation = rest
            .get(..usize::from(operation_len))
            .ok_or_else(malformed)?;
        let key = &rest[usize::from(operation_len)..];
        let text = |b| std::str::from_utf8(b).map_err(|_| malformed());
        Scope::new(text(tenant)?, text(operation)?, text(key)?)
    }

    fn text(&self, start: usize, len: u8) -> &str {
        // Built from `&str` parts in `new`, so always valid UTF-8.
        std::str::from_utf8(&self.encoded[start..start + usize::from(len)]).unwrap_or_default()
    }
}

impl fmt::Debug for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("tenant", &self.tenant())
            .field("operation", &self.operation())
            .field("key", &self.key())
            .finish()
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{:?}", self.tenant(), self.operation(), self.key())
    }
}

fn check_text(part: ScopePart, text: &str, max: usize) -> Result<(), ScopeError> {
    if text.is_empty() {
        return Err(ScopeError::Empty { part });
    }
    if text.len() > max {
        return Err(ScopeError::TooLong {
            part,
            len: text.len(),
            max,
        });
    }
    if let Some((index, c)) = text.char_indices().find(|(_, c)| c.is_control()) {
        return Err(ScopeError::ForbiddenCharacter {
            part,
            index,
            character: c,
        });
    }
    Ok(())
}

fn check_key(key: &str) -> Result<(), ScopeError> {
    let part = ScopePart::Key;
    if key.is_empty() {
        return Err(ScopeError::Empty { part });
    }
    if key.len() > MAX_KEY_LEN {
        return Err(ScopeError::TooLong {
            part,
            len: key.len(),
            max: MAX_KEY_LEN,
        });
    }
    if let Some((index, c)) = key.char_indices().find(|(_, c)| !matches!(c, ' '..='~')) {
        return Err(ScopeError::ForbiddenCharacter {
            part,
            index,
            character: c,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding_is_injective_across_part_boundaries() -> Result<(), ScopeError> {
        let a = Scope::new("ab", "c", "d")?;
        let b = Scope::new("a", "bc", "d")?;
        let c = Scope::new("a", "b", "cd")?;
        assert_ne!(a.encode(), b.encode());
        assert_ne!(b.encode(), c.encode());
        assert_ne!(a.encode(), c.encode());
        Ok(())
    }

    #[test]
    fn decode_round_trips() -> Result<(), ScopeError> {
        let s = Scope::new("acct_1", "create_charge", "6d4c bddc-9f7c")?;
        let back = Scope::decode(s.encode())?;
        assert_eq!(back, s);
        assert_eq!(back.tenant(), "acct_1");
        assert_eq!(back.operation(), "create_charge");
        assert_eq!(back.key(), "6d4c bddc-9f7c");
        Ok(())
    }

    #[test]
    fn decode_rejects_truncated_bytes() {
        assert!(matches!(
            Scope::decode(&[5, b'a']),
            Err(ScopeError::Malformed { .. })
        ));
        assert!(matches!(
            Scope::decode(&[]),
            Err(ScopeError::Malformed { .. })
        ));
    }

    #[test]
    fn a_downstream_key_names_the_request_on_the_scope() -> Result<(), ScopeError> {
        let scope = Scope::new("acct_2", "charge", "k-1")?;
        let (a, b) = (Fingerprint::of_bytes(b"a"), Fingerprint::of_bytes(b"b"));
        let key = scope.downstream_key(&a, REQUEST_ORIGIN);
        assert_eq!(key.len(), 32);
        assert_eq!(
            key,
            scope.downstream_key(&a, REQUEST_ORIGIN),
            "derived, not kept"
        );
        assert_ne!(
            key,
            scope.downstream_key(&b, REQUEST_ORIGIN),
            "another request"
        );
        let other = Scope::new("acct_2", "charge", "k-2")?;
        assert_ne!(key, other.downstream_key(&a, REQUEST_ORIGIN), "another key");
        Ok(())
    }

    /// The key the build before request-derived keys gave an operation whose first attempt had
    /// fence 5 (`tests/fixtures/format-2`'s running claim, taken over by that build's code).
    #[test]
    fn an_operation_an_earlier_build_began_keeps_its_fenced_key() -> Result<(), ScopeError> {
        let scope = Scope::new("acct_2", "charge", "k-running")?;
        let any = Fingerprint::of_bytes(b"req-running");
        assert_eq!(
            scope.downstream_key(&any, 5),
            "7923847df6a7f4711f3e3fa435c2141d"
        );
        Ok(())
    }

    #[test]
    fn key_limits() {
        assert!(Scope::new("t", "o", "k".repeat(255)).is_ok());
        assert!(matches!(
            Scope::new("t", "o", "k".repeat(256)),
            Err(ScopeError::TooLong { len: 256, .. })
        ));
        assert!(matches!(
            Scope::new("t", "o", "a\u{7f}"),
            Err(ScopeError::ForbiddenCharacter { index: 1, .. })
        ));
        assert!(matches!(
            Scope::new("t", "o", "é"),
            Err(ScopeError::ForbiddenCharacter { .. })
        ));
        assert!(matches!(
            Scope::new("t\n", "o", "k"),
            Err(ScopeError::ForbiddenCharacter {
                part: ScopePart::Tenant,
                ..
            })
        ));
    }
}
