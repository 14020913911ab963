//! The write-ahead log: how a group becomes durable with one small sequential sync, and how a
//! store comes back after a crash.
//!
//! The log holds effects, never code: every put and delete a group made, by table name. Replay
//! needs only the registered tables. This module must never acknowledge a frame it has not
//! synced, and never replay a frame that follows a damaged one.

pub(crate) mod format;
mod log;
mod recovery;

use std::path::Path;

use redb::WriteTransaction;

use crate::engine::registry::{Registry, TableId};
use crate::engine::write_set::WriteSet;
use crate::error::RecoveryError;

use self::format::{Payload, PayloadOp};

pub(crate) use self::log::{AppendError, Log, LogStart};
pub use self::recovery::RecoveryReport;
pub(crate) use self::recovery::{ReplayFrame, recover};

/// Encodes the write sets a group kept as one frame payload, appended to `out`.
pub(crate) fn encode_group(
    registry: &Registry,
    sets: &[WriteSet],
    out: &mut Vec<u8>,
) -> Result<(), postcard::Error> {
    let mut ids: Vec<TableId> = Vec::new();
    let mut payload = Payload {
        tables: Vec::new(),
        ops: Vec::with_capacity(sets.iter().map(|s| s.ops().len()).sum()),
    };
    for op in sets.iter().flat_map(|s| s.ops()) {
        let index = match ids.iter().position(|&id| id == op.table) {
            Some(index) => index,
            None => {
                ids.push(op.table);
                payload.tables.push(registry.table(op.table).name());
                ids.len() - 1
            }
        };
        payload.ops.push(PayloadOp {
            // At most one entry per registered table, and table ids are u16.
            table: u16::try_from(index).unwrap_or(u16::MAX),
            key: &op.key,
            value: op.value.as_deref(),
        });
    }
    let buf = postcard::to_extend(&payload, std::mem::take(out))?;
    *out = buf;
    Ok(())
}

/// Applies one frame's writes to `txn`: each group it carries, in order, table by table in
/// the order the writes were made.
pub(crate) fn replay_frame(
    registry: &Registry,
    txn: &WriteTransaction,
    frame: ReplayFrame<'_>,
    dir: &Path,
) -> Result<(), RecoveryError> {
    let bad = |detail: String| RecoveryError::BadPayload {
        seq: frame.seq,
        segment: dir.join(frame.segment),
        offset: frame.offset,
        detail,
    };
    let groups = format::decode_frame(frame.payload).map_err(|e| bad(e.to_string()))?;
    for payload in groups {
        apply(registry, txn, &payload).map_err(|e| match e {
            ApplyError::UnknownTable(table) => RecoveryError::UnknownTable {
                table,
                seq: frame.seq,
                segment: dir.join(frame.segment),
                offset: frame.offset,
            },
            ApplyError::BadTableIndex { index, tables } => {
                bad(format!("op refers to table {index} of {tables}"))
            }
            ApplyError::Decode(e) => bad(e.to_string()),
            ApplyError::Redb(e) => RecoveryError::Apply(e),
        })?;
    }
    Ok(())
}

/// Why a group's payload could not be applied.
#[derive(Debug)]
pub(crate) enum ApplyError {
    /// The payload names a table this store did not register.
    UnknownTable(String),
    /// An op refers to a table index the payload does not list.
    BadTableIndex { index: u16, tables: usize },
    /// The payload's bytes do not decode.
    Decode(postcard::Error),
    /// redb failed.
    Redb(redb::Error),
}

/// Applies one group's encoded payload (as [`encode_group`] made it) to `txn`: how the writer
/// rebuilds an epoch without the groups that failed after it.
pub(crate) fn apply_payload(
    registry: &Registry,
    txn: &WriteTransaction,
    payload: &[u8],
) -> Result<(), ApplyError> {
    let payload: Payload<'_> = postcard::from_bytes(payload).map_err(ApplyError::Decode)?;
    apply(registry, txn, &payload)
}

fn apply(
    registry: &Registry,
    txn: &WriteTransaction,
    payload: &Payload<'_>,
) -> Result<(), ApplyError> {
    let ids = payload
        .tables
        .iter()
        .map(|&name| {
            registry
                .id(name)
                .ok_or_else(|| ApplyError::UnknownTable(name.to_owned()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut rest = payload.ops.as_slice();
    while let Some(first) = rest.first() {
        let run = rest
            .iter()
            .position(|op| op.table != first.table)
            .unwrap_or(rest.len());
        let id = *ids
            .get(usize::from(first.table))
            .ok_or(ApplyError::BadTableIndex {
                index: first.table,
                tables: ids.len(),
            })?;
        let mut ops = rest[..run].iter().map(|op| (op.key, op.value));
        registry
            .table(id)
            .apply(txn, &mut ops)
            .map_err(ApplyError::Redb)?;
        rest = &rest[run..];
    }
    Ok(())
}
