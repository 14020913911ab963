//! A row of the records table, read back as the [`Record`] the state machine decides on.

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::codec::decode_headers;
use super::driver::backend;
use super::schema::{COMPLETED, IN_PROGRESS, TOMBSTONE};
use crate::error::{CorruptRecord, StoreError};
use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::record::{Record, RecordState};
use crate::model::response::Response;
use crate::model::scope::Scope;

/// Milliseconds read from a `bigint` column (a negative one, never written, reads as 0).
pub(crate) fn timestamp(ms: i64) -> Timestamp {
    Timestamp::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// The record in `row` (the lookup statement's columns), and the statement's `now`.
pub(crate) fn record_of(scope: &Scope, row: &PgRow) -> Result<(Record, Timestamp), StoreError> {
    let read = |e: sqlx::Error| backend("read a record", &e);
    let corrupt = |field: &'static str, detail: String| StoreError::CorruptRecord {
        scope: scope.to_string(),
        source: CorruptRecord::BadField { field, detail },
    };
    let present = |field: &'static str, value: Option<i64>| {
        value
            .map(timestamp)
            .ok_or_else(|| corrupt(field, "missing for the record's state".into()))
    };
    let fingerprint: Vec<u8> = row.try_get("fingerprint").map_err(read)?;
    let fingerprint =
        Fingerprint::from_slice(&fingerprint).map_err(|e| corrupt("fingerprint", e.to_string()))?;
    let state: i16 = row.try_get("state").map_err(read)?;
    let lease_until: Option<i64> = row.try_get("lease_until_ms").map_err(read)?;
    let expires: Option<i64> = row.try_get("expires_ms").map_err(read)?;
    let completed: Option<i64> = row.try_get("completed_ms").map_err(read)?;
    let state = match state {
        IN_PROGRESS => RecordState::InProgress {
            lease_until: present("lease_until_ms", lease_until)?,
            checkpoint: row.try_get("checkpoint").map_err(read)?,
        },
        COMPLETED => {
            let status: Option<i32> = row.try_get("status").map_err(read)?;
            let headers: Option<Vec<u8>> = row.try_get("headers").map_err(read)?;
            let body: Option<Vec<u8>> = row.try_get("body").map_err(read)?;
            let status = status
                .and_then(|s| u16::try_from(s).ok())
                .ok_or_else(|| corrupt("status", "missing or out of range".into()))?;
            let headers = decode_headers(headers.as_deref().unwrap_or(&[0, 0])).map_err(|e| {
                StoreError::CorruptRecord {
                    scope: scope.to_string(),
                    source: e,
                }
            })?;
            RecordState::Completed {
                completed_at: present("completed_ms", completed)?,
                expires_at: present("expires_ms", expires)?,
                response: Response::from_parts(status, headers, body.unwrap_or_default()),
            }
        }
        TOMBSTONE => RecordState::Tombstone {
            completed_at: present("completed_ms", completed)?,
            until: present("expires_ms", expires)?,
        },
        other => return Err(corrupt("state", format!("unknown state {other}"))),
    };
    let fence: i64 = row.try_get("fence").map_err(read)?;
    let origin_fence: i64 = row.try_get("origin_fence").map_err(read)?;
    let attempt: i32 = row.try_get("attempt").map_err(read)?;
    let created: i64 = row.try_get("created_ms").map_err(read)?;
    let now: i64 = row.try_get("now").map_err(read)?;
    let record = Record {
        fingerprint,
        fence: u64::try_from(fence).unwrap_or(0),
        origin_fence: u64::try_from(origin_fence).unwrap_or(0),
        attempt: u32::try_from(attempt).unwrap_or(0),
        created_at: timestamp(created),
        state,
    };
    Ok((record, timestamp(now)))
}
