//! The reference model of a crash case: what every key must hold, given what the store
//! acknowledged.

use std::collections::{BTreeMap, BTreeSet};

use crate::{Fingerprint, Record, RecordState, Scope, Timestamp};

/// What the model knows of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KeyState {
    Absent,
    Held {
        /// Which of the key's two requests claimed it (`true`: the other one).
        other: bool,
        fence: u64,
        attempt: u32,
        lease_until: Timestamp,
        checkpoint: Option<Vec<u8>>,
    },
    Completed {
        other: bool,
        fence: u64,
        rows: u8,
        expires_at: Timestamp,
    },
}

impl KeyState {
    /// What `Store::get` shows at `now` (an expired completed record is absent).
    pub(super) fn visible(&self, now: Timestamp) -> KeyState {
        match self {
            KeyState::Completed { expires_at, .. } if *expires_at <= now => KeyState::Absent,
            other => other.clone(),
        }
    }
}

/// A stored record as the model describes it.
pub(super) fn observed(key: u8, record: Option<Record>) -> KeyState {
    match record {
        None => KeyState::Absent,
        Some(r) => match r.state {
            RecordState::InProgress {
                lease_until,
                checkpoint,
            } => KeyState::Held {
                other: r.fingerprint == fingerprint(key, true),
                fence: r.fence,
                attempt: r.attempt,
                lease_until,
                checkpoint,
            },
            RecordState::Completed {
                expires_at,
                response,
                ..
            } => KeyState::Completed {
                other: r.fingerprint == fingerprint(key, true),
                fence: executed_fence(response.body()).unwrap_or(r.fence),
                rows: response.body().first().copied().unwrap_or(0),
                expires_at,
            },
            // The workload runs without tombstones: a tombstone is never expected, and
            // reads as absent (which the model then reports as a mismatch).
            RecordState::Tombstone { .. } => KeyState::Absent,
        },
    }
}

/// Where the model's fences for `execute` completions start. An `execute` closure cannot know
/// the fence its record gets, yet must name its rows after the completion they belong to, as
/// commits name theirs `k{key}/{fence}/{row}`; so an execution is known by this plus its id,
/// which its response carries after the row count (`[rows, id as 4 bytes LE]`).
pub(super) const EXECUTED: u64 = 1 << 40;

/// The model's fence of a completion by `execute`, read from its response body.
pub(super) fn executed_fence(body: &[u8]) -> Option<u64> {
    let id: [u8; 4] = body.get(1..5)?.try_into().ok()?;
    Some(EXECUTED + u64::from(u32::from_le_bytes(id)))
}

/// The model: every key's acknowledged state, every acknowledged commit, keyless rows.
#[derive(Debug, Clone, Default)]
pub(super) struct Model {
    pub(super) keys: BTreeMap<u8, KeyState>,
    /// No fence handed out from now on is below this: fences only grow (a claim that failed
    /// may have used one up).
    pub(super) next_fence: u64,
    /// Business rows of every acknowledged commit, by (key, fence). Rows outlive their
    /// record: eviction removes records, never business rows.
    pub(super) committed: BTreeMap<(u8, u64), u8>,
    /// Keyless rows acknowledged (a row written twice is one row).
    pub(super) plain: BTreeSet<u8>,
    /// `execute` steps run so far: the next one's id.
    pub(super) executions: u32,
}

impl Model {
    pub(super) fn state(&self, key: u8) -> KeyState {
        self.keys.get(&key).cloned().unwrap_or(KeyState::Absent)
    }
}

/// The effect of a step that failed: it may or may not have landed, but never half.
#[derive(Debug, Clone)]
pub(super) enum InFlight {
    /// A step with no effect on stored state (or none was in flight).
    Nothing,
    /// `key` may be in either state.
    Key { key: u8, after: KeyState },
    /// The keyless row may or may not exist.
    Plain(u8),
    /// Eviction: expired records may or may not be gone (invisible either way).
    Evict,
}

pub(super) fn scope(key: u8) -> Scope {
    // Keys are small numbers: always a valid scope.
    Scope::new("tenant", "op", format!("k{key}")).unwrap_or_else(|_| unreachable!())
}

pub(super) fn fingerprint(key: u8, other: bool) -> Fingerprint {
    Fingerprint::of_bytes(&[key, u8::from(other)])
}
