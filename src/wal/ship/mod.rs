//! Shipping the log to a replica: every durable frame, in order, and snapshots that bound the
//! tail a restore replays.
//!
//! The log ships *effects*: a frame's payload is the same bytes it has on disk, so a restore
//! writes the frames into a fresh log and the store's ordinary recovery replays them. A
//! replica is anything that keeps frames in order and deduplicates a re-sent frame by its
//! sequence number; JetStream is the one this crate ships with (`replica::JetStream`, feature
//! `nats`). The traits are blocking: the store calls them from its own threads.
//!
//! - [`Replica`]: what a store writing a stream needs;
//! - [`ReplicaSource`]: what a restore reads.

use std::path::Path;
use std::sync::Arc;

use crate::error::ReplicaError;
use crate::model::replica::{SnapshotInfo, StreamPosition, WriterIdentity};
use crate::model::restore::Lineage;

/// One log frame as it is shipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShippedFrame {
    /// The frame's sequence number: one more than the previous frame's.
    pub seq: u64,
    /// The frame's payload, as the log holds it (`varint(groups) ‖ group payload ...`).
    pub payload: Arc<Vec<u8>>,
}

/// A stream a store writes its log to. Every call is bounded by the replica's own time limit
/// and fails with [`ReplicaError::Unreachable`] past it.
pub trait Replica: Send + Sync + 'static {
    /// Makes `me`, at writer epoch `epoch` (its metadata's), the stream's one writer, and
    /// says where the stream stands. The rules are `model::writer_epoch::claim`'s: refuses
    /// with [`ReplicaError::Fenced`] when the stream was taken over at a later epoch (even if
    /// its writer has since closed), with [`ReplicaError::OtherWriter`] when another store
    /// writes it; a claim left by this same store ([`WriterIdentity::same_store`], a process
    /// that died) is taken back. A stream that is gone is created again.
    fn claim(&self, me: &WriterIdentity, epoch: u64) -> Result<StreamPosition, ReplicaError>;

    /// Appends `frames` (in order, consecutive, following the stream's last frame or already
    /// in it) and returns once the replica has acknowledged every one. A frame the stream
    /// already holds (a re-send after a lost acknowledgement) is acknowledged without being
    /// stored twice. Every frame carries `lineage`, for a restore. [`ReplicaError::Fenced`]
    /// or [`ReplicaError::OtherWriter`] if another store has written the stream since this
    /// one claimed it: this store must stop shipping. [`ReplicaError::Lost`] if the stream
    /// or its writer entry is gone, or ends before what it acknowledged: claim again.
    fn publish(&self, frames: &[ShippedFrame], lineage: &Lineage) -> Result<(), ReplicaError>;

    /// Stores `file`, a store's database holding every frame up to `seq` and nothing after,
    /// as the stream's latest snapshot (with `lineage`), then drops the frames at or before
    /// `seq`. Refused as [`publish`](Replica::publish) is.
    fn snapshot(&self, seq: u64, file: &Path, lineage: &Lineage) -> Result<(), ReplicaError>;

    /// Gives the writer's claim up (the store is closing cleanly).
    fn release(&self, me: &WriterIdentity) -> Result<(), ReplicaError>;
}

/// A stream a restore reads.
pub trait ReplicaSource {
    /// Downloads the latest snapshot into `file` (which must not exist); `None` if the stream
    /// has none (a store that never took one ships its log from frame 1).
    fn fetch_snapshot(&self, file: &Path) -> Result<Option<SnapshotInfo>, ReplicaError>;

    /// The latest snapshot's description, without downloading it; `None` if there is none.
    fn latest_snapshot(&self) -> Result<Option<SnapshotInfo>, ReplicaError>;

    /// Calls `each` with every frame after `after`, and the lineage it was shipped with, in
    /// order, up to the stream's last frame as it is when the call begins; returns that last
    /// frame's number (`after` if none).
    fn frames_after(
        &self,
        after: u64,
        each: &mut dyn FnMut(ShippedFrame, Lineage) -> Result<(), ReplicaError>,
    ) -> Result<u64, ReplicaError>;

    /// Makes `me` the stream's writer in place of a lost one, at a new epoch
    /// (`model::writer_epoch::taken_over`), which it returns: every store at an older epoch
    /// is fenced off from then on, whatever happens to the entry later. `last` is the last
    /// frame the restore read, `known` the highest epoch it saw (a stream whose entry is gone
    /// starts past it); [`ReplicaError::Moved`] if the stream has gone past `last` since (the
    /// old writer is still shipping: read the new frames, or stop it, and take over again).
    fn take_over(&self, me: &WriterIdentity, last: u64, known: u64) -> Result<u64, ReplicaError>;
}

mod shipper;
mod tail;

pub(crate) use self::shipper::{NotShipped, ShipSettings, Shipper};
pub(crate) use self::tail::{TAIL_SEGMENT, TailWriter};

/// What the builder gathers for shipping: the replica, the mode and the bounds.
#[derive(Clone)]
pub(crate) struct ShipOptions {
    pub(crate) replica: Arc<dyn Replica>,
    pub(crate) mode: crate::model::replica::Shipping,
    /// How long a synchronous frame waits for its acknowledgement, and how long a synchronous
    /// store's open waits for the replica to catch up.
    pub(crate) ack_timeout: std::time::Duration,
    /// How long a synchronous store that refuses while the replica is away waits at open for
    /// the replica to catch up (a snapshot may have to be sent).
    pub(crate) open_timeout: std::time::Duration,
    /// Log shipped after which a snapshot is due (or the last snapshot's size, if larger).
    pub(crate) snapshot_bytes: u64,
}

impl std::fmt::Debug for ShipOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShipOptions")
            .field("mode", &self.mode)
            .field("ack_timeout", &self.ack_timeout)
            .field("snapshot_bytes", &self.snapshot_bytes)
            .finish_non_exhaustive()
    }
}
