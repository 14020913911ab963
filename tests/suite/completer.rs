//! Work that attempts abandoned is finished by a `Completer`, fenced like any holder, and a
//! live holder keeps its lease with a `KeepAlive`. Leases run on the store's manual clock;
//! the completer's backoff on the runtime's paused clock.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{LEASE, TestResult, clock, fp, scope};
use idemstore::{Begin, Claim, Completer, RecordState, Response, Store};
use parking_lot::Mutex;

const OPERATION: &str = "create_order";

/// A downstream service that deduplicates on the key it is given, and counts its calls.
#[derive(Default)]
struct Downstream {
    made: Mutex<HashMap<String, u32>>,
    charges: AtomicU32,
    lookups: AtomicU32,
}

impl Downstream {
    fn charge(&self, key: &str) {
        self.charges.fetch_add(1, Ordering::SeqCst);
        let mut made = self.made.lock();
        let n = made.len() as u32 + 1;
        made.entry(key.to_owned()).or_insert(n);
    }

    fn lookup(&self, key: &str) -> Option<u32> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.made.lock().get(key).copied()
    }
}

/// What the completer runs for `OPERATION`: ask downstream, commit what it made, or release.
fn completer(store: &Store, downstream: &Arc<Downstream>) -> Completer<Store> {
    let downstream = downstream.clone();
    Completer::new(store.clone()).operation(OPERATION, move |claim: Claim| {
        let downstream = downstream.clone();
        async move {
            match downstream.lookup(&claim.downstream_key()) {
                Some(n) => {
                    claim
                        .commit_async(move |_| Ok(Response::new(201, format!("charge {n}"))))
                        .await?;
                }
                None => claim.release_async().await?,
            }
            Ok(())
        }
    })
}

/// Claims `key` for `OPERATION`, makes the downstream side effect, and abandons the claim (its
/// process died, or its handler timed out and answered 504).
fn abandon(store: &Store, downstream: &Downstream, key: &str) -> TestResult {
    let Begin::Claimed(claim) = store.begin(&scope_of(key), fp("req"))? else {
        return Err("a new key is claimed".into());
    };
    downstream.charge(&claim.downstream_key());
    drop(claim);
    Ok(())
}

fn scope_of(key: &str) -> idemstore::Scope {
    idemstore::Scope::new("tenant-a", OPERATION, key).expect("a valid scope")
}

#[tokio::test]
async fn abandoned_work_is_completed_by_its_operations_function_without_a_second_side_effect()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = common::open(dir.path(), &clock)?;
    let downstream = Arc::new(Downstream::default());
    abandon(&store, &downstream, "k1")?;
    // Another operation's abandoned key is not this completer's to touch.
    let elsewhere = idemstore::Scope::new("tenant-a", "send_mail", "k2")?;
    let Begin::Claimed(other) = store.begin(&elsewhere, fp("req"))? else {
        return Err("a new key is claimed".into());
    };
    drop(other);
    let completer = completer(&store, &downstream);

    // Within the lease, nothing is abandoned yet.
    assert_eq!(completer.run_once().await?.completed, 0);
    clock.advance(LEASE);
    let round = completer.run_once().await?;
    assert_eq!((round.completed, round.failed), (1, 0), "{round:?}");
    let record = store.get(&scope_of("k1"))?.ok_or("the record")?;
    assert!(
        matches!(record.state(), RecordState::Completed { response, .. } if response.body() == b"charge 1")
    );
    assert_eq!(record.attempt(), 2, "completed as a recovery");
    assert!(matches!(
        store.get(&elsewhere)?.map(|r| r.state().clone()),
        Some(RecordState::InProgress { .. })
    ));
    assert_eq!(
        downstream.charges.load(Ordering::SeqCst),
        1,
        "never charged again"
    );
    assert_eq!(downstream.lookups.load(Ordering::SeqCst), 1);
    // A late retry is a replay.
    assert!(matches!(
        store.begin(&scope_of("k1"), fp("req"))?,
        Begin::Replay(_)
    ));
    Ok(())
}

#[tokio::test]
async fn a_key_that_was_never_acted_on_is_released_for_the_next_request() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = common::open(dir.path(), &clock)?;
    let downstream = Arc::new(Downstream::default());
    let Begin::Claimed(claim) = store.begin(&scope_of("k1"), fp("req"))? else {
        return Err("a new key is claimed".into());
    };
    drop(claim); // died before calling downstream
    clock.advance(LEASE);
    assert_eq!(
        completer(&store, &downstream).run_once().await?.completed,
        1
    );
    assert!(store.get(&scope_of("k1"))?.is_none(), "released");
    assert!(matches!(
        store.begin(&scope_of("k1"), fp("req"))?,
        Begin::Claimed(_)
    ));
    Ok(())
}

/// The completer and a client's retry race for the same abandoned key, from several threads
/// at once: exactly one of them takes it over, and the side effect stays one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completer_racing_a_client_retry_leaves_one_winner() -> TestResult {
    for round in 0..20 {
        let dir = tempfile::tempdir()?;
        let clock = clock();
        let store = common::open(dir.path(), &clock)?;
        let downstream = Arc::new(Downstream::default());
        let key = format!("k{round}");
        abandon(&store, &downstream, &key)?;
        clock.advance(LEASE);
        let completer = completer(&store, &downstream);
        let client = tokio::task::spawn_blocking({
            let (store, key) = (store.clone(), key.clone());
            move || store.begin(&scope_of(&key), fp("req"))
        });
        let round_done = completer.run_once().await?;
        let retried = client.await??;
        let client_won = match retried {
            Begin::Recovered(claim) => {
                claim.commit(|_| Ok(Response::new(201, "by the client")))?;
                true
            }
            Begin::InProgress { .. } | Begin::Replay(_) => false,
            other => return Err(format!("the client got {other:?}").into()),
        };
        let completer_won = round_done.completed == 1;
        assert!(
            client_won != completer_won,
            "round {round}: one winner (client {client_won}, completer {round_done:?})"
        );
        assert_eq!(downstream.charges.load(Ordering::SeqCst), 1);
    }
    Ok(())
}

/// A completion that fails leaves the key in progress for a later round, and the next try
/// waits out a backoff that doubles.
#[tokio::test(start_paused = true)]
async fn a_failing_completion_leaves_the_key_for_a_later_round_with_backoff() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = common::open(dir.path(), &clock)?;
    let downstream = Arc::new(Downstream::default());
    abandon(&store, &downstream, "k1")?;
    clock.advance(LEASE);
    let tries = Arc::new(AtomicU32::new(0));
    let completer = {
        let tries = tries.clone();
        Completer::new(store.clone())
            .operation(OPERATION, move |claim: Claim| {
                let tries = tries.clone();
                async move {
                    if tries.fetch_add(1, Ordering::SeqCst) < 2 {
                        drop(claim); // left in progress
                        return Err("downstream is down".into());
                    }
                    claim
                        .commit_async(|_| Ok(Response::new(201, "late")))
                        .await?;
                    Ok(())
                }
            })
            .backoff(Duration::from_secs(10), Duration::from_secs(60))
    };
    assert_eq!(completer.run_once().await?.failed, 1);
    // Its claim's lease must run out again, and its wait too, before another try.
    clock.advance(LEASE);
    assert_eq!(completer.run_once().await?.waiting, 1, "still waiting");
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        completer.run_once().await?.failed,
        1,
        "tried again after 10 s"
    );
    clock.advance(LEASE);
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(
        completer.run_once().await?.waiting,
        1,
        "the wait doubled to 20 s"
    );
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(completer.run_once().await?.completed, 1);
    assert_eq!(tries.load(Ordering::SeqCst), 3);
    assert!(matches!(
        store.begin(&scope_of("k1"), fp("req"))?,
        Begin::Replay(_)
    ));
    Ok(())
}

/// A holder that keeps a `KeepAlive` is never taken over, however long it works; once the
/// claim is finished (or dropped) the renewals stop, so a dead holder's lease ends. Here on the
/// blocking API (the renewals run on a thread): the test polls for their effect, with a bound,
/// on a store with a short lease on the system clock.
#[test]
fn a_keep_alive_renews_a_live_holders_lease_and_stops_with_the_claim() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = Store::builder()
        .lease(Duration::from_millis(300))
        .sweep(idemstore::Sweep::Off)
        .open(dir.path().join("idem"))?;
    let Begin::Claimed(claim) = store.begin(&scope("k1"), fp("req"))? else {
        return Err("a new key is claimed".into());
    };
    let alive = claim.keep_alive();
    let lease_until = || -> Result<idemstore::Timestamp, Box<dyn std::error::Error>> {
        match store.get(&scope("k1"))?.map(|r| r.state().clone()) {
            Some(RecordState::InProgress { lease_until, .. }) => Ok(lease_until),
            other => Err(format!("not in progress: {other:?}").into()),
        }
    };
    let first = lease_until()?;
    // Renewed past where the first lease ended: three renewals' worth.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lease_until()? < first.saturating_add(Duration::from_millis(300)) {
        assert!(std::time::Instant::now() < deadline, "never renewed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(matches!(
        store.begin(&scope("k1"), fp("req"))?,
        Begin::InProgress { .. }
    ));
    drop(claim);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !alive.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "renewals went on after the claim"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
