//! Everything acknowledged is still there after the store is dropped and reopened.

use crate::common;

use common::{LEASE, ORDERS, TestResult, clock, fp, open, orders, scope};
use idemstore::{Begin, RecordState, Response};

#[test]
fn reopening_after_drop_keeps_every_acknowledged_claim_and_commit_with_its_rows() -> TestResult {
    let dir = tempfile::tempdir()?;
    let clock = clock();
    let mut fences = Vec::new();
    {
        let store = open(dir.path(), &clock)?;
        for i in 0..20 {
            let Begin::Claimed(claim) = store.begin(&scope(&format!("k{i}")), fp("req"))? else {
                return Err("expected Claimed".into());
            };
            fences.push(claim.fence());
            if i % 2 == 0 {
                claim.commit(move |tx| {
                    tx.insert(&ORDERS, format!("order-{i}").as_str(), "paid")?;
                    Ok(Response::new(201, format!("order-{i}").into_bytes()))
                })?;
            } else {
                let mut claim = claim;
                claim.checkpoint(format!("step-{i}").into_bytes())?;
                drop(claim); // in progress, as if the process stopped mid-work
            }
        }
        store.write(|tx| {
            tx.insert(&ORDERS, "plain", "write")?;
            Ok(())
        })?;
    }

    let store = open(dir.path(), &clock)?;
    let rows = orders(&store)?;
    assert_eq!(rows.len(), 11);
    for (i, &fence) in fences.iter().enumerate() {
        let record = store.get(&scope(&format!("k{i}")))?.ok_or("record lost")?;
        assert_eq!(record.fence(), fence);
        if i % 2 == 0 {
            assert!(rows.contains(&(format!("order-{i}"), "paid".to_owned())));
            match store.begin(&scope(&format!("k{i}")), fp("req"))? {
                Begin::Replay(r) => assert_eq!(r.body(), format!("order-{i}").as_bytes()),
                other => return Err(format!("expected Replay, got {other:?}").into()),
            }
        } else {
            assert!(matches!(record.state(), RecordState::InProgress { .. }));
            assert!(matches!(
                store.begin(&scope(&format!("k{i}")), fp("req"))?,
                Begin::InProgress { .. }
            ));
        }
    }

    // Fences keep rising across a reopen: a recovered claim never reuses an old fence.
    clock.advance(LEASE);
    let Begin::Recovered(recovered) = store.begin(&scope("k1"), fp("req"))? else {
        return Err("expected Recovered".into());
    };
    assert!(recovered.fence() > *fences.iter().max().ok_or("no fences")?);
    assert_eq!(recovered.last_checkpoint(), Some(&b"step-1"[..]));
    Ok(())
}
