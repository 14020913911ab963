//! Applying the log's operations to redb through the table registry: at open and in-place
//! recovery (every frame past the checkpoint), and when the writer rebuilds an epoch (the
//! payloads of its durable groups). The log hands back operations by table name; this is where
//! names become registered tables, and where a name nobody registered is refused.

use std::path::Path;

use redb::WriteTransaction;

use crate::error::RecoveryError;
use crate::wal::{self, ReplayFrame};

use crate::engine::tables::registry::Registry;

/// Why a group's operations could not be applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApplyError {
    /// They name a table this store did not register.
    #[error("the group writes table {0:?}, which is not registered")]
    UnknownTable(String),
    /// An op refers to a table index its payload does not list, or the payload does not
    /// decode: damage.
    #[error("the group's payload is malformed: {0}")]
    Malformed(String),
    /// redb failed.
    #[error("redb failed: {0}")]
    Redb(redb::Error),
}

/// Applies one frame's groups to `txn`, in order.
pub(crate) fn apply_frame(
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
    let groups = wal::decode_frame(frame.payload).map_err(|e| bad(e.to_string()))?;
    for payload in groups {
        apply_ops(registry, txn, &payload).map_err(|e| match e {
            ApplyError::UnknownTable(table) => RecoveryError::UnknownTable {
                table,
                seq: frame.seq,
                segment: dir.join(frame.segment),
                offset: frame.offset,
            },
            ApplyError::Malformed(detail) => bad(detail),
            ApplyError::Redb(e) => RecoveryError::Apply(e),
        })?;
    }
    Ok(())
}

/// Applies one group's encoded payload to `txn`: how the writer rebuilds an epoch without the
/// groups that failed after it.
pub(crate) fn apply_group(
    registry: &Registry,
    txn: &WriteTransaction,
    payload: &[u8],
) -> Result<(), ApplyError> {
    let payload = wal::decode_group(payload).map_err(|e| ApplyError::Malformed(e.to_string()))?;
    apply_ops(registry, txn, &payload)
}

/// Applies a payload's operations, runs of one table at a time, in order.
fn apply_ops(
    registry: &Registry,
    txn: &WriteTransaction,
    payload: &wal::Payload<'_>,
) -> Result<(), ApplyError> {
    let ops = payload
        .ops()
        .map(|op| {
            op.map_err(|index| {
                ApplyError::Malformed(format!(
                    "op refers to table {index} of {}",
                    payload.tables.len()
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut rest = ops.as_slice();
    while let Some(first) = rest.first() {
        let run = rest
            .iter()
            .position(|op| op.table != first.table)
            .unwrap_or(rest.len());
        let id = registry
            .id(first.table)
            .ok_or_else(|| ApplyError::UnknownTable(first.table.to_owned()))?;
        let mut run_ops = rest[..run].iter().map(|op| (op.key, op.value));
        registry
            .table(id)
            .open(txn)
            .and_then(|mut table| table.apply(&mut run_ops))
            .map_err(ApplyError::Redb)?;
        rest = &rest[run..];
    }
    Ok(())
}
