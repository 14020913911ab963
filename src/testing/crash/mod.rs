//! Crash cases: run a workload on a [`SimDisk`], crash (or fail) it at a chosen operation,
//! reopen what survived, and check it against a reference model.
//!
//! The model (`model.rs`) follows every acknowledged operation. One operation may be in flight
//! when the fault hits (the workload is sequential); its effect may or may not have landed, but
//! never half. The invariants are in `invariants.rs`; the steps in `ops.rs`.
//!
//! Two kinds of fault:
//! - a crash ([`Fault::CrashAt`]) ends the process: the store is reopened from what the disk
//!   kept, and checked;
//! - an I/O error, a failed sync or a full disk ([`Fault::FailAt`], [`Fault::FailSync`],
//!   [`Fault::FullAt`]) happens once, and **the process goes on**: the store must recover in
//!   place and keep serving. The failed step is settled against what the store then holds
//!   (it must have landed wholly or not at all, and not at all if the store said "not
//!   written"), the rest of the workload runs and is checked as it goes, the live store is
//!   checked at the end, and then so are a restart and a crash of it.
//!
//! A case can chain a second fault to the first ([`CrashCase::then`]): an I/O error, a full
//! disk or a crash a chosen number of disk operations after the first fault, which lands while
//! the store heals, checkpoints or reopens. After a second fault the harness calls
//! `Store::reopen` (at most [`REOPENS`] times) while the store refuses writes, then settles the
//! failed step as above; after a crash, the store is reopened from what the disk kept.
//!
//! During the run, every answer the store gives is also checked against the model.

mod invariants;
mod model;
mod ops;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use redb::TableDefinition;

use crate::testing::{FaultPlan, SecondFault, SimDisk, Tear, Then};
use crate::{Durability, ManualClock, Store, Timestamp};

use self::invariants::{Probe, check, settle};
use self::model::{InFlight, Model};
use self::ops::{Claims, Landed, Step, step};

/// The business table the workload writes: `key/fence/row` → fence.
pub(super) const ROWS: TableDefinition<&str, u64> = TableDefinition::new("rows");
pub(super) const LEASE: Duration = Duration::from_secs(10);
pub(super) const TTL: Duration = Duration::from_secs(60);
const START: Timestamp = Timestamp::from_millis(1_764_000_000_000);
/// How many times, after a second fault, the harness asks a store that refuses writes to
/// recover in place before it calls that a violation.
pub const REOPENS: usize = 3;

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
    /// `Store::execute` on `key`: claim and commit in one step, with `rows` business rows;
    /// `abort` makes the closure fail after writing them.
    Execute {
        /// Which key.
        key: u8,
        /// Whether to send a fingerprint other than the key's usual one.
        other_request: bool,
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
    /// Mutating operation `n`, counted from when the store is open, fails once with an I/O
    /// error; the process goes on, and must be served again without a restart.
    FailAt(u64),
    /// Sync `n`, counted from when the store is open, fails once; the process goes on.
    FailSync(u64),
    /// Mutating operation `n`, counted from when the store is open, fails once because the
    /// disk is full, and space is freed right after; the process goes on.
    FullAt(u64),
}

impl Fault {
    /// Whether the process survives the fault (the store must heal in place).
    fn process_goes_on(self) -> bool {
        matches!(
            self,
            Fault::FailAt(_) | Fault::FailSync(_) | Fault::FullAt(_)
        )
    }
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
    /// A second fault, armed when the first ([`Fault::FailAt`], [`Fault::FailSync`] or
    /// [`Fault::FullAt`]) fires.
    pub then: Option<Then>,
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
    /// Steps that failed because of the fault (the process went on after them).
    pub failed_steps: usize,
    /// Planned faults that fired (a second fault counts when it hit).
    pub faults_fired: u64,
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
    let ran = if let Ok(store) = open(&disk, case.durability, &clock) {
        run_workload(case, store, &disk, &clock, &mut model, &mut report)?
    } else {
        report.disk_ops = disk.counters().ops;
        Ran {
            in_flight: InFlight::Nothing,
            end: End::Crashed,
        }
    };
    report.faults_fired = disk.counters().faults;
    check_reopened(case, &disk, &clock, &model, &ran, &mut report)?;
    Ok(report)
}

/// How the process stood when the workload stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// It crashed (or was planned to: no fault, or a crash): the disk is what a crash keeps.
    Crashed,
    /// It went on after its fault: a restart sees everything the OS has, synced or not.
    WentOn,
}

/// What the workload left for the reopens to check.
struct Ran {
    /// The step the fault cut short, if its effect is still open.
    in_flight: InFlight,
    end: End,
}

/// Runs the workload's steps on the open `store` against the model, until the end or a crash,
/// then (if the process went on) checks the live store, and closes it.
fn run_workload(
    case: &CrashCase,
    store: Store,
    disk: &SimDisk,
    clock: &ManualClock,
    model: &mut Model,
    report: &mut CaseReport,
) -> Result<Ran, Violation> {
    let mut end = if case.fault.process_goes_on() {
        End::WentOn
    } else {
        End::Crashed
    };
    let mut in_flight = InFlight::Nothing;
    plan_after_open(disk, case.fault, case.then);
    let mut claims: Claims = BTreeMap::new();
    for (i, op) in case.ops.iter().enumerate() {
        match step(&store, clock, model, &mut claims, op) {
            Ok(()) => report.acknowledged += 1,
            Err(Step::Violation(v)) => {
                return Err(violation(format!("step {i} {op:?}: {v}")));
            }
            Err(Step::Failed { effect, .. }) if !case.fault.process_goes_on() => {
                in_flight = effect;
                break;
            }
            Err(Step::Failed {
                effect,
                landed,
                error,
            }) => {
                report.failed_steps += 1;
                let failed = Failed {
                    i,
                    op,
                    effect,
                    landed,
                    error,
                };
                if let AfterFailure::Crashed(effect) =
                    after_failure(case, &store, disk, clock, model, report, failed)?
                {
                    in_flight = effect;
                    end = End::Crashed;
                    break;
                }
            }
        }
    }
    if end == End::WentOn && !disk.crashed() {
        // The service resumed without a restart: the live store matches the model.
        check(&store, clock, model, &InFlight::Nothing, Probe::ReadOnly)
            .map_err(|v| violation(format!("live, after the fault: {v}")))?;
    }
    drop(claims);
    report.disk_ops = disk.counters().ops;
    drop(store);
    // A second fault may be a crash during the close's checkpoint.
    if disk.crashed() {
        end = End::Crashed;
    }
    Ok(Ran { in_flight, end })
}

/// A step the fault failed, in a case whose process goes on.
struct Failed<'a> {
    /// Its place in the workload.
    i: usize,
    op: &'a CrashOp,
    /// What it would have done.
    effect: InFlight,
    landed: Landed,
    error: String,
}

/// Where the workload goes after a failed step.
enum AfterFailure {
    /// On, with the step settled against the store.
    Settled,
    /// The second fault was a crash: what the step did is settled by the image the crash left.
    Crashed(InFlight),
}

/// A failed step of a case whose process goes on: the store must heal (by reopening, after a
/// second fault), and the step must have landed wholly or not at all.
fn after_failure(
    case: &CrashCase,
    store: &Store,
    disk: &SimDisk,
    clock: &ManualClock,
    model: &mut Model,
    report: &CaseReport,
    failed: Failed<'_>,
) -> Result<AfterFailure, Violation> {
    let Failed {
        i,
        op,
        effect,
        landed,
        error,
    } = failed;
    if std::env::var_os("IDEMSTORE_CRASH_TRACE").is_some() {
        eprintln!("step {i} {op:?} failed ({error}, {landed:?}), in flight {effect:?}");
    }
    if case.then.is_some() {
        match recover_in_place(store, disk) {
            Healed::Yes => {}
            Healed::Crashed => return Ok(AfterFailure::Crashed(effect)),
            Healed::No(e) => {
                return Err(violation(format!(
                    "step {i} {op:?} failed ({error}); {REOPENS} reopens later the store still refuses writes: {e}"
                )));
            }
        }
    } else if report.failed_steps > 1 {
        return Err(violation(format!(
            "step {i} {op:?} failed ({error}) after the one fault had passed: the store did not recover"
        )));
    }
    if report.failed_steps > 1 + 2 * REOPENS {
        return Err(violation(format!(
            "step {i} {op:?} failed ({error}): too many steps failed after two faults"
        )));
    }
    settle(store, clock, model, &effect, landed).map_err(|v| {
        violation(format!(
            "step {i} {op:?} failed ({error}, {landed:?}); then {v}"
        ))
    })?;
    Ok(AfterFailure::Settled)
}

/// Reopens what the disk kept and checks it against the model. A crash keeps what was synced;
/// a process that went on is also restarted, finding everything the OS has (synced or not).
/// Check both.
fn check_reopened(
    case: &CrashCase,
    disk: &SimDisk,
    clock: &ManualClock,
    model: &Model,
    ran: &Ran,
    report: &mut CaseReport,
) -> Result<(), Violation> {
    let images = match ran.end {
        End::WentOn => vec![
            ("restart", disk.clone()),
            ("crash", disk.crash_image(case.tear)),
        ],
        End::Crashed => vec![("crash", disk.crash_image(case.tear))],
    };
    disk.plan(FaultPlan::default());
    let in_flight = &ran.in_flight;
    for (kind, image) in images {
        let store = open(&image, case.durability, clock)
            .map_err(|e| violation(format!("invariant 4: the {kind} image did not reopen: {e}")))?;
        report.frames_replayed = store.recovery_report().frames_replayed;
        check(&store, clock, model, in_flight, Probe::Claims)
            .map_err(|v| violation(format!("after {kind} ({in_flight:?}): {v}")))?;
    }
    Ok(())
}

/// Whether a store recovered in place after a failed step.
enum Healed {
    Yes,
    /// The disk crashed: the case goes on from the image it left.
    Crashed,
    /// It still refuses writes, for this reason.
    No(crate::StoreError),
}

/// After a failed step of a two-fault case: while the store refuses writes, asks it to
/// recover in place, at most [`REOPENS`] times.
fn recover_in_place(store: &Store, disk: &SimDisk) -> Healed {
    for _ in 0..REOPENS {
        if disk.crashed() {
            return Healed::Crashed;
        }
        if store.writable().is_ok() {
            return Healed::Yes;
        }
        if let Err(e) = store.reopen()
            && std::env::var_os("IDEMSTORE_CRASH_TRACE").is_some()
        {
            eprintln!("reopen failed: {e}");
        }
    }
    match (disk.crashed(), store.writable()) {
        (true, _) => Healed::Crashed,
        (false, Ok(())) => Healed::Yes,
        (false, Err(e)) => Healed::No(e),
    }
}

/// Plans a fault counted from when the store is open, and the one chained to it.
fn plan_after_open(disk: &SimDisk, fault: Fault, then: Option<Then>) {
    let opened = disk.counters();
    let plan = match fault {
        Fault::FailAt(n) => FaultPlan {
            fail_at: Some(opened.ops + n),
            ..FaultPlan::default()
        },
        Fault::FailSync(n) => FaultPlan {
            fail_sync: Some(opened.syncs() + n),
            ..FaultPlan::default()
        },
        Fault::FullAt(n) => FaultPlan {
            full_at: Some(opened.ops + n),
            ..FaultPlan::default()
        },
        Fault::None | Fault::CrashAt(_) => return,
    };
    disk.plan(FaultPlan { then, ..plan });
}

/// Every second fault a two-fault matrix tries after a first one: each kind, at each of the
/// next `ops` disk operations.
pub fn second_faults(ops: u64) -> impl Iterator<Item = Then> {
    (1..=ops).flat_map(|after| {
        [SecondFault::Fail, SecondFault::Full, SecondFault::Crash]
            .into_iter()
            .map(move |fault| Then { after, fault })
    })
}
