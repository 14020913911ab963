//! What the writer answers a facade with: the claim it granted, and why it refused.

use crate::error::{BoxError, ResponseError, StaleReason, StoreError};
use crate::model::claim::{Grant, Recovery};
use crate::model::clock::Timestamp;
use crate::model::record::{Record, RecordState};

use crate::engine::tables::tx::Tx;
use crate::engine::watchers::HoldToken;

/// What the writer holds for a claim it granted.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) grant: Grant,
    /// Counts the claim as a holder of its scope for `begin_or_wait`, from the writer on;
    /// kept for its drop, which wakes the scope's waiters.
    pub(crate) hold: HoldToken,
}

impl Held {
    pub(super) fn of(
        record: &Record,
        claimed_at: Timestamp,
        recovery: Option<Recovery>,
        hold: HoldToken,
    ) -> Self {
        let RecordState::InProgress {
            lease_until,
            checkpoint,
        } = &record.state
        else {
            unreachable!("a claim is granted on the in-progress record it wrote");
        };
        let grant = Grant {
            fence: record.fence,
            origin_fence: record.origin_fence,
            attempt: record.attempt,
            recovery,
            lease_until: *lease_until,
            claimed_at,
            checkpoint: checkpoint.clone(),
        };
        Held {
            grant: grant.checked(),
            hold,
        }
    }
}

/// Why a fence-checked operation was refused.
#[derive(Debug)]
pub(crate) enum Refusal {
    Stale(StaleReason),
    Store(StoreError),
}

impl From<StoreError> for Refusal {
    fn from(e: StoreError) -> Self {
        Refusal::Store(e)
    }
}

/// How a user closure failed. Either way none of its writes are kept.
#[derive(Debug)]
pub(crate) enum UserFailure {
    Aborted(BoxError),
    Panicked(String),
}

/// Why a commit stored nothing.
#[derive(Debug)]
pub(crate) enum CommitRefusal {
    User(UserFailure),
    InvalidResponse(ResponseError),
    Refused(Refusal),
}

/// A user closure run inside a commit or write.
pub(crate) type UserWork<T> = Box<dyn FnOnce(&mut Tx<'_>) -> Result<T, BoxError> + Send>;

/// Why `forget` removed nothing.
#[derive(Debug)]
pub(crate) enum ForgetRefusal {
    Absent,
    Stale(StaleReason),
    InProgress { fence: u64 },
    Store(StoreError),
}
