//! The async API (feature `tokio`): every blocking operation as an async fn that never blocks a
//! runtime worker. The writer answers through a oneshot channel; `begin`'s read, which may
//! touch the disk, runs on the blocking pool; waiting in `begin_or_wait_async` is on a
//! `tokio::sync::Notify`, bounded by `tokio::time`, so tests can pause time.
//!
//! The closures given to `commit_async` and `write_async` run on the store's writer thread, as
//! in the blocking API: like `tokio-rusqlite`'s `call`, they are plain synchronous code that
//! reads and writes through the [`Tx`].

use std::time::Duration;

use crate::claim::{Begin, Claim};
use crate::engine::context::Needs;
use crate::engine::job::Keep;
use crate::engine::lifecycle::{self, Evicted, UserFailure};
use crate::error::{BeginError, BoxError, ClaimError, CommitError, StoreError, WriteError};
use crate::fingerprint::Fingerprint;
use crate::response::Response;
use crate::scope::Scope;
use crate::store::{ReadPath, Store, begin_span};
use crate::tx::Tx;

/// Runs blocking work on the runtime's blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::Internal {
            message: format!("a blocking read failed to run: {e}"),
        })
}

impl Store {
    /// [`Store::begin`] for async callers.
    ///
    /// # Errors
    /// As [`Store::begin`].
    pub async fn begin_async(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<Begin, BeginError> {
        let span = begin_span(scope);
        let answer = async {
            let (store, read_scope) = (self.clone(), scope.clone());
            match blocking(move || store.read_path(&read_scope, fingerprint)).await?? {
                ReadPath::Answered(answer) => Ok(answer),
                ReadPath::Writer => {
                    let decided = scope.clone();
                    let answer = self
                        .engine()
                        .call_async(move |tx, ctx| lifecycle::begin(tx, ctx, &decided, fingerprint))
                        .await??;
                    Ok(self.writer_answer(scope, fingerprint, answer))
                }
            }
        }
        .await;
        let _entered = span.enter();
        self.answered(answer)
    }

    /// [`Store::begin_or_wait`] for async callers: waits on a notification from the holder,
    /// bounded by `tokio::time` (so paused time in tests works).
    ///
    /// # Errors
    /// As [`Store::begin`].
    pub async fn begin_or_wait_async(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        max_wait: Duration,
    ) -> Result<Begin, BeginError> {
        let deadline = tokio::time::Instant::now() + max_wait;
        loop {
            let watch = self.engine().watchers().watch(scope.encode());
            let slot = watch.slot.clone();
            // Registered before the generation is read: a change in between still wakes it.
            let changed = slot.notify.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let seen = slot.generation();
            match self.begin_async(scope, fingerprint).await? {
                Begin::InProgress { .. } if watch.slot.worth_waiting(seen) => {
                    if tokio::time::timeout_at(deadline, changed).await.is_err() {
                        drop(watch);
                        return self.begin_async(scope, fingerprint).await;
                    }
                }
                other => return Ok(other),
            }
        }
    }

    /// [`Store::write`] for async callers.
    ///
    /// # Errors
    /// As [`Store::write`].
    pub async fn write_async<T, F>(&self, work: F) -> Result<T, WriteError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tx<'_>) -> Result<T, BoxError> + Send + 'static,
    {
        let answer = self
            .engine()
            .call_async(move |tx, _ctx| lifecycle::write(tx, Box::new(work)))
            .await?;
        answer.map_err(|failure| match failure {
            UserFailure::Aborted(e) => WriteError::Aborted(e),
            UserFailure::Panicked(message) => WriteError::Panicked { message },
        })
    }

    /// [`Store::evict_expired`] for async callers.
    ///
    /// # Errors
    /// As [`Store::evict_expired`].
    pub async fn evict_expired_async(&self, limit: usize) -> Result<Evicted, StoreError> {
        let store = self.clone();
        blocking(move || store.evict_expired(limit)).await?
    }

    /// [`Store::checkpoint`] for async callers.
    ///
    /// # Errors
    /// As [`Store::checkpoint`].
    pub async fn checkpoint_async(&self) -> Result<(), StoreError> {
        self.engine()
            .call_async(|_, ctx| {
                ctx.need(Needs::Checkpointed);
                (Keep::Nothing, ())
            })
            .await
    }
}

impl Claim {
    /// [`Claim::commit`] for async callers. `work` runs on the store's writer thread.
    ///
    /// # Errors
    /// As [`Claim::commit`].
    pub async fn commit_async<F>(self, work: F) -> Result<Response, CommitError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static,
    {
        let answer = self
            .store()
            .engine()
            .call_async(self.commit_work(work))
            .await;
        let _entered = self.span("commit").entered();
        self.committed(answer)
    }

    /// [`Claim::release`] for async callers.
    ///
    /// # Errors
    /// As [`Claim::release`].
    pub async fn release_async(self) -> Result<(), ClaimError> {
        let answer = self.store().engine().call_async(self.release_work()).await;
        self.refused(answer)
    }

    /// [`Claim::extend`] for async callers.
    ///
    /// # Errors
    /// As [`Claim::extend`].
    pub async fn extend_async(&mut self, lease: Duration) -> Result<(), ClaimError> {
        let work = self.extend_work(lease)?;
        let answer = self.store().engine().call_async(work).await;
        let until = self.refused(answer)?;
        self.set_lease_until(until);
        Ok(())
    }

    /// [`Claim::checkpoint`] for async callers.
    ///
    /// # Errors
    /// As [`Claim::checkpoint`].
    pub async fn checkpoint_async(&mut self, bytes: impl Into<Vec<u8>>) -> Result<(), ClaimError> {
        let bytes = bytes.into();
        let work = self.checkpoint_work(bytes.clone())?;
        let answer = self.store().engine().call_async(work).await;
        self.refused(answer)?;
        self.set_checkpoint(bytes);
        Ok(())
    }
}
