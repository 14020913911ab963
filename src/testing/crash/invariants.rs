//! The invariants a store must keep after a crash or a fault, one function each, and how a
//! step whose outcome was unknown is settled once the store has recovered.
//!
//! 1. every acknowledged claim is still held (in progress) or, if its commit was in flight,
//!    completed;
//! 2. every acknowledged commit has its completed record and all its business rows, and
//!    rows never exist without their commit;
//! 3. nothing that was never acknowledged appears half-applied;
//! 4. the store reopens without error (checked by the caller);
//! 5. a key whose claim was acknowledged is not `Claimed` again while that claim stands.

use std::collections::{BTreeMap, BTreeSet};

use redb::ReadableTable;

use crate::{Begin, ManualClock, Store};

use super::ROWS;
use super::model::{InFlight, KeyState, Model, fingerprint, observed, scope};
use super::ops::Landed;

/// Whether a check may write to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Probe {
    /// Reads only: for a store that goes on afterwards.
    ReadOnly,
    /// Also tries to claim every held key again (invariant 5), which takes over expired
    /// leases: for a store that is checked and dropped.
    Claims,
}

/// Checks the store against the model and the step in flight.
pub(super) fn check(
    store: &Store,
    clock: &ManualClock,
    model: &Model,
    in_flight: &InFlight,
    probe: Probe,
) -> Result<(), String> {
    let keys = keys_to_check(model, in_flight);
    keys_in_acknowledged_state(store, clock, model, in_flight, &keys)?;
    let (rows, plain) = stored_rows(store)?;
    rows_match_commits(store, model, in_flight, &rows)?;
    plain_rows_match(model, in_flight, &plain)?;
    match probe {
        Probe::ReadOnly => Ok(()),
        Probe::Claims => no_second_claim(store, &keys),
    }
}

fn keys_to_check(model: &Model, in_flight: &InFlight) -> Vec<u8> {
    let mut keys: Vec<u8> = model.keys.keys().copied().collect();
    if let InFlight::Key { key, .. } = in_flight {
        keys.push(*key);
    }
    keys
}

fn seen(store: &Store, key: u8) -> Result<KeyState, String> {
    Ok(observed(
        key,
        store
            .get(&scope(key))
            .map_err(|e| format!("get k{key}: {e}"))?,
    ))
}

/// Whether `seen` is the state a step in flight leaves: exactly, except that a claim in
/// flight may have taken any fence from the expected one on (fences only grow).
fn landed_as(seen: &KeyState, after: &KeyState) -> bool {
    match (seen, after) {
        (
            KeyState::Held {
                other,
                fence,
                attempt,
                lease_until,
                checkpoint,
            },
            KeyState::Held {
                other: o,
                fence: f,
                attempt: a,
                lease_until: l,
                checkpoint: c,
            },
        ) => other == o && fence >= f && attempt == a && lease_until == l && checkpoint == c,
        _ => seen == after,
    }
}

/// Invariants 1 and 3: each key is in its acknowledged state, or (for the step in flight)
/// wholly in the state after it.
fn keys_in_acknowledged_state(
    store: &Store,
    clock: &ManualClock,
    model: &Model,
    in_flight: &InFlight,
    keys: &[u8],
) -> Result<(), String> {
    let now = crate::Clock::now(clock);
    for &key in keys {
        let seen = seen(store, key)?;
        let acknowledged = model.state(key).visible(now);
        let landed = match in_flight {
            InFlight::Key { key: k, after } if *k == key => Some(after.visible(now)),
            _ => None,
        };
        if seen != acknowledged && !landed.as_ref().is_some_and(|l| landed_as(&seen, l)) {
            return Err(format!(
                "invariant 1/3: k{key} is {seen:?}; acknowledged {acknowledged:?}, in flight {landed:?}"
            ));
        }
    }
    Ok(())
}

/// Business rows by (key, fence), and keyless rows.
type Rows = (BTreeMap<(u8, u64), u8>, BTreeSet<u8>);

fn stored_rows(store: &Store) -> Result<Rows, String> {
    let read = store.read().map_err(|e| format!("read: {e}"))?;
    let table = read
        .open_table(ROWS)
        .map_err(|e| format!("open rows: {e}"))?;
    let mut rows: BTreeMap<(u8, u64), u8> = BTreeMap::new();
    let mut plain = BTreeSet::new();
    for entry in table.iter().map_err(|e| format!("iter rows: {e}"))? {
        let (k, _) = entry.map_err(|e| format!("row: {e}"))?;
        let k = k.value();
        if let Some(n) = k.strip_prefix("plain/") {
            plain.insert(n.parse::<u8>().map_err(|e| format!("{k}: {e}"))?);
            continue;
        }
        let mut parts = k.split('/');
        let (Some(key), Some(fence)) = (parts.next(), parts.next()) else {
            return Err(format!("malformed row {k}"));
        };
        let key = key
            .trim_start_matches('k')
            .parse::<u8>()
            .map_err(|e| format!("{k}: {e}"))?;
        let fence = fence.parse::<u64>().map_err(|e| format!("{k}: {e}"))?;
        *rows.entry((key, fence)).or_default() += 1;
    }
    Ok((rows, plain))
}

/// Invariant 2: rows exist exactly for the commits that landed, all of them or none, and
/// never without their record.
fn rows_match_commits(
    store: &Store,
    model: &Model,
    in_flight: &InFlight,
    rows: &BTreeMap<(u8, u64), u8>,
) -> Result<(), String> {
    let mut expected = model.committed.clone();
    if let InFlight::Key {
        key,
        after: KeyState::Completed { fence, rows: n, .. },
    } = in_flight
    {
        let record = seen(store, *key)?;
        let record_landed = matches!(record, KeyState::Completed { fence: f, .. } if f == *fence);
        match rows.get(&(*key, *fence)) {
            Some(found) if found != n => {
                return Err(format!(
                    "invariant 3: {found} of {n} rows of k{key}/{fence}"
                ));
            }
            Some(_) if !record_landed => {
                return Err(format!(
                    "invariant 2: rows of k{key}/{fence} without their record"
                ));
            }
            Some(_) => {
                expected.insert((*key, *fence), *n);
            }
            None if record_landed && *n > 0 => {
                return Err(format!(
                    "invariant 2: record of k{key}/{fence} without its rows"
                ));
            }
            None => {}
        }
    }
    if *rows != expected {
        return Err(format!(
            "invariant 2: rows {rows:?}, acknowledged {expected:?}"
        ));
    }
    Ok(())
}

/// Keyless writes: every acknowledged one, and the one in flight at most.
fn plain_rows_match(
    model: &Model,
    in_flight: &InFlight,
    plain: &BTreeSet<u8>,
) -> Result<(), String> {
    let mut expected = model.plain.clone();
    if let InFlight::Plain(n) = in_flight {
        // The write in flight: its row may or may not be there.
        if plain.contains(n) {
            expected.insert(*n);
        }
    }
    if *plain != expected {
        return Err(format!("keyless rows {plain:?}, acknowledged {expected:?}"));
    }
    Ok(())
}

/// Invariant 5: a key whose acknowledged claim stands is never Claimed again, so its side
/// effect cannot run twice. Judged on what is stored, which the checks above matched against
/// the model (an in-flight release may have landed).
fn no_second_claim(store: &Store, keys: &[u8]) -> Result<(), String> {
    for &key in keys {
        if let KeyState::Held { other, .. } | KeyState::Completed { other, .. } = seen(store, key)?
        {
            let answer = store
                .begin(&scope(key), fingerprint(key, other))
                .map_err(|e| format!("begin k{key}: {e}"))?;
            if let Begin::Claimed(_) = answer {
                return Err(format!("invariant 5: k{key} was claimed a second time"));
            }
        }
    }
    Ok(())
}

/// After a failed step whose process goes on: checks the store against the model (with the
/// step in flight, if its outcome is unknown; without it, if the store said it was not
/// written), then makes the model follow what the store holds, so the workload can continue.
pub(super) fn settle(
    store: &Store,
    clock: &ManualClock,
    model: &mut Model,
    in_flight: &InFlight,
    landed: Landed,
) -> Result<(), String> {
    let nothing = InFlight::Nothing;
    let in_flight = match landed {
        Landed::Maybe => in_flight,
        Landed::No => &nothing,
    };
    let now = crate::Clock::now(clock);
    let keys = keys_to_check(model, in_flight);
    keys_in_acknowledged_state(store, clock, model, in_flight, &keys)?;
    let (rows, plain) = stored_rows(store)?;
    rows_match_commits(store, model, in_flight, &rows)?;
    plain_rows_match(model, in_flight, &plain)?;
    match in_flight {
        InFlight::Key { key, after } => {
            let seen = seen(store, *key)?;
            if seen == model.state(*key).visible(now) {
                return Ok(());
            }
            // It landed: the model takes it as acknowledged.
            if let KeyState::Held { fence, .. } = &seen {
                model.next_fence = model.next_fence.max(fence + 1);
            }
            if let KeyState::Completed { fence, rows: n, .. } = after
                && *n > 0
            {
                model.committed.insert((*key, *fence), *n);
            }
            model.keys.insert(*key, seen_or(after, seen));
        }
        InFlight::Plain(n) => {
            if plain.contains(n) {
                model.plain.insert(*n);
            }
        }
        InFlight::Nothing | InFlight::Evict => {}
    }
    Ok(())
}

/// The model's state for a step that landed: what the store shows, except that a completed
/// record keeps its expiry from the model (`visible` hides it once past).
fn seen_or(after: &KeyState, seen: KeyState) -> KeyState {
    match (after, &seen) {
        (KeyState::Completed { .. }, _) => after.clone(),
        _ => seen,
    }
}
