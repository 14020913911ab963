//! The `idemstore` binary, run as a process against stores these tests build with the library:
//! every subcommand, `--json`, the exit codes, every bad input, a damaged log, damaged indexes,
//! and a store held open by another process.
//!
//! A store with frames past its checkpoint (what a crash leaves) is made by a child process:
//! this test binary runs itself with `IDEMSTORE_CLI_CHILD` set, commits, and exits without
//! closing the store, so no checkpoint runs.

#![cfg(unix)]

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::{ORDERS, TestResult, fp};
use idemstore::inspect::{Inspector, LogDamage};
use idemstore::redb::{Database, ReadableTable, TableDefinition};
use idemstore::{Begin, Holder, OpenError, Response, Scope, Store, Sweep};

const CHILD: &str = "IDEMSTORE_CLI_CHILD";

/// Runs the built binary.
fn idemstore(args: &[&str]) -> Result<Output, std::io::Error> {
    Command::new(env!("CARGO_BIN_EXE_idemstore"))
        .args(args)
        .output()
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Result<Run, Box<dyn std::error::Error>> {
    let out = idemstore(args)?;
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8(out.stdout)?,
        stderr: String::from_utf8(out.stderr)?,
    };
    assert!(
        !run.stderr.contains("panicked") && !run.stderr.contains("RUST_BACKTRACE"),
        "{args:?} panicked: {}",
        run.stderr
    );
    Ok(run)
}

/// Runs and expects exit 2 with one line on stderr containing every piece of `expected`.
fn refused(args: &[&str], expected: &[&str]) -> TestResult {
    let r = run(args)?;
    assert_eq!(r.code, Some(2), "{args:?}: {} {}", r.stdout, r.stderr);
    assert_eq!(
        r.stderr.trim_end().lines().count(),
        1,
        "one line: {}",
        r.stderr
    );
    for piece in expected {
        assert!(
            r.stderr.contains(piece),
            "{args:?}: {piece:?} not in {}",
            r.stderr
        );
    }
    Ok(())
}

fn json(text: &str) -> Result<serde_json::Value, serde_json::Error> {
    serde_json::from_str(text)
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

fn scope(tenant: &str, key: &str) -> Scope {
    Scope::new(tenant, "create_order", key).expect("test scopes are valid")
}

/// A closed store: two completed orders of tenant-a (one with a binary body, one with a body
/// over 1 KiB), one in progress, and one completed order of tenant-b.
fn closed_store(dir: &Path) -> TestResult {
    let store = Store::builder().table(ORDERS).sweep(Sweep::Off).open(dir)?;
    let commit = |tenant: &str, key: &str, body: Vec<u8>| -> TestResult {
        let Begin::Claimed(claim) = store.begin(&scope(tenant, key), fp(key))? else {
            return Err("a new key is claimed".into());
        };
        let row = key.to_owned();
        claim.commit(move |tx| {
            tx.insert(&ORDERS, row.as_str(), "paid")?;
            Ok(Response::new(201, body).with_header("content-type", "application/json"))
        })?;
        Ok(())
    };
    commit("tenant-a", "k1", br#"{"order":1}"#.to_vec())?;
    commit("tenant-a", "bin", vec![0, 159, 146, 150])?;
    commit("tenant-b", "long", vec![b'x'; 3000])?;
    let Begin::Claimed(claim) = store.begin(&scope("tenant-a", "stuck"), fp("stuck"))? else {
        return Err("a new key is claimed".into());
    };
    drop(claim); // left in progress, as by a crashed handler
    drop(store);
    Ok(())
}

/// Every file under `dir` with its bytes: to show the read commands change nothing.
fn snapshot(dir: &Path) -> Result<BTreeMap<PathBuf, Vec<u8>>, std::io::Error> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at)? {
            let p = entry?.path();
            if p.is_dir() {
                files.insert(p.clone(), Vec::new());
                stack.push(p);
            } else {
                files.insert(p.clone(), std::fs::read(&p)?);
            }
        }
    }
    Ok(files)
}

#[test]
fn stats_counts_records_by_state_in_text_and_json() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    let text = run(&["stats", path(&dir)])?;
    assert_eq!(text.code, Some(0), "{}", text.stderr);
    assert!(
        text.stdout
            .contains("records             4 (in progress 1, completed 3, of which tombstones 0) in 1 partitions"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("oldest in progress"),
        "{}",
        text.stdout
    );
    let j = json(&run(&["stats", path(&dir), "--json"])?.stdout)?;
    assert_eq!(j["records"], 4);
    assert_eq!(j["in_progress"], 1);
    assert_eq!(j["completed"], 3);
    assert_eq!(j["tombstones"], 0);
    assert_eq!(
        j["pending_replay"]["frames"], 0,
        "a closed store has nothing to replay"
    );
    assert!(j["db_bytes"].as_u64().unwrap_or(0) > 0);
    Ok(())
}

#[test]
fn get_shows_a_record_its_response_and_cuts_long_bodies() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    let d = path(&dir);
    let r = run(&[
        "get",
        d,
        "--tenant",
        "tenant-a",
        "--operation",
        "create_order",
        "--key",
        "k1",
    ])?;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    for piece in [
        "state         completed",
        "status        201",
        "header        content-type: application/json",
        r#"{"order":1}"#,
        "fence         1 (attempt 1)",
    ] {
        assert!(r.stdout.contains(piece), "{piece:?} not in {}", r.stdout);
    }
    let bin = run(&[
        "get",
        d,
        "--tenant",
        "tenant-a",
        "--operation",
        "create_order",
        "--key",
        "bin",
        "--json",
    ])?;
    let j = json(&bin.stdout)?;
    assert_eq!(
        j["record"]["response"]["body"], "0x009f9296",
        "not UTF-8: hex"
    );
    assert_eq!(j["record"]["fingerprint"].as_str().map(str::len), Some(66));

    let long = [
        "get",
        d,
        "--tenant",
        "tenant-b",
        "--operation",
        "create_order",
        "--key",
        "long",
    ];
    let cut = json(&run(&[&long[..], &["--json"]].concat())?.stdout)?;
    assert_eq!(
        cut["record"]["response"]["body"].as_str().map(str::len),
        Some(1024)
    );
    assert_eq!(cut["record"]["response"]["truncated"], true);
    let full = json(&run(&[&long[..], &["--json", "--full"]].concat())?.stdout)?;
    assert_eq!(
        full["record"]["response"]["body"].as_str().map(str::len),
        Some(3000)
    );
    assert!(run(&long)?.stdout.contains("--full shows all"));

    let stuck = json(
        &run(&[
            "get",
            d,
            "--tenant",
            "tenant-a",
            "--operation",
            "create_order",
            "--key",
            "stuck",
            "--json",
        ])?
        .stdout,
    )?;
    assert_eq!(stuck["record"]["state"], "in-progress");
    assert!(stuck["record"]["lease_until"].is_string());

    let missing = run(&[
        "get",
        d,
        "--tenant",
        "tenant-a",
        "--operation",
        "create_order",
        "--key",
        "nope",
    ])?;
    assert_eq!(missing.code, Some(1), "no record: exit 1");
    assert!(missing.stdout.contains("no record for"));
    Ok(())
}

#[test]
fn list_filters_by_state_tenant_age_and_limit() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    let d = path(&dir);
    let list = |extra: &[&str]| -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        let r = run(&[&["list", d, "--json"][..], extra].concat())?;
        assert_eq!(r.code, Some(0), "{}", r.stderr);
        Ok(json(&r.stdout)?)
    };
    let keys = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e["scope"]["key"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(keys(&list(&["--state", "in-progress"])?), ["stuck"]);
    assert_eq!(
        keys(&list(&["--state", "in-progress", "--older-than", "0s"])?),
        ["stuck"]
    );
    assert!(keys(&list(&["--state", "in-progress", "--older-than", "1h"])?).is_empty());
    let mut completed = keys(&list(&["--state", "completed"])?);
    completed.sort();
    assert_eq!(completed, ["bin", "k1", "long"]);
    let mut of_a = keys(&list(&["--state", "completed", "--tenant", "tenant-a"])?);
    of_a.sort();
    assert_eq!(of_a, ["bin", "k1"]);
    assert_eq!(
        keys(&list(&["--state", "completed", "--limit", "1"])?).len(),
        1
    );
    assert!(keys(&list(&["--state", "tombstone"])?).is_empty());
    let text = run(&["list", d, "--state", "in-progress"])?;
    assert!(
        text.stdout
            .contains(r#"tenant-a/create_order/"stuck"  age"#),
        "{}",
        text.stdout
    );
    Ok(())
}

#[test]
fn verify_passes_a_sound_store() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    let r = run(&["verify", path(&dir)])?;
    assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("ok: no problems found"), "{}", r.stdout);
    assert!(
        r.stdout.contains("4 records, 1 partitions checked"),
        "{}",
        r.stdout
    );
    let j = json(&run(&["verify", path(&dir), "--json"])?.stdout)?;
    assert_eq!(j["sound"], true);
    Ok(())
}

/// Tables damaged behind the store's back: an in-progress record moved into a partition, and
/// a row for that partition that covers none of it (too few records, an expiry long past,
/// an empty filter). `verify` names each and exits 1.
#[test]
fn verify_names_a_misplaced_record_and_a_row_that_does_not_cover_its_partition() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    {
        let db = Database::create(dir.join("idemstore.redb"))?;
        let txn = db.begin_write()?;
        {
            let raw = |name| TableDefinition::<&[u8], &[u8]>::new(name);
            let mut claims = txn.open_table(raw("idemstore.claims"))?;
            let (scope_bytes, record) = claims
                .first()?
                .map(|(k, v)| (k.value().to_vec(), v.value().to_vec()))
                .ok_or("a claim")?;
            claims.remove(scope_bytes.as_slice())?;
            let mut key = 0u32.to_be_bytes().to_vec();
            key.extend_from_slice(&scope_bytes);
            txn.open_table(raw("idemstore.done"))?
                .insert(key.as_slice(), record.as_slice())?;
            // A row (docs/design.md, "Partitions"): version 1, sealed, 1 record, first at 0,
            // last expiry at 5 ms, no tombstone end, no tombstones, a filter (8 bits a key) of
            // one empty block.
            let mut row = vec![1u8, 1];
            for word in [1u64, 0, 5, 0, 0] {
                row.extend_from_slice(&word.to_le_bytes());
            }
            row.push(8);
            row.extend_from_slice(&1u32.to_le_bytes());
            row.extend_from_slice(&[0u8; 64]);
            row.extend_from_slice(&0u32.to_le_bytes()); // and no key hashes
            txn.open_table(raw("idemstore.partitions"))?
                .insert(0u32.to_be_bytes().as_slice(), row.as_slice())?;
        }
        txn.commit()?;
    }
    let r = run(&["verify", path(&dir)])?;
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    for problem in [
        r#"record tenant-a/create_order/"stuck" is in-progress but is stored in idemstore.done"#,
        "partition 0: its row counts 1 records, it holds 4",
        "partition 0: its row says its records are gone by 5ms",
        "partition 0: its filter misses 4 of its keys",
        "partition 0: its row lacks the hashes of 4 of its keys",
    ] {
        assert!(r.stdout.contains(problem), "{problem}\n{}", r.stdout);
    }
    assert!(r.stdout.contains("FAILED: 5 problems"), "{}", r.stdout);
    Ok(())
}

/// The child: commits three orders and claims one, then exits without closing the store, so
/// that everything is in the log past the checkpoint (as after a crash).
#[test]
fn child_writes_and_exits_without_a_checkpoint() -> TestResult {
    let Ok(dir) = std::env::var(CHILD) else {
        return Ok(());
    };
    let store = Store::builder()
        .table(ORDERS)
        .sweep(Sweep::Off)
        .checkpoint_interval(Duration::from_secs(3600))
        .open(&dir)?;
    for key in ["c1", "c2", "c3"] {
        let Begin::Claimed(claim) = store.begin(&scope("tenant-a", key), fp(key))? else {
            return Err("a new key is claimed".into());
        };
        let row = key.to_owned();
        claim.commit(move |tx| {
            tx.insert(&ORDERS, row.as_str(), "paid")?;
            Ok(Response::new(201, row.clone().into_bytes()))
        })?;
    }
    let Begin::Claimed(_claim) = store.begin(&scope("tenant-a", "held"), fp("held"))? else {
        return Err("a new key is claimed".into());
    };
    std::process::exit(0); // no drop: no checkpoint, as if killed
}

/// A store whose every write is in the log only.
fn crashed_store(dir: &Path) -> TestResult {
    let status = Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            crate::child_test!("child_writes_and_exits_without_a_checkpoint").as_str(),
            "--nocapture",
        ])
        .env(CHILD, dir)
        .status()?;
    assert!(status.success(), "the child failed");
    Ok(())
}

#[test]
fn read_commands_see_the_log_past_the_checkpoint_and_change_nothing() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    crashed_store(&dir)?;
    let d = path(&dir);
    let before = snapshot(&dir)?;
    let stats = json(&run(&["stats", d, "--json"])?.stdout)?;
    assert_eq!(stats["records"], 4, "{stats}");
    assert_eq!(stats["in_progress"], 1);
    assert_eq!(stats["completed"], 3);
    assert!(
        stats["pending_replay"]["frames"].as_u64().unwrap_or(0) >= 4,
        "{stats}"
    );
    assert_eq!(stats["tables_in_log"], serde_json::json!(["orders"]));
    let got = json(
        &run(&[
            "get",
            d,
            "--tenant",
            "tenant-a",
            "--operation",
            "create_order",
            "--key",
            "c2",
            "--json",
        ])?
        .stdout,
    )?;
    assert_eq!(got["record"]["response"]["body"], "c2");
    let list = json(&run(&["list", d, "--state", "in-progress", "--json"])?.stdout)?;
    assert_eq!(list[0]["scope"]["key"], "held");
    let verify = run(&["verify", d])?;
    assert_eq!(verify.code, Some(0), "{}", verify.stdout);
    let dump = run(&["dump-log", d])?;
    assert_eq!(dump.code, Some(0), "{}", dump.stderr);
    assert!(
        dump.stdout
            .lines()
            .all(|l| l.contains(" seq ") && l.contains("pending")),
        "{}",
        dump.stdout
    );
    assert!(
        dump.stdout
            .contains(r#"idemstore.done put p0 tenant-a/create_order/"c1""#),
        "{}",
        dump.stdout
    );
    assert!(dump.stdout.contains("orders put c1"), "{}", dump.stdout);
    assert_eq!(snapshot(&dir)?, before, "a read command changed the store");
    Ok(())
}

#[test]
fn dump_log_prints_one_line_per_frame_from_a_sequence_number() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    crashed_store(&dir)?;
    let d = path(&dir);
    let all: Vec<serde_json::Value> = run(&["dump-log", d, "--json"])?
        .stdout
        .lines()
        .map(json)
        .collect::<Result<_, _>>()?;
    assert!(all.len() >= 4);
    let seqs: Vec<u64> = all.iter().filter_map(|f| f["seq"].as_u64()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    for frame in &all {
        assert!(
            frame["segment"]
                .as_str()
                .is_some_and(|s| s.starts_with("seg-"))
        );
        assert!(frame["offset"].as_u64().is_some() && frame["size"].as_u64().is_some());
        assert!(frame["ops"][0]["table"].is_string() && frame["ops"][0]["op"].is_string());
    }
    let from = seqs[2].to_string();
    let later = run(&["dump-log", d, "--from", &from])?;
    assert_eq!(later.stdout.lines().count(), all.len() - 2);
    assert!(
        later
            .stdout
            .lines()
            .next()
            .is_some_and(|l| l.contains(&format!(" seq {from} ")))
    );
    Ok(())
}

/// Damage in the middle of the log (a payload byte of the second frame flipped, frames after
/// it intact): `verify` names the segment and offset and exits 1; the other read commands
/// refuse in one line naming them, exit 2.
#[test]
fn a_damaged_log_is_named_by_segment_and_offset() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    crashed_store(&dir)?;
    let d = path(&dir);
    let frames: Vec<serde_json::Value> = run(&["dump-log", d, "--json"])?
        .stdout
        .lines()
        .map(json)
        .collect::<Result<_, _>>()?;
    let second = &frames[1];
    let segment = second["segment"].as_str().ok_or("segment")?.to_owned();
    let offset = second["offset"].as_u64().ok_or("offset")?;
    let file = dir.join("wal").join(&segment);
    let mut bytes = std::fs::read(&file)?;
    bytes[usize::try_from(offset)? + 20] ^= 0xff;
    std::fs::write(&file, bytes)?;

    let verify = run(&["verify", d])?;
    assert_eq!(verify.code, Some(1), "{}{}", verify.stdout, verify.stderr);
    let named = format!("{segment} at offset {offset}");
    assert!(
        verify.stdout.contains(&named),
        "{named:?} not in {}",
        verify.stdout
    );
    assert!(verify.stdout.contains("problem: log:"), "{}", verify.stdout);
    for cmd in ["stats", "list"] {
        let mut args = vec![cmd, d];
        if cmd == "list" {
            args.extend(["--state", "completed"]);
        }
        refused(&args, &[&named, "damaged"])?;
    }
    let dump = run(&["dump-log", d])?;
    assert_eq!(dump.code, Some(2));
    assert_eq!(
        dump.stdout.lines().count(),
        1,
        "the frame before the damage: {}",
        dump.stdout
    );
    assert!(dump.stderr.contains(&named), "{}", dump.stderr);
    Ok(())
}

/// A torn last frame (a crash mid-write) is not damage: `verify` reports it and passes.
#[test]
fn a_torn_last_frame_is_reported_not_failed() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    crashed_store(&dir)?;
    let d = path(&dir);
    let frames: Vec<serde_json::Value> = run(&["dump-log", d, "--json"])?
        .stdout
        .lines()
        .map(json)
        .collect::<Result<_, _>>()?;
    let last = frames.last().ok_or("frames")?;
    let segment = last["segment"].as_str().ok_or("segment")?;
    let offset = last["offset"].as_u64().ok_or("offset")?;
    let file = dir.join("wal").join(segment);
    let mut bytes = std::fs::read(&file)?;
    bytes[usize::try_from(offset)? + 25] ^= 0xff;
    std::fs::write(&file, bytes)?;
    let v = json(&run(&["verify", d, "--json"])?.stdout)?;
    assert_eq!(v["sound"], true, "{v}");
    assert_eq!(v["torn_tail"]["segment"], segment);
    assert_eq!(v["torn_tail"]["offset"], offset);
    Ok(())
}

#[test]
fn a_store_held_open_by_a_process_is_refused_naming_it() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    let store = Store::builder()
        .table(ORDERS)
        .sweep(Sweep::Off)
        .open(&dir)?;
    let d = path(&dir);
    let me = format!("in use by process {}", std::process::id());
    for args in [
        &["stats", d][..],
        &["get", d, "--tenant", "t", "--operation", "o", "--key", "k"],
        &["list", d, "--state", "in-progress"],
        &["verify", d],
        &["dump-log", d],
        &["evict", d],
        &["compact", d],
    ] {
        refused(args, &[&me, "stop it or use the service's /stats"])?;
    }
    drop(store);
    assert_eq!(run(&["stats", d])?.code, Some(0), "free again once closed");
    Ok(())
}

/// A read command locks the directory shared: no store (nor a writing command) opens it
/// meanwhile, and each is told a read command has it, not a process that is gone.
#[test]
fn a_store_being_read_does_not_open_and_says_who_reads_it() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    let inspector = Inspector::open(&dir, LogDamage::Refuse)?;
    let beside = Store::open(&dir)
        .err()
        .ok_or("a store opened beside a reader")?;
    assert!(
        matches!(
            &beside,
            OpenError::AlreadyOpen {
                holder: Holder::Readers,
                ..
            }
        ),
        "{beside:?}"
    );
    assert!(
        beside
            .to_string()
            .contains("a read command of the idemstore tool"),
        "{beside}"
    );
    let d = path(&dir);
    refused(
        &["evict", d],
        &["in use by a read command", "wait for it to finish"],
    )?;
    assert_eq!(run(&["stats", d])?.code, Some(0), "readers share the lock");
    drop(inspector);
    drop(Store::open(&dir)?);
    Ok(())
}

/// The lock file is the store's own: a stale one (what a killed process leaves) is neither a
/// problem for `verify` nor a reason to refuse.
#[test]
fn a_stale_lock_file_is_no_problem_and_no_lock() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    std::fs::write(dir.join("idemstore.lock"), "4000000000\nedge_service\n")?;
    let d = path(&dir);
    let verify = run(&["verify", d])?;
    assert_eq!(verify.code, Some(0), "{} {}", verify.stdout, verify.stderr);
    assert!(!verify.stdout.contains("problem:"), "{}", verify.stdout);
    assert_eq!(run(&["evict", d])?.code, Some(0));
    Ok(())
}

#[test]
fn bad_input_is_one_line_and_exit_2() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let missing = tmp.path().join("missing");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty)?;
    let file = tmp.path().join("file");
    std::fs::write(&file, b"x")?;
    let not_redb = tmp.path().join("not_redb");
    std::fs::create_dir(&not_redb)?;
    std::fs::write(not_redb.join("idemstore.redb"), vec![7u8; 4096])?;
    let other_redb = tmp.path().join("other_redb");
    std::fs::create_dir(&other_redb)?;
    {
        let db = Database::create(other_redb.join("idemstore.redb"))?;
        let txn = db.begin_write()?;
        txn.open_table(TableDefinition::<u64, u64>::new("somebody_else"))?
            .insert(1, 1)?;
        txn.commit()?;
    }
    for cmd in ["stats", "verify", "dump-log", "evict", "compact"] {
        refused(
            &[cmd, path(&missing)],
            &["no such directory", path(&missing)],
        )?;
        refused(&[cmd, path(&file)], &["no such directory"])?;
        refused(
            &[cmd, path(&empty)],
            &["not an idemstore store", "no idemstore.redb"],
        )?;
    }
    assert!(!missing.exists(), "evict must not create a store");
    refused(&["stats", path(&not_redb)], &["not an idemstore store"])?;
    refused(
        &["stats", path(&other_redb)],
        &["not an idemstore store", "no idemstore.meta"],
    )?;

    let store_dir = tmp.path().join("idem");
    closed_store(&store_dir)?;
    let d = path(&store_dir);
    refused(
        &["get", d, "--tenant", "", "--operation", "o", "--key", "k"],
        &["bad scope part", "tenant is empty"],
    )?;
    refused(
        &[
            "get",
            d,
            "--tenant",
            "t",
            "--operation",
            "o",
            "--key",
            "bad\u{7}key",
        ],
        &["bad scope part", "idempotency key"],
    )?;
    refused(
        &["list", d, "--state", "completed", "--tenant", "bad\ntenant"],
        &["bad scope part", "tenant"],
    )?;
    let usage = run(&["list", d, "--state", "finished"])?;
    assert_eq!(usage.code, Some(2), "clap's usage errors exit 2 too");
    let age = run(&[
        "list",
        d,
        "--state",
        "in-progress",
        "--older-than",
        "5 fortnights",
    ])?;
    assert_eq!(age.code, Some(2));
    assert!(
        age.stderr.contains("unknown unit") || age.stderr.contains("not a duration"),
        "{}",
        age.stderr
    );
    Ok(())
}

/// Every command, as run on `dir`: the five that take only a directory, and `get` and `list`.
fn every_command(dir: &str) -> Vec<Vec<&str>> {
    let mut commands: Vec<Vec<&str>> = ["stats", "verify", "dump-log", "evict", "compact"]
        .into_iter()
        .map(|cmd| vec![cmd, dir])
        .collect();
    commands.push(vec![
        "get",
        dir,
        "--tenant",
        "tenant-a",
        "--operation",
        "create_order",
        "--key",
        "k1",
    ]);
    commands.push(vec!["list", dir, "--state", "completed"]);
    commands
}

#[test]
fn a_directory_above_one_store_names_it_for_every_command() -> TestResult {
    let tmp = tempfile::tempdir()?;
    // What the edge service leaves: its store one level below the directory it was given.
    let data = tmp.path().join("idemstore-data");
    let store_dir = data.join("edge_service");
    closed_store(&store_dir)?;
    std::fs::create_dir(data.join("backups"))?; // not a store, searched and passed over
    std::fs::write(data.join("notes.txt"), b"x")?;
    for args in every_command(path(&data)) {
        refused(
            &args,
            &[
                "not an idemstore store",
                "no idemstore.redb",
                "the store below it is",
                path(&store_dir),
            ],
        )?;
    }
    assert!(
        !data.join("idemstore.redb").exists(),
        "evict and compact must not create a store in the directory above"
    );
    // The path named is the one to use.
    let stats = run(&["stats", path(&store_dir)])?;
    assert_eq!(stats.code, Some(0), "{}", stats.stderr);

    // Given relative, as an operator types it, the path named is relative too.
    let out = Command::new(env!("CARGO_BIN_EXE_idemstore"))
        .args(["stats", "idemstore-data"])
        .current_dir(tmp.path())
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr)?;
    assert!(
        stderr.contains("the store below it is idemstore-data/edge_service"),
        "{stderr}"
    );

    // Three levels down is still found.
    let deep_parent = tmp.path().join("deep");
    let deep = deep_parent.join("a").join("b").join("idem");
    closed_store(&deep)?;
    refused(&["stats", path(&deep_parent)], &[path(&deep)])?;
    Ok(())
}

#[test]
fn a_directory_above_two_stores_names_both() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    let first = data.join("edge_service");
    let second = data.join("ledger").join("idem");
    closed_store(&first)?;
    closed_store(&second)?;
    for args in every_command(path(&data)) {
        refused(
            &args,
            &[
                "not an idemstore store",
                "stores below it",
                path(&first),
                path(&second),
                "the one you mean",
            ],
        )?;
    }
    Ok(())
}

#[test]
fn a_directory_with_no_store_below_gets_no_hint() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let data = tmp.path().join("data");
    std::fs::create_dir_all(data.join("a").join("b"))?;
    std::fs::write(data.join("a").join("file"), b"x")?;
    // Four levels down: past the search, so not named.
    closed_store(&data.join("a").join("b").join("c").join("idem"))?;
    for args in every_command(path(&data)) {
        let r = run(&args)?;
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
        assert_eq!(
            r.stderr.trim_end(),
            format!(
                "idemstore: {} is not an idemstore store: it has no idemstore.redb",
                path(&data)
            ),
            "{args:?}"
        );
    }
    Ok(())
}

#[test]
fn evict_removes_expired_records_and_reports() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let clock = common::clock(); // 2025: every TTL of an hour has passed by the system clock
    let store = common::open(tmp.path(), &clock)?;
    for key in ["e1", "e2", "e3"] {
        let Begin::Claimed(claim) = store.begin(&common::scope(key), fp(key))? else {
            return Err("a new key is claimed".into());
        };
        claim.commit(|_| Ok(Response::new(200, "ok")))?;
    }
    drop(store);
    let d = tmp.path().join("idem");
    let d = path(&d);
    let r = run(&["evict", d, "--limit", "2"])?;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("evicted 2 completed records"),
        "{}",
        r.stdout
    );
    let j = json(&run(&["evict", d, "--json"])?.stdout)?;
    assert_eq!(j["evicted"], 1);
    assert_eq!(j["more_due"], false);
    assert_eq!(json(&run(&["stats", d, "--json"])?.stdout)?["records"], 0);
    Ok(())
}

#[test]
fn compact_reports_the_space_given_back() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    let r = run(&["compact", path(&dir)])?;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("given back"), "{}", r.stdout);
    let j = json(&run(&["compact", path(&dir), "--json"])?.stdout)?;
    assert!(j["bytes_after"].as_u64() <= j["bytes_before"].as_u64());
    assert_eq!(run(&["verify", path(&dir)])?.code, Some(0));
    Ok(())
}

/// A closed store with three completed records and no business table: what the tool can back
/// up (it knows no business table's types).
fn store_without_business_tables(dir: &Path) -> TestResult {
    let store = Store::builder().sweep(Sweep::Off).open(dir)?;
    for key in ["b1", "b2", "b3"] {
        let Begin::Claimed(claim) = store.begin(&scope("tenant-a", key), fp(key))? else {
            return Err("a new key is claimed".into());
        };
        claim.commit(move |_| Ok(Response::new(201, key.as_bytes().to_vec())))?;
    }
    Ok(())
}

#[test]
fn backup_copies_a_stopped_store_into_a_directory_that_verifies() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    store_without_business_tables(&dir)?;
    let dest = tmp.path().join("backup");
    let r = run(&["backup", path(&dir), path(&dest)])?;
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("backed up 3 records"), "{}", r.stdout);
    let verify = run(&["verify", path(&dest)])?;
    assert_eq!(verify.code, Some(0), "{}", verify.stdout);
    let again = tmp.path().join("again");
    let j = json(&run(&["backup", path(&dir), path(&again), "--json"])?.stdout)?;
    assert_eq!(j["records"], 3, "{j}");
    assert!(j["bytes"].as_u64().is_some_and(|b| b > 0), "{j}");
    let copy = Store::builder().sweep(Sweep::Off).open(&dest)?;
    let Begin::Replay(stored) = copy.begin(&scope("tenant-a", "b2"), fp("b2"))? else {
        return Err("the copy does not replay b2".into());
    };
    assert_eq!(stored.body(), b"b2");
    Ok(())
}

/// The tool cannot copy a business table (a table is copied through its key and value
/// types, which only the service knows): it says to back up from the service.
#[test]
fn backup_of_a_store_with_business_tables_asks_for_the_service() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    let dest = tmp.path().join("backup");
    refused(
        &["backup", path(&dir), path(&dest)],
        &[
            r#"business table "orders""#,
            "call Store::backup from the service",
        ],
    )?;
    assert!(!dest.exists());
    Ok(())
}

/// A store a running process holds cannot be copied from another process: named, with what
/// to do instead.
#[test]
fn backup_of_a_store_held_by_a_process_names_it_and_says_what_to_do() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    store_without_business_tables(&dir)?;
    let store = Store::builder().sweep(Sweep::Off).open(&dir)?;
    let dest = tmp.path().join("backup");
    refused(
        &["backup", path(&dir), path(&dest)],
        &[
            &format!("in use by process {}", std::process::id()),
            "cannot be copied from another process",
            "call Store::backup from the service, or stop it and run this again",
        ],
    )?;
    assert!(!dest.exists());
    drop(store);
    assert_eq!(run(&["backup", path(&dir), path(&dest)])?.code, Some(0));
    Ok(())
}

/// A destination that holds something is refused before the store is opened: neither it nor
/// the store changes.
#[test]
fn backup_refuses_a_destination_that_is_not_empty_and_changes_nothing() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    store_without_business_tables(&dir)?;
    let dest = tmp.path().join("backup");
    std::fs::create_dir(&dest)?;
    std::fs::write(dest.join("old.tar"), b"an older backup")?;
    let (store_before, dest_before) = (snapshot(&dir)?, snapshot(&dest)?);
    refused(
        &["backup", path(&dir), path(&dest)],
        &["exists and is not empty", path(&dest)],
    )?;
    assert_eq!(snapshot(&dir)?, store_before);
    assert_eq!(snapshot(&dest)?, dest_before);
    Ok(())
}

#[test]
fn every_command_has_help() -> TestResult {
    for cmd in [
        "stats", "get", "list", "verify", "dump-log", "evict", "compact", "backup",
    ] {
        let r = run(&[cmd, "--help"])?;
        assert_eq!(r.code, Some(0));
        assert!(r.stdout.contains("Usage: idemstore"), "{}", r.stdout);
    }
    let top = run(&["--help"])?;
    assert!(top.stdout.contains("dump-log"));
    Ok(())
}

/// `evict` and `compact` cannot replay a log that writes business tables (only the service
/// knows their types): they say so in one line, exit 2, and leave the store as it was.
#[test]
fn maintenance_on_a_crashed_store_asks_for_the_service_first() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    crashed_store(&dir)?;
    let before = snapshot(&dir)?;
    for cmd in ["evict", "compact"] {
        refused(
            &[cmd, path(&dir)],
            &[r#"writes table "orders""#, "start the service once"],
        )?;
    }
    // What the service's open leaves behind for the tool: a clean close checkpoints the log.
    drop(
        Store::builder()
            .table(ORDERS)
            .sweep(Sweep::Off)
            .open(&dir)?,
    );
    assert_ne!(snapshot(&dir)?, before);
    assert_eq!(run(&["evict", path(&dir)])?.code, Some(0));
    Ok(())
}

/// A record whose bytes are damaged: `verify` names its scope; `get` refuses in one line.
#[test]
fn verify_names_a_damaged_record() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    closed_store(&dir)?;
    {
        let db = Database::create(dir.join("idemstore.redb"))?;
        let txn = db.begin_write()?;
        let mut key = 0u32.to_be_bytes().to_vec();
        key.extend_from_slice(scope("tenant-a", "k1").encode());
        txn.open_table(TableDefinition::<&[u8], &[u8]>::new("idemstore.done"))?
            .insert(key.as_slice(), &[1u8, 2, 3][..])?;
        txn.commit()?;
    }
    let r = run(&["verify", path(&dir)])?;
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    assert!(
        r.stdout
            .contains(r#"problem: record tenant-a/create_order/"k1": damaged"#),
        "{}",
        r.stdout
    );
    refused(
        &[
            "get",
            path(&dir),
            "--tenant",
            "tenant-a",
            "--operation",
            "create_order",
            "--key",
            "k1",
        ],
        &[r#"the record of tenant-a/create_order/"k1" is damaged"#],
    )?;
    Ok(())
}

/// CRC-32 (IEEE), bit by bit: enough to forge one segment header in a test.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A segment in a log format this build does not read (left by another version): `verify`
/// names it, the read commands refuse in one line.
#[test]
fn a_segment_of_another_log_format_is_named() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    crashed_store(&dir)?;
    let file = dir.join("wal").join("seg-00000000.log");
    let mut bytes = std::fs::read(&file)?;
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    let crc = crc32(&bytes[0..32]);
    bytes[32..36].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&file, bytes)?;
    let r = run(&["verify", path(&dir)])?;
    assert_eq!(r.code, Some(1), "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout.contains("seg-00000000.log is in log format 3"),
        "{}",
        r.stdout
    );
    refused(
        &["stats", path(&dir)],
        &["seg-00000000.log", "log format 3"],
    )?;
    Ok(())
}

/// `idemstore restore`: a store shipping to a real JetStream, rebuilt by the tool into a new
/// directory that opens with every acknowledged pair; a destination that holds something and
/// a stream that does not exist are refused, leaving nothing behind.
#[cfg(feature = "nats")]
mod restore {
    use super::*;
    use crate::common::nats::{drop_replica, unique, url};
    use idemstore::Shipping;
    use idemstore::replica::JetStream;

    /// A stream name of the test's own, deleted at the end even on failure.
    struct Stream(String);

    impl Drop for Stream {
        fn drop(&mut self) {
            drop_replica(&self.0);
        }
    }

    #[test]
    fn the_tool_restores_a_shipped_store_that_opens_with_every_pair() -> TestResult {
        let stream = Stream(unique("cli"));
        let dir = tempfile::tempdir()?;
        let store = Store::builder()
            .table(ORDERS)
            .ship(JetStream::connect(&url(), &stream.0)?, Shipping::Async)
            .open(dir.path().join("old"))?;
        let keys: Vec<String> = (0..20).map(|i| format!("key-{i}")).collect();
        for key in &keys {
            let scope = Scope::new("t", "op", key)?;
            let Begin::Claimed(claim) = store.begin(&scope, fp(key))? else {
                return Err(format!("{key}: expected a claim").into());
            };
            let row = key.clone();
            claim.commit(move |tx| {
                tx.insert(&ORDERS, row.as_str(), "paid")?;
                Ok(Response::new(201, b"ok".to_vec()))
            })?;
        }
        drop(store); // a clean close ships what is queued

        // A destination that holds something is refused, and left as it was.
        let taken = dir.path().join("taken");
        std::fs::create_dir(&taken)?;
        std::fs::write(taken.join("keep"), b"mine")?;
        let taken_arg = taken.to_str().ok_or("path")?;
        refused(
            &["restore", "--from", &url(), "--store", &stream.0, taken_arg],
            &["not an empty directory", taken_arg],
        )?;
        assert_eq!(std::fs::read_dir(&taken)?.count(), 1);
        // A stream nobody shipped to is refused by name.
        let missing = dir.path().join("missing");
        refused(
            &[
                "restore",
                "--from",
                &url(),
                "--store",
                "no_such_store_anywhere",
                missing.to_str().ok_or("path")?,
            ],
            &["no_such_store_anywhere"],
        )?;
        assert!(!missing.exists());

        let new = dir.path().join("new");
        let out = run(&[
            "restore",
            "--from",
            &url(),
            "--store",
            &stream.0,
            "--json",
            new.to_str().ok_or("path")?,
        ])?;
        assert_eq!(out.code, Some(0), "{} {}", out.stdout, out.stderr);
        let restored: serde_json::Value = serde_json::from_str(out.stdout.trim())?;
        assert_eq!(restored["took_over"], false);
        assert_eq!(restored["guarantee"], "may-lag");
        let store = Store::builder().table(ORDERS).open(&new)?;
        for key in &keys {
            let scope = Scope::new("t", "op", key)?;
            assert!(
                matches!(store.begin(&scope, fp(key))?, Begin::Replay(_)),
                "{key} replays"
            );
        }
        assert_eq!(common::order_count(&store)?, keys.len() as u64);
        Ok(())
    }
}
