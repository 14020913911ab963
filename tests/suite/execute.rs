//! `Store::execute`: claim and commit in one writer step, for work that stays in the process.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use common::{LEASE, ORDERS, TestResult, builder, clock, fp, order_count, orders, scope};
use idemstore::testing::SimDisk;
use idemstore::{Begin, CommitError, ExecuteError, Execution, Response, StaleReason};

const THREADS: usize = 64;
const KEYS: usize = 300;

/// One side effect: the order row, counted by how many times the closure ran and by the rows.
fn place(
    runs: &Arc<AtomicU32>,
    key: &str,
) -> impl FnOnce(&mut idemstore::Tx<'_>) -> Result<Response, idemstore::BoxError> + Send + 'static {
    let (runs, id) = (runs.clone(), format!("order-{key}"));
    move |tx| {
        runs.fetch_add(1, Ordering::SeqCst);
        tx.insert(&ORDERS, id.as_str(), "placed")?;
        Ok(Response::new(201, id.into_bytes()))
    }
}

#[test]
fn sixty_four_threads_racing_each_of_300_keys_run_each_closure_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock).open(dir.path().join("idem"))?;
    let runs = Arc::new(AtomicU32::new(0));
    let executed: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let errors = Arc::new(Mutex::new(Vec::new()));
    let barrier = Arc::new(Barrier::new(THREADS));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (store, runs, executed, errors, barrier) =
                (&store, &runs, &executed, &errors, &barrier);
            s.spawn(move || {
                barrier.wait();
                // Each thread walks the keys from its own starting point, so every key is
                // raced by threads arriving at different moments.
                for i in 0..KEYS {
                    let key = (i + t * 7) % KEYS;
                    let name = format!("k{key}");
                    match store.execute(&scope(&name), fp("same"), place(runs, &name)) {
                        Ok(Execution::Executed(response)) => {
                            executed[key].fetch_add(1, Ordering::SeqCst);
                            assert_eq!(response.body(), format!("order-{name}").as_bytes());
                        }
                        Ok(Execution::Replay(response)) => {
                            assert_eq!(response.body(), format!("order-{name}").as_bytes());
                        }
                        Ok(other) => errors
                            .lock()
                            .expect("errors")
                            .push(format!("{name}: {other:?}")),
                        Err(e) => errors.lock().expect("errors").push(format!("{name}: {e}")),
                    }
                }
            });
        }
    });
    let errors = errors.lock().map_err(|_| "poisoned")?;
    assert!(errors.is_empty(), "{errors:?}");
    for (key, n) in executed.iter().enumerate() {
        assert_eq!(
            n.load(Ordering::SeqCst),
            1,
            "k{key} executed more than once"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), KEYS as u32, "closures run");
    assert_eq!(order_count(&store)?, KEYS as u64, "side effects");
    Ok(())
}

#[test]
fn a_different_request_under_the_same_key_is_a_mismatch_and_runs_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock).open(dir.path().join("idem"))?;
    let runs = Arc::new(AtomicU32::new(0));
    let first = store.execute(&scope("key-1"), fp("a"), place(&runs, "key-1"))?;
    assert!(matches!(first, Execution::Executed(_)), "{first:?}");
    let other = store.execute(&scope("key-1"), fp("b"), place(&runs, "key-1"))?;
    assert!(matches!(other, Execution::Mismatch), "{other:?}");
    let again = store.execute(&scope("key-1"), fp("a"), place(&runs, "key-1"))?;
    match again {
        Execution::Replay(response) => assert_eq!(response.body(), b"order-key-1"),
        other => return Err(format!("expected Replay, got {other:?}").into()),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(order_count(&store)?, 1);
    Ok(())
}

#[test]
fn a_failed_or_panicking_closure_writes_nothing_and_the_retry_runs_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock).open(dir.path().join("idem"))?;
    let err = store
        .execute(&scope("key-1"), fp("a"), |tx| {
            tx.insert(&ORDERS, "half", "written")?;
            Err("the stock ran out".into())
        })
        .err()
        .ok_or("an aborted closure executed")?;
    assert!(matches!(err, ExecuteError::Aborted(_)), "{err:?}");
    let err = store
        .execute(&scope("key-1"), fp("a"), |tx| {
            tx.insert(&ORDERS, "half", "written")?;
            panic!("a bug in the handler");
        })
        .err()
        .ok_or("a panicking closure executed")?;
    assert!(matches!(err, ExecuteError::Panicked(_)), "{err:?}");
    let err = store
        .execute(&scope("key-1"), fp("a"), |tx| {
            tx.insert(&ORDERS, "half", "written")?;
            // An empty header name: refused before anything is stored.
            Ok(Response::new(201, Vec::new()).with_header("", "x"))
        })
        .err()
        .ok_or("an invalid response was stored")?;
    assert!(matches!(err, ExecuteError::InvalidResponse(_)), "{err:?}");
    assert_eq!(store.get(&scope("key-1"))?, None, "no record, no claim");
    assert_eq!(order_count(&store)?, 0);

    let runs = Arc::new(AtomicU32::new(0));
    let retry = store.execute(&scope("key-1"), fp("a"), place(&runs, "key-1"))?;
    assert!(matches!(retry, Execution::Executed(_)), "{retry:?}");
    assert_eq!(
        orders(&store)?,
        vec![("order-key-1".into(), "placed".into())]
    );
    Ok(())
}

#[test]
fn a_live_two_phase_claim_is_in_progress_and_an_expired_one_is_taken_over_and_fenced() -> TestResult
{
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock).open(dir.path().join("idem"))?;
    let runs = Arc::new(AtomicU32::new(0));
    let Begin::Claimed(holder) = store.begin(&scope("key-1"), fp("a"))? else {
        return Err("expected Claimed".into());
    };
    let busy = store.execute(&scope("key-1"), fp("a"), place(&runs, "key-1"))?;
    assert!(
        // Just claimed, and no completion seen yet: the shortest advice, not the lease.
        matches!(busy, Execution::InProgress { retry_after } if retry_after == Duration::from_secs(1)),
        "{busy:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    clock.advance(LEASE + Duration::from_secs(1));
    let taken = store.execute(&scope("key-1"), fp("a"), place(&runs, "key-1"))?;
    assert!(matches!(taken, Execution::Executed(_)), "{taken:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // The slow holder comes back: fenced off, its work is not stored.
    let late = holder
        .commit(|tx| {
            tx.insert(&ORDERS, "late", "twice")?;
            Ok(Response::new(201, b"late".to_vec()))
        })
        .err()
        .ok_or("a stale holder committed over an execution")?;
    assert!(
        matches!(
            late,
            CommitError::Stale(ref stale)
                if matches!(stale.reason, StaleReason::TakenOver { .. })
        ),
        "{late:?}"
    );
    assert_eq!(
        orders(&store)?,
        vec![("order-key-1".into(), "placed".into())]
    );
    Ok(())
}

#[test]
fn an_execution_is_one_log_frame_and_one_sync() -> TestResult {
    let disk = SimDisk::new();
    let clock = clock();
    // No checkpoint in the middle: its syncs are redb's, not a request's.
    let store = builder(&clock)
        .checkpoint_interval(Duration::from_secs(3600))
        .open_simulated(&disk)?;
    let runs = Arc::new(AtomicU32::new(0));
    // Warm up: the first write of a store may set up files.
    let warm = store.execute(&scope("warm-up"), fp("a"), place(&runs, "warm-up"))?;
    assert!(matches!(warm, Execution::Executed(_)), "{warm:?}");

    let counts = |store: &idemstore::Store| -> Result<(u64, u64), idemstore::StoreError> {
        Ok((disk.counters().log_syncs, store.stats()?.groups_committed))
    };
    let before = counts(&store)?;
    let done = store.execute(&scope("key-1"), fp("a"), place(&runs, "key-1"))?;
    let after = counts(&store)?;
    assert!(matches!(done, Execution::Executed(_)), "{done:?}");
    let one = (after.0 - before.0, after.1 - before.1);

    let before = counts(&store)?;
    let Begin::Claimed(claim) = store.begin(&scope("key-2"), fp("a"))? else {
        return Err("expected Claimed".into());
    };
    claim.commit(|_| Ok(Response::new(201, Vec::new())))?;
    let after = counts(&store)?;
    let two = (after.0 - before.0, after.1 - before.1);
    assert_eq!(one, (1, 1), "log syncs and groups of one execute");
    assert_eq!(two, (2, 2), "log syncs and groups of begin + commit");
    Ok(())
}

#[test]
fn the_async_twin_answers_the_same() -> TestResult {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = builder(&clock).open(dir.path().join("idem"))?;
    let runs = Arc::new(AtomicU32::new(0));
    runtime.block_on(async {
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let (store, runs) = (store.clone(), runs.clone());
                tokio::spawn(async move {
                    store
                        .execute_async(&scope("key-1"), fp("a"), place(&runs, "key-1"))
                        .await
                })
            })
            .collect();
        let mut executed = 0;
        for task in tasks {
            match task.await?? {
                Execution::Executed(_) => executed += 1,
                Execution::Replay(_) => {}
                other => return Err(format!("unexpected {other:?}").into()),
            }
        }
        assert_eq!(executed, 1);
        Ok::<_, Box<dyn std::error::Error>>(())
    })?;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(order_count(&store)?, 1);
    let Begin::Replay(_) = store.begin(&scope("key-1"), fp("a"))? else {
        return Err("a two-phase begin after an execution must replay it".into());
    };
    Ok(())
}
