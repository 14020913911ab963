//! Bad input gets a clear error and changes nothing.

use crate::common;

use std::time::Duration;

use common::{ORDERS, TestResult, clock, fp, open, order_count, scope};
use idemstore::redb::TableDefinition;
use idemstore::{
    Begin, ClaimError, CommitError, Fingerprint, FingerprintError, OpenError, RecordState,
    Response, ResponseError, Scope, ScopeError, ScopePart, Store, TxError,
};

const UNREGISTERED: TableDefinition<&str, &str> = TableDefinition::new("not_registered");
const ORDERS_WRONG_TYPES: TableDefinition<u64, &str> = TableDefinition::new("orders");

#[test]
fn malformed_keys_are_refused_with_the_part_named() {
    assert_eq!(
        Scope::new("t", "op", ""),
        Err(ScopeError::Empty {
            part: ScopePart::Key
        })
    );
    assert_eq!(
        Scope::new("t", "op", "k".repeat(256)),
        Err(ScopeError::TooLong {
            part: ScopePart::Key,
            len: 256,
            max: 255
        })
    );
    assert!(matches!(
        Scope::new("t", "op", "abc\r\nInjected: yes"),
        Err(ScopeError::ForbiddenCharacter {
            part: ScopePart::Key,
            index: 3,
            ..
        })
    ));
    assert!(matches!(
        Scope::new("t", "op", "tab\there"),
        Err(ScopeError::ForbiddenCharacter { .. })
    ));
    assert!(matches!(
        Scope::new("", "op", "k"),
        Err(ScopeError::Empty {
            part: ScopePart::Tenant
        })
    ));
    assert!(matches!(
        Scope::new("t", "o\0p", "k"),
        Err(ScopeError::ForbiddenCharacter {
            part: ScopePart::Operation,
            ..
        })
    ));
    let message = Scope::new("t", "op", "k".repeat(300))
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        message.as_deref(),
        Some(
            "the idempotency key is 300 bytes long, over the limit of 255; shorten it (a UUID is 36)"
        )
    );
}

#[test]
fn a_fingerprint_of_the_wrong_length_is_refused() {
    assert_eq!(
        Fingerprint::from_slice(&[7; 16]),
        Err(FingerprintError::WrongLength { len: 16 })
    );
}

fn held(store: &Store) -> Result<idemstore::Claim, Box<dyn std::error::Error>> {
    match store.begin(&scope("k"), fp("req"))? {
        Begin::Claimed(claim) => Ok(claim),
        other => Err(format!("expected Claimed, got {other:?}").into()),
    }
}

fn still_in_progress(store: &Store) -> TestResult {
    match store.get(&scope("k"))?.map(|r| r.state().clone()) {
        Some(RecordState::InProgress { .. }) => Ok(()),
        other => Err(format!("expected the claim still in progress, got {other:?}").into()),
    }
}

#[test]
fn writing_an_unregistered_table_aborts_the_commit_and_writes_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let err = held(&store)?
        .commit(|tx| {
            tx.insert(&ORDERS, "first", "row")?;
            tx.insert(&UNREGISTERED, "k", "v")?;
            Ok(Response::new(201, vec![]))
        })
        .err()
        .ok_or("an unregistered table was written")?;
    let CommitError::Aborted { source, .. } = &err else {
        return Err(format!("expected Aborted, got {err:?}").into());
    };
    assert!(
        matches!(source.downcast_ref::<TxError>(), Some(TxError::UnknownTable { name }) if name == "not_registered"),
        "{source}"
    );
    assert!(err.to_string().contains("Builder::table"), "{err}");
    assert_eq!(order_count(&store)?, 0);
    still_in_progress(&store)?;

    // The same name with other types is refused too.
    let claim = err.into_claim().ok_or("claim")?;
    let err = claim
        .commit(|tx| {
            tx.insert(&ORDERS_WRONG_TYPES, 1, "row")?;
            Ok(Response::new(201, vec![]))
        })
        .err()
        .ok_or("a table was written with the wrong types")?;
    assert!(
        err.to_string().contains("registered as <&str, &str>"),
        "{err}"
    );
    assert!(matches!(
        store.read()?.open_table(UNREGISTERED),
        Err(idemstore::ReadError::Table(TxError::UnknownTable { .. }))
    ));
    Ok(())
}

#[test]
fn an_oversized_response_is_refused_and_the_claim_stays_held() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = common::builder(&clock())
        .max_response_bytes(4096)
        .open(dir.path().join("idem"))?;
    let err = held(&store)?
        .commit(|tx| {
            tx.insert(&ORDERS, "row", "x")?;
            Ok(Response::new(200, vec![0; 5000]))
        })
        .err()
        .ok_or("an oversized response was stored")?;
    assert!(
        matches!(
            err,
            CommitError::InvalidResponse {
                source: ResponseError::TooLarge { max: 4096, .. },
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(order_count(&store)?, 0);
    still_in_progress(&store)?;

    let claim = err.into_claim().ok_or("claim")?;
    let err = claim
        .commit(|_| Ok(Response::new(200, vec![]).with_header("x", vec![0; 9000])))
        .err()
        .ok_or("an oversized header was stored")?;
    assert!(matches!(
        err,
        CommitError::InvalidResponse {
            source: ResponseError::HeaderValueTooLong { .. },
            ..
        }
    ));
    let mut claim = err.into_claim().ok_or("claim")?;
    assert!(matches!(
        claim.checkpoint(vec![0; 65 * 1024]),
        Err(ClaimError::CheckpointTooLarge { max: 65536, .. })
    ));
    assert!(matches!(
        claim.extend(Duration::from_secs(8 * 24 * 3600)),
        Err(ClaimError::InvalidLease { .. })
    ));
    still_in_progress(&store)?;
    Ok(())
}

#[test]
fn invalid_settings_and_tables_fail_at_open() -> TestResult {
    let dir = tempfile::tempdir()?;
    let spoiled = [
        ("lease", Store::builder().lease(Duration::ZERO)),
        ("lease", Store::builder().lease(Duration::from_micros(500))),
        ("max_batch", Store::builder().max_batch(0)),
    ];
    for (setting, builder) in spoiled {
        let err = builder.open(dir.path().join("a")).err();
        assert!(
            matches!(&err, Some(OpenError::InvalidConfig { setting: s, .. }) if *s == setting),
            "{setting}: {err:?}"
        );
    }
    let reserved: TableDefinition<&str, &str> = TableDefinition::new("idemstore.records");
    let err = Store::builder()
        .table(reserved)
        .open(dir.path().join("a"))
        .err();
    assert!(matches!(err, Some(OpenError::BadTable { .. })), "{err:?}");
    let err = Store::builder()
        .table(ORDERS)
        .table(ORDERS_WRONG_TYPES)
        .open(dir.path().join("a"))
        .err();
    assert!(matches!(err, Some(OpenError::BadTable { .. })), "{err:?}");

    // A table that exists on disk with other types.
    drop(Store::builder().table(ORDERS).open(dir.path().join("b"))?);
    let err = Store::builder()
        .table(ORDERS_WRONG_TYPES)
        .open(dir.path().join("b"))
        .err();
    assert!(matches!(err, Some(OpenError::Setup(_))), "{err:?}");
    Ok(())
}

#[test]
fn a_file_that_is_not_a_store_is_refused_and_left_alone() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store_dir = dir.path().join("idem");
    std::fs::create_dir_all(&store_dir)?;
    let file = store_dir.join("idemstore.redb");
    let garbage = b"this is not a redb file, it is a text file of some length".repeat(200);
    std::fs::write(&file, &garbage)?;
    let err = Store::open(&store_dir)
        .err()
        .ok_or("garbage opened as a store")?;
    assert!(matches!(err, OpenError::Database { .. }), "{err:?}");
    assert!(
        err.to_string().contains("restore it from a backup"),
        "{err}"
    );
    assert_eq!(std::fs::read(&file)?, garbage, "the file was changed");
    Ok(())
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let _store = Store::open(dir.path())?;
    let err = Store::open(dir.path()).err();
    assert!(
        matches!(err, Some(OpenError::AlreadyOpen { .. })),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn refused_input_leaves_the_store_empty() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let err = store
        .write(|tx| {
            tx.insert(&ORDERS, "k", "v")?;
            tx.insert(&UNREGISTERED, "k", "v")?;
            Ok(())
        })
        .err()
        .ok_or("an unregistered table was written")?;
    assert!(
        matches!(&err, idemstore::WriteError::Aborted(e) if matches!(e.downcast_ref::<TxError>(), Some(TxError::UnknownTable { .. }))),
        "{err}"
    );
    let stats = store.exact_stats()?;
    assert_eq!(
        (
            stats.records,
            stats.completed,
            stats.in_progress,
            stats.tombstones
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(store.stats()?.groups_committed, 0);
    Ok(())
}

/// Rewrites one entry of the store's metadata table directly in redb.
fn damage_meta(dir: &std::path::Path, key: &[u8], value: &[u8]) -> TestResult {
    let db = idemstore::redb::Database::open(dir.join("idemstore.redb"))?;
    let txn = db.begin_write()?;
    {
        let meta: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idemstore.meta");
        let mut table = txn.open_table(meta)?;
        table.insert(key, value)?;
    }
    txn.commit()?;
    Ok(())
}

#[test]
fn a_damaged_fence_counter_is_refused_rather_than_restarted() -> TestResult {
    let dir = tempfile::tempdir()?;
    {
        let store = open(dir.path(), &clock())?;
        let Begin::Claimed(claim) = store.begin(&scope("k"), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        claim.release()?;
    }
    damage_meta(&dir.path().join("idem"), b"next_fence", &[1, 2, 3])?;
    let err = open(dir.path(), &clock())
        .err()
        .ok_or("a damaged fence counter opened")?;
    assert!(
        matches!(
            err,
            OpenError::CorruptMeta {
                key: "next_fence",
                ..
            }
        ),
        "{err}"
    );
    Ok(())
}

#[test]
fn a_redb_file_that_is_not_a_store_is_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("idemstore.redb");
    {
        let db = idemstore::redb::Database::create(&path)?;
        let txn = db.begin_write()?;
        txn.open_table(ORDERS)?.insert("someone else's", "data")?;
        txn.commit()?;
    }
    let err = Store::open(dir.path())
        .err()
        .ok_or("a foreign redb file was adopted")?;
    assert!(matches!(err, OpenError::NotAStore { .. }), "{err}");
    Ok(())
}
