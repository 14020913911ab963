//! The two traits of the protocol: the store side and the claim side.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use super::keep_alive::KeepAlive;
use crate::error::{ClaimError, CommitError, StoreError};
use crate::model::begin::Begin;
use crate::model::claim::Recovery;
use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::limits::Limits;
use crate::model::maintenance::{Abandoned, Evicted};
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::model::stats::Stats;

/// The store side of the claim protocol: see the module docs and the state machine in the
/// crate docs.
pub trait Protocol: Clone + Send + Sync + 'static {
    /// The claim a winner of `begin` holds.
    type Claim: ProtocolClaim;

    /// Decides, atomically, what to do with a request for `scope`: exactly one of any number
    /// of concurrent callers with a new key is `Claimed`; the others see `InProgress` (or
    /// `Mismatch` for another fingerprint). Nothing is written unless it claims.
    fn begin(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> impl Future<Output = Result<Begin<Self::Claim>, StoreError>> + Send;

    /// Like `begin`, but waits up to `max_wait` for a live holder of the scope to finish
    /// instead of answering `InProgress`, when the backend can tell that it will.
    fn begin_or_wait(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        max_wait: Duration,
    ) -> impl Future<Output = Result<Begin<Self::Claim>, StoreError>> + Send;

    /// Removes up to `limit` completed records past their TTL (tombstoning them if the
    /// backend keeps tombstones), oldest first. Never an in-progress record.
    fn evict_expired(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Evicted, StoreError>> + Send;

    /// In-progress records whose lease has expired, oldest lease first, at most `limit`.
    fn abandoned(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<Abandoned>, StoreError>> + Send;

    /// Records by state and activity counters.
    fn stats(&self) -> impl Future<Output = Result<Stats, StoreError>> + Send;

    /// The lease, TTL and size limits the backend was opened with.
    fn limits(&self) -> Limits;
}

/// What a winner of `begin` holds: ownership of a scope, checked against its fence on every
/// operation. After a take-over, every operation of the previous holder is refused with
/// [`StaleClaim`](crate::StaleClaim) and changes nothing.
pub trait ProtocolClaim: fmt::Debug + Send + Sync + Sized + 'static {
    /// The scope held.
    fn scope(&self) -> &Scope;
    /// The fingerprint of the request that made the claim.
    fn fingerprint(&self) -> Fingerprint;
    /// The fence: new on every claim and take-over, never repeated.
    fn fence(&self) -> u64;
    /// 1 for a fresh claim; n + 1 when taking over from attempt n.
    fn attempt(&self) -> u32;
    /// When the lease ends, by the backend's clock.
    fn lease_until(&self) -> Timestamp;
    /// The latest checkpoint stored for the scope: the previous attempt's when recovered.
    fn last_checkpoint(&self) -> Option<&[u8]>;
    /// Why the claim is a recovery (from `Begin::Recovered`): a take-over of an expired
    /// lease, or a key a recently restored store has no record of. `None` for a fresh claim.
    fn recovery(&self) -> Option<Recovery>;
    /// A key for downstream calls, derived from the scope and the request: the same for every
    /// attempt of this operation, on any backend, and on a store restored from a copy.
    fn downstream_key(&self) -> String;
    /// Renews the lease in the background until dropped or the claim is finished.
    fn keep_alive(&self) -> KeepAlive;

    /// Stores `response` as the scope's completed record, with no business writes. On error
    /// nothing was stored; [`CommitError::into_claim`] gives the claim back when still held.
    fn complete(
        self,
        response: Response,
    ) -> impl Future<Output = Result<Response, CommitError<Self>>> + Send;

    /// Gives the scope up: the work did not happen; the next `begin` is `Claimed`.
    fn release(self) -> impl Future<Output = Result<(), ClaimError>> + Send;

    /// Moves the end of the lease to `lease` from now.
    fn extend(&mut self, lease: Duration) -> impl Future<Output = Result<(), ClaimError>> + Send;

    /// Stores progress for a later attempt to read if this one dies.
    fn checkpoint(&mut self, bytes: Vec<u8>)
    -> impl Future<Output = Result<(), ClaimError>> + Send;
}
