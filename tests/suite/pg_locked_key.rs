//! One locked key fails only itself: concurrent `begin`s share a claim statement (up to 256
//! scopes), and a scope whose row another session holds must neither fail nor delay the
//! others. Before, the statement waited on that row until `statement_timeout` and every scope
//! in it failed ("the statement ran past its timeout"): 111 of 117 unrelated `begin`s in an
//! outside run.
//!
//! The shape from that run: tenant "slow" runs a one-step `execute` whose work holds its
//! transaction (so its claim row stays locked, uncommitted) while its client retries the key
//! with `begin` and 39 other tenants' first requests arrive at the same moment, in three
//! waves. Then the same with a row locked by a session that is not idemstore's (`FOR UPDATE`
//! on a committed record), which the statement can only find by waiting: it gives up after a
//! short lock wait and claims the halves again. The work is held by a channel, not a sleep.

use std::time::{Duration, Instant};

use idemstore::sqlx::{self, AssertSqlSafe};
use idemstore::testing::postgres::{Prefix, unreachable};
use idemstore::{
    Begin, BoxError, Execution, Fingerprint, ManualClock, PgStore, Protocol, Response, Scope,
    Sweep, Timestamp,
};

type TestResult = Result<(), BoxError>;

/// Unrelated tenants whose first requests arrive with the locked key's retry.
const TENANTS: usize = 39;
/// Waves of them.
const WAVES: usize = 3;
/// The statement timeout: what an unrelated `begin` used to wait before it failed.
const TIMEOUT: Duration = Duration::from_secs(1);

async fn open(prefix: &Prefix) -> Result<PgStore, BoxError> {
    PgStore::builder(prefix.url())
        .prefix(prefix.name())
        .clock(ManualClock::new(Timestamp::from_millis(1_700_000_000_000)))
        .sweep(Sweep::Off)
        .timeout(TIMEOUT)
        .open()
        .await
        .map_err(|e| unreachable(prefix.url(), &e))
}

fn scope(tenant: &str, key: &str) -> Result<Scope, BoxError> {
    Ok(Scope::new(tenant, "create_order", key)?)
}

fn fp() -> Fingerprint {
    Fingerprint::of_bytes(b"the request")
}

/// One wave: the locked key's `begin` and `TENANTS` fresh ones, all at once. Returns the
/// locked key's answer and each unrelated `begin`'s time; fails if any unrelated one failed or
/// was not claimed.
async fn wave(
    store: &PgStore,
    locked: Option<&Scope>,
    wave: usize,
) -> Result<(Option<&'static str>, Vec<Duration>), BoxError> {
    let mut racing = tokio::task::JoinSet::new();
    for t in 0..TENANTS {
        let (store, scope) = (
            store.clone(),
            scope(&format!("tenant-{t}"), &format!("w{wave}"))?,
        );
        racing.spawn(async move {
            let started = Instant::now();
            let answer = store.begin(&scope, fp()).await;
            (scope, answer.map(|b| b.outcome()), started.elapsed())
        });
    }
    let locked_answer = match locked {
        Some(scope) => {
            let (store, scope) = (store.clone(), scope.clone());
            Some(tokio::spawn(async move { store.begin(&scope, fp()).await }))
        }
        None => None,
    };
    let mut times = Vec::new();
    let mut failed = Vec::new();
    while let Some(joined) = racing.join_next().await {
        let (scope, answer, took) = joined?;
        match answer {
            Ok("claimed") => times.push(took),
            other => failed.push(format!("{scope}: {other:?} after {took:?}")),
        }
    }
    assert!(
        failed.is_empty(),
        "wave {wave}: {} of {TENANTS} unrelated begins not claimed: {failed:?}",
        failed.len()
    );
    let locked_answer = match locked_answer {
        Some(answer) => match answer.await?? {
            Begin::InProgress { retry_after } => {
                assert!(retry_after > Duration::ZERO);
                Some("in_progress")
            }
            other => return Err(format!("the locked key got {}", other.outcome()).into()),
        },
        None => None,
    };
    times.sort();
    Ok((locked_answer, times))
}

fn median(times: &[Duration]) -> Duration {
    times[times.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_an_execute_holds_fails_and_delays_none_of_the_begins_beside_it() -> TestResult {
    let prefix = Prefix::new("lockedexec");
    let store = open(&prefix).await?;

    // The uncontended batch first: the latency to match.
    let (_, uncontended) = wave(&store, None, 0).await?;

    // Tenant "slow": an `execute` whose work waits for the test's word, holding its
    // transaction and its (uncommitted) claim row.
    let slow = scope("slow", "k")?;
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let executing = {
        let (store, slow) = (store.clone(), slow.clone());
        tokio::spawn(async move {
            store
                .execute(&slow, fp(), async move |_tx| {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok(Response::new(201, "slow done"))
                })
                .await
        })
    };
    started.await?;

    let mut contended = Vec::new();
    for w in 1..=WAVES {
        let (locked, times) = wave(&store, Some(&slow), w).await?;
        assert_eq!(locked, Some("in_progress"));
        contended.extend(times);
    }
    contended.sort();
    eprintln!(
        "unrelated begins: uncontended median {:?} max {:?}; beside the held key median {:?} max {:?}",
        median(&uncontended),
        uncontended.last(),
        median(&contended),
        contended.last()
    );
    // The held key costs its neighbours no wait: nothing near the lock wait (100 ms), let
    // alone the statement timeout they used to fail at.
    assert!(
        median(&contended) < median(&uncontended) * 3 + Duration::from_millis(30),
        "beside the held key: median {:?}, uncontended {:?}",
        median(&contended),
        median(&uncontended)
    );
    assert!(
        contended.last().is_some_and(|max| *max < TIMEOUT / 2),
        "{contended:?}"
    );

    // The execute then commits, and its key replays.
    let _ = finish.send(());
    match executing.await?? {
        Execution::Executed(r) => assert_eq!(r.body(), b"slow done"),
        other => return Err(format!("the held execute: {other:?}").into()),
    }
    match store.begin(&slow, fp()).await? {
        Begin::Replay(r) => assert_eq!(r.body(), b"slow done"),
        other => return Err(format!("after the commit: {}", other.outcome()).into()),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_another_session_locks_fails_none_of_the_begins_beside_it() -> TestResult {
    let prefix = Prefix::new("lockedrow");
    let store = open(&prefix).await?;
    // A committed in-progress record, then a session that is not idemstore's locks its row.
    let held = scope("slow", "k")?;
    let Begin::Claimed(_claim) = store.begin(&held, fp()).await? else {
        return Err("the first begin did not claim".into());
    };
    let blocker = sqlx::PgPool::connect(prefix.url()).await?;
    let mut locked = blocker.begin().await?;
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {} WHERE tenant = 'slow' FOR UPDATE",
        prefix.table("records")
    )))
    .execute(&mut *locked)
    .await?;

    for w in 1..=WAVES {
        let (answer, times) = wave(&store, Some(&held), w).await?;
        assert_eq!(answer, Some("in_progress"));
        // The statement gives up on the lock and claims the halves again: a few lock waits
        // at most, never the statement timeout.
        assert!(times.last().is_some_and(|max| *max < TIMEOUT), "{times:?}");
        eprintln!("wave {w} beside a row locked by another session: {times:?}");
    }
    locked.rollback().await?;
    Ok(())
}
