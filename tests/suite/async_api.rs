//! The async API gives the same guarantees as the blocking one, without blocking a runtime
//! worker; waiting uses tokio's (pausable) time.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::{LEASE, ORDERS, TTL, TestResult, builder, clock, fp, order_count, scope};
use idemstore::{Begin, ClaimError, Response, Scope, Store};

const TASKS: usize = 64;
const KEYS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_racing_each_key_cause_exactly_one_side_effect_per_key() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path().join("idem"))?;
    let side_effects = Arc::new(AtomicU64::new(0));
    let claims: Arc<Vec<AtomicU32>> = Arc::new((0..KEYS).map(|_| AtomicU32::new(0)).collect());
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (store, side_effects, claims, barrier) = (
            store.clone(),
            side_effects.clone(),
            claims.clone(),
            barrier.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut other = 0u32;
            for key in 0..KEYS {
                barrier.wait().await;
                let scope = Scope::new("acct", "charge", format!("key-{key}"))?;
                match store.begin_async(&scope, fp("same")).await? {
                    Begin::Claimed(claim) => {
                        claims[key].fetch_add(1, Ordering::SeqCst);
                        side_effects.fetch_add(1, Ordering::SeqCst);
                        let id = format!("order-{key}");
                        claim
                            .commit_async(move |tx| {
                                tx.insert(&ORDERS, id.as_str(), "charged")?;
                                Ok(Response::new(201, id.clone().into_bytes()))
                            })
                            .await?;
                    }
                    Begin::InProgress { .. } | Begin::Replay(_) => {}
                    Begin::Recovered(_) | Begin::Mismatch | Begin::Expired { .. } => other += 1,
                }
            }
            Ok::<u32, idemstore::Error>(other)
        }));
    }
    for task in tasks {
        assert_eq!(
            task.await??,
            0,
            "a loser saw something other than InProgress or Replay"
        );
    }
    for (key, n) in claims.iter().enumerate() {
        assert_eq!(n.load(Ordering::SeqCst), 1, "key-{key}");
    }
    assert_eq!(side_effects.load(Ordering::SeqCst), KEYS as u64);
    assert_eq!(order_count(&store)?, KEYS as u64);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_async_waiters_get_the_replay_of_one_commit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path().join("idem"))?;
    let Begin::Claimed(holder) = store.begin_async(&scope("k"), fp("req")).await? else {
        return Err("expected Claimed".into());
    };
    let mut waiters = Vec::new();
    for _ in 0..16 {
        let store = store.clone();
        waiters.push(tokio::spawn(async move {
            store
                .begin_or_wait_async(&scope("k"), fp("req"), Duration::from_secs(60))
                .await
        }));
    }
    while store.stats()?.waiting < 16 {
        tokio::task::yield_now().await;
    }
    holder
        .commit_async(|_| Ok(Response::new(201, b"once".to_vec())))
        .await?;
    for waiter in waiters {
        match waiter.await?? {
            Begin::Replay(r) => assert_eq!(r.body(), b"once"),
            other => return Err(format!("expected a replay, got {other:?}").into()),
        }
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn an_async_waiter_times_out_into_in_progress_without_real_waiting() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path().join("idem"))?;
    let Begin::Claimed(_holder) = store.begin_async(&scope("k"), fp("req")).await? else {
        return Err("expected Claimed".into());
    };
    let started = tokio::time::Instant::now();
    let real = std::time::Instant::now();
    let answer = store
        .begin_or_wait_async(&scope("k"), fp("req"), Duration::from_secs(3600))
        .await?;
    assert!(matches!(answer, Begin::InProgress { .. }), "{answer:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(3600),
        "the wait was not bounded by max_wait"
    );
    assert!(
        real.elapsed() < Duration::from_secs(30),
        "paused time should not wait for real"
    );
    assert_eq!(store.stats()?.waiting, 0);
    Ok(())
}

/// `Duration::MAX` is "as long as it takes", not an overflow: the wait is capped.
#[tokio::test(start_paused = true)]
async fn an_async_wait_of_duration_max_does_not_overflow() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = builder(&clock()).open(dir.path().join("idem"))?;
    let answer = store
        .begin_or_wait_async(&scope("new"), fp("req"), Duration::MAX)
        .await?;
    assert!(matches!(answer, Begin::Claimed(_)), "{answer:?}");
    let Begin::Claimed(_holder) = store.begin_async(&scope("k"), fp("req")).await? else {
        return Err("expected Claimed".into());
    };
    let started = tokio::time::Instant::now();
    let answer = store
        .begin_or_wait_async(&scope("k"), fp("req"), Duration::MAX)
        .await?;
    assert!(matches!(answer, Begin::InProgress { .. }), "{answer:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(300 * 24 * 3600),
        "capped at a year"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_async_operation_keeps_the_blocking_apis_rules() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store: Store = builder(&clock).open(dir.path().join("idem"))?;

    let Begin::Claimed(mut claim) = store.begin_async(&scope("k"), fp("req")).await? else {
        return Err("expected Claimed".into());
    };
    claim.checkpoint_async(b"halfway".to_vec()).await?;
    claim.extend_async(Duration::from_secs(60)).await?;
    clock.advance(LEASE); // the original lease, not the extended one
    assert!(matches!(
        store.begin_async(&scope("k"), fp("req")).await?,
        Begin::InProgress { .. }
    ));
    clock.advance(Duration::from_secs(31));
    let Begin::Recovered(recovered) = store.begin_async(&scope("k"), fp("req")).await? else {
        return Err("expected Recovered".into());
    };
    assert_eq!(recovered.last_checkpoint(), Some(&b"halfway"[..]));
    // The stale holder is fenced off, asynchronously too.
    assert!(matches!(
        claim.extend_async(Duration::from_secs(5)).await,
        Err(ClaimError::Stale(_))
    ));
    assert!(matches!(
        claim.release_async().await,
        Err(ClaimError::Stale(_))
    ));
    recovered
        .commit_async(|_| Ok(Response::new(200, b"done".to_vec())))
        .await?;

    let Begin::Claimed(released) = store.begin_async(&scope("other"), fp("req")).await? else {
        return Err("expected Claimed".into());
    };
    released.release_async().await?;
    assert!(matches!(
        store.begin_async(&scope("other"), fp("req")).await?,
        Begin::Claimed(_)
    ));

    let rows = store
        .write_async(|tx| {
            tx.insert(&ORDERS, "plain", "row")?;
            Ok(1u32)
        })
        .await?;
    assert_eq!(rows, 1);
    store.checkpoint_async().await?;
    clock.advance(TTL);
    assert_eq!(store.evict_expired_async(10).await?.removed, 1);
    Ok(())
}
