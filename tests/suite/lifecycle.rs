//! The state machine end to end: each outcome of `begin` and each operation on a claim, with a
//! manual clock.

use crate::common;

use std::time::Duration;

use common::{LEASE, ORDERS, TestResult, clock, fp, open, order_count, orders, scope};
use idemstore::{Begin, ClaimError, CommitError, RecordState, Response, Scope, StaleReason, Store};

fn claim(
    store: &Store,
    key: &str,
    request: &str,
) -> Result<idemstore::Claim, Box<dyn std::error::Error>> {
    match store.begin(&scope(key), fp(request))? {
        Begin::Claimed(claim) => Ok(claim),
        other => Err(format!("expected Claimed, got {other:?}").into()),
    }
}

#[test]
fn same_key_different_payload_is_a_mismatch_and_changes_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;

    // Against an in-progress record.
    let held = claim(&store, "k1", "amount=100")?;
    let before = store.get(&scope("k1"))?;
    assert!(matches!(
        store.begin(&scope("k1"), fp("amount=999"))?,
        Begin::Mismatch
    ));
    assert_eq!(store.get(&scope("k1"))?, before);

    // Against a completed record.
    held.commit(|_| Ok(Response::new(201, b"first".to_vec())))?;
    let before = store.get(&scope("k1"))?;
    let groups = store.stats()?.groups_committed;
    assert!(matches!(
        store.begin(&scope("k1"), fp("amount=999"))?,
        Begin::Mismatch
    ));
    assert_eq!(store.get(&scope("k1"))?, before);
    assert_eq!(
        store.stats()?.groups_committed,
        groups,
        "a mismatch commits nothing"
    );
    Ok(())
}

#[test]
fn completed_key_replays_byte_for_byte_including_a_stored_500() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let body: Vec<u8> = (0..=255u8).cycle().take(4000).collect();
    let stored = Response::new(500, body.clone())
        .with_header("content-type", b"application/problem+json".to_vec())
        .with_header("x-request-id", vec![0, 159, 255]);

    let expected = stored.clone();
    let answered = claim(&store, "k", "req")?.commit(move |_| Ok(stored))?;
    assert_eq!(answered, expected);

    let before = store.stats()?;
    for _ in 0..3 {
        match store.begin(&scope("k"), fp("req"))? {
            Begin::Replay(replayed) => {
                assert_eq!(replayed, expected);
                assert_eq!(replayed.status(), 500);
                assert_eq!(replayed.body(), body.as_slice());
                assert_eq!(
                    replayed.header("Content-Type"),
                    Some(&b"application/problem+json"[..])
                );
            }
            other => return Err(format!("expected Replay, got {other:?}").into()),
        }
    }
    let after = store.stats()?;
    assert_eq!(
        after.groups_committed, before.groups_committed,
        "replays write nothing"
    );
    assert_eq!(
        after.writer_requests, before.writer_requests,
        "replays never reach the writer"
    );
    assert_eq!(after.replays, before.replays + 3);
    Ok(())
}

#[test]
fn live_lease_answers_in_progress_within_the_remaining_lease() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    let _held = claim(&store, "k", "req")?;
    let groups = store.stats()?.groups_committed;

    match store.begin(&scope("k"), fp("req"))? {
        // Just claimed, no completion of the operation seen: the shortest wait.
        Begin::InProgress { retry_after } => assert_eq!(retry_after, Duration::from_secs(1)),
        other => return Err(format!("expected InProgress, got {other:?}").into()),
    }
    clock.advance(Duration::from_millis(20_000));
    match store.begin(&scope("k"), fp("req"))? {
        // As long again as it has run, cut at the end of its lease.
        Begin::InProgress { retry_after } => {
            assert_eq!(retry_after, LEASE - Duration::from_millis(20_000));
        }
        other => return Err(format!("expected InProgress, got {other:?}").into()),
    }
    assert_eq!(
        store.stats()?.groups_committed,
        groups,
        "InProgress writes nothing"
    );
    Ok(())
}

#[test]
fn expired_lease_is_recovered_as_attempt_two_with_the_checkpoint_and_fences_off_the_old_holder()
-> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    let mut old = claim(&store, "k", "req")?;
    let downstream = old.downstream_key();
    old.checkpoint(b"charged ch_123".to_vec())?;
    assert_eq!(old.last_checkpoint(), Some(&b"charged ch_123"[..]));

    clock.advance(LEASE);
    let new = match store.begin(&scope("k"), fp("req"))? {
        Begin::Recovered(claim) => claim,
        other => return Err(format!("expected Recovered, got {other:?}").into()),
    };
    assert_eq!(new.attempt(), 2);
    assert_eq!(new.last_checkpoint(), Some(&b"charged ch_123"[..]));
    assert!(new.fence() > old.fence());
    assert_eq!(new.downstream_key(), downstream, "stable across attempts");

    let record = store.get(&scope("k"))?;
    let stale = |e: &ClaimError| matches!(e, ClaimError::Stale(s) if s.reason == StaleReason::TakenOver { current_fence: new.fence() });
    let err = old
        .extend(Duration::from_secs(60))
        .err()
        .ok_or("stale extend succeeded")?;
    assert!(stale(&err), "{err}");
    let err = old
        .checkpoint(b"overwrite".to_vec())
        .err()
        .ok_or("stale checkpoint succeeded")?;
    assert!(stale(&err), "{err}");
    match old.commit(|tx| {
        tx.insert(&ORDERS, "stale-order", "x")?;
        Ok(Response::new(201, b"stale".to_vec()))
    }) {
        Err(CommitError::Stale(s)) => assert_eq!(
            s.reason,
            StaleReason::TakenOver {
                current_fence: new.fence()
            }
        ),
        other => return Err(format!("expected a stale commit, got {other:?}").into()),
    }
    assert_eq!(
        store.get(&scope("k"))?,
        record,
        "stale operations changed the record"
    );
    assert_eq!(
        order_count(&store)?,
        0,
        "a stale commit wrote a business row"
    );

    // A stale release, on a second key.
    let old = claim(&store, "k2", "req")?;
    clock.advance(LEASE);
    let new2 = match store.begin(&scope("k2"), fp("req"))? {
        Begin::Recovered(claim) => claim,
        other => return Err(format!("expected Recovered, got {other:?}").into()),
    };
    let record = store.get(&scope("k2"))?;
    let err = old.release().err().ok_or("stale release succeeded")?;
    assert!(matches!(err, ClaimError::Stale(_)), "{err}");
    assert_eq!(store.get(&scope("k2"))?, record);

    // The new holders finish normally.
    new.commit(|tx| {
        tx.insert(&ORDERS, "order", "ok")?;
        Ok(Response::new(201, b"done".to_vec()))
    })?;
    new2.release()?;
    assert_eq!(orders(&store)?, vec![("order".to_owned(), "ok".to_owned())]);
    Ok(())
}

#[test]
fn released_key_is_claimed_again_with_a_new_fence() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let first = claim(&store, "k", "req")?;
    let first_fence = first.fence();
    let first_downstream = first.downstream_key();
    first.release()?;
    assert_eq!(store.get(&scope("k"))?, None);
    assert_eq!(store.exact_stats()?.in_progress, 0);

    let second = claim(&store, "k", "req")?;
    assert!(second.fence() > first_fence, "fences never repeat");
    assert_eq!(second.attempt(), 1);
    assert_eq!(
        second.downstream_key(),
        first_downstream,
        "the downstream key names the request, which a release does not change"
    );
    second.release()?;
    let other = claim(&store, "k", "another request")?;
    assert_ne!(other.downstream_key(), first_downstream, "another request");
    Ok(())
}

#[test]
fn extend_moves_the_lease_and_its_index_entry() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    let mut held = claim(&store, "k", "req")?;
    clock.advance(Duration::from_secs(20));
    held.extend(Duration::from_secs(60))?;
    clock.advance(Duration::from_secs(30)); // past the original lease
    match store.begin(&scope("k"), fp("req"))? {
        Begin::InProgress { retry_after } => assert_eq!(retry_after, Duration::from_secs(30)),
        other => return Err(format!("expected InProgress, got {other:?}").into()),
    }
    match store.get(&scope("k"))?.map(|r| r.state().clone()) {
        Some(RecordState::InProgress { lease_until, .. }) => {
            assert_eq!(lease_until, held.lease_until())
        }
        other => return Err(format!("expected an in-progress record, got {other:?}").into()),
    }
    assert_eq!(
        store.exact_stats()?.in_progress,
        1,
        "the old index entry was moved, not copied"
    );
    assert!(matches!(
        held.extend(Duration::ZERO),
        Err(ClaimError::InvalidLease { .. })
    ));
    Ok(())
}

#[test]
fn an_expired_lease_nobody_took_over_can_still_commit() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    let held = claim(&store, "k", "req")?;
    clock.advance(LEASE * 2);
    held.commit(|_| Ok(Response::new(200, b"late but unopposed".to_vec())))?;
    assert!(matches!(
        store.begin(&scope("k"), fp("req"))?,
        Begin::Replay(_)
    ));
    Ok(())
}

#[test]
fn the_same_key_under_two_tenants_is_two_independent_operations() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let a = Scope::new("tenant-a", "create_order", "shared-key")?;
    let b = Scope::new("tenant-b", "create_order", "shared-key")?;

    let (Begin::Claimed(claim_a), Begin::Claimed(claim_b)) = (
        store.begin(&a, fp("a's order"))?,
        store.begin(&b, fp("b's order"))?,
    ) else {
        return Err("both tenants should claim".into());
    };
    assert_ne!(claim_a.downstream_key(), claim_b.downstream_key());
    claim_a.commit(|tx| {
        tx.insert(&ORDERS, "a-1", "a")?;
        Ok(Response::new(201, b"a".to_vec()))
    })?;
    // b is still in progress; a's completion did not touch it.
    assert!(matches!(
        store.begin(&b, fp("b's order"))?,
        Begin::InProgress { .. }
    ));
    claim_b.commit(|tx| {
        tx.insert(&ORDERS, "b-1", "b")?;
        Ok(Response::new(201, b"b".to_vec()))
    })?;
    match (
        store.begin(&a, fp("a's order"))?,
        store.begin(&b, fp("b's order"))?,
    ) {
        (Begin::Replay(ra), Begin::Replay(rb)) => {
            assert_eq!(ra.body(), b"a");
            assert_eq!(rb.body(), b"b");
        }
        other => return Err(format!("expected two replays, got {other:?}").into()),
    }
    // Neither tenant's fingerprint is compared with the other's.
    assert!(matches!(store.begin(&a, fp("b's order"))?, Begin::Mismatch));
    assert_eq!(order_count(&store)?, 2);
    Ok(())
}

#[test]
fn a_dropped_claim_stays_in_progress_until_its_lease_expires() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    drop(claim(&store, "k", "req")?);
    assert!(matches!(
        store.begin(&scope("k"), fp("req"))?,
        Begin::InProgress { .. }
    ));
    clock.advance(LEASE);
    assert!(
        matches!(store.begin(&scope("k"), fp("req"))?, Begin::Recovered(c) if c.attempt() == 2)
    );
    Ok(())
}

#[test]
fn a_failed_commit_closure_returns_the_claim_for_release_or_a_failure_response() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let held = claim(&store, "k", "req")?;
    let err = held
        .commit(|tx| {
            tx.insert(&ORDERS, "half", "written")?;
            Err("card declined".into())
        })
        .err()
        .ok_or("a failing closure committed")?;
    assert!(err.to_string().contains("card declined"), "{err}");
    let held = err.into_claim().ok_or("the claim should come back")?;
    assert_eq!(order_count(&store)?, 0);

    // Commit the deterministic failure instead: replayed like a success.
    held.commit(|_| Ok(Response::new(402, b"card declined".to_vec())))?;
    match store.begin(&scope("k"), fp("req"))? {
        Begin::Replay(r) => assert_eq!(r.status(), 402),
        other => return Err(format!("expected Replay, got {other:?}").into()),
    }

    // A panicking closure is contained the same way.
    let held = claim(&store, "k2", "req")?;
    let err = held
        .commit(|tx| {
            tx.insert(&ORDERS, "panic", "written")?;
            panic!("handler bug")
        })
        .err()
        .ok_or("a panicking closure committed")?;
    assert!(matches!(err, CommitError::Panicked { ref message, .. } if message == "handler bug"));
    err.into_claim()
        .ok_or("the claim should come back")?
        .release()?;
    assert_eq!(order_count(&store)?, 0);
    assert!(matches!(
        store.begin(&scope("k2"), fp("req"))?,
        Begin::Claimed(_)
    ));
    Ok(())
}

#[test]
fn calling_the_store_from_inside_a_closure_is_an_error_not_a_deadlock() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let inner = store.clone();
    let err = store
        .write(move |_| {
            let _outcome = inner.begin(&scope("k"), fp("req"))?;
            Ok(())
        })
        .err()
        .ok_or("a re-entrant begin succeeded")?;
    assert!(
        err.to_string().contains("inside a commit or write closure"),
        "{err}"
    );
    Ok(())
}

#[test]
fn plain_writes_and_reads_see_business_tables() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    store.write(|tx| {
        tx.insert(&ORDERS, "a", "1")?;
        tx.insert(&ORDERS, "b", "2")?;
        tx.insert(&ORDERS, "c", "3")?;
        Ok(())
    })?;
    let seen = store.write(|tx| {
        // Read-your-writes inside one request, merged with what is stored.
        tx.insert(&ORDERS, "bb", "new")?;
        let removed = tx.remove(&ORDERS, "a")?.map(|v| v.value().to_owned());
        let b = tx.get(&ORDERS, "b")?.map(|v| v.value().to_owned());
        let all: Vec<String> = tx
            .range::<&str, &str, &str>(&ORDERS, ..)?
            .iter()
            .map(|(k, v)| format!("{}={}", k.value(), v.value()))
            .collect();
        let some: Vec<String> = tx
            .range(&ORDERS, "b".."c")?
            .iter()
            .map(|(k, _)| k.value().to_owned())
            .collect();
        Ok((removed, b, all, some))
    })?;
    assert_eq!(seen.0.as_deref(), Some("1"));
    assert_eq!(seen.1.as_deref(), Some("2"));
    assert_eq!(seen.2, vec!["b=2", "bb=new", "c=3"]);
    assert_eq!(seen.3, vec!["b", "bb"]);
    assert_eq!(orders(&store)?.len(), 3);
    Ok(())
}

#[test]
fn abandoned_work_is_listed_oldest_lease_first_and_can_be_recovered() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;
    // Three claims at different times; the middle one checkpoints; a fourth is released and a
    // fifth completed: neither of those is abandoned.
    let mut keep = Vec::new();
    for (i, key) in ["second", "first", "third"].iter().enumerate() {
        let mut claim = claim(&store, key, "req")?;
        if i == 0 {
            claim.checkpoint(b"step 2".to_vec())?;
        }
        keep.push(claim);
        clock.advance(Duration::from_secs(1));
    }
    // A claim dropped without finishing (its process "crashed") is abandoned the same way.
    drop(keep.remove(1));
    claim(&store, "released", "req")?.release()?;
    claim(&store, "done", "req")?.commit(|_| Ok(Response::new(200, vec![])))?;
    assert!(store.abandoned(10)?.is_empty(), "no lease has ended yet");

    clock.advance(LEASE);
    let listed = store.abandoned(10)?;
    let keys: Vec<&str> = listed.iter().map(|a| a.scope.key()).collect();
    assert_eq!(keys, vec!["second", "first", "third"]);
    assert_eq!(listed[0].checkpoint.as_deref(), Some(&b"step 2"[..]));
    assert_eq!(listed[0].attempt, 1);
    assert_eq!(store.abandoned(2)?.len(), 2, "the limit bounds the listing");

    // A reconciler takes the oldest over with its fingerprint and finishes it.
    let oldest = &listed[0];
    let Begin::Recovered(recovered) = store.begin(&oldest.scope, oldest.fingerprint)? else {
        return Err("expected Recovered".into());
    };
    assert_eq!(recovered.last_checkpoint(), Some(&b"step 2"[..]));
    recovered.commit(|_| Ok(Response::new(200, b"reconciled".to_vec())))?;
    let keys: Vec<String> = store
        .abandoned(10)?
        .iter()
        .map(|a| a.scope.key().to_owned())
        .collect();
    assert_eq!(keys, vec!["first".to_owned(), "third".to_owned()]);
    drop(keep);
    Ok(())
}

mod waiting {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    use super::*;

    /// Waits (bounded) until `n` callers are waiting in `begin_or_wait`.
    fn until_waiting(store: &Store, n: usize) -> TestResult {
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.stats()?.waiting < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} waiters arrived",
                store.stats()?.waiting
            );
            std::thread::yield_now();
        }
        Ok(())
    }

    #[test]
    fn sixteen_waiters_on_a_held_key_all_get_the_replay_of_one_commit() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = open(dir.path(), &clock())?;
        let side_effects = Arc::new(AtomicU32::new(0));
        let holder = claim(&store, "k", "req")?;
        side_effects.fetch_add(1, Ordering::SeqCst);

        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let (store, side_effects) = (store.clone(), side_effects.clone());
                std::thread::spawn(move || -> Result<Vec<u8>, String> {
                    match store.begin_or_wait(&scope("k"), fp("req"), Duration::from_secs(60)) {
                        Ok(Begin::Replay(response)) => Ok(response.into_body()),
                        Ok(Begin::Claimed(_) | Begin::Recovered(_)) => {
                            side_effects.fetch_add(1, Ordering::SeqCst);
                            Err("a waiter was given the key".into())
                        }
                        other => Err(format!("expected a replay, got {other:?}")),
                    }
                })
            })
            .collect();
        until_waiting(&store, 16)?;
        holder.commit(|_| Ok(Response::new(201, b"the one charge".to_vec())))?;
        for waiter in waiters {
            assert_eq!(
                waiter.join().map_err(|_| "waiter panicked")??,
                b"the one charge"
            );
        }
        assert_eq!(side_effects.load(Ordering::SeqCst), 1);
        assert_eq!(store.stats()?.waiting, 0);
        Ok(())
    }

    #[test]
    fn after_a_release_one_waiter_claims_and_the_others_get_its_replay() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = open(dir.path(), &clock())?;
        let side_effects = Arc::new(AtomicU32::new(0));
        let holder = claim(&store, "k", "req")?;
        let start = Arc::new(Barrier::new(8));
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let (store, side_effects, start) =
                    (store.clone(), side_effects.clone(), start.clone());
                std::thread::spawn(move || -> Result<&'static str, String> {
                    start.wait();
                    match store.begin_or_wait(&scope("k"), fp("req"), Duration::from_secs(60)) {
                        Ok(Begin::Claimed(claim)) => {
                            side_effects.fetch_add(1, Ordering::SeqCst);
                            claim
                                .commit(|_| Ok(Response::new(201, b"by a waiter".to_vec())))
                                .map_err(|e| e.to_string())?;
                            Ok("claimed")
                        }
                        Ok(Begin::Replay(r)) if r.body() == b"by a waiter" => Ok("replayed"),
                        other => Err(format!("unexpected {other:?}")),
                    }
                })
            })
            .collect();
        until_waiting(&store, 8)?;
        holder.release()?; // no side effect happened
        let mut outcomes: Vec<&str> = Vec::new();
        for waiter in waiters {
            outcomes.push(waiter.join().map_err(|_| "waiter panicked")??);
        }
        outcomes.sort_unstable();
        assert_eq!(
            outcomes.iter().filter(|o| **o == "claimed").count(),
            1,
            "{outcomes:?}"
        );
        assert_eq!(side_effects.load(Ordering::SeqCst), 1);
        Ok(())
    }

    #[test]
    fn a_waiter_times_out_into_in_progress() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = open(dir.path(), &clock())?;
        let _holder = claim(&store, "k", "req")?;
        let started = Instant::now();
        let answer = store.begin_or_wait(&scope("k"), fp("req"), Duration::from_millis(50))?;
        assert!(matches!(answer, Begin::InProgress { .. }), "{answer:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(50),
            "it did not wait"
        );
        assert_eq!(store.stats()?.waiting, 0);
        Ok(())
    }

    #[test]
    fn a_key_held_by_no_claim_of_this_process_is_answered_at_once() -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = open(dir.path(), &clock())?;
        drop(claim(&store, "k", "req")?); // as if its process had crashed: the lease lives on
        let started = Instant::now();
        let answer = store.begin_or_wait(&scope("k"), fp("req"), Duration::from_secs(60))?;
        assert!(matches!(answer, Begin::InProgress { .. }), "{answer:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "it waited for nobody"
        );
        Ok(())
    }
}

/// An operator forgets a record: an abandoned one by its fence (a take-over in between is not
/// undone), a completed one by force (so the key can be reused), never an in-progress one by
/// force (its outcome is unknown). Each removal is durable and refused ones change nothing.
#[test]
fn forget_removes_by_fence_or_a_completed_record_by_force_and_nothing_else() -> TestResult {
    use idemstore::{Forget, ForgetError};
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let store = open(dir.path(), &clock)?;

    let held = claim(&store, "held", "req")?;
    let fence = held.fence();
    let refused = store
        .forget(&scope("held"), Forget::Completed)
        .err()
        .ok_or("forced")?;
    assert!(
        matches!(refused, ForgetError::InProgress { fence: f, .. } if f == fence),
        "{refused}"
    );
    assert!(matches!(
        store.forget(&scope("held"), Forget::Fence(fence + 100)),
        Err(ForgetError::Stale(_))
    ));
    let forgotten = store.forget(&scope("held"), Forget::Fence(fence))?;
    assert_eq!(forgotten.fence(), fence);
    assert!(store.get(&scope("held"))?.is_none());
    assert!(matches!(
        held.commit(|_| Ok(Response::new(201, "late"))),
        Err(CommitError::Stale(_))
    ));

    let done = claim(&store, "done", "req")?;
    done.commit(|_| Ok(Response::new(201, "first")))?;
    store.forget(&scope("done"), Forget::Completed)?;
    assert!(matches!(
        store.begin(&scope("done"), fp("another request"))?,
        Begin::Claimed(_)
    ));
    assert!(matches!(
        store.forget(&scope("nothing"), Forget::Completed),
        Err(ForgetError::Absent { .. })
    ));
    // Durable: a reopen finds the same.
    drop(store);
    let store = open(dir.path(), &clock)?;
    assert!(store.get(&scope("held"))?.is_none());
    assert_eq!(
        store.exact_stats()?.in_progress,
        1,
        "only the new claim of `done` is in progress"
    );
    Ok(())
}
