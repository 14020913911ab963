//! The memory budget and how it is shared out.
//!
//! An edge box has 512 MB to 2 GB of RAM, shared with the service the store is embedded in.
//! What the store holds in memory grows with load in four places, and the budget bounds each:
//!
//! - redb's page cache (read cache and the write buffer of the open transaction), which redb
//!   sizes at 1 GiB unless told otherwise: **half** the budget;
//! - an epoch's writes before they are published to redb: the write set, the overlay that
//!   serves the acknowledged records meanwhile, and the log payloads kept to rebuild the epoch
//!   after a failure. Each is about the size of the write set, which is held to **an eighth**
//!   of the budget (at most 32 MiB, past which a larger epoch buys nothing);
//! - one writer group, and one log frame (the groups the log thread writes with one sync): an
//!   eighth each, with the same cap;
//! - with log shipping, the frames synced locally that the replica has not acknowledged yet:
//!   the last **eighth** (same cap). Past it the queue is dropped and a snapshot replaces it.
//!
//! Not bounded by the budget: a single request or response larger than those shares (it is
//! bounded by [`max_response_bytes`](crate::Builder::max_response_bytes) and
//! [`max_checkpoint_bytes`](crate::Builder::max_checkpoint_bytes) instead, and always fits in a
//! group of its own), the requests queued for the writer (at most `max_batch` × 4 of them;
//! more callers wait to queue), callers blocked in `begin_or_wait`, and the allocator's own
//! overhead (with many threads glibc keeps an arena per thread group; see the README).

/// The default budget: 64 MiB, the redb cache 32 MiB of it. Chosen by measurement
/// (`cargo bench --bench memory`): throughput at 64 clients within a few percent of a 1 GiB
/// budget, and a peak RSS well under twice the budget.
pub const DEFAULT_MEMORY_BUDGET: usize = 64 * 1024 * 1024;
/// The smallest budget `open` accepts: below it the redb cache cannot hold the upper levels
/// of the B-trees and every lookup reads the file.
pub const MIN_MEMORY_BUDGET: usize = 4 * 1024 * 1024;
/// The largest share of the budget given to an epoch, a group or a log frame: past it a
/// larger batch no longer saves anything measurable.
const MAX_BATCH_SHARE: u64 = 32 * 1024 * 1024;

/// The budget's shares, computed once at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryShares {
    /// redb's page cache (`Builder::set_cache_size`).
    pub(crate) redb_cache: usize,
    /// Write-set bytes after which an epoch is published.
    pub(crate) epoch: u64,
    /// Write-set bytes after which a group stops taking requests.
    pub(crate) group: u64,
    /// Payload bytes after which the log thread stops adding groups to a frame.
    pub(crate) frame: u64,
    /// Unshipped frame bytes the shipper holds at most.
    pub(crate) ship_queue: u64,
    /// Completed records the open partition takes before it is sealed: as many as fit half
    /// the redb cache at about 256 bytes of page each (a power of two, 4,096 to 1,048,576), so
    /// that the pages new records land on stay cached. 65,536 at the default budget.
    pub(crate) partition_records: u64,
}

impl MemoryShares {
    pub(crate) fn of(budget: usize) -> Self {
        let eighth = (budget as u64 / 8).min(MAX_BATCH_SHARE);
        let redb_cache = budget / 2;
        let partition_records = ((redb_cache as u64 / 2) / 256)
            .clamp(1 << 12, 1 << 20)
            .next_power_of_two()
            .min(1 << 20);
        MemoryShares {
            redb_cache,
            epoch: eighth,
            group: eighth,
            frame: eighth,
            ship_queue: eighth,
            partition_records,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_add_up_to_the_budget_at_most() {
        for budget in [MIN_MEMORY_BUDGET, DEFAULT_MEMORY_BUDGET, 1 << 30, 16 << 30] {
            let s = MemoryShares::of(budget);
            let total = s.redb_cache as u64 + s.epoch + s.group + s.frame + s.ship_queue;
            assert!(total <= budget as u64, "{budget}: {s:?}");
            assert!(s.epoch > 0 && s.group > 0 && s.frame > 0);
        }
        assert_eq!(MemoryShares::of(DEFAULT_MEMORY_BUDGET).redb_cache, 32 << 20);
        assert_eq!(
            MemoryShares::of(DEFAULT_MEMORY_BUDGET).partition_records,
            65_536
        );
        assert_eq!(MemoryShares::of(MIN_MEMORY_BUDGET).partition_records, 4_096);
        assert_eq!(MemoryShares::of(1 << 30).epoch, MAX_BATCH_SHARE);
    }
}
