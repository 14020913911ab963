//! The idempotency record: what the records table stores for one scope.
//!
//! This module owns the record's byte layouts (documented in `docs/design.md`), version byte
//! first: this build writes version 2 and reads 1 and 2, so a store written before version 2
//! is read as it is and each record moves to version 2 when it is next written. Decoding never
//! trusts lengths: a truncated or padded record is an error naming what is wrong, never a panic.

mod reader;
mod v1;
mod v2;

use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::invalid::CorruptRecord;
use crate::model::response::Response;

/// State tags, the same in every version.
const STATE_IN_PROGRESS: u8 = 1;
const STATE_COMPLETED: u8 = 2;
const STATE_TOMBSTONE: u8 = 3;

/// The stored state of one scope, as [`Store::get`](crate::Store::get) returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub(crate) fingerprint: Fingerprint,
    pub(crate) fence: u64,
    pub(crate) origin_fence: u64,
    pub(crate) attempt: u32,
    pub(crate) created_at: Timestamp,
    pub(crate) state: RecordState,
}

/// Where a record is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordState {
    /// A claim holds the scope until `lease_until`; the work's outcome is not known yet.
    InProgress {
        /// When the holder's lease ends and the next `begin` may take over.
        lease_until: Timestamp,
        /// The holder's last [`Claim::checkpoint`](crate::Claim::checkpoint), if any.
        checkpoint: Option<Vec<u8>>,
    },
    /// The work committed; its response is replayed until `expires_at`.
    Completed {
        /// When the commit happened.
        completed_at: Timestamp,
        /// When the record stops answering retries (completed_at + TTL).
        expires_at: Timestamp,
        /// What every retry gets back.
        response: Response,
    },
    /// The work committed, but its response was evicted after the TTL; a retry is told
    /// [`Begin::Expired`](crate::Begin::Expired) until `until` instead of running again.
    Tombstone {
        /// When the commit happened.
        completed_at: Timestamp,
        /// When the marker goes too (TTL + tombstone TTL after the commit).
        until: Timestamp,
    },
}

impl RecordState {
    /// The state's name, for logs and tools: `in-progress`, `completed` or `tombstone`.
    pub fn name(&self) -> &'static str {
        match self {
            RecordState::InProgress { .. } => "in-progress",
            RecordState::Completed { .. } => "completed",
            RecordState::Tombstone { .. } => "tombstone",
        }
    }
}

/// A stored record's state, read from its bytes without decoding the rest (eviction counts
/// what it removes by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoredState {
    InProgress,
    Completed,
    Tombstone,
}

/// Where a record stands at a given time, given the store's retention settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Visibility {
    /// In progress, or completed within its TTL.
    Live,
    /// Completed, past its TTL but within the tombstone TTL: answers `Expired`.
    Tombstone {
        completed_at: Timestamp,
        until: Timestamp,
    },
    /// Past everything: treated as absent.
    Gone,
}

impl Record {
    /// The fingerprint of the request that claimed the scope.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The fence of the current (or last) holder.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// How many attempts have held the scope (1 unless a lease expired and was taken over).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the scope was first claimed.
    pub fn created_at(&self) -> Timestamp {
        self.created_at
    }

    /// In progress or completed, with what each state carries.
    pub fn state(&self) -> &RecordState {
        &self.state
    }

    /// The stored response, if completed (and not yet evicted).
    pub fn response(&self) -> Option<&Response> {
        match &self.state {
            RecordState::Completed { response, .. } => Some(response),
            RecordState::InProgress { .. } | RecordState::Tombstone { .. } => None,
        }
    }

    /// Where the record stands at `now`: a completed record past its TTL is a tombstone for
    /// `tombstone_ttl` more (whether or not eviction has turned it into one yet), then gone.
    pub(crate) fn visibility(
        &self,
        now: Timestamp,
        tombstone_ttl: std::time::Duration,
    ) -> Visibility {
        match self.state {
            RecordState::InProgress { .. } => Visibility::Live,
            RecordState::Completed {
                completed_at,
                expires_at,
                ..
            } => {
                let until = expires_at.saturating_add(tombstone_ttl);
                if now < expires_at {
                    Visibility::Live
                } else if now < until {
                    Visibility::Tombstone {
                        completed_at,
                        until,
                    }
                } else {
                    Visibility::Gone
                }
            }
            RecordState::Tombstone {
                completed_at,
                until,
            } => {
                if now < until {
                    Visibility::Tombstone {
                        completed_at,
                        until,
                    }
                } else {
                    Visibility::Gone
                }
            }
        }
    }

    /// The state of an encoded record of any version (the state tag is its second byte in
    /// every version); `None` for bytes that are no record.
    pub(crate) fn stored_state(bytes: &[u8]) -> Option<StoredState> {
        match *bytes.get(1)? {
            STATE_IN_PROGRESS => Some(StoredState::InProgress),
            STATE_COMPLETED => Some(StoredState::Completed),
            STATE_TOMBSTONE => Some(StoredState::Tombstone),
            _ => None,
        }
    }

    /// Encodes the record in the current layout (version 2, `docs/design.md`).
    pub(crate) fn encode(&self) -> Vec<u8> {
        v2::encode(self)
    }

    /// The record in version 1, as builds before format 2 wrote it.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn encode_v1(&self) -> Vec<u8> {
        v1::encode(self)
    }

    /// A record in each state, with and without a checkpoint, headers and a compressible body.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn samples() -> Vec<Record> {
        let base = Record {
            fingerprint: Fingerprint::of_bytes(b"req"),
            fence: 7,
            origin_fence: 5,
            attempt: 2,
            created_at: Timestamp::from_millis(1_000),
            state: RecordState::InProgress {
                lease_until: Timestamp::from_millis(31_000),
                checkpoint: None,
            },
        };
        let with = |state| Record {
            state,
            ..base.clone()
        };
        let completed = |response| RecordState::Completed {
            completed_at: Timestamp::from_millis(2_000),
            expires_at: Timestamp::from_millis(86_402_000),
            response,
        };
        vec![
            base.clone(),
            with(RecordState::InProgress {
                lease_until: Timestamp::from_millis(31_000),
                checkpoint: Some(b"step-3".to_vec()),
            }),
            with(completed(
                Response::new(500, b"boom".to_vec())
                    .with_header("content-type", b"text/plain".to_vec()),
            )),
            with(completed(Response::new(
                201,
                br#"{"sku":"a","qty":1},"#.repeat(40),
            ))),
            with(RecordState::Tombstone {
                completed_at: Timestamp::from_millis(2_000),
                until: Timestamp::from_millis(90_000_000),
            }),
        ]
    }

    /// Decodes a record of any version this build reads (1 or 2), refusing anything that is
    /// not exactly one well-formed record.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Record, CorruptRecord> {
        match bytes.first() {
            Some(&v1::VERSION) => v1::decode(bytes),
            Some(&v2::VERSION) => v2::decode(bytes),
            Some(&version) => Err(CorruptRecord::UnknownVersion { version }),
            None => Err(CorruptRecord::Truncated {
                field: "version",
                at: 0,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_progress(checkpoint: Option<Vec<u8>>) -> Record {
        Record {
            state: RecordState::InProgress {
                lease_until: Timestamp::from_millis(31_000),
                checkpoint,
            },
            ..Record::samples()[0].clone()
        }
    }

    /// Completed, a 4-byte body and one header.
    fn completed() -> Record {
        Record::samples()[2].clone()
    }

    fn with_body(body: Vec<u8>) -> Record {
        let mut record = completed();
        if let RecordState::Completed { response, .. } = &mut record.state {
            *response = Response::new(201, body);
        }
        record
    }

    fn every_state() -> Vec<Record> {
        let mut records = Record::samples();
        records.push(in_progress(Some(vec![])));
        records
    }

    #[test]
    fn round_trips_every_state_in_both_versions() -> Result<(), CorruptRecord> {
        for rec in every_state() {
            assert_eq!(rec.encode()[0], v2::VERSION);
            assert_eq!(Record::decode(&rec.encode())?, rec);
            assert_eq!(Record::decode(&rec.encode_v1())?, rec);
        }
        Ok(())
    }

    #[test]
    fn every_truncation_is_an_error() {
        for rec in every_state() {
            for bytes in [rec.encode(), rec.encode_v1()] {
                for len in 0..bytes.len() {
                    assert!(
                        Record::decode(&bytes[..len]).is_err(),
                        "prefix of {len} bytes of {bytes:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn trailing_bytes_and_unknown_versions_are_errors() {
        for mut bytes in [in_progress(None).encode(), in_progress(None).encode_v1()] {
            bytes.push(0);
            assert!(matches!(
                Record::decode(&bytes),
                Err(CorruptRecord::TrailingBytes { extra: 1 })
            ));
            bytes[0] = 9;
            assert!(matches!(
                Record::decode(&bytes),
                Err(CorruptRecord::UnknownVersion { version: 9 })
            ));
        }
    }

    #[test]
    fn version_2_is_smaller_and_compresses_large_bodies() {
        // A completed record with a 4-byte body and one header: 84 + 34 bytes in version 1.
        assert_eq!(completed().encode_v1().len(), 118);
        assert_eq!(completed().encode().len(), 78);
        let json = with_body(br#"{"sku":"a","qty":1},"#.repeat(40));
        assert!(json.encode().len() < 200, "{} bytes", json.encode().len());
        // Random bytes do not compress: stored as they are, one byte of encoding tag.
        let mut state = 1u64;
        let noise: Vec<u8> = (0..600)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                (state >> 56) as u8
            })
            .collect();
        let raw = with_body(noise);
        // head 34, fence/origin/attempt 3, times 2 + 2 + 4, status 2, header count 1, tag 1,
        // length 2, then the body.
        assert_eq!(raw.encode().len(), 34 + 3 + 8 + 2 + 1 + 1 + 2 + 600);
    }

    #[test]
    fn a_damaged_compressed_body_is_an_error_not_a_panic() {
        let bytes = with_body(vec![b'a'; 4096]).encode();
        assert!(bytes.len() < 100, "4 KiB of one byte packs small");
        let mut refused = 0;
        for i in 34..bytes.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut damaged = bytes.clone();
                damaged[i] ^= flip;
                refused += usize::from(Record::decode(&damaged).is_err());
            }
        }
        // Lengths, tags and the LZ4 block's own structure are all checked; a flipped time
        // or fence still decodes (as in version 1, a record has no checksum of its own).
        assert!(refused > (bytes.len() - 34) * 3 / 2, "{refused} refused");
    }

    #[test]
    fn version_1_offsets_match_the_design_doc() {
        let bytes = in_progress(Some(b"ab".to_vec())).encode_v1();
        assert_eq!(bytes[0], v1::VERSION);
        assert_eq!(bytes[1], STATE_IN_PROGRESS);
        assert_eq!(&bytes[34..42], &7u64.to_le_bytes());
        assert_eq!(&bytes[42..50], &5u64.to_le_bytes());
        assert_eq!(&bytes[50..54], &2u32.to_le_bytes());
        assert_eq!(&bytes[62..70], &31_000u64.to_le_bytes());
        assert_eq!(bytes[70], 1);
        assert_eq!(&bytes[71..75], &2u32.to_le_bytes());
        assert_eq!(bytes.len(), 77);
    }

    #[test]
    fn version_2_layout_matches_the_design_doc() {
        let bytes = in_progress(Some(b"ab".to_vec())).encode();
        // version, state, fingerprint, then varints: fence 7, origin 5, attempt 2,
        // created 1000 (two bytes), lease +30000 (zigzag 60000, three bytes), checkpoint 2+1.
        assert_eq!(&bytes[..2], &[v2::VERSION, STATE_IN_PROGRESS]);
        assert_eq!(&bytes[34..37], &[7, 5, 2]);
        assert_eq!(&bytes[37..39], &[0xe8, 0x07]);
        assert_eq!(&bytes[39..42], &[0xe0, 0xd4, 0x03]);
        assert_eq!(&bytes[42..], &[3, b'a', b'b']);
    }
}
