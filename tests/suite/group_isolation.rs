//! One failing request inside a group must not disturb the others, and must leave no trace.

use crate::common;

use std::sync::mpsc;
use std::sync::{Arc, Barrier};

use common::{ORDERS, TestResult, clock, fp, open, orders, scope};
use idemstore::{Begin, CommitError, RecordState, Response, Store};

const GOOD: usize = 16;

/// The writer held inside a plain write (which writes nothing), so that requests queue up
/// behind it and are taken as one group when it is let go.
struct HeldWriter {
    release: mpsc::Sender<()>,
    blocker: std::thread::JoinHandle<Result<(), idemstore::WriteError>>,
}

impl HeldWriter {
    fn hold(store: &Store) -> Result<HeldWriter, Box<dyn std::error::Error>> {
        let (release, held) = mpsc::channel::<()>();
        let (running, writer_busy) = mpsc::channel::<()>();
        let store = store.clone();
        let blocker = std::thread::spawn(move || {
            store.write(move |_| {
                running.send(())?;
                held.recv()?;
                Ok(())
            })
        });
        writer_busy.recv()?;
        Ok(HeldWriter { release, blocker })
    }

    fn release(self) -> TestResult {
        self.release.send(())?;
        self.blocker.join().map_err(|_| "blocker panicked")??;
        Ok(())
    }
}

#[test]
fn an_erroring_commit_racing_16_good_ones_in_one_group_leaves_no_trace() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let mut claims = Vec::new();
    for i in 0..=GOOD {
        match store.begin(&scope(&format!("k{i}")), fp("req"))? {
            Begin::Claimed(claim) => claims.push(claim),
            other => return Err(format!("expected Claimed, got {other:?}").into()),
        }
    }

    // Hold the writer inside a plain write so that all 17 commits queue up behind it and are
    // taken as one group when it is let go.
    let held = HeldWriter::hold(&store)?;
    let groups_before = store.stats()?.groups_committed;

    let start = Arc::new(Barrier::new(GOOD + 1));
    let committers: Vec<_> = claims
        .into_iter()
        .enumerate()
        .map(|(i, claim)| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                claim.commit(move |tx| {
                    tx.insert(&ORDERS, format!("order-{i}").as_str(), "row")?;
                    if i == GOOD {
                        tx.insert(&ORDERS, "poison-row", "must not persist")?;
                        return Err("rejected by validation".into());
                    }
                    Ok(Response::new(201, format!("order-{i}").into_bytes()))
                })
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while store.stats()?.queued < GOOD + 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the commits never queued: {:?}",
            store.stats()?
        );
        std::thread::yield_now();
    }
    held.release()?;

    let mut results: Vec<_> = Vec::new();
    for c in committers {
        results.push(c.join().map_err(|_| "committer panicked")?);
    }
    // The blocker wrote nothing, so its group was aborted, not committed: exactly one durable
    // group holds all 17 commits.
    assert_eq!(store.stats()?.groups_committed, groups_before + 1);

    for (i, result) in results.into_iter().enumerate() {
        if i == GOOD {
            let err = result.err().ok_or("the failing commit succeeded")?;
            assert!(matches!(err, CommitError::Aborted { .. }), "{err}");
            let claim = err.into_claim().ok_or("the claim should come back")?;
            assert!(matches!(
                store.get(claim.scope())?.map(|r| r.state().clone()),
                Some(RecordState::InProgress { .. })
            ));
        } else {
            assert_eq!(result?.body(), format!("order-{i}").as_bytes());
            assert!(matches!(
                store.begin(&scope(&format!("k{i}")), fp("req"))?,
                Begin::Replay(_)
            ));
        }
    }
    let rows = orders(&store)?;
    assert_eq!(rows.len(), GOOD, "{rows:?}");
    assert!(
        rows.iter()
            .all(|(k, _)| k != "poison-row" && k != &format!("order-{GOOD}"))
    );
    Ok(())
}

/// Found by the sweeper test: a request queued behind one that ends the writer's epoch early
/// (a checkpoint, a snapshot) was left waiting until some other request arrived.
#[test]
fn a_request_behind_a_checkpoint_in_the_same_group_is_answered_without_new_traffic() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let held = HeldWriter::hold(&store)?;
    let queued = |n: usize| -> TestResult {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while store.stats()?.queued < n {
            assert!(
                std::time::Instant::now() < deadline,
                "requests never queued"
            );
            std::thread::yield_now();
        }
        Ok(())
    };
    let checkpoint = {
        let store = store.clone();
        std::thread::spawn(move || store.checkpoint())
    };
    queued(1)?;
    let (answered, write_done) = mpsc::channel();
    let write = {
        let store = store.clone();
        std::thread::spawn(move || {
            let result = store.write(|tx| {
                tx.insert(&ORDERS, "behind", "the checkpoint")?;
                Ok(())
            });
            let _ = answered.send(result.is_ok());
        })
    };
    queued(2)?;
    held.release()?;
    checkpoint.join().map_err(|_| "checkpoint panicked")??;
    let ok = write_done
        .recv_timeout(std::time::Duration::from_secs(10))
        .map_err(|_| "the write behind the checkpoint was never answered")?;
    assert!(ok);
    write.join().map_err(|_| "writer thread panicked")?;
    assert_eq!(orders(&store)?.len(), 1);
    Ok(())
}
