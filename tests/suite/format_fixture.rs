//! A store written by an earlier build opens, is moved to the current format, answers as it
//! did, and takes new writes.
//!
//! `tests/fixtures/format-1/` was written by format 1's code (commit b871fe3) and
//! `tests/fixtures/format-2/` by format 2's (commit 2216663), each with the program kept beside
//! it (`generator.rs.txt`): scopes in every state a record can be in, checkpointed into redb,
//! and one more only in the log, the process then gone without a close. The format-2 one also
//! has a released scope and a 200-byte body. Their answers are known because the generators'
//! clock was a manual one.

use std::path::Path;
use std::time::Duration;

use idemstore::redb::{ReadableDatabase, ReadableTable};
use idemstore::{Begin, Fingerprint, ManualClock, RecordState, Response, Scope, Store, Timestamp};

use crate::common::{ORDERS, orders};

/// The generator's clock when it stopped.
const FIXTURE_NOW: u64 = 1_790_086_491_000;

/// The formats of the fixtures.
const FIXTURES: [u64; 2] = [1, 2];

fn copy_fixture(format: u64, to: &Path) -> std::io::Result<()> {
    let from =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/format-{format}"));
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
    builder(clock).open(dir)
}

fn builder(clock: &ManualClock) -> idemstore::Builder {
    Store::builder()
        .table(ORDERS)
        .clock(clock.clone())
        .ttl(Duration::from_secs(86_400))
        .tombstone_ttl(Duration::from_secs(7 * 86_400))
        .lease(Duration::from_secs(30))
        .sweep(idemstore::Sweep::Off)
        .log_segment_bytes(1 << 20)
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
fn assert_fixture_answers(store: &Store, format: u64) -> Result<(), Box<dyn std::error::Error>> {
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

    if format >= 2 {
        assert!(
            store
                .get(&scope("acct_3", "refund", "k-released"))?
                .is_none(),
            "released before the checkpoint: absent"
        );
        let k200 = replayed(store, &scope("acct_4", "create_order", "k-200"), "req-200");
        assert_eq!((k200.status(), k200.body()), (201, &[b'r'; 200][..]));
    }

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
fn older_stores_open_and_answer_as_they_did() -> Result<(), Box<dyn std::error::Error>> {
    for format in FIXTURES {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("idem");
        copy_fixture(format, &path)?;
        let clock = ManualClock::new(Timestamp::from_millis(FIXTURE_NOW));
        let store = open(&path, &clock)?;
        assert!(
            store.recovery_report().frames_replayed > 0,
            "format {format}: the last scope is only in the log"
        );
        assert_fixture_answers(&store, format)?;
        let stats = store.exact_stats()?;
        assert_eq!(stats.in_progress, 1, "format {format}: the running claim");
        drop(store);
        // Moved once: the log it replayed is checkpointed with the move, and the answers
        // are the same from the new format's own tables.
        let store = open(&path, &clock)?;
        assert_eq!(
            store.recovery_report().frames_replayed,
            0,
            "format {format}"
        );
        assert_fixture_answers(&store, format)?;
    }
    Ok(())
}

#[test]
fn older_stores_take_new_writes_and_reopen() -> Result<(), Box<dyn std::error::Error>> {
    for format in FIXTURES {
        takes_new_writes(format)?;
    }
    Ok(())
}

fn takes_new_writes(format: u64) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("idem");
    copy_fixture(format, &path)?;
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
    assert_eq!(claim.recovery(), Some(idemstore::Recovery::LeaseExpired));
    // Begun by an earlier build, whose downstream keys came from the first attempt's fence
    // (5): the take-over keeps the key that attempt passed downstream, as the earlier build's
    // own take-over gave it.
    assert_eq!(
        claim.downstream_key(),
        "7923847df6a7f4711f3e3fa435c2141d",
        "format {format}"
    );
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

/// Every entry of the store's record and meta tables, read with redb itself.
fn store_entries(store_dir: &Path) -> Result<Entries, Box<dyn std::error::Error>> {
    let db = idemstore::redb::Database::open(store_dir.join("idemstore.redb"))?;
    let txn = db.begin_read()?;
    let mut entries = Vec::new();
    for name in ["idemstore.claims", "idemstore.done", "idemstore.meta"] {
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

/// The names of the tables in the store's file.
fn tables_of(store_dir: &Path) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    use idemstore::redb::TableHandle;
    let db = idemstore::redb::Database::open(store_dir.join("idemstore.redb"))?;
    let txn = db.begin_read()?;
    Ok(txn.list_tables()?.map(|t| t.name().to_owned()).collect())
}

#[test]
fn the_move_raises_the_format_and_a_newer_one_is_refused() -> Result<(), Box<dyn std::error::Error>>
{
    for format in FIXTURES {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("idem");
        copy_fixture(format, &path)?;
        assert_eq!(format_of(&path)?, format, "the fixture's format");
        assert!(tables_of(&path)?.contains(&"idemstore.records".to_owned()));
        let clock = ManualClock::new(Timestamp::from_millis(FIXTURE_NOW));
        drop(open(&path, &clock)?);
        assert_eq!(
            format_of(&path)?,
            3,
            "moved: a build that only reads {format} must now refuse it"
        );
        let tables = tables_of(&path)?;
        for old in [
            "idemstore.records",
            "idemstore.expiry",
            "idemstore.leases",
            "idemstore.tombstones",
        ] {
            assert!(
                !tables.contains(&old.to_owned()),
                "{old} is gone: {tables:?}"
            );
        }

        // A store from a build newer than this one: refused, and left as it was.
        {
            let db = idemstore::redb::Database::open(path.join("idemstore.redb"))?;
            let txn = db.begin_write()?;
            txn.open_table(META)?
                .insert(&b"format_version"[..], &4u64.to_le_bytes()[..])?;
            txn.commit()?;
        }
        let before = store_entries(&path)?;
        match open(&path, &clock) {
            Err(idemstore::OpenError::UnsupportedFormat { found, supported }) => {
                assert_eq!((found, supported), (4, 3));
            }
            other => panic!("format 4 must be refused: {other:?}"),
        }
        assert_eq!(format_of(&path)?, 4);
        assert!(before == store_entries(&path)?, "nothing changed");
    }
    Ok(())
}

/// The move under faults, on a simulated disk (feature `testing`).
#[cfg(feature = "testing")]
mod faults {
    use super::*;
    use idemstore::testing::{FaultPlan, SimDisk, Tear};

    /// The fixture's files on a simulated disk, durable.
    fn fixture_disk(format: u64) -> Result<SimDisk, std::io::Error> {
        let from =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/format-{format}"));
        let disk = SimDisk::new();
        for file in ["idemstore.redb", "wal/seg-00000000.log"] {
            disk.set_file(file, std::fs::read(from.join(file))?);
        }
        Ok(disk)
    }

    /// The move is one durable commit. Power lost at any write or sync of an open that moves the
    /// store leaves a disk that opens with every answer (moved or not yet); an I/O error at any of
    /// them (a failed sync's writes never reach the disk) fails that open, and the next open in
    /// the same process, and a crash after it, still give every answer.
    #[test]
    fn the_move_survives_a_crash_or_a_failed_write_at_any_point()
    -> Result<(), Box<dyn std::error::Error>> {
        let clock = ManualClock::new(Timestamp::from_millis(FIXTURE_NOW));
        for format in FIXTURES {
            let mut op = 1;
            loop {
                let disk = fixture_disk(format)?;
                disk.plan(FaultPlan {
                    crash_at: Some(op),
                    ..FaultPlan::default()
                });
                drop(builder(&clock).open_simulated(&disk));
                if !disk.crashed() {
                    break; // the open was done before operation `op`
                }
                for tear in [Tear::Drop, Tear::Sectors(1)] {
                    let image = disk.crash_image(tear);
                    let store = builder(&clock)
                        .open_simulated(&image)
                        .map_err(|e| format!("format {format}, crash at {op} ({tear:?}): {e}"))?;
                    assert_fixture_answers(&store, format)?;
                    // What the reopened store acknowledges rests on the move: a crash now keeps
                    // both.
                    written_then_crashed(&store, &image, &clock, format, op)?;
                }

                let disk = fixture_disk(format)?;
                disk.plan(FaultPlan {
                    fail_at: Some(op),
                    ..FaultPlan::default()
                });
                drop(builder(&clock).open_simulated(&disk));
                let store = builder(&clock)
                    .open_simulated(&disk)
                    .map_err(|e| format!("format {format}, failure at {op}, reopened: {e}"))?;
                assert_fixture_answers(&store, format)?;
                drop(store);
                let image = disk.crash_image(Tear::Drop);
                let store = builder(&clock)
                    .open_simulated(&image)
                    .map_err(|e| format!("format {format}, failure at {op}, then a crash: {e}"))?;
                assert_fixture_answers(&store, format)?;
                written_then_crashed(&store, &image, &clock, format, op)?;
                op += 1;
            }
            assert!(op > 10, "format {format}: the open wrote only {op} times");
        }
        Ok(())
    }

    /// Commits a new scope on `store` (open on `disk`), then loses power: the reopened disk has
    /// it and every answer of the fixture.
    fn written_then_crashed(
        store: &Store,
        disk: &SimDisk,
        clock: &ManualClock,
        format: u64,
        op: u64,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let after = scope("acct_9", "create_order", &format!("after-{op}"));
        let Begin::Claimed(claim) = store.begin(&after, fp("req-after"))? else {
            return Err(format!("format {format}, op {op}: a new key is claimed").into());
        };
        claim.commit(|_| Ok(Response::new(201, b"after".to_vec())))?;
        let store = builder(clock)
            .open_simulated(&disk.crash_image(Tear::Drop))
            .map_err(|e| format!("format {format}, op {op}, after a write and a crash: {e}"))?;
        assert_fixture_answers(&store, format)?;
        assert_eq!(replayed(&store, &after, "req-after").body(), b"after");
        Ok(())
    }
}
