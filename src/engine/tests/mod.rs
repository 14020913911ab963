//! The engine's behaviour that only shows through a whole store: poison, reads off the
//! runtime, the shared snapshot, and the partitions (`tests/partitions.rs`).

use crate::error::StoreError;
use crate::model::clock::{ManualClock, Timestamp};
use crate::model::config::{SelfHeal, Sweep};
use crate::{Begin, Fingerprint, Response, Scope, Store};

/// A builder on a clock that stands still, with no sweeper: nothing changes the store but the
/// test.
fn quiet() -> crate::Builder {
    Store::builder()
        .clock(ManualClock::new(Timestamp::from_millis(1_000_000)))
        .sweep(Sweep::Off)
}

/// While poisoned (here with self-heal off, so it stays so), a store answers everything
/// that only reads: a replay, `get`, business reads, stats (which say why). Writes are
/// refused with the cause. `reopen` brings it back.
#[test]
fn a_poisoned_store_answers_reads_refuses_writes_and_comes_back_on_reopen()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = quiet()
        .self_heal(SelfHeal::Off)
        .open(dir.path().join("idem"))?;
    let scope = Scope::new("t", "op", "done")?;
    let fingerprint = Fingerprint::of_bytes(b"request");
    let Begin::Claimed(claim) = store.begin(&scope, fingerprint)? else {
        return Err("a new key is claimed".into());
    };
    claim.commit(|_| Ok(Response::new(201, "stored")))?;

    let cause = StoreError::unknown("syncing the log", &"an injected failure");
    store.engine().poison_for_test(&cause);
    assert!(matches!(store.begin(&scope, fingerprint)?, Begin::Replay(r) if r.body() == b"stored"));
    assert!(store.get(&scope)?.is_some());
    assert!(store.read().is_ok(), "business reads");
    let stats = store.stats()?;
    assert!(
        stats
            .poisoned
            .as_deref()
            .is_some_and(|c| c.contains("injected")),
        "{stats:?}"
    );
    let refused = store
        .begin(&Scope::new("t", "op", "new")?, fingerprint)
        .err()
        .ok_or("a poisoned store took a new claim")?;
    assert!(matches!(refused, StoreError::Poisoned { .. }), "{refused}");
    assert!(store.writable().is_err());

    let report = store.reopen()?;
    assert_eq!(report.bytes_dropped, 0);
    assert!(store.writable().is_ok());
    assert!(matches!(
        store.begin(&Scope::new("t", "op", "new")?, fingerprint)?,
        Begin::Claimed(_)
    ));
    assert_eq!(store.stats()?.restores, 1);
    Ok(())
}

/// While a compaction holds the file, `begin_async` does not read inline (which would block
/// a runtime worker for the whole compaction): it reads from the blocking pool and answers
/// once the file is free.
#[cfg(feature = "tokio")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_reads_off_the_runtime_while_the_file_is_held()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = quiet().open(dir.path().join("idem"))?;
    let scope = Scope::new("t", "op", "k")?;
    let fingerprint = Fingerprint::of_bytes(b"request");
    let Begin::Claimed(claim) = store.begin_async(&scope, fingerprint).await? else {
        return Err("a new key is claimed".into());
    };
    claim
        .commit_async(|_| Ok(Response::new(201, "done")))
        .await?;
    store.checkpoint_async().await?; // published to redb: the read must go to the file

    let engine = store.engine();
    let held = engine.hold_exclusively();
    assert!(
        engine.try_read_path::<()>(&scope, fingerprint).is_none(),
        "no inline read while held"
    );
    let begin = tokio::spawn({
        let (store, scope) = (store.clone(), scope.clone());
        async move { store.begin_async(&scope, fingerprint).await }
    });
    drop(held);
    let answer = begin.await??;
    assert!(matches!(answer, Begin::Replay(r) if r.body() == b"done"));
    assert!(matches!(
        engine.try_read_path::<()>(&scope, fingerprint),
        Some(Ok(Some(Begin::Replay(_))))
    ));
    Ok(())
}

/// Readers share one snapshot of the records table between publishes. A publish must end it
/// (a record published and cleared from the overlay is then found), and so must a
/// compaction, which redb refuses while a read transaction is open.
#[test]
fn the_shared_snapshot_ends_at_every_publish_and_before_a_compaction()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = quiet().open(dir.path().join("idem"))?;
    let fingerprint = Fingerprint::of_bytes(b"request");
    for round in 0..3 {
        let scope = Scope::new("t", "op", format!("k{round}"))?;
        // Opens the shared snapshot, which does not have the key.
        assert!(store.get(&scope)?.is_none());
        let Begin::Claimed(claim) = store.begin(&scope, fingerprint)? else {
            return Err("a new key is claimed".into());
        };
        claim.commit(move |_| Ok(Response::new(201, format!("body {round}"))))?;
        store.checkpoint()?; // published: the overlay no longer has it
        assert!(
            store.get(&scope)?.is_some(),
            "round {round}: the published record is read"
        );
        assert!(
            matches!(store.begin(&scope, fingerprint)?, Begin::Replay(r) if r.body() == format!("body {round}").as_bytes()),
            "round {round}: the published record is found"
        );
        let compacted = store.compact();
        assert!(compacted.is_ok(), "round {round}: {compacted:?}");
        assert!(
            store.get(&scope)?.is_some(),
            "round {round}: read after the compaction"
        );
    }
    Ok(())
}

mod partitions;
