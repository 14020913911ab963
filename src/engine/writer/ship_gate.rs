//! The gate a synchronous store that refuses while its replica is away keeps: no new group
//! while the replica does not answer, and no restore in place (which makes frames visible)
//! before the replica holds every frame.

use std::sync::Arc;

use crate::error::StoreError;
use crate::wal::ship::Shipper;

/// For a synchronous store that refuses while the replica is away: whether it may write
/// now (the replica answers). The error says why not, as "not written" (nothing of the
/// request ran).
///
/// In every mode, a store the stream's writer fenced off (a take-over at a later epoch,
/// another store's stream) takes no writes: whatever it acknowledged would never reach the
/// stream, and a restore of the stream would not know it.
pub(super) fn ship_ready(shipper: Option<&Arc<Shipper>>) -> Result<(), StoreError> {
    if let Some(e) = shipper.and_then(|s| s.fenced()) {
        return Err(fenced(e));
    }
    refusing(shipper).map_or(Ok(()), |s| s.ready().map_err(refused))
}

fn fenced(e: crate::error::ReplicaError) -> StoreError {
    StoreError::NotWritten {
        kind: std::io::ErrorKind::PermissionDenied,
        cause: format!("this store's stream is written by another store: it takes no writes ({e})")
            .into(),
    }
}

/// For a synchronous store that refuses while the replica is away: whether a restore in
/// place may make frames visible, which needs the replica to hold every one of them (a
/// frame the replica did not acknowledge is kept until it does).
pub(super) fn ship_caught_up(shipper: Option<&Arc<Shipper>>) -> Result<(), StoreError> {
    refusing(shipper).map_or(Ok(()), |s| s.caught_up().map_err(refused))
}

/// The shipper, if the store ships synchronously and refuses while the replica is away.
fn refusing(shipper: Option<&Arc<Shipper>>) -> Option<&Arc<Shipper>> {
    shipper.filter(|s| s.mode().refuses())
}

fn refused(e: crate::error::ReplicaError) -> StoreError {
    StoreError::NotWritten {
        // As for a frame the replica did not acknowledge (`wal::log_thread`).
        kind: std::io::ErrorKind::NotConnected,
        cause: format!(
            "the store ships its log synchronously and refuses writes while its replica lacks frames or does not answer ({e})"
        )
        .into(),
    }
}
