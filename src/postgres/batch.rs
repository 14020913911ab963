//! Group commit for claims: the `begin`s that arrive while a claim statement is out wait for
//! the next one, and go to the database together, in one statement (one round trip, one WAL
//! flush), each with its own answer. The local store's writer groups claims the same way.
//!
//! No timer: a batch fills while the one before it is in flight, so a lone `begin` goes at
//! once, and under load each statement carries what arrived during the last.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;
use sqlx::postgres::PgRow;
use tokio::sync::oneshot;

use crate::error::StoreError;
use crate::model::fingerprint::Fingerprint;
use crate::model::scope::Scope;

/// Claim statements out at once. The second fills while the first is in flight; more would
/// take connections from the callers' work for little.
const RUNNERS: usize = 2;

/// The most scopes one statement claims.
const MOST: usize = 256;

/// A scope's columns, as a claimed row names them.
pub(crate) type Columns = (String, String, String);

/// The answer to one scope's claim: its row if the statement claimed it (or took it over),
/// none if the scope was not claimable (the caller reads the record to answer).
pub(crate) type Answer = Result<Option<PgRow>, StoreError>;

/// One `begin` waiting for its statement.
pub(crate) struct Waiting {
    pub(crate) scope: Scope,
    pub(crate) fingerprint: Fingerprint,
    answer: oneshot::Sender<Answer>,
}

/// What a `begin` that joins the queue must do.
pub(crate) enum Joined {
    /// A runner will take it: wait for the answer.
    Queued,
    /// Start a runner (fewer than [`RUNNERS`] are out), then wait.
    StartRunner,
}

/// The claims waiting, and how many runners carry them to the database.
#[derive(Default)]
pub(crate) struct Batches {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    waiting: Vec<Waiting>,
    runners: usize,
}

/// A runner's place among the [`RUNNERS`]: given back when it finds nothing waiting (under the
/// same lock, so no claim is left without a runner), or when its task ends any other way.
pub(crate) struct Slot<'a> {
    batches: &'a Batches,
    held: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.held {
            self.batches.state.lock().runners -= 1;
        }
    }
}

impl Batches {
    /// Queues the claim of `scope`; the receiver gets its answer.
    pub(crate) fn join(
        &self,
        scope: Scope,
        fingerprint: Fingerprint,
    ) -> (Joined, oneshot::Receiver<Answer>) {
        let (answer, receiver) = oneshot::channel();
        let mut state = self.state.lock();
        state.waiting.push(Waiting {
            scope,
            fingerprint,
            answer,
        });
        let joined = if state.runners < RUNNERS {
            state.runners += 1;
            Joined::StartRunner
        } else {
            Joined::Queued
        };
        (joined, receiver)
    }

    /// The place of a runner that [`Joined::StartRunner`] started.
    pub(crate) fn slot(&self) -> Slot<'_> {
        Slot {
            batches: self,
            held: true,
        }
    }

    /// The next batch for the runner holding `slot`: up to [`MOST`] waiting claims in the
    /// order they came, at most one per scope (one statement cannot update a row twice; a
    /// second `begin` of a scope goes in the next batch), without callers that gave up.
    /// `None` when nothing waits: the runner stops and its slot is given back.
    pub(crate) fn next(&self, slot: &mut Slot<'_>) -> Option<Vec<Waiting>> {
        let mut state = self.state.lock();
        state.waiting.retain(|w| !w.answer.is_closed());
        if state.waiting.is_empty() {
            state.runners -= 1;
            slot.held = false;
            return None;
        }
        let mut scopes = HashSet::new();
        let (mut batch, mut rest) = (Vec::new(), Vec::new());
        for waiting in state.waiting.drain(..) {
            if batch.len() < MOST && scopes.insert(waiting.scope.clone()) {
                batch.push(waiting);
            } else {
                rest.push(waiting);
            }
        }
        state.waiting = rest;
        Some(batch)
    }
}

/// Answers every claim of `batch`: its row from `claimed` (by scope), or none; or, if the
/// statement failed, its error. A caller that has gone is skipped.
pub(crate) fn answer(batch: Vec<Waiting>, claimed: Result<HashMap<Columns, PgRow>, StoreError>) {
    match claimed {
        Ok(mut rows) => {
            for waiting in batch {
                let columns = columns(&waiting.scope);
                let _ = waiting.answer.send(Ok(rows.remove(&columns)));
            }
            debug_assert!(rows.is_empty(), "a claimed row that no caller asked for");
        }
        Err(e) => {
            for waiting in batch {
                let _ = waiting.answer.send(Err(e.clone()));
            }
        }
    }
}

/// A scope's columns.
pub(crate) fn columns(scope: &Scope) -> Columns {
    (
        scope.tenant().to_owned(),
        scope.operation().to_owned(),
        scope.key().to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(key: &str) -> Scope {
        Scope::new("t", "op", key).expect("a valid scope")
    }

    #[test]
    fn a_batch_holds_each_scope_once_and_the_rest_wait_for_the_next() {
        let batches = Batches::default();
        let fp = Fingerprint::of_bytes(b"req");
        let (first, _a) = batches.join(scope("a"), fp);
        let (second, _b) = batches.join(scope("a"), fp);
        let (third, _c) = batches.join(scope("b"), fp);
        let (fourth, _d) = batches.join(scope("c"), fp);
        assert!(matches!(first, Joined::StartRunner));
        assert!(matches!(second, Joined::StartRunner));
        assert!(matches!((third, fourth), (Joined::Queued, Joined::Queued)));

        let mut slot = batches.slot();
        let batch = batches.next(&mut slot).expect("claims wait");
        let keys: Vec<&str> = batch.iter().map(|w| w.scope.key()).collect();
        assert_eq!(
            keys,
            ["a", "b", "c"],
            "in order, the second `a` left for later"
        );
        let batch = batches.next(&mut slot).expect("the second `a` waits");
        assert_eq!(batch.len(), 1);
        assert!(batches.next(&mut slot).is_none());
        assert!(
            !slot.held,
            "a runner that finds nothing gives its place back"
        );
        drop(slot);
        assert_eq!(batches.state.lock().runners, 1, "one runner still out");
    }

    #[test]
    fn a_runner_that_ends_early_gives_its_place_back_and_gone_callers_are_skipped() {
        let batches = Batches::default();
        let fp = Fingerprint::of_bytes(b"req");
        let (_, gone) = batches.join(scope("a"), fp);
        drop(gone);
        {
            let _slot = batches.slot(); // a runner that panicked with it
        }
        assert_eq!(batches.state.lock().runners, 0);
        let mut slot = batches.slot();
        batches.state.lock().runners += 1;
        assert!(
            batches.next(&mut slot).is_none(),
            "a caller that gave up is not claimed for"
        );
        assert_eq!(batches.state.lock().runners, 0);
    }
}
