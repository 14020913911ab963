//! What a request sees of the writer besides the transaction: the time, the settings, the
//! fence counter and the partitions.

use crate::engine::tables::tx::Tx;
use crate::model::clock::Timestamp;
use crate::model::config::Config;
use crate::model::pace::Pace;

use std::sync::Arc;

use crate::engine::tables::layout::{InternalTables, META_NEXT_FENCE};
use crate::engine::tables::partitions::Partitions;
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
    /// Which partition takes a completed record, and what each may hold.
    pub(crate) partitions: &'a Partitions,
    /// The writer's fence counter: the next fence to hand out.
    next_fence: &'a mut u64,
    needs: Needs,
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
        partitions: &'a Partitions,
        next_fence: &'a mut u64,
    ) -> Self {
        Context {
            now,
            config,
            pace,
            tables,
            watchers,
            partitions,
            next_fence,
            needs: Needs::Durable,
        }
    }

    /// Asks for more than durability before this request is answered.
    pub(crate) fn need(&mut self, needs: Needs) {
        self.needs = self.needs.max(needs);
    }

    pub(crate) fn needs(&self) -> Needs {
        self.needs
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
