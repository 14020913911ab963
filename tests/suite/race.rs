//! Real threads racing `begin` on the same key: exactly one side effect per key.

use crate::common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use common::{ORDERS, TestResult, fp, order_count};
use idemstore::{Begin, Response, Scope, Store};

const THREADS: usize = 32;
const KEYS: usize = 500;

/// What the losers of a race were told.
#[derive(Default)]
struct Seen {
    claimed: AtomicU32,
    in_progress: AtomicU32,
    replay: AtomicU32,
    other: AtomicU32,
}

#[test]
fn thirty_two_threads_racing_each_of_500_keys_cause_exactly_500_side_effects() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Store::builder()
        .table(ORDERS)
        .open(dir.path().join("idem"))?;
    let side_effects = Arc::new(AtomicU64::new(0));
    let claims_per_key: Arc<Vec<AtomicU32>> =
        Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let seen = Arc::new(Seen::default());
    let barrier = Arc::new(Barrier::new(THREADS));

    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (store, side_effects, claims_per_key, seen, barrier) = (
                store.clone(),
                side_effects.clone(),
                claims_per_key.clone(),
                seen.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                let mut errors = Vec::new();
                for key in 0..KEYS {
                    // Every thread starts each key at the same moment. A failure is recorded,
                    // never returned early: the others would wait at the barrier forever.
                    barrier.wait();
                    let attempt = || -> Result<(), idemstore::Error> {
                        let scope = Scope::new("acct", "charge", format!("key-{key}"))?;
                        match store.begin(&scope, fp("same request"))? {
                            Begin::Claimed(claim) => {
                                claims_per_key[key].fetch_add(1, Ordering::SeqCst);
                                seen.claimed.fetch_add(1, Ordering::SeqCst);
                                // The side effect happens outside the store, once per winner.
                                side_effects.fetch_add(1, Ordering::SeqCst);
                                let id = format!("order-{key}");
                                claim.commit(move |tx| {
                                    tx.insert(&ORDERS, id.as_str(), "charged")?;
                                    Ok(Response::new(201, id.clone().into_bytes()))
                                })?;
                            }
                            Begin::InProgress { .. } => {
                                seen.in_progress.fetch_add(1, Ordering::SeqCst);
                            }
                            Begin::Replay(response) => {
                                assert_eq!(response.body(), format!("order-{key}").as_bytes());
                                seen.replay.fetch_add(1, Ordering::SeqCst);
                            }
                            Begin::Recovered(_) | Begin::Mismatch | Begin::Expired { .. } => {
                                seen.other.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                        Ok(())
                    };
                    if let Err(e) = attempt() {
                        errors.push(format!("key-{key}: {e}"));
                    }
                }
                errors
            })
        })
        .collect();
    let mut errors = Vec::new();
    for worker in workers {
        errors.extend(worker.join().map_err(|_| "a worker panicked")?);
    }
    assert!(errors.is_empty(), "{errors:?}");

    for (key, claims) in claims_per_key.iter().enumerate() {
        assert_eq!(
            claims.load(Ordering::SeqCst),
            1,
            "key-{key} was claimed more than once"
        );
    }
    assert_eq!(side_effects.load(Ordering::SeqCst), KEYS as u64);
    assert_eq!(
        order_count(&store)?,
        KEYS as u64,
        "one business row per key"
    );
    assert_eq!(seen.claimed.load(Ordering::SeqCst), KEYS as u32);
    assert_eq!(
        seen.other.load(Ordering::SeqCst),
        0,
        "losers saw only InProgress or Replay"
    );
    let losers = seen.in_progress.load(Ordering::SeqCst) + seen.replay.load(Ordering::SeqCst);
    assert_eq!(losers as usize, KEYS * (THREADS - 1));
    // Exactly one durable group per claim and one per commit: the losers that reached the
    // writer were answered without committing (or syncing) anything.
    let stats = store.stats()?;
    assert_eq!(stats.groups_committed, 2 * KEYS as u64, "{stats:?}");
    Ok(())
}
