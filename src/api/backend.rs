//! The local store as a backend of the protocol: the trait's methods are its async ones. Here,
//! beside `Store`, as sqlx's `Pool` implements `Executor`: the protocol knows no backend.

use std::time::Duration;

use super::claim::{Begin, Claim, CommitError};
use super::store::Store;
use crate::error::{ClaimError, StoreError};
use crate::model::claim::Recovery;
use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::limits::Limits;
use crate::model::maintenance::{Abandoned, Evicted};
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::model::stats::Stats;
use crate::protocol::keep_alive::KeepAlive;
use crate::protocol::{Protocol, ProtocolClaim};

/// Runs blocking reads off the runtime's workers.
pub(super) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::Internal {
            message: format!("a blocking read failed to run: {e}"),
        })?
}

impl Protocol for Store {
    type Claim = Claim;

    async fn begin(&self, scope: &Scope, fingerprint: Fingerprint) -> Result<Begin, StoreError> {
        self.begin_async(scope, fingerprint).await
    }

    async fn begin_or_wait(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        max_wait: Duration,
    ) -> Result<Begin, StoreError> {
        self.begin_or_wait_async(scope, fingerprint, max_wait).await
    }

    async fn evict_expired(&self, limit: usize) -> Result<Evicted, StoreError> {
        self.evict_expired_async(limit).await
    }

    async fn abandoned(&self, limit: usize) -> Result<Vec<Abandoned>, StoreError> {
        let store = self.clone();
        blocking(move || Store::abandoned(&store, limit)).await
    }

    /// Exact ([`Store::exact_stats`]): through the trait, callers compare counts across
    /// backends.
    async fn stats(&self) -> Result<Stats, StoreError> {
        let store = self.clone();
        blocking(move || Store::exact_stats(&store)).await
    }

    fn limits(&self) -> Limits {
        Store::limits(self)
    }
}

impl ProtocolClaim for Claim {
    fn scope(&self) -> &Scope {
        Claim::scope(self)
    }

    fn fingerprint(&self) -> Fingerprint {
        Claim::fingerprint(self)
    }

    fn fence(&self) -> u64 {
        Claim::fence(self)
    }

    fn attempt(&self) -> u32 {
        Claim::attempt(self)
    }

    fn lease_until(&self) -> Timestamp {
        Claim::lease_until(self)
    }

    fn last_checkpoint(&self) -> Option<&[u8]> {
        Claim::last_checkpoint(self)
    }

    fn recovery(&self) -> Option<Recovery> {
        Claim::recovery(self)
    }

    fn downstream_key(&self) -> String {
        Claim::downstream_key(self)
    }

    fn keep_alive(&self) -> KeepAlive {
        Claim::keep_alive(self)
    }

    async fn complete(self, response: Response) -> Result<Response, CommitError> {
        self.commit_async(move |_tx| Ok(response)).await
    }

    async fn release(self) -> Result<(), ClaimError> {
        self.release_async().await
    }

    async fn extend(&mut self, lease: Duration) -> Result<(), ClaimError> {
        self.extend_async(lease).await
    }

    async fn checkpoint(&mut self, bytes: Vec<u8>) -> Result<(), ClaimError> {
        self.checkpoint_async(bytes).await
    }
}
