//! What the relay delivers: order per subject through faults, dead letters, no starvation, a reopen.

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{
    BoxError, Faulty, Mutex, Outbox, OutboxHarness, Protocol, Relay, Shared, clock, commit_new,
    eventually, outbox_is, relay_config, within,
};
use crate::model::message::DeadLetter;

/// Four tasks commit 30 orders each, each task to a subject of its own (so that the
/// commits of one subject never overlap), some commits publishing two messages, while the
/// relay delivers through a sink that fails, times out and stalls: every committed id
/// arrives exactly once (failed attempts are never accepted), and per subject in commit
/// order.
pub async fn the_relay_delivers_every_message_in_order_per_subject_through_a_faulty_sink<
    H: OutboxHarness,
>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open_at(&harness.place(), clock()).await?;
    let sink = Arc::new(Faulty::default());
    let relay = Relay::start(&backend, Shared(sink.clone()), relay_config());
    let committed: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
    let mut tasks = Vec::new();
    for task in 0..4 {
        let subject = format!("ledger.s{task}");
        let mut keys = Vec::new();
        for i in 0..30 {
            let messages = if i % 5 == 0 { 2 } else { 1 };
            keys.push((format!("t{task}-{i}"), messages));
        }
        tasks.push((subject, keys));
    }
    let runs = tasks.into_iter().map(|(subject, keys)| {
        let committed = committed.clone();
        let backend = &backend;
        async move {
            for (key, n) in keys {
                let messages = (0..n)
                    .map(|m| (subject.clone(), format!("{key}/{m}").into_bytes()))
                    .collect();
                let ids = commit_new(harness, backend, &key, messages).await?;
                committed
                    .lock()
                    .entry(subject.clone())
                    .or_default()
                    .extend(ids);
            }
            Ok::<_, BoxError>(())
        }
    });
    for run in futures_join(runs).await {
        run?;
    }
    let committed = committed.lock().clone();
    let total: usize = committed.values().map(Vec::len).sum();
    assert_eq!(total, 4 * (30 + 6));
    eventually("every committed message delivered", || async {
        Ok(sink.accepted.lock().len() >= total)
    })
    .await?;
    outbox_is(&backend, 0, 0).await?;
    let stats = relay.stats();
    relay.stop().await;

    let accepted = sink.accepted();
    let ids: HashSet<&str> = accepted.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(
        accepted.len(),
        total,
        "deliveries: each message accepted once"
    );
    assert_eq!(ids.len(), total);
    assert_eq!(stats.delivered, total as u64, "{stats:?}");
    assert!(stats.retried > 0, "the sink did fail: {stats:?}");
    assert!(
        sink.failures.load(Ordering::Relaxed) > 10,
        "the sink did fail"
    );
    let mut arrived: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in &accepted {
        arrived
            .entry(m.subject.clone())
            .or_default()
            .push(m.id.clone());
    }
    assert_eq!(arrived, committed, "per subject, in commit order");
    Ok(())
}

/// Runs the futures at once on this task; their outputs in order.
async fn futures_join<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pinned: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in pinned.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// A message the sink always refuses moves to the dead letters after the relay's
/// `max_attempts` (4), with its last error, and its subject goes on; retried, it goes back
/// to the end of the outbox with its id and is delivered; dropped, it is gone.
pub async fn a_poison_message_is_dead_lettered_then_retried_or_dropped<H: OutboxHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open_at(&harness.place(), clock()).await?;
    let sink = Arc::new(Faulty::default());
    let relay = Relay::start(&backend, Shared(sink.clone()), relay_config());
    let (poison, good) = commit_two_poisoned_of_twelve(harness, &backend).await?;
    let dead = the_poison_is_dead_lettered(&backend, &sink, &poison, &good).await?;
    cure_then_retry_one_and_drop_the_other(&backend, &sink, &dead).await?;
    let stats = relay.stats();
    relay.stop().await;
    assert_eq!(stats.dead_lettered, 2, "{stats:?}");
    assert!(
        !sink.has(&dead[1].message.id),
        "the dropped one never arrived"
    );
    Ok(())
}

/// Twelve commits of one message each over two subjects, two of them poison: their ids,
/// (poison, good).
async fn commit_two_poisoned_of_twelve<H: OutboxHarness>(
    harness: &H,
    backend: &H::Backend,
) -> Result<(Vec<String>, Vec<String>), BoxError> {
    let mut poison = Vec::new();
    let mut good = Vec::new();
    for i in 0..12 {
        let payload = if i % 5 == 2 {
            b"poison".to_vec()
        } else {
            vec![i]
        };
        let is_poison = payload == b"poison";
        let ids = commit_new(
            harness,
            backend,
            &format!("k{i}"),
            vec![(format!("billing.s{}", i % 2), payload)],
        )
        .await?;
        if is_poison {
            poison.extend(ids);
        } else {
            good.extend(ids);
        }
    }
    assert_eq!(poison.len(), 2);
    Ok((poison, good))
}

/// The good messages are delivered; the poison ones are dead letters, in commit order, after
/// four attempts with the sink's refusal as their last error.
async fn the_poison_is_dead_lettered<B: Protocol + Outbox>(
    backend: &B,
    sink: &Faulty,
    poison: &[String],
    good: &[String],
) -> Result<Vec<DeadLetter>, BoxError> {
    outbox_is(backend, 0, 2).await?;
    assert!(
        good.iter().all(|id| sink.has(id)),
        "the good messages went on"
    );
    assert!(poison.iter().all(|id| !sink.has(id)));
    let dead = Outbox::dead_letters(backend, 10).await?;
    let dead_ids: Vec<&str> = dead.iter().map(|d| d.message.id.as_str()).collect();
    assert_eq!(
        dead_ids,
        poison.iter().map(String::as_str).collect::<Vec<_>>()
    );
    for letter in &dead {
        assert_eq!(letter.attempts, 4, "{letter:?}");
        assert!(letter.last_error.contains("refuses"), "{letter:?}");
        assert_eq!(letter.message.payload, b"poison");
    }
    assert_eq!(
        Outbox::dead_letters(backend, 1).await?.len(),
        1,
        "the limit"
    );
    Ok(dead)
}

/// With the sink cured, the first dead letter is retried (same id, at the end of the outbox)
/// and delivered; the second is dropped. Neither can be retried or dropped twice.
async fn cure_then_retry_one_and_drop_the_other<B: Protocol + Outbox>(
    backend: &B,
    sink: &Faulty,
    dead: &[DeadLetter],
) -> Result<(), BoxError> {
    sink.poison_cured.store(true, Ordering::SeqCst);
    let requeued = Outbox::retry_dead_letter(backend, dead[0].message.seq)
        .await?
        .ok_or("no dead letter to retry")?;
    assert_eq!(requeued.id, dead[0].message.id, "the id survives a retry");
    assert!(requeued.seq > dead[1].message.seq, "requeued at the end");
    let id = requeued.id.clone();
    eventually("the retried message delivered", || async {
        Ok(sink.has(&id))
    })
    .await?;
    assert!(Outbox::drop_dead_letter(backend, dead[1].message.seq).await?);
    assert!(
        !Outbox::drop_dead_letter(backend, dead[1].message.seq).await?,
        "already dropped"
    );
    assert!(
        Outbox::retry_dead_letter(backend, dead[0].message.seq)
            .await?
            .is_none(),
        "already retried"
    );
    outbox_is(backend, 0, 0).await
}

/// One subject whose messages all fail (retried, never given up within the case) fills
/// more than a batch ahead of other subjects: the others are delivered all the same, within
/// seconds, while it waits out its backoff; cured, it is delivered in order. (A relay that
/// read the first `batch` messages by seq read only the failing subject's, skipped them
/// while they waited, and read the same batch again: the others waited until the whole
/// subject was dead-lettered.)
pub async fn a_subject_that_keeps_failing_does_not_starve_the_others<H: OutboxHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let backend = harness.open_at(&harness.place(), clock()).await?;
    let mut stuck = Vec::new();
    for i in 0..3 {
        let poison = vec![("billing.stuck".to_owned(), b"poison".to_vec()); 2];
        stuck.extend(commit_new(harness, &backend, &format!("stuck{i}"), poison).await?);
    }
    let mut others = Vec::new();
    for i in 0..4u8 {
        let message = vec![(format!("billing.ok{}", i % 2), vec![i])];
        others.extend(commit_new(harness, &backend, &format!("ok{i}"), message).await?);
    }
    let sink = Arc::new(Faulty::default());
    let config = relay_config()
        .batch(4)
        .max_attempts(10_000)
        .backoff(Duration::from_millis(20), Duration::from_millis(200));
    let relay = Relay::start(&backend, Shared(sink.clone()), config);
    within(
        "the other subjects delivered past the failing one",
        Duration::from_secs(10),
        || async { Ok(others.iter().all(|id| sink.has(id))) },
    )
    .await?;
    assert!(
        stuck.iter().all(|id| !sink.has(id)),
        "the failing subject waits"
    );
    assert!(sink.failures.load(Ordering::Relaxed) > 0, "it was tried");
    sink.poison_cured.store(true, Ordering::SeqCst);
    outbox_is(&backend, 0, 0).await?;
    relay.stop().await;
    let arrived: Vec<String> = sink
        .accepted()
        .into_iter()
        .filter(|m| m.subject == "billing.stuck")
        .map(|m| m.id)
        .collect();
    assert_eq!(arrived, stuck, "the failing subject, in order, once cured");
    Ok(())
}

/// Messages committed while no relay runs are still pending after the backend is closed
/// and opened again, and a relay started then delivers them in commit order; what is
/// committed after the reopen comes after them.
pub async fn pending_messages_survive_a_reopen_and_are_delivered_after_it<H: OutboxHarness>(
    harness: &H,
) -> Result<(), BoxError> {
    let clock = clock();
    let place = harness.place();
    let backend = harness.open_at(&place, clock.clone()).await?;
    let mut ids = Vec::new();
    for i in 0..10u8 {
        ids.extend(
            commit_new(
                harness,
                &backend,
                &format!("k{i}"),
                vec![("s".into(), vec![i])],
            )
            .await?,
        );
    }
    drop(backend);
    let backend = harness.open_at(&place, clock.clone()).await?;
    assert_eq!(backend.stats().await?.outbox_pending, 10);
    ids.extend(commit_new(harness, &backend, "after", vec![("s".into(), vec![99])]).await?);
    let sink = Arc::new(Faulty::default());
    let relay = Relay::start(&backend, Shared(sink.clone()), relay_config());
    outbox_is(&backend, 0, 0).await?;
    relay.stop().await;
    let arrived: Vec<String> = sink.accepted().into_iter().map(|m| m.id).collect();
    assert_eq!(arrived, ids, "in commit order, across the reopen");
    Ok(())
}
