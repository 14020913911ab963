//! Version 1 of the record layout: fixed-width little-endian fields. Written by builds before
//! format 2 and read, as it is, by this one (`docs/design.md`, "Record, version 1").

use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::invalid::CorruptRecord;
use crate::model::limits::FINGERPRINT_LEN;
use crate::model::response::Response;

use super::reader::{Reader, unknown_state};
use super::{Record, RecordState, STATE_COMPLETED, STATE_IN_PROGRESS, STATE_TOMBSTONE};

pub(super) const VERSION: u8 = 1;

pub(super) fn decode(bytes: &[u8]) -> Result<Record, CorruptRecord> {
    let mut r = Reader::new(bytes);
    let version = r.u8("version")?;
    debug_assert_eq!(
        version, VERSION,
        "the caller dispatches on the version byte"
    );
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
        other => return Err(unknown_state(other)),
    };
    r.finish()?;
    Ok(Record {
        fingerprint,
        fence,
        origin_fence,
        attempt,
        created_at,
        state,
    })
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
        let name = r.utf8(name_len, "header name")?;
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

#[cfg(any(test, feature = "testing"))]
fn put_u32_len(out: &mut Vec<u8>, len: usize) {
    // Lengths are bounded by the store's limits (far below 4 GiB) before any record is built.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_le_bytes());
}

/// The version 1 writer, kept for tests and fuzzing: version 1 bytes as format 1 wrote them.
#[cfg(any(test, feature = "testing"))]
pub(super) fn encode(record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(96);
    out.push(VERSION);
    out.push(match record.state {
        RecordState::InProgress { .. } => STATE_IN_PROGRESS,
        RecordState::Completed { .. } => STATE_COMPLETED,
        RecordState::Tombstone { .. } => STATE_TOMBSTONE,
    });
    out.extend_from_slice(record.fingerprint.as_bytes());
    out.extend_from_slice(&record.fence.to_le_bytes());
    out.extend_from_slice(&record.origin_fence.to_le_bytes());
    out.extend_from_slice(&record.attempt.to_le_bytes());
    out.extend_from_slice(&record.created_at.as_millis().to_le_bytes());
    match &record.state {
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
