//! Crash cases: run a workload on a [`SimDisk`], crash (or fail) it at a chosen operation,
//! reopen what survived, and check it against a reference model.
//!
//! The model follows every acknowledged operation. One operation may be in flight when the
//! fault hits (the workload is sequential); its effect may or may not have landed, but never
//! half. The invariants checked after the reopen:
//!
//! 1. every acknowledged claim is still held (in progress) or, if its commit was in flight,
//!    completed;
//! 2. every acknowledged commit has its completed record and all its business rows, and
//!    rows never exist without their commit;
//! 3. nothing that was never acknowledged appears half-applied;
//! 4. the store reopens without error;
//! 5. a key whose claim was acknowledged is not `Claimed` again while that claim stands.
//!
//! During the run, every answer the store gives is also checked against the model.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

use redb::{ReadableTable, TableDefinition};

use crate::testing::{FaultPlan, SimDisk, Tear};
use crate::{
    Begin, Claim, ClaimError, CommitError, Durability, Fingerprint, ManualClock, Record,
    RecordState, Response, Scope, Store, Timestamp,
};

/// The business table the workload writes: `key/fence/row` → fence.
const ROWS: TableDefinition<&str, u64> = TableDefinition::new("rows");
const LEASE: Duration = Duration::from_secs(10);
const TTL: Duration = Duration::from_secs(60);
const START: Timestamp = Timestamp::from_millis(1_764_000_000_000);

/// One step of a workload. Keys are small numbers so that steps collide often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashOp {
    /// `begin` on key `key`; `other_request` sends a different fingerprint.
    Begin {
        /// Which key.
        key: u8,
        /// Whether to send a fingerprint other than the key's usual one.
        other_request: bool,
    },
    /// Commit the claim held on `key` with `rows` business rows; `abort` makes the closure
    /// fail after writing them.
    Commit {
        /// Which key.
        key: u8,
        /// Business rows to write (bounded by the runner).
        rows: u8,
        /// Whether the closure fails after writing.
        abort: bool,
    },
    /// Release the claim held on `key`.
    Release {
        /// Which key.
        key: u8,
    },
    /// Extend the claim held on `key` by `secs` seconds from now.
    Extend {
        /// Which key.
        key: u8,
        /// Seconds, 1 or more.
        secs: u8,
    },
    /// Store a checkpoint on the claim held on `key`.
    Checkpoint {
        /// Which key.
        key: u8,
    },
    /// `Store::checkpoint` (the log's).
    StoreCheckpoint,
    /// `Store::evict_expired` with room for everything.
    Evict,
    /// Move the clock forward.
    Advance {
        /// Seconds.
        secs: u8,
    },
    /// A keyless `Store::write` of one row.
    Write {
        /// Row number.
        n: u8,
    },
}

/// The fault a case injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// No fault: the whole workload runs, then the machine loses power.
    None,
    /// Power is lost at mutating operation `n`, counted from the disk's creation (so a crash
    /// while the store is first created is covered too).
    CrashAt(u64),
    /// Mutating operation `n`, counted from when the store is open, fails once; the process
    /// goes on (poisoned) and then restarts.
    FailAt(u64),
    /// Sync `n`, counted from when the store is open, fails once; the process goes on
    /// (poisoned) and then restarts.
    FailSync(u64),
}

/// A whole case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashCase {
    /// The store's durability mode.
    pub durability: Durability,
    /// The workload.
    pub ops: Vec<CrashOp>,
    /// What goes wrong.
    pub fault: Fault,
    /// What the crash does to the write in flight.
    pub tear: Tear,
}

/// What a case did, for choosing crash points and for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CaseReport {
    /// Mutating disk operations the run made before reopening.
    pub disk_ops: u64,
    /// Workload steps acknowledged before the fault.
    pub acknowledged: usize,
    /// Frames the reopen replayed.
    pub frames_replayed: u64,
}

/// An invariant that did not hold, with the step and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Violation {}

fn violation(message: impl Into<String>) -> Violation {
    Violation(message.into())
}

/// What the model knows of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyState {
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
    fn visible(&self, now: Timestamp) -> KeyState {
        match self {
            KeyState::Completed { expires_at, .. } if *expires_at <= now => KeyState::Absent,
            other => other.clone(),
        }
    }
}

fn observed(key: u8, record: Option<Record>) -> KeyState {
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
                fence: r.fence,
                rows: response.body().first().copied().unwrap_or(0),
                expires_at,
            },
            // The workload runs without tombstones: a tombstone is never expected, and
            // reads as absent (which the model then reports as a mismatch).
            RecordState::Tombstone { .. } => KeyState::Absent,
        },
    }
}

/// The model: every key's acknowledged state, every acknowledged commit, keyless rows.
#[derive(Debug, Clone, Default)]
struct Model {
    keys: BTreeMap<u8, KeyState>,
    next_fence: u64,
    /// Business rows of every acknowledged commit, by (key, fence). Rows outlive their
    /// record: eviction removes records, never business rows.
    committed: BTreeMap<(u8, u64), u8>,
    /// Keyless rows acknowledged (a row written twice is one row).
    plain: BTreeSet<u8>,
}

impl Model {
    fn state(&self, key: u8) -> KeyState {
        self.keys.get(&key).cloned().unwrap_or(KeyState::Absent)
    }
}

/// The effect of the step that was in flight when the fault hit.
#[derive(Debug, Clone)]
enum InFlight {
    /// A step with no effect on stored state (or none was in flight).
    Nothing,
    /// `key` may be in either state.
    Key { key: u8, after: KeyState },
    /// The keyless row may or may not exist.
    Plain(u8),
    /// Eviction: expired records may or may not be gone (invisible either way).
    Evict,
}

fn scope(key: u8) -> Scope {
    // Keys are small numbers: always a valid scope.
    Scope::new("tenant", "op", format!("k{key}")).unwrap_or_else(|_| unreachable!())
}

fn fingerprint(key: u8, other: bool) -> Fingerprint {
    Fingerprint::of_bytes(&[key, u8::from(other)])
}

fn open(
    disk: &SimDisk,
    durability: Durability,
    clock: &ManualClock,
) -> Result<Store, crate::OpenError> {
    Store::builder()
        .durability(durability)
        .lease(LEASE)
        .ttl(TTL)
        .clock(clock.clone())
        .table(ROWS)
        .log_segment_bytes(64 * 1024)
        .checkpoint_bytes(128 * 1024)
        .checkpoint_interval(Duration::from_secs(3600))
        .sweep(crate::Sweep::Off)
        .open_simulated(disk)
}

/// Runs a case and checks every invariant. Never panics on store errors: they are either
/// expected (after the fault) or reported as a [`Violation`].
///
/// # Errors
/// The first invariant that did not hold.
pub fn run_case(case: &CrashCase) -> Result<CaseReport, Violation> {
    let disk = SimDisk::new();
    if let Fault::CrashAt(n) = case.fault {
        disk.plan(FaultPlan {
            crash_at: Some(n),
            ..FaultPlan::default()
        });
    }
    let clock = ManualClock::new(START);
    let mut model = Model {
        next_fence: 1,
        ..Model::default()
    };
    let mut report = CaseReport::default();
    let mut in_flight = InFlight::Nothing;
    if let Ok(store) = open(&disk, case.durability, &clock) {
        let opened = disk.counters();
        match case.fault {
            Fault::FailAt(n) => disk.plan(FaultPlan {
                fail_at: Some(opened.ops + n),
                ..FaultPlan::default()
            }),
            Fault::FailSync(n) => disk.plan(FaultPlan {
                fail_sync: Some(opened.syncs() + n),
                ..FaultPlan::default()
            }),
            Fault::None | Fault::CrashAt(_) => {}
        }
        let mut claims: Claims = BTreeMap::new();
        for (i, op) in case.ops.iter().enumerate() {
            match step(&store, &clock, &mut model, &mut claims, op) {
                Ok(()) => report.acknowledged = i + 1,
                Err(Step::Violation(v)) => {
                    return Err(violation(format!("step {i} {op:?}: {v}")));
                }
                Err(Step::Failed(effect)) => {
                    in_flight = effect;
                    break;
                }
            }
        }
        drop(claims);
        report.disk_ops = disk.counters().ops;
        drop(store);
    } else {
        report.disk_ops = disk.counters().ops;
    }

    // A crash keeps what was synced; a failed operation is followed by a restart of the
    // process, which finds everything the OS has (synced or not). Check both.
    let images = match case.fault {
        Fault::None | Fault::CrashAt(_) => vec![("crash", disk.crash_image(case.tear))],
        Fault::FailAt(_) | Fault::FailSync(_) => vec![
            ("restart", disk.clone()),
            ("crash", disk.crash_image(case.tear)),
        ],
    };
    disk.plan(FaultPlan::default());
    for (kind, image) in images {
        let store = open(&image, case.durability, &clock)
            .map_err(|e| violation(format!("invariant 4: the {kind} image did not reopen: {e}")))?;
        report.frames_replayed = store.recovery_report().frames_replayed;
        check(&store, &clock, &model, &in_flight)
            .map_err(|v| violation(format!("after {kind} ({in_flight:?}): {v}")))?;
    }
    Ok(report)
}

/// The claims the workload holds, oldest first per key: after a take-over the stale holder
/// is still around and acts first, as a slow process would, and is told it is stale.
type Claims = BTreeMap<u8, VecDeque<Claim>>;

/// How a step ended, when it did not end well.
enum Step {
    /// The store broke an invariant while running.
    Violation(String),
    /// The fault hit: the store failed; this step may or may not have landed.
    Failed(InFlight),
}

fn failed_or(err: &dyn fmt::Display, poisoned_or_io: bool, effect: InFlight) -> Step {
    if poisoned_or_io {
        Step::Failed(effect)
    } else {
        Step::Violation(format!("unexpected error: {err}"))
    }
}

fn is_fault(e: &crate::StoreError) -> bool {
    matches!(
        e,
        crate::StoreError::Redb(_)
            | crate::StoreError::OutcomeUnknown { .. }
            | crate::StoreError::Poisoned { .. }
            | crate::StoreError::Closed
    )
}

fn step(
    store: &Store,
    clock: &ManualClock,
    model: &mut Model,
    claims: &mut Claims,
    op: &CrashOp,
) -> Result<(), Step> {
    let now = crate::Clock::now(clock);
    match *op {
        CrashOp::Begin { key, other_request } => {
            let before = model.state(key).visible(now);
            let expected_fence = model.next_fence;
            let claimed_after = KeyState::Held {
                other: other_request,
                fence: expected_fence,
                attempt: match &before {
                    KeyState::Held { attempt, .. } => attempt + 1,
                    _ => 1,
                },
                lease_until: now.saturating_add(LEASE),
                checkpoint: match &before {
                    KeyState::Held { checkpoint, .. } => checkpoint.clone(),
                    _ => None,
                },
            };
            let answer = store.begin(&scope(key), fingerprint(key, other_request));
            let answer = match answer {
                Ok(answer) => answer,
                Err(crate::BeginError::Store(e)) => {
                    return Err(failed_or(
                        &e,
                        is_fault(&e),
                        InFlight::Key {
                            key,
                            after: claimed_after,
                        },
                    ));
                }
            };
            let kind = match &before {
                KeyState::Absent => "Claimed",
                KeyState::Held { other, .. } | KeyState::Completed { other, .. }
                    if *other != other_request =>
                {
                    "Mismatch"
                }
                KeyState::Completed { .. } => "Replay",
                KeyState::Held { lease_until, .. } if *lease_until > now => "InProgress",
                KeyState::Held { .. } => "Recovered",
            };
            let (got, claim) = match answer {
                Begin::Claimed(c) => ("Claimed", Some(c)),
                Begin::Recovered(c) => ("Recovered", Some(c)),
                Begin::Replay(_) => ("Replay", None),
                Begin::InProgress { .. } => ("InProgress", None),
                Begin::Mismatch => ("Mismatch", None),
                Begin::Expired { .. } => ("Expired", None),
            };
            if got != kind {
                return Err(Step::Violation(format!(
                    "begin answered {got}, the model expected {kind} from {before:?}"
                )));
            }
            if let Some(claim) = claim {
                let seen = KeyState::Held {
                    other: claim.fingerprint() == fingerprint(key, true),
                    fence: claim.fence(),
                    attempt: claim.attempt(),
                    lease_until: claim.lease_until(),
                    checkpoint: claim.last_checkpoint().map(<[u8]>::to_vec),
                };
                if seen != claimed_after {
                    return Err(Step::Violation(format!(
                        "claim {seen:?}, the model expected {claimed_after:?}"
                    )));
                }
                model.next_fence += 1;
                model.keys.insert(key, claimed_after);
                claims.entry(key).or_default().push_back(claim);
            }
            Ok(())
        }
        CrashOp::Commit { key, rows, abort } => {
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
                        return Err(Step::Violation("commit answered another body".into()));
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
                (Err(CommitError::Store(e)), _, _) => Err(failed_or(
                    &e,
                    is_fault(&e),
                    if current && !abort {
                        InFlight::Key { key, after: done }
                    } else {
                        InFlight::Nothing
                    },
                )),
                (other, current, abort) => Err(Step::Violation(format!(
                    "commit (current {current}, abort {abort}) answered {other:?}"
                ))),
            }
        }
        CrashOp::Release { key } => {
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
                (Err(ClaimError::Store(e)), _) => Err(failed_or(
                    &e,
                    is_fault(&e),
                    if current {
                        InFlight::Key {
                            key,
                            after: KeyState::Absent,
                        }
                    } else {
                        InFlight::Nothing
                    },
                )),
                (other, current) => Err(Step::Violation(format!(
                    "release (current {current}) answered {other:?}"
                ))),
            }
        }
        CrashOp::Extend { key, secs } => {
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
            .map_err(|e| failed_or(&e, is_fault(&e), InFlight::Nothing)),
        CrashOp::Evict => match store.evict_expired(usize::MAX) {
            Ok(_) => Ok(()),
            Err(e) => Err(failed_or(&e, is_fault(&e), InFlight::Evict)),
        },
        CrashOp::Advance { secs } => {
            clock.advance(Duration::from_secs(u64::from(secs)));
            Ok(())
        }
        CrashOp::Write { n } => {
            let row = format!("plain/{n}");
            match store.write(move |tx| {
                tx.insert(&ROWS, row.as_str(), u64::from(n))?;
                Ok(())
            }) {
                Ok(()) => {
                    model.plain.insert(n);
                    Ok(())
                }
                Err(crate::WriteError::Store(e)) => {
                    Err(failed_or(&e, is_fault(&e), InFlight::Plain(n)))
                }
                Err(other) => Err(Step::Violation(format!("write answered {other}"))),
            }
        }
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
        (Err(ClaimError::Store(e)), _) => Err(failed_or(
            &e,
            is_fault(&e),
            if current {
                InFlight::Key { key, after }
            } else {
                InFlight::Nothing
            },
        )),
        (other, current) => Err(Step::Violation(format!(
            "claim update (current {current}) answered {other:?}"
        ))),
    }
}

/// Checks the reopened store against the model and the step in flight.
fn check(
    store: &Store,
    clock: &ManualClock,
    model: &Model,
    in_flight: &InFlight,
) -> Result<(), String> {
    let now = crate::Clock::now(clock);
    // Invariants 1 and 3: each key is in its acknowledged state, or (for the step in flight)
    // wholly in the state after it.
    let mut keys: Vec<u8> = model.keys.keys().copied().collect();
    if let InFlight::Key { key, .. } = in_flight {
        keys.push(*key);
    }
    for &key in &keys {
        let seen = observed(
            key,
            store
                .get(&scope(key))
                .map_err(|e| format!("get k{key}: {e}"))?,
        );
        let acknowledged = model.state(key).visible(now);
        let landed = match in_flight {
            InFlight::Key { key: k, after } if *k == key => Some(after.visible(now)),
            _ => None,
        };
        if seen != acknowledged && landed.as_ref() != Some(&seen) {
            return Err(format!(
                "invariant 1/3: k{key} is {seen:?}; acknowledged {acknowledged:?}, in flight {landed:?}"
            ));
        }
    }

    // Invariant 2: rows exist exactly for the commits that landed, all of them or none, and
    // never without their record.
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
    let mut expected = model.committed.clone();
    if let InFlight::Key {
        key,
        after: KeyState::Completed { fence, rows: n, .. },
    } = in_flight
    {
        let record = observed(*key, store.get(&scope(*key)).map_err(|e| e.to_string())?);
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
    if rows != expected {
        return Err(format!(
            "invariant 2: rows {rows:?}, acknowledged {expected:?}"
        ));
    }
    let mut expected_plain = model.plain.clone();
    if let InFlight::Plain(n) = in_flight {
        // The write in flight: its row may or may not be there.
        if plain.contains(n) {
            expected_plain.insert(*n);
        }
    }
    if plain != expected_plain {
        return Err(format!(
            "keyless rows {plain:?}, acknowledged {expected_plain:?}"
        ));
    }

    // Invariant 5: a key whose acknowledged claim stands is never Claimed again, so its side
    // effect cannot run twice.
    // Judged on what is stored, which invariants 1 and 3 just matched against the model (an
    // in-flight release may have landed).
    for &key in &keys {
        let stored = observed(
            key,
            store
                .get(&scope(key))
                .map_err(|e| format!("get k{key}: {e}"))?,
        );
        if let KeyState::Held { other, .. } | KeyState::Completed { other, .. } = stored {
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
