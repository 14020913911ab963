//! The shipper's snapshot thread: a snapshot made and sent when the stream needs one (it does
//! not go on where the log does) or when one is due (the tail has grown), while the frame
//! thread goes on shipping.

use super::{Inner, ShipState};
use crate::error::ReplicaError;
use crate::metrics;

/// Why a snapshot did not reach the replica.
enum SnapshotFailure {
    /// It could not be made here (the disk is full, the database cannot be read): the replica
    /// is not at fault, and frames go on shipping.
    Here(String),
    /// The replica did not take it.
    Replica(ReplicaError),
}

impl Inner {
    /// Makes and sends snapshots when one is needed (catching up) or due (a long tail).
    pub(super) fn run_snapshots(&self) {
        let mut failures = 0;
        loop {
            {
                let mut state = self.state.lock();
                loop {
                    if state.stopping || state.state == ShipState::Fenced {
                        return;
                    }
                    let wanted = state.needs_snapshot || state.snapshotting;
                    let claimed = !matches!(state.state, ShipState::Claiming);
                    if wanted && claimed && self.make_snapshot.get().is_some() {
                        break;
                    }
                    self.changed.wait(&mut state);
                }
                if state.needs_snapshot {
                    state.state = ShipState::CatchingUp;
                }
            }
            match self.snapshot() {
                Ok(()) => failures = 0,
                Err(failure) => {
                    self.snapshot_failed(&failure);
                    failures += 1;
                    if !self.pause(self.settings.backoff.spread_after(failures)) {
                        return;
                    }
                }
            }
        }
    }

    fn snapshot(&self) -> Result<(), SnapshotFailure> {
        let dir = &self.settings.snapshot_dir;
        let local = |what: &str, e: &dyn std::fmt::Display| {
            SnapshotFailure::Here(format!(
                "making a snapshot ({what}, {}): {e}",
                dir.display()
            ))
        };
        let make = self
            .make_snapshot
            .get()
            .ok_or_else(|| local("starting", &"no snapshot maker"))?;
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| local("removing an old one", &e))?;
        }
        let (file, seq) = make(dir).map_err(|e| local("copying the database", &e))?;
        let bytes = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        let sent = self.replica.snapshot(seq, &file, &self.lineage());
        let _ = std::fs::remove_dir_all(dir);
        sent.map_err(SnapshotFailure::Replica)?;
        let mut state = self.state.lock();
        state.snapshot_error = None;
        state.snapshots += 1;
        state.last_snapshot = Some(seq);
        state.last_snapshot_bytes = bytes;
        state.snapshotting = false;
        state.shipped = state.shipped.max(seq);
        state.drop_through(seq);
        state.forget_kept_through(seq);
        if state.needs_snapshot {
            // Whole again if the queue begins right after the snapshot (or nothing came since).
            state.needs_snapshot = state.next_to_ship() != seq + 1 && state.durable > seq;
            if !state.needs_snapshot {
                state.state = ShipState::Shipping;
                state.last_error = None;
            }
        }
        tracing::info!(seq, bytes, "sent a snapshot to the replica");
        metrics::count(metrics::SHIP_SNAPSHOTS, 1);
        state.report();
        drop(state);
        self.changed.notify_all();
        Ok(())
    }

    /// Counts a failed snapshot. A replica's failure is the replica's state (as for frames);
    /// one made here changes nothing of it, except that a stream waiting for this snapshot
    /// (`CatchingUp`) says why it still waits.
    fn snapshot_failed(&self, failure: &SnapshotFailure) {
        metrics::count(metrics::SHIP_SNAPSHOT_FAILURES, 1);
        let detail = match failure {
            SnapshotFailure::Replica(e) => e.to_string(),
            SnapshotFailure::Here(detail) => detail.clone(),
        };
        tracing::warn!(error = %detail, "a snapshot for the replica failed; trying again");
        {
            let mut state = self.state.lock();
            state.snapshot_failures += 1;
            state.snapshot_error = Some(detail.clone());
            if let SnapshotFailure::Here(_) = failure
                && state.needs_snapshot
                && state.state == ShipState::CatchingUp
            {
                state.last_error = Some(ReplicaError::Refused { detail });
            }
        }
        if let SnapshotFailure::Replica(e) = failure {
            self.failed(e);
        }
    }
}
