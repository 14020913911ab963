//! The async API (feature `tokio`): every blocking operation as an async fn that never blocks a
//! runtime worker for long. The writer answers through a oneshot channel. `begin`'s read runs
//! inline (a read transaction on cached pages takes microseconds, a hop to the blocking pool
//! about twenty), or on the blocking pool while a compaction holds the file. The price: a read
//! of pages not in the OS cache blocks its worker for one disk read. Waiting in
//! `begin_or_wait_async` is on a `tokio::sync::Notify`, bounded by `tokio::time`, so tests can
//! pause time.
//!
//! The closures given to `commit_async` and `write_async` run on the store's writer thread, as
//! in the blocking API: like `tokio-rusqlite`'s `call`, they are plain synchronous code that
//! reads and writes through the [`Tx`].

use std::time::Duration;

use crate::api::claim::Begin;
use crate::api::claim::Claim;
use crate::api::claim::CommitError;
use crate::api::store::{Store, written};
use crate::engine::{Tx, request};
use crate::error::{BoxError, ClaimError, ExecuteError, StoreError, WriteError};
use crate::model::execution::Execution;
use crate::model::fingerprint::Fingerprint;
use crate::model::maintenance::Evicted;
use crate::model::response::Response;
use crate::model::scope::Scope;

impl Store {
    /// [`Store::begin`] for async callers.
    ///
    /// # Errors
    /// As [`Store::begin`].
    pub async fn begin_async(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<Begin, StoreError> {
        let begun = self.engine().begin_async(scope, fingerprint).await?;
        Ok(self.bind(scope, fingerprint, begun))
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
    ) -> Result<Begin, StoreError> {
        let begun = self
            .engine()
            .begin_or_wait_async(scope, fingerprint, max_wait)
            .await?;
        Ok(self.bind(scope, fingerprint, begun))
    }

    /// [`Store::execute`] for async callers: the closure runs on the writer thread, never on
    /// a runtime worker.
    ///
    /// # Errors
    /// As [`Store::execute`].
    pub async fn execute_async<F>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Execution, ExecuteError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static,
    {
        let begun = self
            .engine()
            .execute_async(scope, fingerprint, Box::new(work))
            .await?;
        Ok(Execution::from_begin(begun))
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
        written(
            self.engine()
                .run_async(request::write(Box::new(work)))
                .await?,
        )
    }

    /// [`Store::evict_expired`] for async callers.
    ///
    /// # Errors
    /// As [`Store::evict_expired`].
    pub async fn evict_expired_async(&self, limit: usize) -> Result<Evicted, StoreError> {
        self.engine().evict_async(limit).await
    }

    /// [`Store::checkpoint`] for async callers.
    ///
    /// # Errors
    /// As [`Store::checkpoint`].
    pub async fn checkpoint_async(&self) -> Result<(), StoreError> {
        self.engine().run_async(request::checkpoint_log()).await
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
            .run_async(self.commit_request(work))
            .await;
        let _entered = self.holding.span("commit").entered();
        self.committed(answer)
    }

    /// [`Claim::release`] for async callers.
    ///
    /// # Errors
    /// As [`Claim::release`].
    pub async fn release_async(self) -> Result<(), ClaimError> {
        let answer = self
            .store()
            .engine()
            .run_async(self.release_request())
            .await;
        self.refused(answer)
    }

    /// [`Claim::extend`] for async callers.
    ///
    /// # Errors
    /// As [`Claim::extend`].
    pub async fn extend_async(&mut self, lease: Duration) -> Result<(), ClaimError> {
        let request = self.extend_request(lease)?;
        let answer = self.store().engine().run_async(request).await;
        let until = self.refused(answer)?;
        self.holding.extended(until);
        Ok(())
    }

    /// [`Claim::checkpoint`] for async callers.
    ///
    /// # Errors
    /// As [`Claim::checkpoint`].
    pub async fn checkpoint_async(&mut self, bytes: impl Into<Vec<u8>>) -> Result<(), ClaimError> {
        let bytes = bytes.into();
        let request = self.checkpoint_request(bytes.clone())?;
        let answer = self.store().engine().run_async(request).await;
        self.refused(answer)?;
        self.holding.checkpointed(bytes);
        Ok(())
    }
}
