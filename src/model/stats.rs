//! What a store reports about itself: records by state, the log, and counters since open.

use std::time::Duration;

/// Buckets of the group-size histogram: sizes 1, 2-3, 4-7, ..., 512-1023, 1024 and more.
pub(crate) const GROUP_SIZE_BUCKETS: usize = 11;

/// A store's state and activity, from [`Store::stats`](crate::Store::stats) (or, exact,
/// [`Store::exact_stats`](crate::Store::exact_stats)).
///
/// Records by state are read from the tables' lengths (constant time); counters count since
/// the store was opened in this process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Records of every state (expired ones not yet evicted included).
    pub records: u64,
    /// In-progress records (claims held, or abandoned by a crashed attempt).
    pub in_progress: u64,
    /// Completed records, including ones past their TTL that eviction has not reached yet.
    pub completed: u64,
    /// Tombstones (see `Builder::tombstone_ttl`): completed records whose response eviction
    /// removed.
    pub tombstones: u64,
    /// Age of the in-progress record whose lease ends first (normally the oldest work in
    /// progress; an extended lease can hide an older one). `None` if nothing is in progress.
    pub oldest_in_progress: Option<Duration>,

    /// Log bytes written since the last checkpoint: what a crash now would replay.
    pub log_bytes_since_checkpoint: u64,
    /// Time since the last checkpoint (or since open, if none yet). `None` in `Redb` mode.
    pub since_checkpoint: Option<Duration>,
    /// Bytes appended to the write-ahead log since open (frame headers included).
    pub log_bytes: u64,
    /// Checkpoints since open.
    pub checkpoints: u64,

    /// `begin` answers since open: `Claimed`.
    pub claims: u64,
    /// `Recovered`: take-overs of an expired lease, and keys unknown to a store in its restore
    /// window (see [`Stats::restore_window`]).
    pub recoveries: u64,
    /// `Replay`.
    pub replays: u64,
    /// `InProgress`.
    pub in_progress_answers: u64,
    /// `Mismatch`.
    pub mismatches: u64,
    /// `Expired` (tombstone hits).
    pub expired_answers: u64,
    /// Commits, releases, extends and checkpoints refused because another attempt took the
    /// scope over (a stale fence).
    pub stale_rejections: u64,
    /// Completed records evicted after their TTL (by `evict_expired` or the sweeper).
    pub evicted: u64,
    /// Tombstones removed after their time.
    pub tombstones_removed: u64,

    /// Groups that wrote something and were made durable.
    pub groups_committed: u64,
    /// Epochs published: redb transactions, each carrying one or more groups, committed and
    /// made visible to readers.
    pub epochs: u64,
    /// Writer groups by number of requests: `group_sizes[i]` counts groups of `2^i ..
    /// 2^(i+1)` requests (the last bucket, 1,024 and more).
    pub group_sizes: [u64; GROUP_SIZE_BUCKETS],
    /// Requests the writer answered.
    pub writer_requests: u64,
    /// Requests waiting for the writer right now.
    pub queued: usize,
    /// Callers waiting in `begin_or_wait` right now.
    pub waiting: usize,

    /// Why writes are refused, while they are: the store is poisoned by a failure of unknown
    /// outcome and recovers in place (see `Builder::self_heal`). `None` while it is writable.
    pub poisoned: Option<String>,
    /// In-place recoveries since open (after a failed sync, a failed checkpoint, a redb error,
    /// or `Store::reopen`).
    pub restores: u64,
    /// The store's files and directories that other users may read (they should be `0700`
    /// and `0600`: stored responses are private).
    pub loose_permissions: Vec<crate::model::config::LooseFile>,
    /// Outbox messages committed and not yet delivered (or moved to the dead letters).
    pub outbox_pending: u64,
    /// Time since the oldest of them was committed. `None` if none is pending.
    pub oldest_pending_message: Option<Duration>,
    /// Messages the relay gave up on (`Store::dead_letters`).
    pub dead_letters: u64,
    /// The memory budget the store was opened with (`Builder::memory_budget`).
    pub memory_budget: usize,
    /// The share of it given to redb's page cache.
    pub redb_cache_bytes: usize,
    /// Partitions of completed records (the embedded store; 0 elsewhere).
    pub partitions: u64,
    /// Memory the partitions' filters take, outside the budget: about 2 bytes a completed
    /// record, and the open partition's filter whole (the embedded store; 0 elsewhere).
    pub filter_bytes: u64,
    /// The restore this store was rebuilt by (a [`Store::backup`](crate::Store::backup) copy
    /// opened, or [`Store::restore`](crate::Store::restore) from a replica): when it first
    /// opened, what it may lack, the last frame it holds, and when its restore window ends.
    /// Until then, with [`Guarantee::MayLag`](crate::Guarantee), unknown keys answer
    /// `Recovered` ([`Recovery::Restored`](crate::Recovery::Restored)). `None` for a store
    /// never restored (and on PostgreSQL). Not to be confused with [`Stats::restores`], the
    /// in-place recoveries.
    pub restore_window: Option<crate::model::restore::RestoreWindow>,
    /// Log shipping to a replica (`Builder::ship`): its state and how far the replica is
    /// behind; `None` when the store does not ship.
    pub shipping: Option<crate::model::replica::ShippingStats>,
}
