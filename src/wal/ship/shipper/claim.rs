//! The shipper's claim of the stream, and what a replica's failure does to its state.
//!
//! What the store does with the stream it claimed is `model::writer_epoch::after_claim`:
//! ship on from the queue, catch up with a snapshot, or stop because the stream holds frames
//! this store's log lacks. A broker that lost the stream (`ReplicaError::Lost`) sends the
//! shipper back here: the claim creates the stream again and the store catches it up with a
//! snapshot of everything it holds.

use super::{Inner, ShipState};
use crate::error::ReplicaError;
use crate::model::writer_epoch::{AfterClaim, after_claim};

impl Inner {
    /// Counts a replica's failure in the state: fenced (for good), lost (claim again), or
    /// unreachable (try again).
    pub(super) fn failed(&self, e: &ReplicaError) {
        let mut state = self.state.lock();
        state.last_error = Some(e.clone());
        state.state = match e {
            ReplicaError::OtherWriter { .. }
            | ReplicaError::Moved { .. }
            | ReplicaError::Fenced { .. } => {
                tracing::error!(error = %e, "shipping stopped: another store writes the stream");
                state.clear_queue();
                ShipState::Fenced
            }
            ReplicaError::Lost { .. } => {
                tracing::error!(error = %e, "the broker lost the stream; claiming it again to send a snapshot of everything this store holds");
                state.requeue_kept();
                ShipState::Claiming
            }
            _ => {
                if state.state != ShipState::Unreachable {
                    tracing::warn!(error = %e, "the replica is unreachable; shipping tries again");
                }
                ShipState::Unreachable
            }
        };
        state.report();
        drop(state);
        self.changed.notify_all();
    }

    /// Claims the stream, trying again while the replica is away; `false` if stopped or
    /// fenced.
    pub(super) fn claim_stream(&self) -> bool {
        let mut failures = 0;
        loop {
            if self.state.lock().stopping {
                return false;
            }
            match self.replica.claim(&self.settings.me, self.settings.epoch) {
                Ok(position) => {
                    self.claimed(position.last_frame, position.snapshot);
                    return self.state.lock().state != ShipState::Fenced;
                }
                Err(e) => {
                    self.failed(&e);
                    if matches!(
                        e,
                        ReplicaError::OtherWriter { .. } | ReplicaError::Fenced { .. }
                    ) {
                        return false;
                    }
                    failures += 1;
                    if !self.pause(self.settings.backoff.spread_after(failures)) {
                        return false;
                    }
                }
            }
        }
    }

    /// The stream is ours and ends at `last`; `snapshot` is where its snapshot is, if any.
    fn claimed(&self, last: u64, snapshot: Option<u64>) {
        let mut state = self.state.lock();
        let lost = matches!(state.last_error, Some(ReplicaError::Lost { .. }));
        // A claim comes first, or after a broker lost the stream: what the stream holds now
        // counts, not what it acknowledged before.
        assert!(
            state.shipped == 0 || lost,
            "the stream is claimed again only after the broker lost it"
        );
        state.shipped = last;
        // Frames the stream already holds leave the queue.
        state.drop_through(last);
        let next = state.next_to_ship();
        // A stream begins with a snapshot: a restore needs the store's own file (its
        // settings, such as the partitions' filter key, are not in any frame).
        match after_claim(last, state.durable, next, snapshot.is_some()) {
            AfterClaim::Ahead => {
                state.state = ShipState::Fenced;
                state.last_error = Some(ReplicaError::Refused {
                    detail: format!(
                        "the stream holds frames up to {last}, past this store's log ({}): another store wrote it, or this store is an older copy; restore from the stream, or ship to another one",
                        state.durable
                    ),
                });
                tracing::error!(
                    last,
                    durable = state.durable,
                    "shipping stopped: the stream is ahead of this store"
                );
            }
            after => {
                if after == AfterClaim::CatchUp {
                    state.needs_snapshot = true;
                }
                state.state = if state.needs_snapshot {
                    ShipState::CatchingUp
                } else {
                    ShipState::Shipping
                };
                // A lost stream stays in the alert until the snapshot has caught it up.
                if !lost || !state.needs_snapshot {
                    state.last_error = None;
                }
                tracing::info!(
                    stream_last = last,
                    durable = state.durable,
                    catching_up = state.needs_snapshot,
                    "claimed the stream"
                );
            }
        }
        state.report();
        drop(state);
        self.changed.notify_all();
    }
}
