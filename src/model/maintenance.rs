//! What maintenance and monitoring operations take and report: an eviction pass, the
//! abandoned-work listing, an operator's removal, a compaction, a backup. Plain values, the
//! same from every backend.

use std::time::Duration;

use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::scope::Scope;

/// What one eviction pass did, and whether more is waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Evicted {
    /// Completed records whose TTL passed and whose response was removed (deleted, or kept as
    /// a tombstone when `Builder::tombstone_ttl` is set).
    pub removed: usize,
    /// Tombstones whose time ran out, deleted.
    pub tombstones_removed: usize,
    /// Whether more is due past this pass's limit.
    pub backlog: Backlog,
}

/// Whether work remains after a bounded pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backlog {
    /// Nothing more is due now.
    Empty,
    /// More is due: call again.
    More,
}

/// In-progress work whose lease expired: its outcome is unknown, and no attempt holds it.
///
/// A reconciler drives it to completion: `begin` with the same fingerprint takes it
/// over as `Recovered`, with the attempt count and the last checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Abandoned {
    /// The scope.
    pub scope: Scope,
    /// The fingerprint of the request that claimed it (pass it to `begin` to take it over).
    pub fingerprint: Fingerprint,
    /// The last holder's fence.
    pub fence: u64,
    /// Attempts so far.
    pub attempt: u32,
    /// When it was first claimed.
    pub created_at: Timestamp,
    /// When the last lease ended.
    pub lease_until: Timestamp,
    /// The last checkpoint stored, if any.
    pub checkpoint: Option<Vec<u8>>,
}

/// What [`Store::compact`](crate::Store::compact) did to the database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// The file's size before, in bytes.
    pub bytes_before: u64,
    /// The file's size after, in bytes.
    pub bytes_after: u64,
}

impl Compacted {
    /// Bytes given back to the file system.
    pub fn reclaimed(&self) -> u64 {
        self.bytes_before.saturating_sub(self.bytes_after)
    }
}

/// What [`Store::backup`](crate::Store::backup) copied: one snapshot of the store, taken
/// after every write acknowledged before the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackedUp {
    /// Records copied: in progress, completed and tombstones.
    pub records: u64,
    /// Outbox messages copied: pending ones and dead letters.
    pub messages: u64,
    /// Rows of the business tables copied, all tables together.
    pub business_rows: u64,
    /// The size of the copy's database file, in bytes.
    pub bytes: u64,
    /// The snapshot's point, as the store's fence counter: every claim and take-over given a
    /// fence below it happened before the snapshot, none at or above it did.
    pub next_fence: u64,
    /// How long the backup took, from the call to the copy renamed into place.
    pub duration: Duration,
}

/// How `forget` may remove a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forget {
    /// An in-progress record, if it still has this fence: an operator who found out (by its
    /// downstream key) that the abandoned attempt had no side effect gives the key back, and
    /// a take-over in the meantime is not undone.
    Fence(u64),
    /// A completed record (or its tombstone), by force: the key can be used again for a new
    /// request. An in-progress record is refused: its outcome is unknown.
    Completed,
}

/// What [`Store::restore`](crate::Store::restore) rebuilt.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Restored {
    /// The frame the snapshot covered.
    pub snapshot: u64,
    /// Frames after the snapshot written into the new store's log; its first open replays
    /// them.
    pub frames: u64,
    /// The last frame the stream held: the restored store's log goes on after it.
    pub last_frame: u64,
    /// What the old store promised: with [`Guarantee::MayLag`](crate::Guarantee::MayLag) it
    /// may have acknowledged more than the stream held, and the restored store answers
    /// unknown keys as recoveries for a while after its first open.
    pub guarantee: crate::model::replica::Guarantee,
    /// Whether the restore took the stream over (see [`Takeover`]).
    pub took_over: bool,
    /// How long the restore took.
    pub duration: std::time::Duration,
}

/// Whether a restore makes the new store the stream's writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// The old store is lost: the restored store becomes the stream's writer, and the old one
    /// is fenced off (its publishes fail from now on). Use it for the box that replaces a lost
    /// one.
    Yes,
    /// A copy only (to inspect, or to test a restore): the stream keeps its writer, and the
    /// restored store is refused if it tries to ship to the stream.
    No,
}
