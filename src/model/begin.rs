//! What `begin` answers: one enum for every backend, generic over the claim the backend hands
//! out, and the one place where a decision that writes nothing becomes an answer.

use std::time::Duration;

use crate::model::clock::Timestamp;
use crate::model::decision::Decision;
use crate::model::pace::Pace;
use crate::model::response::Response;

/// The outcome of `begin`: one atomic decision per call.
///
/// `C` is the claim the backend hands out; for the local [`Store`](crate::Store) it is
/// [`Claim`](crate::Claim), which commits through redb tables (the default: `Begin` is
/// `Begin<Claim>`).
///
/// Deliberately not `#[non_exhaustive]`: a new outcome must fail to compile in every `match`
/// rather than fall into a wildcard arm that might run the operation twice.
#[derive(Debug)]
#[must_use = "a Begin says whether to do the work; ignoring it loses a claim or a replay"]
pub enum Begin<C> {
    /// No live record existed: the caller owns the scope and must do the work, then commit
    /// or release the claim.
    Claimed(C),
    /// An earlier attempt may have run: the caller owns the scope now, but must reconcile
    /// with the claim's downstream key before acting. The claim's `recovery()` says why
    /// ([`Recovery`](crate::Recovery)): a previous attempt's lease expired and this is the next
    /// attempt, with that attempt's last checkpoint; or the store was restored from a copy
    /// that may lack writes the old store acknowledged, within its restore window, and has no
    /// record of the key (attempt 1, no checkpoint; the downstream key is the old store's).
    Recovered(C),
    /// The request already completed: this is its stored response, byte for byte.
    Replay(Response),
    /// A live claim for the same request holds the scope; nothing was written. Retry after
    /// `retry_after`.
    InProgress {
        /// How long the holder probably still needs: the operation's recent completion time
        /// (claim to completion, a moving average kept per operation name by this process)
        /// minus how long the holder has run. Never shorter than one second (unless the lease
        /// ends sooner) nor past the end of the holder's lease, when a retry would recover
        /// it. With no completion of the operation seen yet, or once the holder has outrun
        /// the estimate: as long again as it has run so far, so successive retries back off
        /// (1 s, 2 s, 4 s, ...).
        retry_after: Duration,
    },
    /// The scope is held or completed for a different request (another fingerprint): the key
    /// was reused for a different operation. Nothing was written.
    Mismatch,
    /// The request completed at `completed_at`, but its response was evicted after the TTL
    /// (a tombstone remains, see `Builder::tombstone_ttl`). It must not run again; the client
    /// should look the result up by other means. Nothing was written.
    Expired {
        /// When the operation completed.
        completed_at: Timestamp,
    },
}

impl<C> Begin<C> {
    /// The answer to a decision that writes nothing; `None` for a claim or a take-over, which
    /// only the writer (inside its transaction) may grant. A claim in flight is advised from
    /// `pace`, the estimate for `operation`.
    pub(crate) fn without_writing(
        decision: Decision<'_>,
        pace: &Pace,
        operation: &str,
    ) -> Option<Self> {
        match decision {
            Decision::Replay(response) => Some(Begin::Replay(response.clone())),
            Decision::InProgress(in_flight) => Some(Begin::InProgress {
                retry_after: pace.advise(operation, in_flight),
            }),
            Decision::Mismatch => Some(Begin::Mismatch),
            Decision::Expired { completed_at } => Some(Begin::Expired { completed_at }),
            Decision::Claim | Decision::TakeOver(_) => None,
        }
    }

    /// The same answer with its claim (if any) turned into another type: how a backend binds
    /// what its engine granted to a handle.
    pub(crate) fn map_claim<D>(self, bind: impl FnOnce(C) -> D) -> Begin<D> {
        match self {
            Begin::Claimed(claim) => Begin::Claimed(bind(claim)),
            Begin::Recovered(claim) => Begin::Recovered(bind(claim)),
            Begin::Replay(response) => Begin::Replay(response),
            Begin::InProgress { retry_after } => Begin::InProgress { retry_after },
            Begin::Mismatch => Begin::Mismatch,
            Begin::Expired { completed_at } => Begin::Expired { completed_at },
        }
    }

    /// The outcome's name, for logs and metrics: `claimed`, `recovered`, `replay`,
    /// `in_progress`, `mismatch`, `expired`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Begin::Claimed(_) => "claimed",
            Begin::Recovered(_) => "recovered",
            Begin::Replay(_) => "replay",
            Begin::InProgress { .. } => "in_progress",
            Begin::Mismatch => "mismatch",
            Begin::Expired { .. } => "expired",
        }
    }
}
