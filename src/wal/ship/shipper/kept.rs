//! Frames the stream acknowledged since its last snapshot, kept to send again to a broker
//! that lost them (`ReplicaError::Lost`).
//!
//! A catch-up snapshot holds the frames the database file holds, which may stop short of the
//! log: a synchronous store keeps a frame the replica never acknowledged out of the file until
//! the replica does, and the replica cannot take it before the frames it lost. So the frames
//! acknowledged since the last snapshot stay here, and a lost stream gets them back after its
//! new snapshot. They share the queue's budget: past it the oldest go (a later snapshot then
//! stands for them, as after an overflow).

use super::{Queued, State};

impl State {
    /// Keeps `frame`, which the stream acknowledged, within the queue's budget `budget`.
    pub(super) fn keep(&mut self, frame: Queued, budget: u64) {
        self.kept_bytes += frame.frame.payload.len() as u64;
        self.kept.push_back(frame);
        while self.kept_bytes + self.queued_bytes > budget {
            let Some(old) = self.kept.pop_front() else {
                break;
            };
            self.kept_bytes -= old.frame.payload.len() as u64;
        }
    }

    /// A snapshot of every frame up to `seq` reached the stream: what it covers needs no keeping.
    pub(super) fn forget_kept_through(&mut self, seq: u64) {
        while self.kept.front().is_some_and(|q| q.frame.seq <= seq) {
            if let Some(q) = self.kept.pop_front() {
                self.kept_bytes -= q.frame.payload.len() as u64;
            }
        }
    }

    /// The stream lost what it acknowledged: the kept frames go back in front of the queue,
    /// to follow the catch-up snapshot.
    pub(super) fn requeue_kept(&mut self) {
        assert!(
            self.kept
                .back()
                .zip(self.queue.front())
                .is_none_or(|(k, q)| k.frame.seq < q.frame.seq),
            "kept frames come before the queued ones"
        );
        self.queued_bytes += self.kept_bytes;
        self.kept_bytes = 0;
        while let Some(q) = self.kept.pop_back() {
            self.queue.push_front(q);
        }
    }
}
