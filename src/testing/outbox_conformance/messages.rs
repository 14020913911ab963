//! What a commit records: no message without the commit, ids from the downstream key, the payload.

use std::sync::Arc;
use std::time::Duration;

use super::{
    Begin, BoxError, Clock, Committed, Ending, Faulty, Fingerprint, OutboxHarness, Protocol,
    ProtocolClaim, Relay, Shared, claim, clock, outbox_is, relay_config, scope,
};

/// A commit whose work fails after publishing, and a commit by a holder that another
/// attempt took over, leave no message; the holder's own commit does.
pub async fn a_rolled_back_or_stale_commit_leaves_no_message<H: OutboxHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let backend = harness.open_at(&harness.place(), clock.clone()).await?;
    let failing = claim(&backend, "rolled-back").await?;
    let ended = harness
        .commit(
            failing,
            vec![("orders.placed".into(), b"1".to_vec())],
            Ending::Fail,
        )
        .await?;
    assert_eq!(ended, Committed::RolledBack);
    let stats = backend.stats().await?;
    assert_eq!(stats.outbox_pending, 0, "a rolled-back commit's message");

    let first = claim(&backend, "taken-over").await?;
    clock.advance(backend.limits().lease);
    let second = match backend
        .begin(&scope("taken-over"), Fingerprint::of_bytes(b"taken-over"))
        .await?
    {
        Begin::Recovered(claim) => claim,
        other => return Err(format!("expected Recovered, got {}", other.outcome()).into()),
    };
    let stale = harness
        .commit(
            first,
            vec![("orders.placed".into(), b"2".to_vec())],
            Ending::Commit,
        )
        .await?;
    assert_eq!(stale, Committed::Stale);
    let stats = backend.stats().await?;
    assert_eq!(stats.outbox_pending, 0, "a stale commit's message");

    let kept = harness
        .commit(
            second,
            vec![("orders.placed".into(), b"3".to_vec())],
            Ending::Commit,
        )
        .await?;
    assert!(
        matches!(kept, Committed::Kept(ref ids) if ids.len() == 1),
        "{kept:?}"
    );
    let stats = backend.stats().await?;
    assert_eq!(stats.outbox_pending, 1, "the holder's message");
    assert_eq!(
        stats.oldest_pending_message,
        Some(Duration::ZERO),
        "{stats:?}"
    );
    Ok(())
}

/// A message's id is the claim's downstream key (the same for every attempt of the
/// operation), a dash and its index in the commit; it arrives with its subject, payload and
/// commit time.
pub async fn committed_messages_carry_the_downstream_key_and_index_and_their_payload<
    H: OutboxHarness,
>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let backend = harness.open_at(&harness.place(), clock.clone()).await?;
    let first = claim(&backend, "order-1").await?;
    let downstream = first.downstream_key();
    clock.advance(backend.limits().lease);
    // A recovered attempt publishes under the same key as the first would have.
    let recovered = match backend
        .begin(&scope("order-1"), Fingerprint::of_bytes(b"order-1"))
        .await?
    {
        Begin::Recovered(claim) => claim,
        other => return Err(format!("expected Recovered, got {}", other.outcome()).into()),
    };
    drop(first);
    let committed_at = clock.now();
    let payloads: Vec<(String, Vec<u8>)> = vec![
        ("orders.placed".into(), vec![0, 255, 10, 13]),
        ("orders.billed".into(), b"{\"total\":3}".to_vec()),
        ("orders.placed".into(), Vec::new()),
    ];
    let ids = match harness
        .commit(recovered, payloads.clone(), Ending::Commit)
        .await?
    {
        Committed::Kept(ids) => ids,
        other => return Err(format!("expected Kept, got {other:?}").into()),
    };
    let expected: Vec<String> = (0..3).map(|i| format!("{downstream}-{i}")).collect();
    assert_eq!(ids, expected);

    let sink = Arc::new(Faulty::default());
    let relay = Relay::start(&backend, Shared(sink.clone()), relay_config());
    outbox_is(&backend, 0, 0).await?;
    relay.stop().await;
    let accepted = sink.accepted();
    let got: Vec<(String, String, Vec<u8>)> = accepted
        .iter()
        .map(|m| (m.id.clone(), m.subject.clone(), m.payload.clone()))
        .collect();
    let want: Vec<(String, String, Vec<u8>)> = ids
        .iter()
        .cloned()
        .zip(payloads)
        .map(|(id, (subject, payload))| (id, subject, payload))
        .collect();
    let mut got_sorted = got.clone();
    got_sorted.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(got_sorted, want_sorted, "each message once, as published");
    assert!(
        accepted.iter().all(|m| m.committed_at == committed_at),
        "committed at the clock's time: {accepted:?}"
    );
    Ok(())
}
