//! The workload's steps, one function per operation, each checked against the model as it
//! runs.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use crate::{
    Begin, Claim, ClaimError, CommitError, ExecuteError, Execution, ManualClock, Response, Store,
    StoreError, Timestamp,
};

use super::model::{EXECUTED, InFlight, KeyState, Model, fingerprint, scope};
use super::{CrashOp, LEASE, ROWS, TTL};

/// The claims the workload holds, oldest first per key: after a take-over the stale holder
/// is still around and acts first, as a slow process would, and is told it is stale.
pub(super) type Claims = BTreeMap<u8, VecDeque<Claim>>;

/// How a step ended, when it did not end well.
pub(super) enum Step {
    /// The store broke an invariant while running.
    Violation(String),
    /// The fault hit: the store failed the step, which may or may not have landed.
    Failed {
        /// What the step would have done.
        effect: InFlight,
        /// Whether it may have.
        landed: Landed,
        /// The error, for reports.
        error: String,
    },
}

/// Whether a failed step may have reached the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Landed {
    /// The store said nothing of it was written.
    No,
    /// Its outcome is unknown.
    Maybe,
}

/// What a store error says of the step that got it; `None` for an error no injected fault
/// explains.
fn landed(e: &StoreError) -> Option<Landed> {
    match e {
        StoreError::NotWritten { .. } | StoreError::Redb(_) | StoreError::Poisoned { .. } => {
            Some(Landed::No)
        }
        StoreError::OutcomeUnknown { .. } | StoreError::Closed => Some(Landed::Maybe),
        _ => None,
    }
}

fn failed(err: &StoreError, effect: InFlight) -> Step {
    match landed(err) {
        Some(landed) => Step::Failed {
            effect,
            landed,
            error: err.to_string(),
        },
        None => Step::Violation(format!("unexpected error: {err}")),
    }
}

fn violation(message: impl fmt::Display) -> Step {
    Step::Violation(message.to_string())
}

/// Runs one step against the store and the model.
pub(super) fn step(
    store: &Store,
    clock: &ManualClock,
    model: &mut Model,
    claims: &mut Claims,
    op: &CrashOp,
) -> Result<(), Step> {
    match *op {
        CrashOp::Begin { key, other_request } => {
            begin(store, clock, model, claims, key, other_request)
        }
        CrashOp::Commit { key, rows, abort } => {
            commit(store, clock, model, claims, key, rows, abort)
        }
        CrashOp::Execute {
            key,
            other_request,
            rows,
            abort,
        } => execute(store, clock, model, key, other_request, rows, abort),
        CrashOp::Release { key } => release(model, claims, key),
        CrashOp::Extend { key, secs } => {
            let now = crate::Clock::now(clock);
            let lease = Duration::from_secs(u64::from(secs.max(1)));
            update_claim(
                model,
                claims,
                key,
                |claim| claim.extend(lease),
                |state| {
                    if let KeyState::Held { lease_until, .. } = state {
                        *lease_until = now.saturating_add(lease);
                    }
                },
            )
        }
        CrashOp::Checkpoint { key } => {
            let bytes = vec![key; 3];
            let stored = bytes.clone();
            update_claim(
                model,
                claims,
                key,
                move |claim| claim.checkpoint(bytes),
                move |state| {
                    if let KeyState::Held { checkpoint, .. } = state {
                        *checkpoint = Some(stored);
                    }
                },
            )
        }
        CrashOp::StoreCheckpoint => store
            .checkpoint()
            .map_err(|e| failed(&e, InFlight::Nothing)),
        CrashOp::Evict => match store.evict_expired(usize::MAX) {
            Ok(_) => Ok(()),
            Err(e) => Err(failed(&e, InFlight::Evict)),
        },
        CrashOp::Advance { secs } => {
            clock.advance(Duration::from_secs(u64::from(secs)));
            Ok(())
        }
        CrashOp::Write { n } => write(store, model, n),
    }
}

fn begin(
    store: &Store,
    clock: &ManualClock,
    model: &mut Model,
    claims: &mut Claims,
    key: u8,
    other_request: bool,
) -> Result<(), Step> {
    let now = crate::Clock::now(clock);
    let before = model.state(key).visible(now);
    let answer = match store.begin(&scope(key), fingerprint(key, other_request)) {
        Ok(answer) => answer,
        Err(e) => {
            // If it landed, it took the next fence (or a later one: fences only grow).
            let after = claimed_after(&before, now, other_request, model.next_fence);
            return Err(failed(&e, InFlight::Key { key, after }));
        }
    };
    let kind = expected_answer(&before, now, other_request);
    let (got, claim) = answer_name(answer);
    if got != kind {
        return Err(violation(format_args!(
            "begin answered {got}, the model expected {kind} from {before:?}"
        )));
    }
    let Some(claim) = claim else {
        return Ok(());
    };
    let expected = claimed_after(&before, now, other_request, claim.fence());
    check_claim(&claim, model, key, &expected)?;
    model.next_fence = claim.fence() + 1;
    model.keys.insert(key, expected);
    claims.entry(key).or_default().push_back(claim);
    Ok(())
}

/// The key's state once a `begin` at `now` has claimed it with `fence`, from `before`: a
/// recovery counts one more attempt and keeps the last checkpoint.
fn claimed_after(before: &KeyState, now: Timestamp, other_request: bool, fence: u64) -> KeyState {
    KeyState::Held {
        other: other_request,
        fence,
        attempt: match before {
            KeyState::Held { attempt, .. } => attempt + 1,
            _ => 1,
        },
        lease_until: now.saturating_add(LEASE),
        checkpoint: match before {
            KeyState::Held { checkpoint, .. } => checkpoint.clone(),
            _ => None,
        },
    }
}

/// The answer the model expects `begin` to give at `now`, by the name of its variant.
fn expected_answer(before: &KeyState, now: Timestamp, other_request: bool) -> &'static str {
    match before {
        KeyState::Absent => "Claimed",
        KeyState::Held { other, .. } | KeyState::Completed { other, .. }
            if *other != other_request =>
        {
            "Mismatch"
        }
        KeyState::Completed { .. } => "Replay",
        KeyState::Held { lease_until, .. } if *lease_until > now => "InProgress",
        KeyState::Held { .. } => "Recovered",
    }
}

/// The name of `begin`'s answer, and its claim if it made one.
fn answer_name(answer: Begin) -> (&'static str, Option<Claim>) {
    match answer {
        Begin::Claimed(c) => ("Claimed", Some(c)),
        Begin::Recovered(c) => ("Recovered", Some(c)),
        Begin::Replay(_) => ("Replay", None),
        Begin::InProgress { .. } => ("InProgress", None),
        Begin::Mismatch => ("Mismatch", None),
        Begin::Expired { .. } => ("Expired", None),
    }
}

/// A new claim's fence was never handed out before, and the claim is what the model expects.
fn check_claim(claim: &Claim, model: &Model, key: u8, expected: &KeyState) -> Result<(), Step> {
    if claim.fence() < model.next_fence {
        return Err(violation(format_args!(
            "fence {} handed out again (the next new fence is at least {})",
            claim.fence(),
            model.next_fence
        )));
    }
    let seen = KeyState::Held {
        other: claim.fingerprint() == fingerprint(key, true),
        fence: claim.fence(),
        attempt: claim.attempt(),
        lease_until: claim.lease_until(),
        checkpoint: claim.last_checkpoint().map(<[u8]>::to_vec),
    };
    if seen != *expected {
        return Err(violation(format_args!(
            "claim {seen:?}, the model expected {expected:?}"
        )));
    }
    Ok(())
}

fn commit(
    _store: &Store,
    clock: &ManualClock,
    model: &mut Model,
    claims: &mut Claims,
    key: u8,
    rows: u8,
    abort: bool,
) -> Result<(), Step> {
    let now = crate::Clock::now(clock);
    let Some(claim) = claims.get_mut(&key).and_then(VecDeque::pop_front) else {
        return Ok(());
    };
    let fence = claim.fence();
    let other = claim.fingerprint() == fingerprint(key, true);
    let current = matches!(model.state(key), KeyState::Held { fence: f, .. } if f == fence);
    let rows = rows % 4;
    let done = KeyState::Completed {
        other,
        fence,
        rows,
        expires_at: now.saturating_add(TTL),
    };
    let result = claim.commit(move |tx| {
        for row in 0..rows {
            tx.insert(&ROWS, format!("k{key}/{fence}/{row}").as_str(), fence)?;
        }
        if abort {
            return Err("aborted by the workload".into());
        }
        Ok(Response::new(201, vec![rows]))
    });
    match (result, current, abort) {
        (Ok(response), true, false) => {
            if response.body() != [rows] {
                return Err(violation("commit answered another body"));
            }
            model.keys.insert(key, done);
            if rows > 0 {
                model.committed.insert((key, fence), rows);
            }
            Ok(())
        }
        (Err(e @ CommitError::Aborted { .. }), true, true) => {
            // Still held: it acts again later.
            if let Some(claim) = e.into_claim() {
                claims.entry(key).or_default().push_front(claim);
            }
            Ok(())
        }
        (Err(CommitError::Stale(_)), false, _) => Ok(()),
        (Err(CommitError::Store(e)), _, _) => Err(failed(
            &e,
            if current && !abort {
                InFlight::Key { key, after: done }
            } else {
                InFlight::Nothing
            },
        )),
        (other, current, abort) => Err(violation(format_args!(
            "commit (current {current}, abort {abort}) answered {other:?}"
        ))),
    }
}

fn execute(
    store: &Store,
    clock: &ManualClock,
    model: &mut Model,
    key: u8,
    other_request: bool,
    rows: u8,
    abort: bool,
) -> Result<(), Step> {
    let now = crate::Clock::now(clock);
    let before = model.state(key).visible(now);
    let kind = match &before {
        KeyState::Held { other, .. } | KeyState::Completed { other, .. }
            if *other != other_request =>
        {
            "mismatch"
        }
        KeyState::Completed { .. } => "replay",
        KeyState::Held { lease_until, .. } if *lease_until > now => "in_progress",
        KeyState::Absent | KeyState::Held { .. } => "executed",
    };
    let id = model.executions;
    model.executions += 1;
    let fence = EXECUTED + u64::from(id);
    let rows = rows % 4;
    let done = KeyState::Completed {
        other: other_request,
        fence,
        rows,
        expires_at: now.saturating_add(TTL),
    };
    let mut body = vec![rows];
    body.extend_from_slice(&id.to_le_bytes());
    let expected_body = body.clone();
    let result = store.execute(&scope(key), fingerprint(key, other_request), move |tx| {
        for row in 0..rows {
            tx.insert(&ROWS, format!("k{key}/{fence}/{row}").as_str(), fence)?;
        }
        if abort {
            return Err("aborted by the workload".into());
        }
        Ok(Response::new(201, body))
    });
    let runs = kind == "executed";
    match result {
        Ok(execution) if execution.outcome() != kind => Err(violation(format_args!(
            "execute answered {}, the model expected {kind} from {before:?}",
            execution.outcome()
        ))),
        Ok(Execution::Executed(response)) => {
            if abort || response.body() != expected_body {
                return Err(violation("execute stored a response it should not have"));
            }
            model.keys.insert(key, done);
            if rows > 0 {
                model.committed.insert((key, fence), rows);
            }
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(ExecuteError::Aborted(_)) if runs && abort => Ok(()),
        Err(ExecuteError::Store(e)) => Err(failed(
            &e,
            if runs && !abort {
                InFlight::Key { key, after: done }
            } else {
                InFlight::Nothing
            },
        )),
        Err(other) => Err(violation(format_args!(
            "execute (expected {kind}, abort {abort}) answered {other}"
        ))),
    }
}

fn release(model: &mut Model, claims: &mut Claims, key: u8) -> Result<(), Step> {
    let Some(claim) = claims.get_mut(&key).and_then(VecDeque::pop_front) else {
        return Ok(());
    };
    let current =
        matches!(model.state(key), KeyState::Held { fence, .. } if fence == claim.fence());
    match (claim.release(), current) {
        (Ok(()), true) => {
            model.keys.insert(key, KeyState::Absent);
            Ok(())
        }
        (Err(ClaimError::Stale(_)), false) => Ok(()),
        (Err(ClaimError::Store(e)), _) => Err(failed(
            &e,
            if current {
                InFlight::Key {
                    key,
                    after: KeyState::Absent,
                }
            } else {
                InFlight::Nothing
            },
        )),
        (other, current) => Err(violation(format_args!(
            "release (current {current}) answered {other:?}"
        ))),
    }
}

/// `extend` or `checkpoint` on the claim held for `key`, checked against the model.
fn update_claim(
    model: &mut Model,
    claims: &mut Claims,
    key: u8,
    call: impl FnOnce(&mut Claim) -> Result<(), ClaimError>,
    change: impl FnOnce(&mut KeyState),
) -> Result<(), Step> {
    let Some(held) = claims.get_mut(&key) else {
        return Ok(());
    };
    let Some(claim) = held.front_mut() else {
        return Ok(());
    };
    let state = model.state(key);
    let current = matches!(state, KeyState::Held { fence, .. } if fence == claim.fence());
    let mut after = state.clone();
    change(&mut after);
    match (call(claim), current) {
        (Ok(()), true) => {
            model.keys.insert(key, after);
            Ok(())
        }
        (Err(ClaimError::Stale(_)), false) => {
            // Told it is stale, the holder gives up.
            held.pop_front();
            Ok(())
        }
        (Err(ClaimError::Store(e)), _) => Err(failed(
            &e,
            if current {
                InFlight::Key { key, after }
            } else {
                InFlight::Nothing
            },
        )),
        (other, current) => Err(violation(format_args!(
            "claim update (current {current}) answered {other:?}"
        ))),
    }
}

fn write(store: &Store, model: &mut Model, n: u8) -> Result<(), Step> {
    let row = format!("plain/{n}");
    match store.write(move |tx| {
        tx.insert(&ROWS, row.as_str(), u64::from(n))?;
        Ok(())
    }) {
        Ok(()) => {
            model.plain.insert(n);
            Ok(())
        }
        Err(crate::WriteError::Store(e)) => Err(failed(&e, InFlight::Plain(n))),
        Err(other) => Err(violation(format_args!("write answered {other}"))),
    }
}
