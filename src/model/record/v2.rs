//! Version 2 of the record layout, the one this build writes: varints where numbers are small,
//! times as distances from the one before, and stored responses above [`COMPRESS_AT`] bytes
//! compressed as an LZ4 block when that saves space (`docs/design.md`, "Record, version 2").

use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::invalid::CorruptRecord;
use crate::model::limits::{FINGERPRINT_LEN, MAX_RESPONSE_BYTES};
use crate::model::response::Response;

use super::reader::{Reader, put_delta, put_varint, unknown_state};
use super::{Record, RecordState, STATE_COMPLETED, STATE_IN_PROGRESS, STATE_TOMBSTONE};

pub(super) const VERSION: u8 = 2;

/// Bodies shorter than this are stored as they are: below it LZ4 rarely saves enough to pay
/// for the decompression on every replay.
pub(crate) const COMPRESS_AT: usize = 256;

/// How a body is stored.
const BODY_RAW: u8 = 0;
const BODY_LZ4: u8 = 1;

pub(super) fn encode(record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(VERSION);
    out.push(match record.state {
        RecordState::InProgress { .. } => STATE_IN_PROGRESS,
        RecordState::Completed { .. } => STATE_COMPLETED,
        RecordState::Tombstone { .. } => STATE_TOMBSTONE,
    });
    out.extend_from_slice(record.fingerprint.as_bytes());
    put_varint(&mut out, record.fence);
    put_varint(&mut out, record.origin_fence);
    put_varint(&mut out, u64::from(record.attempt));
    let created = record.created_at.as_millis();
    put_varint(&mut out, created);
    match &record.state {
        RecordState::InProgress {
            lease_until,
            checkpoint,
        } => {
            put_delta(&mut out, created, lease_until.as_millis());
            match checkpoint {
                None => put_varint(&mut out, 0),
                Some(bytes) => {
                    put_varint(&mut out, bytes.len() as u64 + 1);
                    out.extend_from_slice(bytes);
                }
            }
        }
        RecordState::Completed {
            completed_at,
            expires_at,
            response,
        } => {
            put_delta(&mut out, created, completed_at.as_millis());
            put_delta(&mut out, completed_at.as_millis(), expires_at.as_millis());
            put_response(&mut out, response);
        }
        RecordState::Tombstone {
            completed_at,
            until,
        } => {
            put_delta(&mut out, created, completed_at.as_millis());
            put_delta(&mut out, completed_at.as_millis(), until.as_millis());
        }
    }
    out
}

fn put_response(out: &mut Vec<u8>, response: &Response) {
    out.reserve(response.encoded_len());
    put_varint(out, u64::from(response.status()));
    put_varint(out, response.headers().len() as u64);
    for (name, value) in response.headers() {
        put_varint(out, name.len() as u64);
        out.extend_from_slice(name.as_bytes());
        put_varint(out, value.len() as u64);
        out.extend_from_slice(value);
    }
    let body = response.body();
    if body.len() >= COMPRESS_AT {
        let packed = lz4_flex::block::compress(body);
        // Kept only if it saves more than its own extra length field.
        if packed.len() + 4 < body.len() {
            out.push(BODY_LZ4);
            put_varint(out, body.len() as u64);
            put_varint(out, packed.len() as u64);
            out.extend_from_slice(&packed);
            return;
        }
    }
    out.push(BODY_RAW);
    put_varint(out, body.len() as u64);
    out.extend_from_slice(body);
}

pub(super) fn decode(bytes: &[u8]) -> Result<Record, CorruptRecord> {
    let mut r = Reader::new(bytes);
    let version = r.u8("version")?;
    debug_assert_eq!(
        version, VERSION,
        "the caller dispatches on the version byte"
    );
    let state_tag = r.u8("state")?;
    let fingerprint = Fingerprint::from_array(r.array::<FINGERPRINT_LEN>("fingerprint")?);
    let fence = r.varint("fence")?;
    let origin_fence = r.varint("origin fence")?;
    let attempt = r.varint_as::<u32>("attempt")?;
    let created = r.varint("created_at")?;
    let state = match state_tag {
        STATE_IN_PROGRESS => in_progress(&mut r, created)?,
        STATE_COMPLETED => {
            let completed_at = r.delta(created, "completed_at")?;
            RecordState::Completed {
                completed_at: Timestamp::from_millis(completed_at),
                expires_at: Timestamp::from_millis(r.delta(completed_at, "expires_at")?),
                response: response(&mut r)?,
            }
        }
        STATE_TOMBSTONE => {
            let completed_at = r.delta(created, "completed_at")?;
            RecordState::Tombstone {
                completed_at: Timestamp::from_millis(completed_at),
                until: Timestamp::from_millis(r.delta(completed_at, "until")?),
            }
        }
        other => return Err(unknown_state(other)),
    };
    r.finish()?;
    Ok(Record {
        fingerprint,
        fence,
        origin_fence,
        attempt,
        created_at: Timestamp::from_millis(created),
        state,
    })
}

fn in_progress(r: &mut Reader<'_>, created: u64) -> Result<RecordState, CorruptRecord> {
    let lease_until = Timestamp::from_millis(r.delta(created, "lease_until")?);
    let checkpoint = match r.varint_as::<usize>("checkpoint length")? {
        0 => None,
        len => Some(r.take(len - 1, "checkpoint")?.to_vec()),
    };
    Ok(RecordState::InProgress {
        lease_until,
        checkpoint,
    })
}

fn response(r: &mut Reader<'_>) -> Result<Response, CorruptRecord> {
    let status = r.varint_as::<u16>("status")?;
    let count = r.varint_as::<usize>("header count")?;
    let mut headers = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let name_len = r.varint_as::<usize>("header name length")?;
        let name = r.utf8(name_len, "header name")?;
        let value_len = r.varint_as::<usize>("header value length")?;
        headers.push((name, r.take(value_len, "header value")?.to_vec()));
    }
    let body = match r.u8("body encoding")? {
        BODY_RAW => {
            let len = r.varint_as::<usize>("body length")?;
            r.take(len, "body")?.to_vec()
        }
        BODY_LZ4 => unpack(r)?,
        other => {
            return Err(CorruptRecord::BadField {
                field: "body encoding",
                detail: format!("unknown body encoding {other}"),
            });
        }
    };
    Ok(Response::from_parts(status, headers, body))
}

/// An LZ4 body: its length is checked against the largest response a store accepts before
/// anything is allocated, and the block must decompress to exactly that length.
fn unpack(r: &mut Reader<'_>) -> Result<Vec<u8>, CorruptRecord> {
    let len = r.varint_as::<usize>("body length")?;
    if len > MAX_RESPONSE_BYTES {
        return Err(CorruptRecord::BadField {
            field: "body length",
            detail: format!("{len} bytes is more than any store accepts ({MAX_RESPONSE_BYTES})"),
        });
    }
    let packed_len = r.varint_as::<usize>("compressed body length")?;
    let packed = r.take(packed_len, "compressed body")?;
    match lz4_flex::block::decompress(packed, len) {
        Ok(body) if body.len() == len => Ok(body),
        Ok(body) => Err(CorruptRecord::BadField {
            field: "compressed body",
            detail: format!("decompressed to {} bytes, not {len}", body.len()),
        }),
        Err(e) => Err(CorruptRecord::BadField {
            field: "compressed body",
            detail: e.to_string(),
        }),
    }
}
