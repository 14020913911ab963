//! The idempotency record: what the records table stores for one scope.
//!
//! This module owns the record's byte layout (documented in `docs/design.md`, little-endian,
//! version byte first). Decoding never trusts lengths: a truncated or padded record is an error
//! naming what is wrong, never a panic.

use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::invalid::CorruptRecord;
use crate::model::limits::FINGERPRINT_LEN;
use crate::model::response::Response;

/// The record format this build writes and reads.
pub(crate) const RECORD_VERSION: u8 = 1;

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

    /// Encodes the record in the layout documented in `docs/design.md`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        out.push(RECORD_VERSION);
        out.push(match self.state {
            RecordState::InProgress { .. } => STATE_IN_PROGRESS,
            RecordState::Completed { .. } => STATE_COMPLETED,
            RecordState::Tombstone { .. } => STATE_TOMBSTONE,
        });
        out.extend_from_slice(self.fingerprint.as_bytes());
        out.extend_from_slice(&self.fence.to_le_bytes());
        out.extend_from_slice(&self.origin_fence.to_le_bytes());
        out.extend_from_slice(&self.attempt.to_le_bytes());
        out.extend_from_slice(&self.created_at.as_millis().to_le_bytes());
        match &self.state {
            RecordState::InProgress {
                lease_until,
                checkpoint,
            } => {
                out.extend_from_slice(&lease_until.as_millis().to_le_bytes());
                match checkpoint {
                    None => out.push(0),
                    Some(bytes) => {
                        out.push(1);
                        put_u32_len(&mut out, bytes.len());
                        out.extend_from_slice(bytes);
                    }
                }
            }
            RecordState::Completed {
                completed_at,
                expires_at,
                response,
            } => {
                out.reserve(response.encoded_len() + 16);
                out.extend_from_slice(&completed_at.as_millis().to_le_bytes());
                out.extend_from_slice(&expires_at.as_millis().to_le_bytes());
                out.extend_from_slice(&response.status().to_le_bytes());
                // Header count and lengths are bounded by `Response::validate` before any write.
                out.extend_from_slice(&(response.headers().len() as u16).to_le_bytes());
                for (name, value) in response.headers() {
                    out.extend_from_slice(&(name.len() as u16).to_le_bytes());
                    out.extend_from_slice(name.as_bytes());
                    put_u32_len(&mut out, value.len());
                    out.extend_from_slice(value);
                }
                put_u32_len(&mut out, response.body().len());
                out.extend_from_slice(response.body());
            }
            RecordState::Tombstone {
                completed_at,
                until,
            } => {
                out.extend_from_slice(&completed_at.as_millis().to_le_bytes());
                out.extend_from_slice(&until.as_millis().to_le_bytes());
            }
        }
        out
    }

    /// Decodes a record, refusing anything that is not exactly one well-formed record.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Record, CorruptRecord> {
        let mut r = Reader { bytes, pos: 0 };
        let version = r.u8("version")?;
        if version != RECORD_VERSION {
            return Err(CorruptRecord::UnknownVersion { version });
        }
        let state_tag = r.u8("state")?;
        let fingerprint = Fingerprint::from_array(r.array::<FINGERPRINT_LEN>("fingerprint")?);
        let fence = r.u64("fence")?;
        let origin_fence = r.u64("origin fence")?;
        let attempt = r.u32("attempt")?;
        let created_at = Timestamp::from_millis(r.u64("created_at")?);
        let state = match state_tag {
            STATE_IN_PROGRESS => in_progress(&mut r)?,
            STATE_COMPLETED => completed(&mut r)?,
            STATE_TOMBSTONE => RecordState::Tombstone {
                completed_at: Timestamp::from_millis(r.u64("completed_at")?),
                until: Timestamp::from_millis(r.u64("until")?),
            },
            other => {
                return Err(CorruptRecord::BadField {
                    field: "state",
                    detail: format!("unknown state tag {other}"),
                });
            }
        };
        if r.pos != bytes.len() {
            return Err(CorruptRecord::TrailingBytes {
                extra: bytes.len() - r.pos,
            });
        }
        Ok(Record {
            fingerprint,
            fence,
            origin_fence,
            attempt,
            created_at,
            state,
        })
    }
}

/// An in-progress record's fields after the common head: the lease, the checkpoint.
fn in_progress(r: &mut Reader<'_>) -> Result<RecordState, CorruptRecord> {
    let lease_until = Timestamp::from_millis(r.u64("lease_until")?);
    let checkpoint = match r.u8("checkpoint flag")? {
        0 => None,
        1 => {
            let len = r.u32("checkpoint length")? as usize;
            Some(r.take(len, "checkpoint")?.to_vec())
        }
        other => {
            return Err(CorruptRecord::BadField {
                field: "checkpoint flag",
                detail: format!("{other} is neither 0 nor 1"),
            });
        }
    };
    Ok(RecordState::InProgress {
        lease_until,
        checkpoint,
    })
}

/// A completed record's fields after the common head: its times, then the response.
fn completed(r: &mut Reader<'_>) -> Result<RecordState, CorruptRecord> {
    let completed_at = Timestamp::from_millis(r.u64("completed_at")?);
    let expires_at = Timestamp::from_millis(r.u64("expires_at")?);
    let status = r.u16("status")?;
    let count = r.u16("header count")?;
    let mut headers = Vec::with_capacity(usize::from(count).min(64));
    for _ in 0..count {
        let name_len = usize::from(r.u16("header name length")?);
        let name = std::str::from_utf8(r.take(name_len, "header name")?)
            .map_err(|_| CorruptRecord::BadField {
                field: "header name",
                detail: "not UTF-8".into(),
            })?
            .to_owned();
        let value_len = r.u32("header value length")? as usize;
        headers.push((name, r.take(value_len, "header value")?.to_vec()));
    }
    let body_len = r.u32("body length")? as usize;
    let body = r.take(body_len, "body")?.to_vec();
    Ok(RecordState::Completed {
        completed_at,
        expires_at,
        response: Response::from_parts(status, headers, body),
    })
}

fn put_u32_len(out: &mut Vec<u8>, len: usize) {
    // Lengths are bounded by the store's limits (far below 4 GiB) before any record is built.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], CorruptRecord> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(CorruptRecord::Truncated {
                field,
                at: self.pos,
            })?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], CorruptRecord> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, field)?);
        Ok(out)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, CorruptRecord> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, CorruptRecord> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, CorruptRecord> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, CorruptRecord> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn in_progress(checkpoint: Option<Vec<u8>>) -> Record {
        Record {
            fingerprint: Fingerprint::of_bytes(b"req"),
            fence: 7,
            origin_fence: 5,
            attempt: 2,
            created_at: Timestamp::from_millis(1_000),
            state: RecordState::InProgress {
                lease_until: Timestamp::from_millis(31_000),
                checkpoint,
            },
        }
    }

    fn completed() -> Record {
        Record {
            state: RecordState::Completed {
                completed_at: Timestamp::from_millis(2_000),
                expires_at: Timestamp::from_millis(86_402_000),
                response: Response::new(500, b"boom".to_vec())
                    .with_header("content-type", b"text/plain".to_vec()),
            },
            ..in_progress(None)
        }
    }

    #[test]
    fn round_trips_every_state() -> Result<(), CorruptRecord> {
        let tombstone = Record {
            state: RecordState::Tombstone {
                completed_at: Timestamp::from_millis(2_000),
                until: Timestamp::from_millis(90_000_000),
            },
            ..in_progress(None)
        };
        for rec in [
            in_progress(None),
            in_progress(Some(vec![])),
            in_progress(Some(b"step-3".to_vec())),
            completed(),
            tombstone,
        ] {
            assert_eq!(Record::decode(&rec.encode())?, rec);
        }
        Ok(())
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = completed().encode();
        for len in 0..bytes.len() {
            assert!(
                Record::decode(&bytes[..len]).is_err(),
                "prefix of {len} bytes"
            );
        }
    }

    #[test]
    fn trailing_bytes_and_unknown_versions_are_errors() {
        let mut bytes = in_progress(None).encode();
        bytes.push(0);
        assert!(matches!(
            Record::decode(&bytes),
            Err(CorruptRecord::TrailingBytes { extra: 1 })
        ));
        let mut bytes = in_progress(None).encode();
        bytes[0] = 9;
        assert!(matches!(
            Record::decode(&bytes),
            Err(CorruptRecord::UnknownVersion { version: 9 })
        ));
    }

    #[test]
    fn layout_offsets_match_the_design_doc() {
        let bytes = in_progress(Some(b"ab".to_vec())).encode();
        assert_eq!(bytes[0], RECORD_VERSION);
        assert_eq!(bytes[1], STATE_IN_PROGRESS);
        assert_eq!(&bytes[34..42], &7u64.to_le_bytes());
        assert_eq!(&bytes[42..50], &5u64.to_le_bytes());
        assert_eq!(&bytes[50..54], &2u32.to_le_bytes());
        assert_eq!(&bytes[62..70], &31_000u64.to_le_bytes());
        assert_eq!(bytes[70], 1);
        assert_eq!(&bytes[71..75], &2u32.to_le_bytes());
        assert_eq!(bytes.len(), 77);
    }
}
