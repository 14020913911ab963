//! What a request sees of the writer besides the transaction: the time, the settings, and the
//! fence counter.

use crate::engine::tables::tx::Tx;
use crate::model::clock::Timestamp;
use crate::model::config::Config;
use crate::model::pace::Pace;
use crate::model::record::RecordState;

use std::sync::Arc;

use crate::engine::tables::layout::{InternalTables, META_NEXT_FENCE};
use crate::engine::watchers::Watchers;

/// Per-request view of the writer's state.
#[derive(Debug)]
pub(crate) struct Context<'a> {
    /// The time this request is decided at (read once per request).
    pub(crate) now: Timestamp,
    pub(crate) config: &'a Config,
    /// The operations' completion times, for what a duplicate of a claim in flight is told.
    pub(crate) pace: &'a Pace,
    pub(crate) tables: InternalTables,
    /// Claims granted here count as holders at once (see `watchers`).
    pub(crate) watchers: &'a Arc<Watchers>,
    /// The writer's fence counter: the next fence to hand out.
    next_fence: &'a mut u64,
    /// The writer's hint of when a record may first be gone (see [`Context::gone_from`]).
    gone_from: &'a mut Option<Timestamp>,
    needs: Needs,
    /// Records and tombstones this request removed beside a key it claimed, for the eviction
    /// counters.
    evicted_beside: (u64, u64),
}

/// What must have happened before a request is answered. Ordered: each includes the ones
/// before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Needs {
    /// The request's group is durable (the default).
    Durable,
    /// Everything acknowledged so far is visible to redb read transactions.
    Published,
    /// Everything acknowledged so far is durable in redb itself (a checkpoint).
    Checkpointed,
    /// After a checkpoint, the database to itself (for compaction): the job's
    /// [`Job::exclusive`](super::job::Job::exclusive) runs then.
    Exclusive,
}

impl<'a> Context<'a> {
    pub(crate) fn new(
        now: Timestamp,
        config: &'a Config,
        pace: &'a Pace,
        tables: InternalTables,
        watchers: &'a Arc<Watchers>,
        next_fence: &'a mut u64,
        gone_from: &'a mut Option<Timestamp>,
    ) -> Self {
        Context {
            now,
            config,
            pace,
            tables,
            watchers,
            next_fence,
            gone_from,
            needs: Needs::Durable,
            evicted_beside: (0, 0),
        }
    }

    /// Asks for more than durability before this request is answered.
    pub(crate) fn need(&mut self, needs: Needs) {
        self.needs = self.needs.max(needs);
    }

    pub(crate) fn needs(&self) -> Needs {
        self.needs
    }

    /// Counts a record removed beside a new key, by the state it was stored in (the writer
    /// counts them only if the request's writes are kept).
    pub(crate) fn count_evicted_beside(&mut self, removed: &RecordState) {
        match removed {
            RecordState::Tombstone { .. } => self.evicted_beside.1 += 1,
            RecordState::InProgress { .. } | RecordState::Completed { .. } => {
                self.evicted_beside.0 += 1;
            }
        }
    }

    /// The earliest time a stored record may be gone, if this epoch has read it already: a
    /// claim then looks beside its key only from that time on. It is read once per epoch
    /// (the writer resets it), so a record that goes during the epoch is only found from the
    /// next one; a hint, whose only cost when wrong is a removal left to the sweeper.
    pub(crate) fn gone_from(&self) -> Option<Timestamp> {
        *self.gone_from
    }

    pub(crate) fn set_gone_from(&mut self, at: Timestamp) {
        *self.gone_from = Some(at);
    }

    /// Records and tombstones counted by [`Context::count_evicted_beside`].
    pub(crate) fn evicted_beside(&self) -> (u64, u64) {
        self.evicted_beside
    }

    /// Hands out a fence that was never handed out before, and records the counter in the
    /// request's writes so that it survives with the claim that uses it.
    pub(crate) fn allocate_fence(&mut self, tx: &mut Tx<'_>) -> u64 {
        let fence = *self.next_fence;
        // Fences only grow: a restore takes the larger of the counter and the file's.
        *self.next_fence = fence
            .checked_add(1)
            .expect("a store hands out fewer than 2^64 fences");
        tx.put_raw(
            self.tables.meta,
            META_NEXT_FENCE,
            self.next_fence.to_le_bytes().to_vec(),
        );
        fence
    }
}
