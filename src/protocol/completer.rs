//! Finishing work that attempts abandoned (feature `tokio`).
//!
//! A request can be claimed, cause a side effect downstream, and then be left in progress: its
//! process died, or its handler timed out on the downstream call and answered 504. If the
//! client never retries, nobody finishes it: the customer was charged and there is no record
//! of it. A [`Completer`] is the reconciler that finishes such work: for each operation the
//! application registers a function, and the completer hands it every abandoned key of that
//! operation as a *recovery*, a [`Claim`](crate::Claim) taken over like any retry would (attempt n + 1, the
//! last checkpoint, the downstream key), fenced like any other holder. The function pushes the
//! work through and commits, records a final failure, or releases the key.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::error::{BoxError, StoreError};
use crate::model::backoff::Doubling;
use crate::model::begin::Begin;
use crate::model::claim::Recovery;
use crate::model::scope::Scope;
use crate::protocol::{Protocol, ProtocolClaim};

/// What a completion function returns.
type Completion = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>;
/// A registered completion function.
type CompleteFn<C> = Arc<dyn Fn(C) -> Completion + Send + Sync>;
/// A finished completion task: its key and what the function returned (or how it failed).
type Finished = Result<(Scope, Result<(), BoxError>), tokio::task::JoinError>;

/// Finishes abandoned in-progress work: see the module docs.
///
/// ```
/// use std::time::Duration;
/// use idemstore::{Completer, Response, Store};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let store = Store::open(dir.path().join("idem"))?;
/// let completer = Completer::new(store.clone())
///     .operation("create_charge", |claim| async move {
///         // Ask downstream what the abandoned attempt did, with the same key it used.
///         let _key = claim.downstream_key();
///         claim.commit_async(|_tx| Ok(Response::new(201, "charged"))).await?;
///         Ok(())
///     })
///     .every(Duration::from_secs(10))
///     .start(); // runs until dropped
/// # drop(completer);
/// # Ok(())
/// # }
/// ```
///
/// The function gets the claim as a take-over: it should find out what the previous attempt
/// did (by [`Claim::downstream_key`](crate::Claim::downstream_key) and [`Claim::last_checkpoint`](crate::Claim::last_checkpoint)) and then commit, or
/// release the key if nothing happened. If it returns an error, or leaves the claim unfinished,
/// the key stays in progress and is tried again in a later round, each time after a longer
/// wait (`backoff`). A function that may run longer than the lease should hold a
/// [`KeepAlive`](crate::KeepAlive).
///
/// `P` is the backend ([`Store`](crate::Store), or `PgStore` with feature `postgres`); the
/// functions get its claim type.
pub struct Completer<P: Protocol> {
    store: P,
    operations: HashMap<String, CompleteFn<P::Claim>>,
    every: Duration,
    concurrency: usize,
    batch: usize,
    backoff: Doubling,
    /// Keys whose completion failed: when they may be tried again, and their failures in a
    /// row.
    waiting: Arc<Mutex<HashMap<Scope, (Instant, u32)>>>,
}

impl<P: Protocol> Clone for Completer<P> {
    fn clone(&self) -> Self {
        Completer {
            store: self.store.clone(),
            operations: self.operations.clone(),
            every: self.every,
            concurrency: self.concurrency,
            batch: self.batch,
            backoff: self.backoff,
            waiting: self.waiting.clone(),
        }
    }
}

impl<P: Protocol> fmt::Debug for Completer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completer")
            .field("operations", &self.operations.keys().collect::<Vec<_>>())
            .field("every", &self.every)
            .field("concurrency", &self.concurrency)
            .field("batch", &self.batch)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

/// What one round of a [`Completer`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Round {
    /// Abandoned keys handed to a completion function that returned `Ok`.
    pub completed: usize,
    /// Completion functions that returned an error (or panicked): those keys wait for a later
    /// round.
    pub failed: usize,
    /// Abandoned keys skipped because an earlier completion of theirs failed and their wait is
    /// not over.
    pub waiting: usize,
    /// Abandoned keys that a client's retry took over (or finished) first: not the completer's.
    pub taken: usize,
}

impl<P: Protocol> Completer<P> {
    /// A completer with no operations yet; runs every 10 s, 4 completions at a time, looks at
    /// up to 100 abandoned keys a round, and waits up to 10 s (doubling to 10 min) before
    /// trying a key whose completion failed again.
    pub fn new(store: P) -> Self {
        Completer {
            store,
            operations: HashMap::new(),
            every: Duration::from_secs(10),
            concurrency: 4,
            batch: 100,
            backoff: Doubling::new(Duration::from_secs(10), Duration::from_secs(600)),
            waiting: Arc::default(),
        }
    }

    /// Registers the completion function for `operation` (a scope's operation part: with the
    /// HTTP layer, the method and route, `"POST /charges"`). Keys of operations with no
    /// function are left alone.
    #[must_use]
    pub fn operation<F, Fut>(mut self, operation: &str, complete: F) -> Self
    where
        F: Fn(P::Claim) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        let complete: CompleteFn<P::Claim> = Arc::new(move |claim| Box::pin(complete(claim)));
        self.operations.insert(operation.to_owned(), complete);
        self
    }

    /// Time between rounds. Default 10 s.
    #[must_use]
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every.max(Duration::from_millis(1));
        self
    }

    /// Completions run at once at most. Default 4.
    #[must_use]
    pub fn concurrency(mut self, completions: usize) -> Self {
        self.concurrency = completions.max(1);
        self
    }

    /// Abandoned keys looked at per round, oldest lease first. Default 100.
    #[must_use]
    pub fn batch(mut self, keys: usize) -> Self {
        self.batch = keys.max(1);
        self
    }

    /// The wait before a key whose completion failed is tried again: `first`, doubling up to
    /// `max`, each wait less up to half of it at random. Default 10 s to 10 min.
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = Doubling::new(first, max);
        self
    }

    /// Runs rounds on a task of the current tokio runtime until the returned handle is
    /// dropped. A round that fails (the store cannot list) is logged, and the next one tries
    /// again.
    pub fn start(self) -> CompleterTask {
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = self.run_once().await {
                    tracing::warn!(error = %e, "a completer round failed");
                }
                tokio::time::sleep(self.every).await;
            }
        });
        CompleterTask { task }
    }

    /// One round: takes over every abandoned key of a registered operation whose wait is
    /// over, and runs its completion function (`concurrency` at a time).
    ///
    /// # Errors
    /// [`StoreError`] if the abandoned keys cannot be listed.
    pub async fn run_once(&self) -> Result<Round, StoreError> {
        let abandoned = self.store.abandoned(self.batch).await?;
        let mut round = Round::default();
        let mut running = JoinSet::new();
        for work in abandoned {
            let Some(complete) = self.operations.get(work.scope.operation()) else {
                continue;
            };
            if self.is_waiting(&work.scope) {
                round.waiting += 1;
                continue;
            }
            let claim = match self.store.begin(&work.scope, work.fingerprint).await {
                Ok(Begin::Recovered(claim)) if claim.recovery() == Some(Recovery::LeaseExpired) => {
                    claim
                }
                // Released or evicted since it was listed: there is nothing to complete, and
                // this fresh claim must not hold the key (in a restore window it is a
                // recovery, but of a request nobody is waiting for here).
                Ok(Begin::Claimed(claim) | Begin::Recovered(claim)) => {
                    if let Err(e) = claim.release().await {
                        tracing::warn!(error = %e, "could not release a key the completer claimed by mistake");
                    }
                    continue;
                }
                Ok(_) => {
                    round.taken += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            while running.len() >= self.concurrency {
                self.settle(running.join_next().await, &mut round);
            }
            let scope = work.scope.clone();
            let complete = complete.clone();
            running.spawn(async move { (scope, complete(claim).await) });
        }
        while let Some(done) = running.join_next().await {
            self.settle(Some(done), &mut round);
        }
        Ok(round)
    }

    fn is_waiting(&self, scope: &Scope) -> bool {
        self.waiting
            .lock()
            .get(scope)
            .is_some_and(|(until, _)| Instant::now() < *until)
    }

    /// Counts a finished completion, and makes a failed key wait.
    fn settle(&self, done: Option<Finished>, round: &mut Round) {
        let failed = match done {
            None => return,
            Some(Ok((scope, Ok(())))) => {
                self.waiting.lock().remove(&scope);
                round.completed += 1;
                return;
            }
            Some(Ok((scope, Err(e)))) => {
                tracing::warn!(%scope, error = %e, "completing abandoned work failed; it is tried again later");
                scope
            }
            Some(Err(e)) => {
                // A panic: its key is not known here, and stays in progress for a later round.
                tracing::error!(error = %e, "a completion function panicked");
                round.failed += 1;
                return;
            }
        };
        round.failed += 1;
        let mut waiting = self.waiting.lock();
        let failures = waiting.get(&failed).map_or(1, |(_, n)| n.saturating_add(1));
        let wait = self.backoff.spread_after(failures);
        waiting.insert(failed, (Instant::now() + wait, failures));
    }
}

/// A running [`Completer`]; dropping it stops it (a completion in flight is cancelled, and
/// its key stays in progress for the next completer or retry).
#[derive(Debug)]
#[must_use = "dropping the handle stops the completer"]
pub struct CompleterTask {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for CompleterTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}
