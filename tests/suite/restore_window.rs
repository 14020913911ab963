//! After a restore, a store cannot re-run a request blind: a backup copy opened in place of the
//! store it was taken from answers a key it does not know `Recovered` (reason `Restored`)
//! during its restore window, with the downstream key the original store's attempt had, so the
//! handler checks downstream instead of charging twice. Known keys replay; after the window, with
//! the window off, or after a restore that lacks nothing (`Guarantee::Complete`), answers are
//! the usual ones; a reopen does not restart the window; `execute` and the inbox run their
//! local work again and publish under the original's message ids.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idemstore::{
    Begin, Claim, Clock, Execution, Guarantee, ManualClock, Recovery, Response, Store,
};
use parking_lot::Mutex;

use crate::common::{self, ORDERS, TTL, TestResult, fp, scope};

/// The original store, a backup of it, and what the original acknowledged after the backup.
struct Restore {
    _tmp: tempfile::TempDir,
    clock: ManualClock,
    copy: PathBuf,
    /// The downstream key the original's claim of "lost" had (acknowledged after the backup).
    lost_key: String,
    /// The downstream key of "held", in progress on the original when the backup was taken.
    held_key: String,
}

/// An original store with "known" completed and "held" in progress, backed up; then "lost"
/// claimed and committed on the original only.
fn backed_up() -> Result<Restore, Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let clock = common::clock();
    let original = common::builder(&clock).open(tmp.path().join("idem"))?;
    commit(claimed(&original, "known")?, "known")?;
    let held = claimed(&original, "held")?;
    let held_key = held.downstream_key();
    let copy = tmp.path().join("backup");
    original.backup(&copy)?;
    let lost = claimed(&original, "lost")?;
    let lost_key = lost.downstream_key();
    commit(lost, "lost")?; // acknowledged: the copy lacks it
    drop(held);
    drop(original);
    Ok(Restore {
        _tmp: tmp,
        clock,
        copy,
        lost_key,
        held_key,
    })
}

fn claimed(store: &Store, key: &str) -> Result<Claim, Box<dyn std::error::Error>> {
    match store.begin(&scope(key), fp(key))? {
        Begin::Claimed(claim) => Ok(claim),
        other => Err(format!("{key}: expected Claimed, got {}", other.outcome()).into()),
    }
}

fn commit(claim: Claim, key: &str) -> TestResult {
    let row = key.to_owned();
    claim.commit(move |tx| {
        tx.insert(&ORDERS, row.as_str(), "charged")?;
        Ok(Response::new(201, row.clone().into_bytes()))
    })?;
    Ok(())
}

/// The claim of a restored recovery, or what was answered instead.
fn restored(begin: Begin) -> Result<Claim, Box<dyn std::error::Error>> {
    match begin {
        Begin::Recovered(claim) if claim.recovery() == Some(Recovery::Restored) => Ok(claim),
        Begin::Recovered(claim) => Err(format!("recovered for {:?}", claim.recovery()).into()),
        other => Err(format!("expected Recovered, got {}", other.outcome()).into()),
    }
}

#[test]
fn a_backup_opened_in_its_window_answers_an_unknown_key_as_restored_with_the_old_key() -> TestResult
{
    let r = backed_up()?;
    let opened_at = r.clock.now();
    let copy = common::builder(&r.clock).open(&r.copy)?;

    let recovered = restored(copy.begin(&scope("lost"), fp("lost"))?)?;
    assert_eq!(
        recovered.downstream_key(),
        r.lost_key,
        "the key the original's attempt passed downstream"
    );
    assert_eq!(
        (recovered.attempt(), recovered.last_checkpoint()),
        (1, None)
    );
    assert_eq!(
        Recovery::Restored.to_string(),
        "restored, may have run elsewhere"
    );
    // A duplicate meanwhile waits for this claim, as for any claim.
    assert!(matches!(
        copy.begin(&scope("lost"), fp("lost"))?,
        Begin::InProgress { .. }
    ));
    commit(recovered, "lost")?;
    assert!(matches!(
        copy.begin(&scope("lost"), fp("lost"))?,
        Begin::Replay(_)
    ));

    match copy.begin(&scope("known"), fp("known"))? {
        Begin::Replay(response) => assert_eq!(response.body(), b"known"),
        other => return Err(format!("a known key replays, got {}", other.outcome()).into()),
    }
    // Another request on a known key is still refused.
    assert!(matches!(
        copy.begin(&scope("known"), fp("another"))?,
        Begin::Mismatch
    ));

    // The claim the original held when the backup was taken: a take-over once its lease ends,
    // with the key its first attempt had.
    assert!(matches!(
        copy.begin(&scope("held"), fp("held"))?,
        Begin::InProgress { .. }
    ));
    r.clock.advance(common::LEASE);
    let Begin::Recovered(taken) = copy.begin(&scope("held"), fp("held"))? else {
        return Err("an expired lease in the copy is taken over".into());
    };
    assert_eq!(taken.recovery(), Some(Recovery::LeaseExpired));
    assert_eq!(taken.attempt(), 2);
    assert_eq!(taken.downstream_key(), r.held_key);
    drop(taken);

    let stats = copy.stats()?;
    let window = stats.restore_window.ok_or("the stats show the restore")?;
    assert_eq!(window.guarantee, Guarantee::MayLag);
    assert_eq!(window.restored_at, opened_at);
    assert_eq!(
        window.ends_at,
        opened_at.saturating_add(TTL),
        "the TTL by default"
    );
    assert!(
        window.last_frame > 0,
        "the frames the backup's snapshot held"
    );
    assert_eq!((stats.recoveries, stats.claims), (2, 0), "{stats:?}");
    Ok(())
}

#[test]
fn after_the_window_unknown_keys_are_claimed_again() -> TestResult {
    let r = backed_up()?;
    let window = Duration::from_secs(600);
    let opened_at = r.clock.now();
    let copy = common::builder(&r.clock)
        .restore_window(window)
        .open(&r.copy)?;
    r.clock
        .set(opened_at.saturating_add(window - Duration::from_millis(1)));
    restored(copy.begin(&scope("new-1"), fp("new-1"))?)?.release()?;
    r.clock.set(opened_at.saturating_add(window));
    claimed(&copy, "new-2")?.release()?;
    // A released recovery leaves the key absent: claimed afresh now, with the same key.
    let again = claimed(&copy, "new-1")?;
    assert_eq!(again.recovery(), None);
    assert_eq!(
        copy.stats()?
            .restore_window
            .map(|w| w.ends_at.saturating_since(w.restored_at)),
        Some(window)
    );
    Ok(())
}

#[test]
fn a_zero_window_turns_the_restored_answers_off() -> TestResult {
    let r = backed_up()?;
    let copy = common::builder(&r.clock)
        .restore_window(Duration::ZERO)
        .open(&r.copy)?;
    let claim = claimed(&copy, "lost")?;
    assert_eq!(
        claim.downstream_key(),
        r.lost_key,
        "the key is the request's all the same"
    );
    let window = copy.stats()?.restore_window.ok_or("still shown")?;
    assert_eq!(window.ends_at, window.restored_at);
    Ok(())
}

#[test]
fn a_window_over_ten_years_is_refused_at_open() -> TestResult {
    let r = backed_up()?;
    let refused = common::builder(&r.clock)
        .restore_window(Duration::from_secs(3651 * 24 * 3600))
        .open(&r.copy)
        .err()
        .ok_or("an invalid window was accepted")?;
    assert!(
        matches!(&refused, idemstore::OpenError::InvalidConfig { setting, .. } if *setting == "restore_window"),
        "{refused:?}"
    );
    Ok(())
}

/// Writes a pending restore mark into a closed store's file as a restore would
/// (`docs/design.md`, "Meta": version 1, the guarantee, the last frame).
fn mark_restore(dir: &Path, guarantee: u8, last_frame: u64) -> TestResult {
    use idemstore::redb::{Database, TableDefinition};
    let meta: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemstore.meta");
    let db = Database::open(dir.join("idemstore.redb"))?;
    let txn = db.begin_write()?;
    {
        let mut table = txn.open_table(meta)?;
        let mut value = vec![1, guarantee];
        value.extend_from_slice(&last_frame.to_le_bytes());
        table.insert(&b"restore_pending"[..], value.as_slice())?;
    }
    txn.commit()?;
    Ok(())
}

#[test]
fn a_restore_that_lacks_nothing_answers_as_usual() -> TestResult {
    let r = backed_up()?;
    mark_restore(&r.copy, 1, 4242)?; // complete: what a synchronous replica promises
    let copy = common::builder(&r.clock).open(&r.copy)?;
    assert_eq!(claimed(&copy, "lost")?.recovery(), None);
    let window = copy.stats()?.restore_window.ok_or("the restore is shown")?;
    assert_eq!(
        (window.guarantee, window.last_frame),
        (Guarantee::Complete, 4242)
    );
    Ok(())
}

#[test]
fn a_store_never_restored_shows_no_restore() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = common::open(dir.path(), &common::clock())?;
    assert_eq!(store.stats()?.restore_window, None);
    assert_eq!(claimed(&store, "k")?.recovery(), None);
    Ok(())
}

#[test]
fn a_reopen_keeps_the_window_where_the_first_open_started_it() -> TestResult {
    let r = backed_up()?;
    let opened_at = r.clock.now();
    let copy = common::builder(&r.clock).open(&r.copy)?;
    drop(copy);
    r.clock.advance(TTL / 2);
    let copy = common::builder(&r.clock).open(&r.copy)?;
    let window = copy.stats()?.restore_window.ok_or("the restore is shown")?;
    assert_eq!(window.restored_at, opened_at, "not restarted by the reopen");
    restored(copy.begin(&scope("new-1"), fp("new-1"))?)?.release()?;
    drop(copy);
    r.clock.set(opened_at.saturating_add(TTL));
    let copy = common::builder(&r.clock).open(&r.copy)?;
    claimed(&copy, "new-1")?.release()?;
    // A marker read again (a second backup of the copy) starts a new window.
    let again = r.copy.with_file_name("backup-of-the-copy");
    copy.backup(&again)?;
    drop(copy);
    let reopened_at = r.clock.now();
    let second = common::builder(&r.clock).open(&again)?;
    let window = second
        .stats()?
        .restore_window
        .ok_or("the restore is shown")?;
    assert_eq!(window.restored_at, reopened_at);
    restored(second.begin(&scope("new-1"), fp("new-1"))?)?.release()?;
    Ok(())
}

/// Ids of the messages a closure published, and how often it ran.
#[derive(Default)]
struct Ran {
    ids: Mutex<Vec<String>>,
    times: Mutex<u32>,
}

fn publishing(
    ran: &Arc<Ran>,
    key: &str,
) -> impl FnOnce(&mut idemstore::Tx<'_>) -> Result<Response, idemstore::BoxError> + Send + 'static {
    let (ran, row) = (ran.clone(), key.to_owned());
    move |tx| {
        *ran.times.lock() += 1;
        tx.insert(&ORDERS, row.as_str(), "applied")?;
        let id = tx.publish("orders.applied", row.clone().into_bytes())?;
        ran.ids.lock().push(id);
        Ok(Response::new(200, row.into_bytes()))
    }
}

/// `execute` and the inbox run their work where the copy lacks it (its effects are local, lost
/// with the record), answer `Executed`, count it as a recovery, and publish under the ids the
/// original gave: a broker that deduplicates by id keeps one of each.
#[test]
fn execute_and_the_inbox_run_again_in_the_window_under_the_original_ids() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let clock = common::clock();
    let original = common::builder(&clock).open(tmp.path().join("idem"))?;
    let copy_dir = tmp.path().join("backup");
    original.backup(&copy_dir)?;
    let there = Arc::new(Ran::default());
    let step = scope("step");
    let ran = original.execute(&step, fp("step"), publishing(&there, "step"))?;
    assert!(matches!(ran, Execution::Executed(_)), "{ran:?}");
    let ran = original.consume("billing", "msg-1", fp("msg-1"), publishing(&there, "msg-1"))?;
    assert!(matches!(ran, Execution::Executed(_)), "{ran:?}");
    drop(original);

    let copy = common::builder(&clock).open(&copy_dir)?;
    let here = Arc::new(Ran::default());
    let executed = copy.execute(&step, fp("step"), publishing(&here, "step"))?;
    assert!(matches!(executed, Execution::Executed(_)), "{executed:?}");
    let consumed = copy.consume("billing", "msg-1", fp("msg-1"), publishing(&here, "msg-1"))?;
    assert!(matches!(consumed, Execution::Executed(_)), "{consumed:?}");
    assert_eq!(
        *here.ids.lock(),
        *there.ids.lock(),
        "the original's message ids"
    );
    assert_eq!(copy.exact_stats()?.recoveries, 2);
    // Once, as anywhere: the redelivery replays.
    let again = copy.consume("billing", "msg-1", fp("msg-1"), publishing(&here, "msg-1"))?;
    assert!(matches!(again, Execution::Replay(_)), "{again:?}");
    assert_eq!(*here.times.lock(), 2);
    assert_eq!(common::order_count(&copy)?, 2);
    Ok(())
}

#[test]
fn begin_or_wait_answers_restored_too() -> TestResult {
    let r = backed_up()?;
    let copy = common::builder(&r.clock).open(&r.copy)?;
    let claim =
        restored(copy.begin_or_wait(&scope("lost"), fp("lost"), Duration::from_secs(1))?)?;
    assert_eq!(claim.downstream_key(), r.lost_key);
    Ok(())
}

#[cfg(feature = "tokio")]
#[tokio::test]
async fn the_async_api_answers_restored_too() -> TestResult {
    let r = backed_up()?;
    let copy = common::builder(&r.clock).open(&r.copy)?;
    let claim = restored(copy.begin_async(&scope("lost"), fp("lost")).await?)?;
    assert_eq!(claim.downstream_key(), r.lost_key);
    claim.release_async().await?;
    let waited = copy
        .begin_or_wait_async(&scope("lost"), fp("lost"), Duration::from_secs(1))
        .await?;
    restored(waited)?.release_async().await?;
    let ran = Arc::new(Ran::default());
    let executed = copy
        .execute_async(&scope("lost"), fp("lost"), publishing(&ran, "lost"))
        .await?;
    assert!(matches!(executed, Execution::Executed(_)), "{executed:?}");
    assert_eq!(copy.exact_stats()?.recoveries, 3);
    Ok(())
}
