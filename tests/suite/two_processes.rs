//! Two real processes, one store directory: while process A writes and calls `Store::reopen`
//! over and over (each reopen closes and reopens the redb file), process B tries to open the
//! same directory in a tight loop. B must never get in, A must never be poisoned by B, and once
//! A has exited B opens the store and finds every write A acknowledged.
//!
//! redb's own lock on the database file is let go for a moment by every reopen; only the lock
//! on the directory, held for the store's whole life, keeps B out. The test binary runs itself
//! in both roles (`child_role`, selected by an environment variable).

#![cfg(unix)]

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use common::{ORDERS, TestResult, fp};
use idemstore::redb::ReadableTable;
use idemstore::{Begin, OpenError, Response, Scope, Store, StoreError, Sweep};

const ROLE: &str = "IDEMSTORE_TWO_PROCESSES_ROLE";
const DIR: &str = "IDEMSTORE_TWO_PROCESSES_DIR";
/// The pid of A, which B's refusals must name.
const HOLDER: &str = "IDEMSTORE_TWO_PROCESSES_HOLDER";
/// How long B keeps trying while A reopens.
const TRY_FOR: Duration = Duration::from_secs(3);
/// How long any one answer from a child may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(60);
const WRITERS: usize = 2;

fn open(dir: &Path) -> Result<Store, OpenError> {
    Store::builder().table(ORDERS).sweep(Sweep::Off).open(dir)
}

/// The children: a no-op unless the parent set the role.
#[test]
fn child_role() -> TestResult {
    let (Ok(role), Ok(dir)) = (std::env::var(ROLE), std::env::var(DIR)) else {
        return Ok(());
    };
    println!(); // ends the harness's `test child_role ... ` line: every line after is ours
    match role.as_str() {
        "writer" => writer(Path::new(&dir)),
        "opener" => opener(Path::new(&dir)),
        other => Err(format!("unknown role {other}").into()),
    }
}

/// Process A: commits from `WRITERS` threads and reopens from another until its stdin closes,
/// printing `ack KEY` for every acknowledged commit and a line for every failure.
fn writer(dir: &Path) -> TestResult {
    let store = open(dir)?;
    println!("ready");
    let stop = Arc::new(AtomicBool::new(false));
    let stdin_closed = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            for _ in std::io::stdin().lock().lines().map_while(Result::ok) {}
            stop.store(true, Ordering::SeqCst);
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let (store, stop) = (store.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                for i in 0u64.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let key = format!("t{t}-{i}");
                    match commit(&store, &key) {
                        Ok(()) => println!("ack {key}"),
                        Err(e) => println!("write-failed {key}: {e}"),
                    }
                }
            })
        })
        .collect();
    let (reopened, other) = (AtomicU64::new(0), AtomicU64::new(0));
    while !stop.load(Ordering::SeqCst) {
        match store.reopen() {
            Ok(_) => {
                reopened.fetch_add(1, Ordering::Relaxed);
            }
            // A failed restore poisons the store: what B's open would do to A.
            Err(e @ StoreError::Poisoned { .. }) => println!("reopen-failed {e}"),
            // Anything else left the store as it was (a reopen answered without running).
            Err(_) => {
                other.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    for w in writers {
        w.join().map_err(|_| "a writer thread panicked")?;
    }
    stdin_closed
        .join()
        .map_err(|_| "the stdin thread panicked")?;
    match store.writable() {
        Ok(()) => println!("writable"),
        Err(e) => println!("not-writable {e}"),
    }
    commit(&store, "final")?;
    println!("ack final");
    println!(
        "reopens {} {}",
        reopened.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed)
    );
    Ok(())
}

fn commit(store: &Store, key: &str) -> Result<(), idemstore::Error> {
    let scope = Scope::new("tenant", "order", key)?;
    let Begin::Claimed(claim) = store.begin(&scope, fp(key))? else {
        return Ok(());
    };
    let row = key.to_owned();
    claim.commit(move |tx| {
        tx.insert(&ORDERS, row.as_str(), "paid")?;
        Ok(Response::new(201, row.clone().into_bytes()))
    })?;
    Ok(())
}

/// Process B: tries to open the directory until told `stop`, then prints `tries OPENED NAMED
/// OTHER`; told `open`, opens it (which must now succeed) and prints every order row.
fn opener(dir: &Path) -> TestResult {
    let holder = std::env::var(HOLDER)?;
    let (commands_tx, commands) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            if commands_tx.send(line).is_err() {
                break;
            }
        }
    });
    let (mut opened, mut named, mut other) = (0u64, 0u64, 0u64);
    while commands.try_recv().is_err() {
        match open(dir) {
            Ok(store) => {
                opened += 1;
                drop(store);
            }
            Err(e @ OpenError::AlreadyOpen { .. }) if e.to_string().contains(&holder) => {
                named += 1;
            }
            Err(e) => {
                if other == 0 {
                    println!("refused-other {e}");
                }
                other += 1;
            }
        }
    }
    println!("tries {opened} {named} {other}");
    if commands.recv()? != "open" {
        return Err("expected `open`".into());
    }
    let store = open(dir)?;
    let read = store.read()?;
    for entry in read.open_table(ORDERS)?.iter()? {
        println!("row {}", entry?.0.value());
    }
    println!("rows-done");
    Ok(())
}

/// A child process that is killed if the test ends before it exits.
struct Running {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Running {
    fn start(role: &str, dir: &Path, holder: Option<u32>) -> Result<Running, std::io::Error> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args([
                crate::child_test!("child_role").as_str(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, role)
            .env(DIR, dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(pid) = holder {
            command.env(HOLDER, pid.to_string());
        }
        let mut child = command.spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let (lines_tx, lines) = mpsc::channel();
        if let Some(stdout) = stdout {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if lines_tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Running {
            child,
            stdin,
            lines,
        })
    }

    /// Lines up to and including the first that starts with `prefix`.
    fn until(&self, prefix: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let deadline = Instant::now() + ANSWER_WITHIN;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).map_err(|_| {
                let last = &seen[seen.len().saturating_sub(20)..];
                format!("no `{prefix}` line from the child; its last lines: {last:?}")
            })?;
            let done = line.starts_with(prefix);
            seen.push(line);
            if done {
                return Ok(seen);
            }
        }
    }

    fn send(&mut self, line: &str) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        writeln!(stdin, "{line}")
    }

    /// Closes its stdin, waits for it to exit, and returns the rest of what it printed.
    fn finish(mut self) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        self.stdin = None;
        let status = self.child.wait()?;
        let rest: Vec<String> = self.lines.iter().collect();
        if !status.success() {
            let last = &rest[rest.len().saturating_sub(20)..];
            return Err(format!("the child failed ({status}); its last lines: {last:?}").into());
        }
        Ok(rest)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn a_second_process_never_opens_a_directory_whose_store_reopens_under_load() -> TestResult {
    if std::env::var(ROLE).is_ok() {
        return Ok(()); // this process is a child
    }
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path().join("idem");
    let a = Running::start("writer", &dir, None)?;
    a.until("ready")?;
    let mut b = Running::start("opener", &dir, Some(a.child.id()))?;
    std::thread::sleep(TRY_FOR);
    b.send("stop")?;
    let b_lines = b.until("tries ")?;
    let a_lines = a.finish()?;
    b.send("open")?;
    let rows = b.until("rows-done")?;
    b.finish()?;

    let (mut acked, mut failures, mut reopens) = (BTreeSet::new(), Vec::new(), None);
    for line in &a_lines {
        if let Some(key) = line.strip_prefix("ack ") {
            acked.insert(key.to_owned());
        } else if let Some(counts) = line.strip_prefix("reopens ") {
            reopens = Some(counts.to_owned());
        } else if line.starts_with("write-failed")
            || line.starts_with("reopen-failed")
            || line.starts_with("not-writable")
        {
            failures.push(line.clone());
        }
    }
    let tries = b_lines.last().ok_or("no tries line")?;
    println!("B: {tries} (opened, refused naming A, refused otherwise); A: reopens {reopens:?}");
    let counts: Vec<u64> = tries
        .trim_start_matches("tries ")
        .split(' ')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let [opened, named, other] = counts[..] else {
        return Err(format!("bad tries line {tries:?}").into());
    };
    assert_eq!(opened, 0, "B opened the directory A holds, {opened} times");
    assert_eq!(
        other,
        0,
        "B was refused without A named: {:?}",
        b_lines.iter().find(|l| l.starts_with("refused-other"))
    );
    assert!(named > 0, "B never tried");
    assert!(
        failures.is_empty(),
        "A failed while B tried: {:?}",
        &failures[..failures.len().min(5)]
    );
    let reopened: u64 = reopens
        .as_deref()
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .ok_or("A did not report its reopens")?;
    // Counts, not rates: a shared 2-core machine can slow A a lot, and one reopen beside B's
    // tries is already the window the lock closes.
    assert!(reopened > 0, "A never reopened");

    let seen: BTreeSet<String> = rows
        .iter()
        .filter_map(|l| l.strip_prefix("row "))
        .map(str::to_owned)
        .collect();
    let lost: Vec<_> = acked.difference(&seen).collect();
    assert!(lost.is_empty(), "acknowledged writes missing: {lost:?}");
    assert!(
        acked.iter().any(|k| k != "final"),
        "A acknowledged no write while B tried"
    );
    Ok(())
}
