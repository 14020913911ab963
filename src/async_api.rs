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
            // Inline when the file is free (a read of cached pages: microseconds, far less
            // than a hop to the blocking pool); on the blocking pool while a compaction holds it.
            let path = match self.try_read_path(scope, fingerprint) {
                Some(path) => path?,
                None => {
                    let (store, read_scope) = (self.clone(), scope.clone());
                    blocking(move || store.read_path(&read_scope, fingerprint)).await??
                }
            };
            match path {
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
        // `Duration::MAX` means "as long as it takes": cap it where the sum would overflow.
        let start = tokio::time::Instant::now();
        let deadline = start
            .checked_add(max_wait)
            .unwrap_or(start + crate::store::MAX_WAIT);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, Timestamp};
    use crate::config::Sweep;

    /// While a compaction holds the file, `begin_async` does not read inline (which would block
    /// a runtime worker for the whole compaction): it reads from the blocking pool and answers
    /// once the file is free.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn begin_reads_off_the_runtime_while_the_file_is_held() -> Result<(), crate::Error> {
        let dir = tempfile::tempdir().map_err(|e| StoreError::Internal {
            message: e.to_string(),
        })?;
        let store = Store::builder()
            .clock(ManualClock::new(Timestamp::from_millis(1_000_000)))
            .sweep(Sweep::Off)
            .open(dir.path().join("idem"))?;
        let scope = Scope::new("t", "op", "k")?;
        let fingerprint = Fingerprint::of_bytes(b"request");
        let Begin::Claimed(claim) = store.begin_async(&scope, fingerprint).await? else {
            panic!("a new key is claimed");
        };
        claim
            .commit_async(|_| Ok(Response::new(201, "done")))
            .await?;
        store.checkpoint_async().await?; // published to redb: the read must go to the file

        let held = store.engine().hold_exclusively();
        assert!(
            store.try_read_path(&scope, fingerprint).is_none(),
            "no inline read while held"
        );
        let begin = tokio::spawn({
            let (store, scope) = (store.clone(), scope.clone());
            async move { store.begin_async(&scope, fingerprint).await }
        });
        drop(held);
        let answer = begin.await.map_err(|e| StoreError::Internal {
            message: e.to_string(),
        })??;
        assert!(matches!(answer, Begin::Replay(r) if r.body() == b"done"));
        assert!(matches!(
            store.try_read_path(&scope, fingerprint),
            Some(Ok(ReadPath::Answered(_)))
        ));
        Ok(())
    }
}
