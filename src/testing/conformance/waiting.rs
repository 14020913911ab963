//! Waiting for a holder, abandoned work, tenants kept apart.

use std::time::Duration;

use super::{
    Begin, BoxError, Harness, Protocol, ProtocolClaim, Response, Settings, claimed, clock,
    fingerprint, scope, stored_response,
};

/// `begin_or_wait` waits for a live holder and answers its outcome: its response if it
/// completed, a claim if it released; past `max_wait` it answers `InProgress`.
pub async fn begin_or_wait_gets_the_outcome_of_the_holder<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let max_wait = Duration::from_secs(30);

    let key = scope("tenant-a", "order-0009");
    let holder = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let waiter = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            backend
                .begin_or_wait(&key, fingerprint("r"), max_wait)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let response = stored_response("9");
    holder.complete(response.clone()).await?;
    match waiter.await?? {
        Begin::Replay(replayed) => assert_eq!(replayed, response),
        other => return Err(format!("a waiter on a commit: got {}", other.outcome()).into()),
    }

    let key = scope("tenant-a", "order-0010");
    let holder = claimed(backend.begin(&key, fingerprint("r")).await?, "new")?;
    let waiter = tokio::spawn({
        let (backend, key) = (backend.clone(), key.clone());
        async move {
            backend
                .begin_or_wait(&key, fingerprint("r"), max_wait)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    holder.release().await?;
    let claim = match waiter.await?? {
        Begin::Claimed(claim) => claim,
        other => return Err(format!("a waiter on a release: got {}", other.outcome()).into()),
    };

    let started = tokio::time::Instant::now();
    let answer = backend
        .begin_or_wait(&key, fingerprint("r"), Duration::from_millis(200))
        .await?;
    assert!(
        matches!(answer, Begin::InProgress { .. }),
        "got {}",
        answer.outcome()
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by max_wait"
    );
    claim.release().await?;
    Ok(())
}

/// `abandoned` lists in-progress records whose lease ended, oldest lease first, with what a
/// reconciler needs to take them over; live leases and completed records are not listed.
pub async fn abandoned_lists_expired_leases_oldest_first<H: Harness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let settings = Settings::default();
    let backend = harness.open(settings, clock.clone()).await?;
    let mut held = Vec::new();
    for i in 0..3 {
        let key = scope("tenant-a", &format!("abandoned-{i}"));
        let mut claim = claimed(
            backend.begin(&key, fingerprint(&format!("r{i}"))).await?,
            "new",
        )?;
        claim.checkpoint(format!("step {i}").into_bytes()).await?;
        held.push(claim);
        clock.advance(Duration::from_secs(1));
    }
    let done = claimed(
        backend
            .begin(&scope("tenant-a", "completed-1"), fingerprint("r"))
            .await?,
        "new",
    )?;
    done.complete(Response::new(200, "ok")).await?;
    assert!(
        backend.abandoned(10).await?.is_empty(),
        "every lease is live"
    );

    clock.advance(settings.lease);
    let fresh = claimed(
        backend
            .begin(&scope("tenant-a", "live-1"), fingerprint("r"))
            .await?,
        "new",
    )?;
    let listed = backend.abandoned(10).await?;
    let keys: Vec<&str> = listed.iter().map(|a| a.scope.key()).collect();
    assert_eq!(keys, ["abandoned-0", "abandoned-1", "abandoned-2"]);
    for (i, abandoned) in listed.iter().enumerate() {
        assert_eq!(abandoned.fingerprint, fingerprint(&format!("r{i}")));
        assert_eq!(abandoned.fence, held[i].fence());
        assert_eq!(abandoned.attempt, 1);
        assert_eq!(
            abandoned.checkpoint.as_deref(),
            Some(format!("step {i}").as_bytes())
        );
    }
    assert_eq!(backend.abandoned(2).await?.len(), 2, "at most the limit");
    // A reconciler takes one over with the listed fingerprint.
    let first = &listed[0];
    let taken = match backend.begin(&first.scope, first.fingerprint).await? {
        Begin::Recovered(claim) => claim,
        other => return Err(format!("expected Recovered, got {}", other.outcome()).into()),
    };
    taken.complete(Response::new(200, "reconciled")).await?;
    assert_eq!(backend.abandoned(10).await?.len(), 2);
    fresh.release().await?;
    Ok(())
}

/// The same operation and key under two tenants are two independent operations.
pub async fn tenants_never_see_each_other<H: Harness>(harness: &H) -> Result<(), BoxError> {
    let backend = harness.open(Settings::default(), clock()).await?;
    let (a, b) = (
        scope("tenant-a", "shared-key-1"),
        scope("tenant-b", "shared-key-1"),
    );
    let claim_a = claimed(backend.begin(&a, fingerprint("a's request")).await?, "a")?;
    let claim_b = match backend.begin(&b, fingerprint("b's request")).await? {
        Begin::Claimed(claim) => claim,
        other => return Err(format!("tenant b: expected Claimed, got {}", other.outcome()).into()),
    };
    claim_a.complete(Response::new(201, "for a")).await?;
    claim_b.complete(Response::new(201, "for b")).await?;
    for (scope, request, body) in [(&a, "a's request", "for a"), (&b, "b's request", "for b")] {
        match backend.begin(scope, fingerprint(request)).await? {
            Begin::Replay(response) => assert_eq!(response.body(), body.as_bytes()),
            other => return Err(format!("{scope}: got {}", other.outcome()).into()),
        }
    }
    Ok(())
}
