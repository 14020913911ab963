//! Group commit for claims: the `begin`s that arrive while a claim statement is out wait for
//! the next one, and go to the database together, in one statement (one round trip, one WAL
//! flush), each with its own answer. The local store's writer groups claims the same way.
//!
//! No timer: a batch fills while the one before it is in flight, so a lone `begin` goes at
//! once, and under load each statement carries what arrived during the last.
//!
//! Scopes that share a statement must not share its fate. A scope another session holds in an
//! open transaction (an `execute` in flight, a session whose `COMMIT` answer was lost) is
//! answered busy by the statement without waiting (its advisory lock, `sql::Hold`); a row
//! locked any other way makes the statement give up after `sql::LOCK_WAIT_MS`, and the batch
//! is split in two and each half claimed again, side by side, until the locked scope is alone
//! and busy. A statement that fails fails only the scopes it carried.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;

use parking_lot::Mutex;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, Row};
use tokio::sync::oneshot;

use super::config::duration_i64;
use super::driver::{backend, is_lock_wait, timed, within};
use super::sql::Hold;
use super::store::PgStore;
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

/// What a claim statement did for one scope.
#[derive(Debug)]
pub(crate) enum Claimed {
    /// It claimed the scope (or took it over): the claim's row.
    Row(PgRow),
    /// The scope was not claimable: the caller reads the record to answer.
    Unclaimed,
    /// Another session holds the scope's row in an open transaction: in progress.
    Busy,
}

/// The answer to one scope's claim.
pub(crate) type Answer = Result<Claimed, StoreError>;

/// The answers of one statement, by scope.
type Answers = HashMap<Columns, Answer>;

/// A claim statement that gave up waiting for a locked row (`lock_timeout`).
pub(crate) struct LockWait;

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

/// Answers every claim of `batch` from `answers` (a scope the statement returned no row for
/// was not claimable). A caller that has gone is skipped.
pub(crate) fn answer(batch: Vec<Waiting>, mut answers: Answers) {
    for waiting in batch {
        let answer = answers
            .remove(&columns(&waiting.scope))
            .unwrap_or(Ok(Claimed::Unclaimed));
        let _ = waiting.answer.send(answer);
    }
    debug_assert!(answers.is_empty(), "an answer that no caller asked for");
}

/// Every scope of `batch` answered by the statement's failure.
fn failed(batch: &[Waiting], e: &StoreError) -> Answers {
    batch
        .iter()
        .map(|w| (columns(&w.scope), Err(e.clone())))
        .collect()
}

impl PgStore {
    /// Queues the claim of `scope` for the next statement, starting a runner if one is free,
    /// and waits for its answer. The runner's own calls are bounded; this bounds the wait for
    /// its turn too (two statements ahead of it at most, and its own).
    pub(crate) async fn claim_in_batch(&self, scope: &Scope, fingerprint: Fingerprint) -> Answer {
        let (joined, answer) = self.inner.batches.join(scope.clone(), fingerprint);
        if let Joined::StartRunner = joined {
            tokio::spawn(self.clone().run_batches());
        }
        let limit = self.call_limit().saturating_mul(3);
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(StoreError::Backend {
                message: "claim: the statement carrying it ended without an answer".into(),
            }),
            Err(_) => Err(StoreError::Backend {
                message: format!("claim: no answer from the database within {limit:?}").into(),
            }),
        }
    }

    /// A runner: claims what waits, a batch a statement, until nothing does.
    async fn run_batches(self) {
        let batches = &self.inner.batches;
        let mut slot = batches.slot();
        while let Some(batch) = batches.next(&mut slot) {
            self.claim_batch(batch).await;
        }
    }

    /// One statement for `batch`, on a pooled connection, and each scope answered. If it gave
    /// up on a locked row, its halves are claimed again side by side, each answered as soon as
    /// its statement is; a scope alone with the lock is busy.
    fn claim_batch(&self, batch: Vec<Waiting>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let scopes: Vec<(&Scope, Fingerprint)> =
                batch.iter().map(|w| (&w.scope, w.fingerprint)).collect();
            let claimed = match timed(self.call_limit(), "claim", self.inner.pool.acquire()).await {
                Ok(mut conn) => self.claim_rows(&mut conn, &scopes, Hold::Shared).await,
                Err(e) => Err(e),
            };
            let answers = match claimed {
                Ok(Ok(rows)) => by_scope(rows).unwrap_or_else(|e| failed(&batch, &e)),
                Err(e) => failed(&batch, &e),
                Ok(Err(LockWait)) if batch.len() == 1 => {
                    HashMap::from([(columns(&batch[0].scope), Ok(Claimed::Busy))])
                }
                Ok(Err(LockWait)) => {
                    let mut left = batch;
                    let right = left.split_off(left.len() / 2);
                    tokio::join!(self.claim_batch(left), self.claim_batch(right));
                    return;
                }
            };
            answer(batch, answers);
        })
    }

    /// The claim statement for `scopes` on `conn`, holding them as `hold` says: a row, with
    /// its scope, for each it claimed or found busy; [`LockWait`] if it gave up on a row lock.
    pub(crate) async fn claim_rows(
        &self,
        conn: &mut PgConnection,
        scopes: &[(&Scope, Fingerprint)],
        hold: Hold,
    ) -> Result<Result<Vec<PgRow>, LockWait>, StoreError> {
        let inner = &self.inner;
        let config = &inner.config;
        let column = |f: fn(&Scope) -> &str| -> Vec<String> {
            scopes.iter().map(|(s, _)| f(s).to_owned()).collect()
        };
        let fingerprints: Vec<Vec<u8>> = scopes
            .iter()
            .map(|(_, fp)| fp.as_bytes().to_vec())
            .collect();
        let sql = match hold {
            Hold::Shared => inner.sql.claim.clone(),
            Hold::Exclusive => inner.sql.claim_held.clone(),
        };
        let claimed = within(
            self.call_limit(),
            "claim",
            sqlx::query(AssertSqlSafe(sql))
                .bind(column(Scope::tenant))
                .bind(column(Scope::operation))
                .bind(column(Scope::key))
                .bind(fingerprints)
                .bind(duration_i64(config.lease))
                .bind(config.now())
                .bind(duration_i64(config.tombstone_ttl))
                .fetch_all(&mut *conn),
        )
        .await?;
        match claimed {
            Ok(rows) => Ok(Ok(rows)),
            Err(e) if is_lock_wait(&e) => Ok(Err(LockWait)),
            Err(e) => Err(backend("claim", &e)),
        }
    }
}

/// What a statement's rows say, by scope: claimed, or busy.
fn by_scope(rows: Vec<PgRow>) -> Result<Answers, StoreError> {
    let read = |e: sqlx::Error| backend("read a claimed row", &e);
    rows.into_iter()
        .map(|row| {
            let columns = (
                row.try_get("tenant").map_err(read)?,
                row.try_get("operation").map_err(read)?,
                row.try_get("key").map_err(read)?,
            );
            let busy: bool = row.try_get("busy").map_err(read)?;
            let claimed = if busy {
                Claimed::Busy
            } else {
                Claimed::Row(row)
            };
            Ok((columns, Ok(claimed)))
        })
        .collect()
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
