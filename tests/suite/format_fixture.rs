//! A store written by an earlier build opens, answers as it did, and takes new writes.
//!
//! `tests/fixtures/format-1/` was written by format 1's code (commit b871fe3) with the
//! program kept beside it (`generator.rs.txt`): five scopes in every state a record can be in,
//! four of them checkpointed into redb and the fifth only in the log, the process then gone
//! without a close. Its answers are known because the generator's clock was a manual one.

use std::path::Path;
use std::time::Duration;

use idemstore::redb::{ReadableDatabase, ReadableTable};
use idemstore::{Begin, Fingerprint, ManualClock, RecordState, Response, Scope, Store, Timestamp};

use crate::common::{ORDERS, orders};

/// The generator's clock when it stopped.
const FIXTURE_NOW: u64 = 1_790_086_491_000;

fn copy_fixture(to: &Path) -> std::io::Result<()> {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-1");
    std::fs::create_dir_all(to.join("wal"))?;
    for file in ["idemstore.redb", "wal/seg-00000000.log"] {
        std::fs::copy(from.join(file), to.join(file))?;
        set_owner_only(&to.join(file))?;
    }
    set_owner_only(to)?;
    set_owner_only(&to.join("wal"))
}

/// A checkout makes files 0644 and directories 0755; the store wants them its owner's alone.
fn set_owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = if path.is_dir() { 0o700 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

fn open(dir: &Path, clock: &ManualClock) -> Result<Store, idemstore::OpenError> {
    Store::builder()
        .table(ORDERS)
        .clock(clock.clone())
        .ttl(Duration::from_secs(86_400))
        .tombstone_ttl(Duration::from_secs(7 * 86_400))
        .lease(Duration::from_secs(30))
        .sweep(idemstore::Sweep::Off)
        .log_segment_bytes(1 << 20)
        .open(dir)
}

fn scope(tenant: &str, operation: &str, key: &str) -> Scope {
    Scope::new(tenant, operation, key).expect("the fixture's scopes are valid")
}

fn fp(s: &str) -> Fingerprint {
    Fingerprint::of_bytes(s.as_bytes())
}

fn replayed(store: &Store, scope: &Scope, fingerprint: &str) -> Response {
    match store.begin(scope, fp(fingerprint)) {
        Ok(Begin::Replay(response)) => response,
        other => panic!("{scope}: expected a replay, got {other:?}"),
    }
}

/// What the fixture holds, asked through the public API.
fn assert_fixture_answers(store: &Store) -> Result<(), Box<dyn std::error::Error>> {
    let old = scope("acct_1", "create_order", "old-1");
    assert!(
        matches!(store.begin(&old, fp("req-old"))?, Begin::Expired { .. }),
        "the evicted record is a tombstone"
    );
    assert!(matches!(
        store.get(&old)?.map(|r| r.state().clone()),
        Some(RecordState::Tombstone { .. })
    ));

    let done = scope(
        "acct_1",
        "create_order",
        "550e8400-e29b-41d4-a716-446655440000",
    );
    let response = replayed(store, &done, "req-done");
    assert_eq!(response.status(), 201);
    assert_eq!(
        response.headers(),
        &[
            ("content-type".to_owned(), b"application/json".to_vec()),
            ("x-request-id".to_owned(), b"r-2".to_vec()),
        ]
    );
    let body = String::from_utf8(response.body().to_vec())?;
    assert!(body.starts_with("{\"order\":\"ord_2\",\"lines\":[{\"sku\":\"sku-0\",\"qty\":0}"));
    assert!(
        body.ends_with("{\"sku\":\"sku-59\",\"qty\":59}]}"),
        "{body}"
    );
    assert!(matches!(
        store.begin(&done, fp("another request"))?,
        Begin::Mismatch { .. }
    ));

    let taken = scope("acct_2", "charge", "k-taken");
    assert_eq!(replayed(store, &taken, "req-taken").body(), b"charged");
    let record = store.get(&taken)?.ok_or("the taken-over record is there")?;
    assert_eq!(record.attempt(), 2);
    assert!(record.fence() > 1);

    let running = scope("acct_2", "charge", "k-running");
    assert!(matches!(
        store.begin(&running, fp("req-running"))?,
        Begin::InProgress { .. }
    ));
    match store.get(&running)?.map(|r| r.state().clone()) {
        Some(RecordState::InProgress { checkpoint, .. }) => {
            assert_eq!(checkpoint.as_deref(), Some(&b"step-2"[..]));
        }
        other => panic!("the running claim is in progress: {other:?}"),
    }

    let logged = scope("acct_3", "refund", "k-logged");
    let response = replayed(store, &logged, "req-logged");
    assert_eq!((response.status(), response.body()), (202, &b"queued"[..]));

    let mut rows = orders(store)?;
    rows.sort();
    assert_eq!(
        rows,
        [
            ("ord_2".to_owned(), "widget x3".to_owned()),
            ("ord_5".to_owned(), "refund".to_owned()),
            ("ord_old".to_owned(), "gadget x1".to_owned()),
        ]
    );
    Ok(())
}

#[test]
fn a_format_1_store_opens_and_answers_as_it_did() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("idem");
    copy_fixture(&path)?;
    let clock = ManualClock::new(Timestamp::from_millis(FIXTURE_NOW));
    let store = open(&path, &clock)?;
    assert!(
        store.recovery_report().frames_replayed > 0,
        "the fifth scope is only in the log"
    );
    assert_fixture_answers(&store)?;
    Ok(())
}

#[test]
fn a_format_1_store_takes_new_writes_and_reopens() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("idem");
    copy_fixture(&path)?;
    let clock = ManualClock::new(Timestamp::from_millis(FIXTURE_NOW));
    let store = open(&path, &clock)?;
    // A new scope, and an old one rewritten: the running claim's lease ends and it is taken over.
    let new = scope("acct_4", "create_order", "k-new");
    let Begin::Claimed(claim) = store.begin(&new, fp("req-new"))? else {
        panic!("a new key is claimed");
    };
    claim.commit(|tx| {
        tx.insert(&ORDERS, "ord_new", "new")?;
        Ok(Response::new(201, vec![b'x'; 4096]))
    })?;
    clock.advance(Duration::from_secs(31));
    let running = scope("acct_2", "charge", "k-running");
    let Begin::Recovered(claim) = store.begin(&running, fp("req-running"))? else {
        panic!("the running claim's lease has ended");
    };
    assert_eq!(claim.last_checkpoint(), Some(&b"step-2"[..]));
    claim.commit(|_| Ok(Response::new(200, b"recovered".to_vec())))?;
    drop(store);

    let store = open(&path, &clock)?;
    assert_eq!(
        replayed(&store, &new, "req-new").body(),
        &vec![b'x'; 4096][..]
    );
    assert_eq!(
        replayed(&store, &running, "req-running").body(),
        b"recovered"
    );
    let taken = scope("acct_2", "charge", "k-taken");
    assert_eq!(replayed(&store, &taken, "req-taken").body(), b"charged");
    assert_eq!(orders(&store)?.len(), 4);
    Ok(())
}

const META: idemstore::redb::TableDefinition<&[u8], &[u8]> =
    idemstore::redb::TableDefinition::new("idemstore.meta");

/// A table's entries as bytes.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Every entry of the store's records and meta tables, read with redb itself.
fn store_entries(store_dir: &Path) -> Result<Entries, Box<dyn std::error::Error>> {
    let db = idemstore::redb::Database::open(store_dir.join("idemstore.redb"))?;
    let txn = db.begin_read()?;
    let mut entries = Vec::new();
    for name in ["idemstore.records", "idemstore.meta"] {
        let table = txn.open_table(idemstore::redb::TableDefinition::<&[u8], &[u8]>::new(name))?;
        for entry in table.iter()? {
            let (k, v) = entry?;
            entries.push((k.value().to_vec(), v.value().to_vec()));
        }
    }
    Ok(entries)
}

fn format_of(store_dir: &Path) -> Result<u64, Box<dyn std::error::Error>> {
    let db = idemstore::redb::Database::open(store_dir.join("idemstore.redb"))?;
    let txn = db.begin_read()?;
    let meta = txn.open_table(META)?;
    let value = meta
        .get(&b"format_version"[..])?
        .ok_or("no format_version")?;
    Ok(u64::from_le_bytes(value.value().try_into()?))
}

#[test]
fn the_open_raises_the_format_and_a_newer_one_is_refused() -> Result<(), Box<dyn std::error::Error>>
{
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("idem");
    copy_fixture(&path)?;
    assert_eq!(format_of(&path)?, 1, "the fixture is format 1");
    let clock = ManualClock::new(Timestamp::from_millis(FIXTURE_NOW));
    drop(open(&path, &clock)?);
    assert_eq!(
        format_of(&path)?,
        2,
        "a build that only reads 1 must now refuse it"
    );

    // A store from a build newer than this one: refused, and left as it was.
    {
        let db = idemstore::redb::Database::open(path.join("idemstore.redb"))?;
        let txn = db.begin_write()?;
        txn.open_table(META)?
            .insert(&b"format_version"[..], &3u64.to_le_bytes()[..])?;
        txn.commit()?;
    }
    let before = store_entries(&path)?;
    match open(&path, &clock) {
        Err(idemstore::OpenError::UnsupportedFormat { found, supported }) => {
            assert_eq!((found, supported), (3, 2));
        }
        other => panic!("format 3 must be refused: {other:?}"),
    }
    assert_eq!(format_of(&path)?, 3);
    assert!(before == store_entries(&path)?, "nothing changed");
    Ok(())
}
