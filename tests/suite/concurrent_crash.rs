//! Threads racing on a few shared keys while the simulated disk dies at a random operation:
//! every answer a thread was given must be backed by what survives the crash. Sequential
//! workloads (the crash matrix) never have a group waiting behind another group's sync; this
//! does, so it checks that answers resting on an earlier group (a `Replay` of its commit, an
//! `InProgress` for its claim) are never given before that group is durable.

use crate::common;

use std::sync::{Arc, Mutex};

use common::{ORDERS, TestResult, builder, clock, fp, order_count};
use idemstore::testing::{FaultPlan, Rng, SimDisk, Tear};
use idemstore::{Begin, Durability, RecordState, Response, Scope};

const THREADS: usize = 8;
/// Each thread walks through the keys in order (sometimes skipping one), so threads keep
/// racing on fresh keys and duplicates reach the writer while the first claim is still syncing.
const STEPS: u64 = 150;

/// What a thread was told, for checking after the crash.
#[derive(Debug, Clone)]
enum Told {
    Claimed { key: u64, fence: u64 },
    Committed { key: u64 },
    InProgress { key: u64 },
    Replay { key: u64 },
}

fn scope(key: u64) -> Scope {
    Scope::new("tenant", "op", format!("k{key}")).expect("valid")
}

#[test]
fn answers_given_before_a_crash_are_backed_by_what_survives() -> TestResult {
    let seed = 0xC0FFEE_u64;
    println!("concurrent crash seed {seed:#x}");
    let mut rng = Rng::new(seed);
    for durability in [Durability::Wal, Durability::Redb] {
        for round in 0..40 {
            let disk = SimDisk::new();
            let clock = clock();
            let store = builder(&clock)
                .durability(durability)
                .open_simulated(&disk)?;
            let opened = disk.counters().ops;
            disk.plan(FaultPlan {
                crash_at: Some(opened + 20 + rng.below(400)),
                // A slow disk: groups queue behind the sync in flight.
                log_sync_latency: Some(std::time::Duration::from_micros(300)),
                ..FaultPlan::default()
            });
            let told: Arc<Mutex<Vec<Told>>> = Arc::default();
            let workers: Vec<_> = (0..THREADS as u64)
                .map(|t| {
                    let (store, told) = (store.clone(), told.clone());
                    let mut rng = Rng::new(seed ^ (round * 31 + t));
                    std::thread::spawn(move || {
                        for step in 0..STEPS {
                            let key = step + rng.below(2);
                            let Ok(answer) = store.begin(&scope(key), fp("req")) else {
                                return; // the disk is gone
                            };
                            let entry = match answer {
                                Begin::Claimed(claim) | Begin::Recovered(claim) => {
                                    told.lock().expect("told").push(Told::Claimed {
                                        key,
                                        fence: claim.fence(),
                                    });
                                    let row = format!("k{key}");
                                    if claim
                                        .commit(move |tx| {
                                            tx.insert(&ORDERS, row.as_str(), "x")?;
                                            Ok(Response::new(201, vec![1]))
                                        })
                                        .is_err()
                                    {
                                        return;
                                    }
                                    Told::Committed { key }
                                }
                                Begin::InProgress { .. } => Told::InProgress { key },
                                Begin::Replay(_) => Told::Replay { key },
                                Begin::Mismatch | Begin::Expired { .. } => continue,
                            };
                            told.lock().expect("told").push(entry);
                        }
                    })
                })
                .collect();
            for w in workers {
                w.join().map_err(|_| "worker panicked")?;
            }
            let image = disk.crash_image(Tear::Sectors(1 + rng.below(3)));
            drop(store);

            let store = builder(&clock)
                .durability(durability)
                .open_simulated(&image)?;
            let rows = store.read()?.open_table(ORDERS)?;
            let told = told.lock().expect("told").clone();
            for answer in &told {
                let (key, what) = match answer {
                    Told::Claimed { key, .. } => (*key, "claimed"),
                    Told::Committed { key } => (*key, "committed"),
                    Told::InProgress { key } => (*key, "in progress"),
                    Told::Replay { key } => (*key, "replayed"),
                };
                let record = store.get(&scope(key))?.ok_or_else(|| {
                    format!(
                        "{durability:?} round {round}: k{key} was {what} but its record is gone"
                    )
                })?;
                let completed = matches!(record.state(), RecordState::Completed { .. });
                let row = rows.get(format!("k{key}").as_str())?.is_some();
                assert_eq!(
                    completed, row,
                    "{durability:?} round {round}: k{key} record and row disagree"
                );
                match answer {
                    Told::Claimed { fence, .. } => {
                        assert!(
                            record.fence() >= *fence,
                            "{durability:?} round {round}: k{key} lost fence {fence}"
                        );
                    }
                    Told::Committed { .. } | Told::Replay { .. } => {
                        assert!(
                            completed,
                            "{durability:?} round {round}: k{key} was {what} but is not completed"
                        );
                    }
                    Told::InProgress { .. } => {}
                }
            }
            assert!(order_count(&store)? <= STEPS + 1);
        }
    }
    Ok(())
}
