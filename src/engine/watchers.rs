//! Who holds which scope in this process, and who is waiting for it.
//!
//! `begin_or_wait` waits for the holder of a scope to finish instead of answering
//! `InProgress`. A live [`Claim`](crate::Claim) counts as a holder of its scope; when it goes
//! (after its commit or release returned, or dropped unfinished), the scope's generation moves
//! on and every waiter wakes to ask `begin` again. A waiter reads the generation *before* it
//! asks, so a change in between is never missed. Nothing here touches storage.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

#[derive(Debug, Default)]
struct SlotState {
    generation: u64,
    holders: usize,
    waiters: usize,
}

/// One scope's holders and waiters.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    state: Mutex<SlotState>,
    changed: Condvar,
    #[cfg(feature = "tokio")]
    pub(crate) notify: tokio::sync::Notify,
}

impl Slot {
    pub(crate) fn generation(&self) -> u64 {
        self.state.lock().generation
    }

    /// Whether waiting can be answered: a live claim of this process holds the scope, or
    /// one finished since generation `seen` (then the caller should ask again at once).
    pub(crate) fn worth_waiting(&self, seen: u64) -> bool {
        let state = self.state.lock();
        state.holders > 0 || state.generation != seen
    }

    /// Waits until the generation moves past `seen` or `deadline` passes. Returns whether it
    /// moved.
    pub(crate) fn wait_past(&self, seen: u64, deadline: Instant) -> bool {
        let mut state = self.state.lock();
        while state.generation == seen {
            if self.changed.wait_until(&mut state, deadline).timed_out() {
                return state.generation != seen;
            }
        }
        true
    }
}

#[derive(Debug, Default)]
pub(crate) struct Watchers {
    slots: Mutex<HashMap<Vec<u8>, Arc<Slot>>>,
    waiting: std::sync::atomic::AtomicUsize,
}

impl Watchers {
    /// The slot of `scope`, counted in under the map's lock: a slot is removed only when
    /// nothing counts on it, so one counted in here cannot be orphaned by a removal.
    fn count_in(&self, scope: &[u8], count: impl FnOnce(&mut SlotState)) -> Arc<Slot> {
        let mut slots = self.slots.lock();
        let slot = slots.entry(scope.to_vec()).or_default().clone();
        count(&mut slot.state.lock());
        slot
    }

    /// A claim on `scope` is gone: wake everyone waiting for it.
    fn release(&self, scope: &[u8]) {
        let mut slots = self.slots.lock();
        let Some(slot) = slots.get(scope).cloned() else {
            return;
        };
        let unused = {
            let mut state = slot.state.lock();
            state.holders = state.holders.saturating_sub(1);
            state.generation += 1;
            state.holders == 0 && state.waiters == 0
        };
        if unused {
            slots.remove(scope);
        }
        drop(slots);
        slot.changed.notify_all();
        #[cfg(feature = "tokio")]
        slot.notify.notify_waiters();
    }

    /// Registers a waiter on `scope` for as long as the guard lives.
    pub(crate) fn watch<'a>(&'a self, scope: &[u8]) -> Watch<'a> {
        let slot = self.count_in(scope, |state| state.waiters += 1);
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Watch {
            watchers: self,
            scope: scope.to_vec(),
            slot,
        }
    }

    /// Callers waiting in `begin_or_wait` right now.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// One claim's hold on its scope, counted from the moment the writer grants the claim (before
/// any other request can see it) until the [`Claim`](crate::Claim) that owns it is dropped, or
/// until the answer carrying it is lost (a failed group, a caller that gave up).
#[derive(Debug)]
pub(crate) struct HoldToken {
    watchers: Arc<Watchers>,
    scope: Vec<u8>,
}

impl HoldToken {
    pub(crate) fn new(watchers: &Arc<Watchers>, scope: &[u8]) -> Self {
        watchers.count_in(scope, |state| state.holders += 1);
        HoldToken {
            watchers: watchers.clone(),
            scope: scope.to_vec(),
        }
    }
}

impl Drop for HoldToken {
    fn drop(&mut self) {
        self.watchers.release(&self.scope);
    }
}

/// A registered waiter; unregisters on drop.
#[derive(Debug)]
pub(crate) struct Watch<'a> {
    watchers: &'a Watchers,
    scope: Vec<u8>,
    pub(crate) slot: Arc<Slot>,
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.watchers
            .waiting
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        let mut slots = self.watchers.slots.lock();
        let unused = {
            let mut state = self.slot.state.lock();
            state.waiters = state.waiters.saturating_sub(1);
            state.holders == 0 && state.waiters == 0
        };
        if unused {
            slots.remove(&self.scope);
        }
    }
}
