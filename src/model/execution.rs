//! What `execute` answers: the request ran now, or the answer `begin` would have given.

use std::time::Duration;

use crate::model::begin::Begin;
use crate::model::clock::Timestamp;
use crate::model::response::Response;

/// The outcome of [`Store::execute`](crate::Store::execute): claim and commit in one step.
///
/// Deliberately not `#[non_exhaustive]`, like [`Begin`]: a new outcome must fail to compile in
/// every `match` rather than fall into a wildcard arm.
#[derive(Debug)]
#[must_use = "an Execution says whether the work ran; ignoring it hides a replay or a refusal"]
pub enum Execution {
    /// The closure ran, and its writes and the completed record committed together: this is
    /// its response. It ran as a first attempt, or over a two-phase claim whose lease had
    /// expired (that attempt's checkpoint is not read: `execute` is for local work, which a
    /// crashed attempt never half did), or, in a restored store's restore window, over a key
    /// the old store may have run (its local effects went with it, and messages the closure
    /// publishes get the ids the old store gave them). The last two count as recoveries in
    /// [`Stats`](crate::Stats).
    Executed(Response),
    /// The request already completed: its stored response, byte for byte. The closure did not
    /// run.
    Replay(Response),
    /// A live two-phase claim for the same request holds the scope; nothing ran or was
    /// written. Retry after `retry_after`.
    InProgress {
        /// How long until the holder's lease ends.
        retry_after: Duration,
    },
    /// The key is held or completed for a different request; nothing ran or was written.
    Mismatch,
    /// The request completed at `completed_at`, and its response was evicted (a tombstone
    /// remains); nothing ran or was written.
    Expired {
        /// When the operation completed.
        completed_at: Timestamp,
    },
}

impl Execution {
    /// The engine's answer, where a claim stands for "ran now, with this response".
    pub(crate) fn from_begin(begun: Begin<Response>) -> Self {
        match begun {
            Begin::Claimed(response) | Begin::Recovered(response) => Execution::Executed(response),
            Begin::Replay(response) => Execution::Replay(response),
            Begin::InProgress { retry_after } => Execution::InProgress { retry_after },
            Begin::Mismatch => Execution::Mismatch,
            Begin::Expired { completed_at } => Execution::Expired { completed_at },
        }
    }

    /// The outcome's name, for logs and metrics: `executed`, `replay`, `in_progress`,
    /// `mismatch`, `expired`.
    pub fn outcome(&self) -> &'static str {
        match self {
            Execution::Executed(_) => "executed",
            Execution::Replay(_) => "replay",
            Execution::InProgress { .. } => "in_progress",
            Execution::Mismatch => "mismatch",
            Execution::Expired { .. } => "expired",
        }
    }
}
