//! Real tasks racing the same keys: each key's work runs once.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{
    AtomicU32, Begin, BoxError, Harness, Protocol, ProtocolClaim, Response, Settings, claimed,
    clock, fingerprint, scope,
};

/// Races `tasks` tasks on each of `keys` keys: every task retries until it has the key's
/// response. Returns how many times the work ran per key.
async fn race<P: Protocol>(backend: &P, keys: usize, tasks: usize) -> Result<Vec<u32>, BoxError> {
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..keys).map(|_| AtomicU32::new(0)).collect());
    let mut racing = tokio::task::JoinSet::new();
    for task in 0..tasks {
        for k in 0..keys {
            let (backend, runs) = (backend.clone(), runs.clone());
            racing.spawn(async move {
                let key = scope("tenant-a", &format!("raced-{k:03}"));
                loop {
                    match backend.begin(&key, fingerprint("same request")).await? {
                        Begin::Claimed(claim) | Begin::Recovered(claim) => {
                            runs[k].fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await;
                            let body = format!("key {k} by task {task}");
                            let stored = claim.complete(Response::new(201, body)).await?;
                            return Ok::<_, BoxError>((k, stored.into_body()));
                        }
                        Begin::Replay(response) => return Ok((k, response.into_body())),
                        Begin::InProgress { .. } => tokio::task::yield_now().await,
                        other => return Err(format!("a racer got {}", other.outcome()).into()),
                    }
                }
            });
        }
    }
    let mut bodies: Vec<HashSet<Vec<u8>>> = vec![HashSet::new(); keys];
    while let Some(done) = racing.join_next().await {
        let (k, body) = done??;
        bodies[k].insert(body);
    }
    for (k, seen) in bodies.iter().enumerate() {
        assert_eq!(
            seen.len(),
            1,
            "key {k}: every racer got the one stored response"
        );
    }
    Ok(runs.iter().map(|r| r.load(Ordering::SeqCst)).collect())
}

/// 64 tasks racing each of 8 keys: the work runs exactly once per key, and every task gets
/// that run's response.
pub async fn sixty_four_racing_tasks_run_each_key_once<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let runs = race(&backend, 8, 64).await?;
    assert_eq!(runs, vec![1; 8], "side effects per key");
    let stats = backend.stats().await?;
    assert_eq!((stats.completed, stats.in_progress), (8, 0), "{stats:?}");
    Ok(())
}

/// 64 tasks racing to take over one expired lease: exactly one recovers it, and the work runs
/// once more, not 64 times.
pub async fn sixty_four_racing_take_overs_recover_once<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let key = scope("tenant-a", "raced-000");
    let crashed = claimed(
        backend.begin(&key, fingerprint("same request")).await?,
        "new",
    )?;
    clock.advance(settings.lease);
    let recovered = Arc::new(AtomicU32::new(0));
    let mut racing = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let (backend, key, recovered) = (backend.clone(), key.clone(), recovered.clone());
        racing.spawn(async move {
            match backend.begin(&key, fingerprint("same request")).await? {
                Begin::Recovered(claim) => {
                    recovered.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(Some(claim))
                }
                Begin::InProgress { .. } => Ok(None),
                other => Err(format!("a racer got {}", other.outcome()).into()),
            }
        });
    }
    let mut winner = None;
    while let Some(done) = racing.join_next().await {
        if let Some(claim) = done?? {
            winner = Some(claim);
        }
    }
    assert_eq!(
        recovered.load(Ordering::SeqCst),
        1,
        "take-overs of one lease"
    );
    let winner = winner.ok_or("nobody took the lease over")?;
    assert_eq!(winner.attempt(), 2);
    winner.complete(Response::new(201, "once")).await?;
    drop(crashed);
    Ok(())
}

/// 80 `begin`s released at once: 16 keys, each begun by four tasks with one request and by a
/// fifth with another, so the backend's group commit (the local writer's groups, the
/// PostgreSQL claim batches) holds keys twice, new keys, and mismatches together. Each key is
/// claimed exactly once, with a fence of its own; every other `begin` of it answers what its
/// request makes of the claim (`InProgress` for the same request, `Mismatch` for another); and
/// once completed, each claimer's request replays.
pub async fn a_burst_of_begins_gets_one_claim_per_key_and_exact_answers<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    const KEYS: usize = 16;
    let backend = harness.open(Settings::default(), clock()).await?;
    let start = Arc::new(tokio::sync::Barrier::new(KEYS * 5));
    let mut racing = tokio::task::JoinSet::new();
    for k in 0..KEYS {
        for task in 0..5 {
            let (backend, start) = (backend.clone(), start.clone());
            let request = if task == 4 {
                "another request"
            } else {
                "the request"
            };
            racing.spawn(async move {
                let key = scope("tenant-a", &format!("burst-{k:02}"));
                start.wait().await;
                let answer = backend.begin(&key, fingerprint(request)).await?;
                Ok::<_, BoxError>((k, request, answer))
            });
        }
    }
    let mut answers: Vec<Vec<(&str, Begin<_>)>> = (0..KEYS).map(|_| Vec::new()).collect();
    while let Some(done) = racing.join_next().await {
        let (k, request, answer) = done??;
        answers[k].push((request, answer));
    }
    let mut fences = HashSet::new();
    for (k, answered) in answers.into_iter().enumerate() {
        let (mut claims, mut others) = (Vec::new(), Vec::new());
        for (request, answer) in answered {
            match answer {
                Begin::Claimed(claim) => claims.push((request, claim)),
                other => others.push((request, other)),
            }
        }
        assert_eq!(claims.len(), 1, "key {k}: claims");
        let (winner, claim) = claims.pop().ok_or("no claim")?;
        assert!(
            fences.insert(claim.fence()),
            "key {k}: a fence handed out twice"
        );
        for (request, other) in &others {
            match other {
                Begin::InProgress { .. } if *request == winner => {}
                Begin::Mismatch if *request != winner => {}
                other => {
                    return Err(format!(
                        "key {k}: {request:?} got {} while {winner:?} held the key",
                        other.outcome()
                    )
                    .into());
                }
            }
        }
        claim
            .complete(Response::new(201, format!("burst {k}")))
            .await?;
        let key = scope("tenant-a", &format!("burst-{k:02}"));
        match backend.begin(&key, fingerprint(winner)).await? {
            Begin::Replay(response) => assert_eq!(response.body(), format!("burst {k}").as_bytes()),
            other => return Err(format!("key {k}: a retry got {}", other.outcome()).into()),
        }
    }
    Ok(())
}
