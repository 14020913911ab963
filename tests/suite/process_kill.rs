//! A real process, killed with SIGKILL while it claims and commits from several threads: after
//! each kill the store reopens and holds every operation the child reported as acknowledged.
//!
//! The test binary runs itself as the child (`child_writes_until_killed`, selected by an
//! environment variable). The child prints `claim <key> <fence>` and `commit <key>` only after
//! the store acknowledged them; the parent kills it after a random number of such lines, a
//! different number each round (seeded, printed).

#![cfg(unix)]

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{ORDERS, TestResult, fp};
use idemstore::{Begin, RecordState, Response, Scope, Store};

const CHILD_DIR: &str = "IDEMSTORE_KILL_CHILD_DIR";
const CHILD_ROUND: &str = "IDEMSTORE_KILL_CHILD_ROUND";
const ROUNDS: u64 = 6;
const THREADS: usize = 4;

fn open(dir: &std::path::Path) -> Result<Store, idemstore::OpenError> {
    Store::builder().table(ORDERS).open(dir)
}

/// The child: runs only when the parent sets the environment; a no-op otherwise.
#[test]
fn child_writes_until_killed() -> TestResult {
    let (Ok(dir), Ok(round)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_ROUND)) else {
        return Ok(());
    };
    let store = open(std::path::Path::new(&dir))?;
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            let round = round.clone();
            std::thread::spawn(move || -> Result<(), idemstore::Error> {
                for i in 0u64.. {
                    let key = format!("r{round}-t{t}-{i}");
                    let scope = Scope::new("tenant", "order", &key)?;
                    let Begin::Claimed(claim) = store.begin(&scope, fp("req"))? else {
                        continue;
                    };
                    println!("claim {key} {}", claim.fence());
                    // Every third claim is left in progress, as if its work were still running.
                    if i % 3 == 2 {
                        continue;
                    }
                    let row = key.clone();
                    claim.commit(move |tx| {
                        tx.insert(&ORDERS, row.as_str(), "paid")?;
                        Ok(Response::new(201, row.clone().into_bytes()))
                    })?;
                    println!("commit {key}");
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "child worker panicked")??;
    }
    Ok(())
}

#[test]
fn sigkill_at_random_moments_loses_nothing_acknowledged() -> TestResult {
    if std::env::var(CHILD_DIR).is_ok() {
        return Ok(()); // this process is a child
    }
    let dir = tempfile::tempdir()?;
    let store_dir = dir.path().join("idem");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    println!("process kill seed {seed}");
    let mut rng = idemstore_rng(seed);
    let mut claims: BTreeMap<String, u64> = BTreeMap::new();
    let mut commits: Vec<String> = Vec::new();

    for round in 0..ROUNDS {
        let kill_after = 20 + rng() % 400;
        let mut child = Command::new(std::env::current_exe()?)
            .args([
                crate::child_test!("child_writes_until_killed").as_str(),
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR, &store_dir)
            .env(CHILD_ROUND, round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no child stdout")?;
        let (lines_tx, lines) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = 0;
        while seen < kill_after {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    if record(&line, &mut claims, &mut commits) {
                        seen += 1;
                    }
                }
                Err(_) => {
                    let _ = child.kill();
                    return Err(format!(
                        "round {round}: the child stopped after {seen} acknowledgements"
                    )
                    .into());
                }
            }
        }
        child.kill()?; // SIGKILL
        child.wait()?;
        // Lines the child printed before it died are acknowledgements too.
        for line in lines.try_iter().collect::<Vec<_>>() {
            record(&line, &mut claims, &mut commits);
        }
        reader.join().map_err(|_| "reader panicked")?;

        let store = open(&store_dir)?;
        let read = store.read()?;
        let orders = read.open_table(ORDERS)?;
        for (key, fence) in &claims {
            let scope = Scope::new("tenant", "order", key)?;
            let record = store
                .get(&scope)?
                .ok_or_else(|| format!("round {round}: acknowledged claim {key} lost"))?;
            assert_eq!(record.fence(), *fence, "round {round}: {key}");
            if let RecordState::Completed { .. } = record.state() {
                assert!(
                    orders.get(key.as_str())?.is_some(),
                    "round {round}: {key} completed without its row"
                );
            } else {
                assert!(
                    orders.get(key.as_str())?.is_none(),
                    "round {round}: {key} has a row but is in progress"
                );
            }
        }
        for key in &commits {
            let scope = Scope::new("tenant", "order", key)?;
            let record = store
                .get(&scope)?
                .ok_or_else(|| format!("round {round}: acknowledged commit {key} lost"))?;
            assert!(
                matches!(record.state(), RecordState::Completed { .. }),
                "round {round}: acknowledged commit {key} is not completed"
            );
            assert!(
                orders.get(key.as_str())?.is_some(),
                "round {round}: {key} lost its row"
            );
        }
        println!(
            "round {round}: killed after {seen} acknowledgements; {} claims and {} commits verified (replayed {} frames)",
            claims.len(),
            commits.len(),
            store.recovery_report().frames_replayed
        );
    }
    assert!(
        commits.len() > 50,
        "too little work was verified: {}",
        commits.len()
    );
    Ok(())
}

/// Parses one line of the child's output; true if it was an acknowledgement.
fn record(line: &str, claims: &mut BTreeMap<String, u64>, commits: &mut Vec<String>) -> bool {
    let parts: Vec<&str> = line.split(' ').collect();
    match parts.as_slice() {
        ["claim", key, fence] => match fence.parse() {
            Ok(fence) => {
                claims.insert((*key).to_owned(), fence);
                true
            }
            Err(_) => false,
        },
        ["commit", key] => {
            commits.push((*key).to_owned());
            true
        }
        _ => false,
    }
}

fn idemstore_rng(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
