//! Completed records in partitions by time: what a caller sees of them.

use std::time::Duration;

use crate::model::clock::{ManualClock, Timestamp};
use crate::model::config::Sweep;
use crate::model::maintenance::Backlog;
use crate::{Begin, Execution, Fingerprint, RecordState, Response, Scope, Store};

const TTL: Duration = Duration::from_secs(80 * 60);
/// An eighth of the TTL: the open partition takes records this long.
const WINDOW: Duration = Duration::from_secs(10 * 60);

fn open(dir: &std::path::Path, clock: &ManualClock) -> Result<Store, crate::OpenError> {
    Store::builder()
        .clock(clock.clone())
        .ttl(TTL)
        .sweep(Sweep::Off)
        .open(dir)
}

fn scope(key: &str) -> Result<Scope, crate::ScopeError> {
    Scope::new("t", "op", key)
}

fn fp(s: &str) -> Fingerprint {
    Fingerprint::of_bytes(s.as_bytes())
}

/// Claims and commits `key` with `body`.
fn pair(store: &Store, key: &str, body: &str) -> Result<(), Box<dyn std::error::Error>> {
    let Begin::Claimed(claim) = store.begin(&scope(key)?, fp(key))? else {
        return Err(format!("{key} is new").into());
    };
    let body = body.to_owned();
    claim.commit(move |_| Ok(Response::new(201, body)))?;
    Ok(())
}

fn replayed(store: &Store, key: &str) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    match store.begin(&scope(key)?, fp(key))? {
        Begin::Replay(response) => Ok(response.body().to_vec()),
        other => Err(format!("{key}: expected a replay, got {other:?}").into()),
    }
}

#[test]
fn records_go_a_partition_at_a_time_once_every_record_in_it_is_gone()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let store = open(dir.path(), &clock)?;
    for key in ["a", "b", "c"] {
        pair(&store, key, "first")?;
    }
    clock.advance(WINDOW + Duration::from_millis(1));
    for key in ["d", "e"] {
        pair(&store, key, "second")?;
    }
    assert_eq!(store.exact_stats()?.partitions, 2);
    assert_eq!(store.evict_expired(100)?.removed, 0, "nothing is gone yet");

    clock.advance(TTL - WINDOW - Duration::from_millis(1));
    assert!(store.get(&scope("a")?)?.is_none(), "past its TTL: gone");
    assert_eq!(replayed(&store, "d")?, b"second", "still in its TTL");
    let evicted = store.evict_expired(100)?;
    assert_eq!((evicted.removed, evicted.backlog), (3, Backlog::Empty));
    let stats = store.exact_stats()?;
    assert_eq!((stats.completed, stats.partitions), (2, 1));
    assert_eq!(replayed(&store, "e")?, b"second");

    clock.advance(WINDOW);
    assert_eq!(store.evict_expired(100)?.removed, 0, "a millisecond early");
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        store.evict_expired(100)?.removed,
        2,
        "the second partition is gone now"
    );
    let stats = store.exact_stats()?;
    assert_eq!((stats.records, stats.partitions), (0, 0));
    let again = store.evict_expired(100)?;
    assert_eq!((again.removed, again.backlog), (0, Backlog::Empty));
    Ok(())
}

#[test]
fn eviction_works_through_a_partition_in_bounded_batches() -> Result<(), Box<dyn std::error::Error>>
{
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let store = open(dir.path(), &clock)?;
    for i in 0..10 {
        pair(&store, &format!("k{i}"), "x")?;
    }
    clock.advance(TTL);
    let mut removed = 0;
    for _ in 0..3 {
        let pass = store.evict_expired(3)?;
        assert_eq!((pass.removed, pass.backlog), (3, Backlog::More));
        removed += pass.removed;
    }
    let last = store.evict_expired(3)?;
    assert_eq!((last.removed, last.backlog), (1, Backlog::Empty));
    assert_eq!(removed + last.removed, 10);
    assert_eq!(store.exact_stats()?.records, 0);
    // A new record after the store emptied goes to a new partition, and stays.
    pair(&store, "later", "y")?;
    assert_eq!(store.evict_expired(100)?.removed, 0);
    assert_eq!(replayed(&store, "later")?, b"y");
    Ok(())
}

#[test]
fn a_key_claimed_again_once_gone_answers_from_its_newest_partition()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let store = open(dir.path(), &clock)?;
    pair(&store, "k", "first")?;
    pair(&store, "released", "first")?;
    clock.advance(TTL + WINDOW);
    // Both old records are gone but still stored: a new claim hides them.
    pair(&store, "k", "second")?;
    let Begin::Claimed(claim) = store.begin(&scope("released")?, fp("released"))? else {
        return Err("a gone key is claimed again".into());
    };
    claim.release()?;
    assert!(
        store.get(&scope("released")?)?.is_none(),
        "released: absent again"
    );
    assert_eq!(replayed(&store, "k")?, b"second");
    assert_eq!(store.exact_stats()?.partitions, 2);

    drop(store);
    let store = open(dir.path(), &clock)?;
    assert_eq!(replayed(&store, "k")?, b"second", "after a reopen");
    assert!(store.get(&scope("released")?)?.is_none());
    assert_eq!(
        store.evict_expired(100)?.removed,
        2,
        "the old partition goes, with both hidden records"
    );
    assert_eq!(replayed(&store, "k")?, b"second", "after the eviction");
    assert!(matches!(
        store.begin(&scope("released")?, fp("released"))?,
        Begin::Claimed(_)
    ));
    Ok(())
}

#[test]
fn full_partitions_are_sealed_with_rows_a_reopen_reads() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    // The smallest budget: partitions of 4,096 records.
    let open_small = || {
        Store::builder()
            .clock(clock.clone())
            .ttl(TTL)
            .sweep(Sweep::Off)
            .memory_budget(crate::model::memory::MIN_MEMORY_BUDGET)
            .open(dir.path())
    };
    let store = open_small()?;
    let count = 4_096 + 100;
    for i in 0..count {
        let key = format!("key-{i:05}");
        let done = store.execute(&scope(&key)?, fp(&key), move |_| {
            Ok(Response::new(201, format!("body {i}")))
        })?;
        assert!(matches!(done, Execution::Executed(_)));
    }
    assert_eq!(store.exact_stats()?.partitions, 2);
    drop(store);
    let store = open_small()?;
    assert_eq!(
        store.exact_stats()?.partitions,
        2,
        "the sealed one from its row"
    );
    for i in (0..count).step_by(7) {
        let key = format!("key-{i:05}");
        assert_eq!(replayed(&store, &key)?, format!("body {i}").as_bytes());
    }
    assert!(matches!(
        store.begin(&scope("never-written")?, fp("x"))?,
        Begin::Claimed(_)
    ));
    Ok(())
}

#[test]
fn tombstones_replace_responses_once_every_ttl_in_a_partition_has_passed()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let keep = Duration::from_secs(3600);
    let store = Store::builder()
        .clock(clock.clone())
        .ttl(TTL)
        .tombstone_ttl(keep)
        .sweep(Sweep::Off)
        .open(dir.path())?;
    pair(&store, "a", "first")?;
    pair(&store, "b", "first")?;
    clock.advance(WINDOW + Duration::from_millis(1));
    pair(&store, "c", "second")?; // opens the next partition, sealing the first

    clock.advance(TTL - WINDOW - Duration::from_millis(1));
    assert!(
        matches!(store.begin(&scope("a")?, fp("a"))?, Begin::Expired { .. }),
        "past its TTL, before any eviction: expired"
    );
    let pass = store.evict_expired(100)?;
    assert_eq!((pass.removed, pass.tombstones_removed), (2, 0));
    match store.get(&scope("a")?)?.map(|r| r.state().clone()) {
        Some(RecordState::Tombstone { .. }) => {}
        other => return Err(format!("a tombstone, not {other:?}").into()),
    }
    assert!(matches!(
        store.begin(&scope("b")?, fp("b"))?,
        Begin::Expired { .. }
    ));
    assert_eq!(store.evict_expired(100)?.removed, 0, "done once");

    clock.advance(keep);
    let pass = store.evict_expired(100)?;
    assert_eq!(
        (pass.removed, pass.tombstones_removed),
        (1, 2),
        "the first partition's tombstones go; c, past its TTL now, becomes one"
    );
    assert!(store.get(&scope("a")?)?.is_none());
    assert!(matches!(
        store.begin(&scope("a")?, fp("a"))?,
        Begin::Claimed(_)
    ));
    Ok(())
}

/// Rows are a cache of what the records say: with one partition's row gone (a crash lost it)
/// and another's damaged, an open reads both partitions whole, rebuilds their generation's
/// filter with their keys, and every key still answers.
#[test]
fn lost_rows_are_rebuilt_from_the_records() -> Result<(), Box<dyn std::error::Error>> {
    use redb::TableDefinition;

    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let open_small = || {
        Store::builder()
            .clock(clock.clone())
            .ttl(TTL)
            .sweep(Sweep::Off)
            .memory_budget(crate::model::memory::MIN_MEMORY_BUDGET)
            .open(dir.path())
    };
    let store = open_small()?;
    let count = 2 * 4_096 + 100;
    for i in 0..count {
        let key = format!("key-{i:05}");
        let done = store.execute(&scope(&key)?, fp(&key), move |_| {
            Ok(Response::new(201, format!("body {i}")))
        })?;
        assert!(matches!(done, Execution::Executed(_)));
    }
    assert_eq!(store.exact_stats()?.partitions, 3);
    drop(store);
    {
        let db = redb::Database::open(dir.path().join("idemstore.redb"))?;
        let txn = db.begin_write()?;
        {
            let mut rows =
                txn.open_table(TableDefinition::<&[u8], &[u8]>::new("idemstore.partitions"))?;
            assert!(
                rows.remove(1u32.to_be_bytes().as_slice())?.is_some(),
                "the sealed partitions have rows"
            );
            rows.insert(0u32.to_be_bytes().as_slice(), &b"damaged"[..])?;
        }
        txn.commit()?;
    }
    let store = open_small()?;
    for i in 0..count {
        let key = format!("key-{i:05}");
        assert_eq!(replayed(&store, &key)?, format!("body {i}").as_bytes());
    }
    Ok(())
}

/// The rows of `idemstore.partitions`, by partition number, read from the closed file.
fn rows(dir: &std::path::Path) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    use redb::{ReadableDatabase, ReadableTable, TableDefinition};

    let db = redb::Database::open(dir.join("idemstore.redb"))?;
    let txn = db.begin_read()?;
    let rows = txn.open_table(TableDefinition::<&[u8], &[u8]>::new("idemstore.partitions"))?;
    let mut numbers = Vec::new();
    for row in rows.iter()? {
        let (key, _) = row?;
        numbers.push(u32::from_be_bytes(key.value().try_into()?));
    }
    Ok(numbers)
}

#[test]
fn a_store_closing_seals_its_open_partition_and_the_next_record_opens_another()
-> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
    let store = open(dir.path(), &clock)?;
    for key in ["a", "b", "c"] {
        pair(&store, key, "first")?;
    }
    drop(store);
    assert_eq!(
        rows(dir.path())?,
        [0],
        "the open partition got its row at close"
    );

    let store = open(dir.path(), &clock)?;
    assert_eq!(store.exact_stats()?.partitions, 1);
    for key in ["a", "b", "c"] {
        assert_eq!(replayed(&store, key)?, b"first");
    }
    pair(&store, "d", "second")?;
    assert_eq!(
        store.exact_stats()?.partitions,
        2,
        "a sealed partition takes no more records, whatever its size"
    );
    drop(store);
    assert_eq!(rows(dir.path())?, [0, 1]);

    // Opened and closed with nothing written: nothing to seal, no new partition.
    drop(open(dir.path(), &clock)?);
    assert_eq!(rows(dir.path())?, [0, 1]);
    let store = open(dir.path(), &clock)?;
    for (key, body) in [("a", "first"), ("d", "second")] {
        assert_eq!(replayed(&store, key)?, body.as_bytes());
    }
    assert!(matches!(
        store.begin(&scope("e")?, fp("e"))?,
        Begin::Claimed(_)
    ));
    Ok(())
}
