//! Random workloads crashed at every operation (or a stride of them), in both durability
//! modes, reopened and checked against the reference model in `idemstore::testing`; and
//! faults in pairs: a first one the process survives, then a second while the store heals.
//!
//! Deterministic: the seeds are fixed, and every disk operation is a crash point.
//! `IDEMSTORE_CRASH_SEEDS=1,2,3` runs other seeds; `IDEMSTORE_CRASH_STRIDE=n` crashes at every
//! n-th operation only, for quicker runs over many seeds.

use std::time::Instant;

use idemstore::Durability;
use idemstore::testing::{CrashCase, Fault, Tear, run_case, second_faults, workload};

const STEPS: usize = 40;
const KEYS: u8 = 4;

fn seeds() -> Vec<u64> {
    match std::env::var("IDEMSTORE_CRASH_SEEDS") {
        Ok(list) => list
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect(),
        Err(_) => vec![1, 2, 3, 4, 5, 6, 7, 8],
    }
}

fn stride() -> u64 {
    std::env::var("IDEMSTORE_CRASH_STRIDE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// A case that runs `ops` with no fault.
fn fault_free(durability: Durability, ops: Vec<idemstore::testing::CrashOp>) -> CrashCase {
    CrashCase {
        durability,
        ops,
        fault: Fault::None,
        tear: Tear::Drop,
        then: None,
    }
}

fn run(case: &CrashCase, seed: u64) -> Result<idemstore::testing::CaseReport, String> {
    run_case(case).map_err(|v| {
        format!(
            "seed {seed}, {:?}, fault {:?}, then {:?}, tear {:?}: {v}\nreproduce: IDEMSTORE_CRASH_SEEDS={seed} IDEMSTORE_CRASH_STRIDE=1 cargo test --all-features --test crash_matrix",
            case.durability, case.fault, case.then, case.tear
        )
    })
}

#[test]
fn crashes_at_every_point_of_random_workloads_keep_every_acknowledged_write() -> Result<(), String>
{
    let started = Instant::now();
    let mut cases = 0u64;
    for durability in [Durability::Wal, Durability::Redb] {
        for seed in seeds() {
            println!("crash matrix: seed {seed}, {durability:?}");
            let ops = workload(seed, STEPS, KEYS);
            let mut case = fault_free(durability, ops);
            let clean = run(&case, seed)?;
            cases += 1;
            assert_eq!(
                clean.acknowledged, STEPS,
                "seed {seed}: the fault-free run must finish"
            );
            for at in (1..=clean.disk_ops).step_by(stride() as usize) {
                for tear in [Tear::Drop, Tear::Sectors(1), Tear::Sectors(3)] {
                    case.fault = Fault::CrashAt(at);
                    case.tear = tear;
                    run(&case, seed)?;
                    cases += 1;
                }
            }
        }
    }
    println!("crash matrix: {cases} cases in {:?}", started.elapsed());
    Ok(())
}

#[test]
fn io_errors_and_failed_syncs_at_random_points_keep_every_acknowledged_write() -> Result<(), String>
{
    let mut cases = 0u64;
    for durability in [Durability::Wal, Durability::Redb] {
        for seed in seeds() {
            let ops = workload(seed ^ 0xfau64, STEPS, KEYS);
            let mut case = fault_free(durability, ops);
            let clean = run(&case, seed)?;
            let syncs_guess = clean.disk_ops / 2;
            for at in (1..=clean.disk_ops).step_by(5) {
                case.fault = Fault::FailAt(at);
                run(&case, seed)?;
                cases += 1;
            }
            for n in (1..=syncs_guess).step_by(3) {
                case.fault = Fault::FailSync(n);
                case.tear = Tear::Sectors(1);
                run(&case, seed)?;
                cases += 1;
            }
        }
    }
    println!("fault matrix: {cases} cases");
    Ok(())
}

/// A full disk at every disk operation of a workload, once, then space again: nothing
/// acknowledged is lost, a request refused for lack of space is refused wholly ("not
/// written"), and the store goes on serving without a restart (the harness runs the rest of
/// the workload on the same store, checks it live, then restarts and crashes it).
#[test]
fn a_full_disk_at_any_operation_loses_nothing_and_service_resumes_without_a_restart()
-> Result<(), String> {
    let mut cases = 0u64;
    let mut refused = 0u64;
    for durability in [Durability::Wal, Durability::Redb] {
        for seed in seeds() {
            let ops = workload(seed ^ 0xd15c, STEPS, KEYS);
            let mut case = fault_free(durability, ops);
            let clean = run(&case, seed)?;
            for at in (1..=clean.disk_ops).step_by(stride() as usize) {
                case.fault = Fault::FullAt(at);
                let report = run(&case, seed)?;
                refused += report.failed_steps as u64;
                cases += 1;
            }
        }
    }
    println!("full-disk matrix: {cases} cases, {refused} requests refused and then served again");
    assert!(
        refused > cases / 10,
        "the full disk hit too few requests ({refused} of {cases} cases) for the test to mean much"
    );
    Ok(())
}

/// Disk operations after the first fault at which a second one is tried: a restore (reopen,
/// rewrite, replay, checkpoint, a new segment) takes about this many.
const SECOND_OPS: u64 = 14;

/// Two faults: a first that the process survives (a failed sync of the log or of the database
/// file, a full disk, an I/O error: in a group, a checkpoint or a redb commit), then a second
/// (an I/O error, a full disk or a crash) at each of the next operations, while the store
/// heals, checkpoints or reopens. Every acknowledged write is there afterwards, live and after
/// a restart and a crash (un-synced data dropped), and the store opens. Sync failures lose
/// their writes as the page cache does after a failed `fsync` (see `SimDisk`).
fn two_faults(durability: Durability) -> Result<(), String> {
    let started = Instant::now();
    let (mut cases, mut both_fired) = (0u64, 0u64);
    let stride = stride().max(3);
    for seed in seeds().into_iter().take(2) {
        let ops = workload(seed ^ 0x2f, STEPS, KEYS);
        let mut case = fault_free(durability, ops);
        let clean = run(&case, seed)?;
        let syncs_guess = clean.disk_ops / 2;
        let firsts = (1..=syncs_guess)
            .step_by(stride as usize)
            .map(Fault::FailSync)
            .chain(
                (1..=clean.disk_ops)
                    .step_by(3 * stride as usize)
                    .flat_map(|at| [Fault::FullAt(at), Fault::FailAt(at + 1)]),
            );
        for first in firsts {
            for then in second_faults(SECOND_OPS) {
                case.fault = first;
                case.then = Some(then);
                let report = run(&case, seed)?;
                cases += 1;
                both_fired += u64::from(report.faults_fired >= 2);
            }
        }
    }
    println!(
        "two-fault matrix, {durability:?}: {cases} cases ({both_fired} where both faults fired) in {:?}",
        started.elapsed()
    );
    assert!(
        both_fired > cases / 3,
        "the second fault hit too few cases ({both_fired} of {cases}) for the test to mean much"
    );
    Ok(())
}

#[test]
fn a_second_fault_while_the_log_backed_store_heals_keeps_every_acknowledged_write()
-> Result<(), String> {
    two_faults(Durability::Wal)
}

#[test]
fn a_second_fault_while_the_redb_store_heals_keeps_every_acknowledged_write() -> Result<(), String>
{
    two_faults(Durability::Redb)
}
