//! The shipper's snapshot thread: a snapshot made and sent when the stream needs one (it does
//! not go on where the log does) or when one is due (the tail has grown), while the frame
//! thread goes on shipping.

use super::{Inner, ShipState};
use crate::error::ReplicaError;
use crate::metrics;

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
                Err(e) => {
                    tracing::warn!(error = %e, "a snapshot for the replica failed; trying again");
                    self.failed(&e);
                    failures += 1;
                    if !self.pause(self.backoff().spread_after(failures)) {
                        return;
                    }
                }
            }
        }
    }

    fn snapshot(&self) -> Result<(), ReplicaError> {
        let make = self
            .make_snapshot
            .get()
            .ok_or_else(|| ReplicaError::Refused {
                detail: "no snapshot maker".into(),
            })?;
        let dir = &self.settings.snapshot_dir;
        let local = |what: &str, e: &dyn std::fmt::Display| ReplicaError::Refused {
            detail: format!("making a snapshot ({what}, {}): {e}", dir.display()),
        };
        if dir.exists() {
            std::fs::remove_dir_all(dir).map_err(|e| local("removing an old one", &e))?;
        }
        let (file, seq) = make(dir).map_err(|e| local("copying the database", &e))?;
        let bytes = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
        let sent = self
            .replica
            .snapshot(seq, &file, self.settings.mode.guarantee());
        let _ = std::fs::remove_dir_all(dir);
        sent?;
        let mut state = self.state.lock();
        state.snapshots += 1;
        state.last_snapshot = Some(seq);
        state.last_snapshot_bytes = bytes;
        state.snapshotting = false;
        state.shipped = state.shipped.max(seq);
        while state.queue.front().is_some_and(|q| q.frame.seq <= seq) {
            if let Some(q) = state.queue.pop_front() {
                state.queued_bytes -= q.frame.payload.len() as u64;
            }
        }
        if state.needs_snapshot {
            // Whole again if the queue begins right after the snapshot (or nothing came since).
            let next = state
                .queue
                .front()
                .map_or(state.durable + 1, |q| q.frame.seq);
            state.needs_snapshot = next != seq + 1 && state.durable > seq;
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
}
