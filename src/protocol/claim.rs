//! The claim model both backends' claims are made of: what a claim holds ([`Holding`]), the
//! checks every claim operation makes before it reaches its backend, and the refusal of a stale
//! claim. `Claim` (local) and `PgClaim` differ only in how they reach their records.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::keep_alive::{KeepAlive, Renew};
use crate::error::{ClaimError, StaleClaim, StaleReason};
use crate::model::claim::{Grant, Recovery};
use crate::model::clock::Timestamp;
use crate::model::fingerprint::Fingerprint;
use crate::model::limits::MAX_LEASE;
use crate::model::scope::Scope;
use crate::model::settings::lease_in_range;

/// What a winner of `begin` holds, in any backend: its scope, the request's fingerprint and
/// the grant, kept up to date as the holder extends and checkpoints.
pub(crate) struct Holding {
    scope: Scope,
    fingerprint: Fingerprint,
    grant: Grant,
    /// Alive as long as the claim: a [`KeepAlive`] stops once it is gone.
    alive: Arc<()>,
}

impl Holding {
    pub(crate) fn new(scope: Scope, fingerprint: Fingerprint, grant: Grant) -> Self {
        debug_assert_eq!(grant.invalid(), None, "a backend checks its grants");
        Holding {
            scope,
            fingerprint,
            grant,
            alive: Arc::new(()),
        }
    }

    pub(crate) fn scope(&self) -> &Scope {
        &self.scope
    }

    pub(crate) fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    pub(crate) fn fence(&self) -> u64 {
        self.grant.fence
    }

    pub(crate) fn attempt(&self) -> u32 {
        self.grant.attempt
    }

    pub(crate) fn lease_until(&self) -> Timestamp {
        self.grant.lease_until
    }

    pub(crate) fn claimed_at(&self) -> Timestamp {
        self.grant.claimed_at
    }

    pub(crate) fn last_checkpoint(&self) -> Option<&[u8]> {
        self.grant.checkpoint.as_deref()
    }

    /// Why the claim is a recovery; `None` for a plain first attempt.
    pub(crate) fn recovery(&self) -> Option<Recovery> {
        self.grant.recovery
    }

    /// The same for every attempt of the operation, on this store or one restored from it:
    /// derived from the scope and the request (see `Scope::downstream_key`).
    pub(crate) fn downstream_key(&self) -> String {
        self.scope
            .downstream_key(&self.fingerprint, self.grant.origin_fence)
    }

    /// The backend moved the end of the lease to `until`.
    pub(crate) fn extended(&mut self, until: Timestamp) {
        self.grant.lease_until = until;
    }

    /// The backend stored `bytes` as the checkpoint.
    pub(crate) fn checkpointed(&mut self, bytes: Vec<u8>) {
        self.grant.checkpoint = Some(bytes);
    }

    /// Renews this claim's lease through `backend` until the claim is gone or finished.
    pub(crate) fn keep_alive<B: Renew>(&self, backend: B) -> KeepAlive {
        KeepAlive::start(HeldLease {
            backend,
            scope: self.scope.clone(),
            fence: self.grant.fence,
            claim: Arc::downgrade(&self.alive),
        })
    }

    /// The refusal of this claim, which no longer holds its scope for `reason`; said in the
    /// log. The backend counts it.
    pub(crate) fn stale(&self, reason: StaleReason) -> StaleClaim {
        tracing::warn!(
            tenant = self.scope.tenant(),
            operation = self.scope.operation(),
            key = self.scope.key(),
            fence = self.grant.fence,
            %reason,
            "refused a stale claim"
        );
        StaleClaim {
            scope: self.scope.clone(),
            fence: self.grant.fence,
            reason,
        }
    }

    /// A span for an operation (`commit`, `release`, ...) on this claim.
    pub(crate) fn span(&self, op: &'static str) -> tracing::Span {
        if !crate::model::scope::spans_wanted() {
            return tracing::Span::none();
        }
        tracing::debug_span!(
            "idemstore.claim",
            op,
            tenant = self.scope.tenant(),
            operation = self.scope.operation(),
            key = self.scope.key(),
            fence = self.grant.fence
        )
    }

    /// The claim's `Debug`, under its type's `name`.
    pub(crate) fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("scope", &self.scope)
            .field("fence", &self.grant.fence)
            .field("attempt", &self.grant.attempt)
            .field("recovery", &self.grant.recovery)
            .field("lease_until", &self.grant.lease_until)
            .finish()
    }
}

/// Checks a lease a holder asks for, by the rule a store's own lease setting keeps
/// ([`lease_in_range`]: 1 ms ..= [`MAX_LEASE`]).
pub(crate) fn check_lease(lease: Duration) -> Result<(), ClaimError> {
    if !lease_in_range(lease) {
        return Err(ClaimError::InvalidLease {
            requested_ms: lease.as_millis(),
            max_ms: MAX_LEASE.as_millis(),
        });
    }
    Ok(())
}

/// Checks a checkpoint's size against the backend's `max`.
pub(crate) fn check_checkpoint(bytes: &[u8], max: usize) -> Result<(), ClaimError> {
    if bytes.len() > max {
        return Err(ClaimError::CheckpointTooLarge {
            len: bytes.len(),
            max,
        });
    }
    Ok(())
}

/// One claim's lease as the keep-alive renews it, from beside its holder and without the claim.
pub(crate) struct HeldLease<B> {
    pub(crate) backend: B,
    pub(crate) scope: Scope,
    pub(crate) fence: u64,
    /// Gone once the claim is (committed, released, or dropped).
    claim: Weak<()>,
}

impl<B> HeldLease<B> {
    /// Whether the claim itself is gone: nothing to renew.
    pub(crate) fn claim_dropped(&self) -> bool {
        self.claim.strong_count() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_a_millisecond_at_least_and_at_most_the_maximum() {
        assert!(check_lease(Duration::from_millis(1)).is_ok());
        assert!(check_lease(MAX_LEASE).is_ok());
        for bad in [
            Duration::ZERO,
            Duration::from_micros(500),
            MAX_LEASE + Duration::from_millis(1),
        ] {
            assert!(
                matches!(check_lease(bad), Err(ClaimError::InvalidLease { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_checkpoint_may_be_exactly_the_maximum() {
        assert!(check_checkpoint(&[0; 4], 4).is_ok());
        assert!(matches!(
            check_checkpoint(&[0; 5], 4),
            Err(ClaimError::CheckpointTooLarge { len: 5, max: 4 })
        ));
    }
}
