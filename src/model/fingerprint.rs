//! Fingerprints: what tells a retry of a request apart from a different request under the same
//! key.
//!
//! This module owns the canonical encoding and the hash. It must never depend on anything that
//! varies between runs (hash-map order, addresses, time).

use crate::model::hex::hex;
use crate::model::limits::FINGERPRINT_LEN;
use std::fmt;

use serde::Serialize;

use crate::model::invalid::FingerprintError;

/// Domain separation, so a fingerprint of a command never equals one of raw bytes that happen
/// to match its encoding, and so neither equals a BLAKE3 hash computed elsewhere.
const COMMAND_CONTEXT: &str = "idemstore 2026-11 fingerprint of a serde command v1";
const BYTES_CONTEXT: &str = "idemstore 2026-11 fingerprint of raw bytes v1";

/// A 256-bit BLAKE3 hash of a request, stored with its claim.
///
/// A retry must carry the same fingerprint as the first attempt; the same key with a different
/// fingerprint is answered [`Begin::Mismatch`](crate::Begin::Mismatch).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; FINGERPRINT_LEN]);

impl Fingerprint {
    /// Hashes the canonical encoding of a validated command.
    ///
    /// The encoding is postcard's, which is deterministic for a given value and type. Hash the
    /// command *after* parsing and validation, not the raw request, so that formatting, field
    /// order in the JSON text and transport metadata do not change it.
    ///
    /// Maps must be ordered: a `HashMap` serializes in an order that changes from run to run, so
    /// two identical commands would get different fingerprints. Use `BTreeMap` (or a `Vec` of
    /// pairs) in types you fingerprint.
    ///
    /// # Errors
    /// [`FingerprintError::Encode`] if serde refuses the value (for example a sequence whose
    /// length is not known up front).
    pub fn of<T: Serialize + ?Sized>(command: &T) -> Result<Self, FingerprintError> {
        let mut hasher = blake3::Hasher::new_derive_key(COMMAND_CONTEXT);
        let encoded = postcard::to_io(command, HashWriter(&mut hasher)).map_err(|e| {
            FingerprintError::Encode {
                message: e.to_string(),
            }
        });
        encoded?;
        Ok(Fingerprint(*hasher.finalize().as_bytes()))
    }

    /// Hashes raw bytes, for callers that already hold a canonical form (for example a JSON body
    /// canonicalized per RFC 8785).
    pub fn of_bytes(bytes: &[u8]) -> Self {
        let mut hasher = blake3::Hasher::new_derive_key(BYTES_CONTEXT);
        hasher.update(bytes);
        Fingerprint(*hasher.finalize().as_bytes())
    }

    /// Wraps a fingerprint computed elsewhere (for example read back from a log).
    pub const fn from_array(bytes: [u8; FINGERPRINT_LEN]) -> Self {
        Fingerprint(bytes)
    }

    /// Wraps a fingerprint given as a slice.
    ///
    /// # Errors
    /// [`FingerprintError::WrongLength`] unless the slice is exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, FingerprintError> {
        <[u8; FINGERPRINT_LEN]>::try_from(bytes)
            .map(Fingerprint)
            .map_err(|_| FingerprintError::WrongLength { len: bytes.len() })
    }

    /// The 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; FINGERPRINT_LEN] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0[..8]))?;
        f.write_str("…")
    }
}

/// Streams postcard's output into the hasher, so fingerprinting allocates nothing.
struct HashWriter<'a>(&'a mut blake3::Hasher);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Serialize)]
    struct Charge<'a> {
        amount: u64,
        currency: &'a str,
        metadata: BTreeMap<&'a str, &'a str>,
    }

    #[test]
    fn same_command_same_fingerprint() -> Result<(), FingerprintError> {
        let mut m1 = BTreeMap::new();
        m1.insert("b", "2");
        m1.insert("a", "1");
        let mut m2 = BTreeMap::new();
        m2.insert("a", "1");
        m2.insert("b", "2");
        let a = Fingerprint::of(&Charge {
            amount: 100,
            currency: "eur",
            metadata: m1,
        })?;
        let b = Fingerprint::of(&Charge {
            amount: 100,
            currency: "eur",
            metadata: m2,
        })?;
        assert_eq!(a, b);
        Ok(())
    }

    #[test]
    fn different_command_different_fingerprint() -> Result<(), FingerprintError> {
        let a = Fingerprint::of(&(100u64, "eur"))?;
        let b = Fingerprint::of(&(101u64, "eur"))?;
        assert_ne!(a, b);
        Ok(())
    }

    #[test]
    fn bytes_and_commands_live_in_separate_domains() -> Result<(), FingerprintError> {
        let bytes = postcard::to_stdvec(&7u8).map_err(|e| FingerprintError::Encode {
            message: e.to_string(),
        })?;
        assert_ne!(Fingerprint::of(&7u8)?, Fingerprint::of_bytes(&bytes));
        Ok(())
    }

    #[test]
    fn from_slice_checks_length() {
        assert!(matches!(
            Fingerprint::from_slice(&[0; 31]),
            Err(FingerprintError::WrongLength { len: 31 })
        ));
        assert!(Fingerprint::from_slice(&[0; 32]).is_ok());
    }
}
