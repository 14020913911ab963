//! The writer thread: the only place a redb write transaction exists.
//!
//! It takes everything queued (up to `max_batch`), runs it in arrival order inside one
//! transaction, makes the group durable once, then answers every request of the group. A group
//! that cannot be made durable fails all its requests and poisons the store.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;

use redb::Database;

use crate::config::{Config, Durability};
use crate::error::StoreError;
use crate::tx::Tx;

use super::context::Context;
use super::counters::Counters;
use super::job::{Job, Keep};
use super::poison::{PanicGuard, Poison};
use super::registry::Registry;
use super::tables::InternalTables;
use super::write_set::WriteSet;

/// Whether a group wrote anything (a group that did not is aborted, never committed: a durable
/// commit that changes nothing still costs a sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Changed {
    No,
    Yes,
}

pub(crate) struct Writer {
    pub(crate) db: Arc<Database>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) tables: InternalTables,
    pub(crate) config: Arc<Config>,
    pub(crate) poison: Arc<Poison>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) next_fence: u64,
    pub(crate) queue: Receiver<Box<dyn Job>>,
}

impl Writer {
    /// Runs until every sender is dropped (the store and all its claims are gone).
    pub(crate) fn run(mut self) {
        let poison = self.poison.clone();
        let _guard = PanicGuard(&poison);
        let mut group: Vec<Box<dyn Job>> = Vec::new();
        while let Ok(first) = self.queue.recv() {
            group.push(first);
            while group.len() < self.config.max_batch {
                match self.queue.try_recv() {
                    Ok(job) => group.push(job),
                    Err(_) => break,
                }
            }
            self.counters
                .queued
                .fetch_sub(group.len(), Ordering::Relaxed);
            self.run_group(&mut group);
        }
    }

    fn run_group(&mut self, group: &mut Vec<Box<dyn Job>>) {
        let result = self.poison.check().and_then(|()| self.execute(group));
        if let Err(e) = &result {
            if !matches!(e, StoreError::Poisoned { .. }) {
                self.poison.set(&e.to_string());
            }
        }
        Counters::add(&self.counters.requests, group.len() as u64);
        for job in group.drain(..) {
            job.finish(result.clone());
        }
    }

    fn execute(&mut self, group: &mut [Box<dyn Job>]) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        let mut changed = Changed::No;
        for job in group.iter_mut() {
            let mut writes = WriteSet::default();
            let keep = {
                let mut tx = Tx::new(&txn, &self.registry, &mut writes);
                let mut ctx = Context::new(
                    self.config.clock.now(),
                    &self.config,
                    self.tables,
                    &mut self.next_fence,
                );
                job.run(&mut tx, &mut ctx)
            };
            if keep == Keep::Writes && !writes.is_empty() {
                self.registry.apply(&txn, writes.ops())?;
                changed = Changed::Yes;
            }
        }
        match changed {
            Changed::No => txn.abort()?,
            Changed::Yes => {
                self.persist(txn)?;
                Counters::add(&self.counters.groups_committed, 1);
            }
        }
        Ok(())
    }

    /// Makes the group durable according to the store's durability mode.
    fn persist(&mut self, mut txn: redb::WriteTransaction) -> Result<(), StoreError> {
        match self.config.durability {
            Durability::Redb => {
                txn.set_durability(redb::Durability::Immediate)?;
                txn.commit()?;
            }
        }
        Ok(())
    }
}
