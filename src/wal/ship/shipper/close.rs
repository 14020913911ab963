//! Closing a shipper: a last chance for what is queued, then the threads stop and the stream
//! is given up, so the next store to ship to it need not wait for a claim to go stale.

use std::time::{Duration, Instant};

use super::{Inner, ShipState, Shipper};

impl Drop for Shipper {
    fn drop(&mut self) {
        self.inner.last_chance(self.inner.settings.ack_timeout);
        self.inner.state.lock().stopping = true;
        self.inner.changed.notify_all();
        // The shipper's threads hold no handle of the store (the snapshot maker holds the
        // database, not the engine), so this never runs on one of them.
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
        if let Err(e) = self.inner.replica.release(&self.inner.settings.me) {
            tracing::warn!(error = %e, "giving the stream up failed; the next open of this store takes it back");
        }
    }
}

impl Inner {
    /// Waits up to `limit` for the replica to hold every frame synced so far, while it
    /// answers: a store closed right after its writes (still claiming the stream, or sending
    /// the snapshot a new stream begins with) ships them before it goes. A replica already
    /// known to be away, or a stream another store took, gets no wait: what it lacks goes
    /// with the next open's snapshot.
    fn last_chance(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut state = self.state.lock();
        loop {
            let waiting = match state.state {
                ShipState::Shipping => !state.caught_up(),
                ShipState::Claiming | ShipState::CatchingUp => true,
                ShipState::Unreachable | ShipState::Fenced => false,
            };
            if !waiting || Instant::now() >= deadline {
                return;
            }
            self.changed.wait_until(&mut state, deadline);
        }
    }
}
