//! `execute`: claim, work and completion in one transaction, on every backend that has it.
//! The work writes one business row, so each case counts side effects in two ways: how many
//! times the work ran, and the rows that committed.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{
    AtomicU32, Begin, BoxError, CommitError, Fingerprint, Harness, Protocol, ProtocolClaim,
    Response, Scope, Settings, claimed, clock, fingerprint, scope, stored_response,
};
use crate::error::ExecuteError;
use crate::model::execution::Execution;

/// What the work does after it has written its row.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Work {
    /// Answers this response.
    Answer(Response),
    /// Returns an error.
    Fail,
    /// Panics.
    Panic,
}

/// A backend with a one-step `execute` ([`Store::execute`](crate::Store::execute),
/// [`PgStore::execute`](crate::PgStore::execute)), and a business table the work writes.
///
/// [`PgStore::execute`]: crate::PgStore::execute
pub trait ExecuteHarness: Harness {
    /// Runs `execute` for `scope` and `fingerprint` on `backend`. The work adds one to `ran`,
    /// inserts the business row `row`, then does what `work` says.
    fn execute(
        backend: &Self::Backend,
        scope: &Scope,
        fingerprint: Fingerprint,
        row: String,
        work: Work,
        ran: Arc<AtomicU32>,
    ) -> impl Future<Output = Result<Execution, ExecuteError>> + Send;

    /// The business rows committed so far, sorted.
    fn rows(backend: &Self::Backend) -> impl Future<Output = Result<Vec<String>, BoxError>> + Send;
}

/// The work of a harness's `execute`, once its row is written: the one place that turns a
/// [`Work`] into its outcome.
pub(crate) fn finish(work: Work) -> Result<Response, BoxError> {
    match work {
        Work::Answer(response) => Ok(response),
        Work::Fail => Err("the work was asked to fail".into()),
        Work::Panic => panic!("the work was asked to panic"),
    }
}

/// The first run stores its response with its row; a retry replays it byte for byte without
/// running the work, another request with the key is refused, and `begin` sees the same
/// completed record.
pub async fn execute_runs_once_and_replays_byte_for_byte<H: ExecuteHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let (key, ran) = (scope("tenant-a", "exec-0001"), Arc::new(AtomicU32::new(0)));
    let response = stored_response("exec-0001");
    let run = |request: &'static str| {
        let work = Work::Answer(response.clone());
        H::execute(
            &backend,
            &key,
            fingerprint(request),
            "row-1".into(),
            work,
            ran.clone(),
        )
    };
    match run("r").await? {
        Execution::Executed(stored) => assert_eq!(stored, response),
        other => return Err(format!("first execute: expected Executed, got {other:?}").into()),
    }
    match run("r").await? {
        Execution::Replay(stored) => assert_eq!(stored, response, "replayed byte for byte"),
        other => return Err(format!("retry: expected Replay, got {other:?}").into()),
    }
    let other = run("another request").await?;
    assert!(matches!(other, Execution::Mismatch), "{other:?}");
    match backend.begin(&key, fingerprint("r")).await? {
        Begin::Replay(stored) => assert_eq!(stored, response),
        other => return Err(format!("begin after execute: got {}", other.outcome()).into()),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the work ran once");
    assert_eq!(H::rows(&backend).await?, vec!["row-1".to_owned()]);
    let stats = backend.stats().await?;
    assert_eq!((stats.completed, stats.in_progress), (1, 0), "{stats:?}");
    Ok(())
}

/// Work that fails or panics keeps none of its writes and leaves the key free: the retry runs
/// it again, and `begin` would claim it.
pub async fn failed_or_panicked_execute_writes_nothing<H: ExecuteHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let (key, ran) = (scope("tenant-a", "exec-0002"), Arc::new(AtomicU32::new(0)));
    let attempt = |work| {
        H::execute(
            &backend,
            &key,
            fingerprint("r"),
            "row-2".into(),
            work,
            ran.clone(),
        )
    };
    let failed = attempt(Work::Fail).await;
    assert!(
        matches!(failed, Err(ExecuteError::Aborted(_))),
        "{failed:?}"
    );
    let panicked = attempt(Work::Panic).await;
    assert!(
        matches!(panicked, Err(ExecuteError::Panicked(_))),
        "{panicked:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    assert!(H::rows(&backend).await?.is_empty(), "no row kept");
    let stats = backend.stats().await?;
    assert_eq!((stats.records, stats.in_progress), (0, 0), "{stats:?}");

    let response = Work::Answer(Response::new(201, "third time"));
    let third = attempt(response).await?;
    assert!(matches!(third, Execution::Executed(_)), "{third:?}");
    assert_eq!(H::rows(&backend).await?, vec!["row-2".to_owned()]);
    Ok(())
}

/// A live two-phase claim keeps its key from `execute` (`InProgress`, nothing runs); once its
/// lease ends, `execute` takes the key over and runs, and the old holder is stale.
pub async fn execute_defers_to_a_live_claim_and_takes_over_an_expired_one<H: ExecuteHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let (key, ran) = (scope("tenant-a", "exec-0003"), Arc::new(AtomicU32::new(0)));
    let holder = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let answer = || Work::Answer(Response::new(201, "by execute"));
    let busy = H::execute(
        &backend,
        &key,
        fingerprint("r"),
        "row-3".into(),
        answer(),
        ran.clone(),
    )
    .await?;
    assert!(matches!(busy, Execution::InProgress { .. }), "{busy:?}");
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "nothing ran under a live claim"
    );

    clock.advance(settings.lease);
    let taken = H::execute(
        &backend,
        &key,
        fingerprint("r"),
        "row-3".into(),
        answer(),
        ran.clone(),
    )
    .await?;
    assert!(matches!(taken, Execution::Executed(_)), "{taken:?}");
    let late = holder.complete(Response::new(201, "by the holder")).await;
    assert!(matches!(late, Err(CommitError::Stale(_))), "{late:?}");
    match backend.begin(&key, fingerprint("r")).await? {
        Begin::Replay(stored) => assert_eq!(stored.body(), b"by execute"),
        other => return Err(format!("after the take-over: got {}", other.outcome()).into()),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 1);
    assert_eq!(H::rows(&backend).await?, vec!["row-3".to_owned()]);
    Ok(())
}

/// 64 tasks racing `execute` on each of 8 keys: each key's work runs and commits its row
/// exactly once, and every task gets that run's response.
pub async fn sixty_four_racing_executes_run_each_key_once<H: ExecuteHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    const KEYS: usize = 8;
    let backend = harness.open(Settings::default(), clock()).await?;
    let ran: Arc<Vec<Arc<AtomicU32>>> =
        Arc::new((0..KEYS).map(|_| Arc::new(AtomicU32::new(0))).collect());
    let mut racing = tokio::task::JoinSet::new();
    for task in 0..64 {
        for k in 0..KEYS {
            let (backend, ran) = (backend.clone(), ran.clone());
            racing.spawn(async move {
                let key = scope("tenant-a", &format!("exec-raced-{k}"));
                let work = Work::Answer(Response::new(201, format!("key {k} by task {task}")));
                let row = format!("row-{k}");
                let done = H::execute(
                    &backend,
                    &key,
                    fingerprint("same"),
                    row,
                    work,
                    ran[k].clone(),
                )
                .await;
                (k, done)
            });
        }
    }
    let mut bodies: Vec<HashSet<Vec<u8>>> = vec![HashSet::new(); KEYS];
    let mut executed = [0u32; KEYS];
    while let Some(joined) = racing.join_next().await {
        let (k, done) = joined?;
        match done? {
            Execution::Executed(response) => {
                executed[k] += 1;
                bodies[k].insert(response.into_body());
            }
            Execution::Replay(response) => {
                bodies[k].insert(response.into_body());
            }
            other => return Err(format!("a racer on key {k} got {other:?}").into()),
        }
    }
    assert_eq!(executed, [1; KEYS], "Executed answers per key");
    for (k, seen) in bodies.iter().enumerate() {
        assert_eq!(
            seen.len(),
            1,
            "key {k}: every racer got the one stored response"
        );
    }
    let runs: Vec<u32> = ran.iter().map(|r| r.load(Ordering::SeqCst)).collect();
    assert_eq!(runs, vec![1; KEYS], "the work ran once per key");
    let rows = H::rows(&backend).await?;
    assert_eq!(
        rows,
        (0..KEYS).map(|k| format!("row-{k}")).collect::<Vec<_>>()
    );
    Ok(())
}
