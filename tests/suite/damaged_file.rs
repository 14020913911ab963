//! Issue 26, item 7. A damaged database file is an error that says so, never a panic in the
//! caller: 64 bytes flipped at offsets across the file, then every public call a service makes
//! at start (open, begin, get, stats, the abandoned-work listing) must return (`Ok`, or an
//! error naming the damage), whatever redb finds. redb panics on some damaged structures
//! ("Malformed allocator state" at open, a slice index out of range while reading a page);
//! the store catches those panics where it calls redb.

use crate::common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use common::{ORDERS, TestResult, builder, clock, fp, scope};
use idemstore::{Begin, ManualClock, OpenError, Response, Store, StoreError};

const RECORDS: usize = 300;

/// A closed store with `RECORDS` completed orders (several pages of every table).
fn make_store(dir: &Path, clock: &ManualClock) -> TestResult {
    let store = builder(clock).open(dir)?;
    for i in 0..RECORDS {
        let key = format!("order-{i:04}");
        let Begin::Claimed(claim) = store.begin(&scope(&key), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        claim.commit(move |tx| {
            tx.insert(&ORDERS, key.as_str(), "paid")?;
            Ok(Response::new(201, vec![b'r'; 150]))
        })?;
    }
    Ok(())
}

/// Copies every file of `from` into `to` (a flat store directory and its `wal/`).
fn copy_store(from: &Path, to: &Path) -> std::io::Result<()> {
    for entry in walk(from)? {
        let target = to.join(entry.strip_prefix(from).map_err(std::io::Error::other)?);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::copy(&entry, &target)?;
    }
    Ok(())
}

fn walk(dir: &Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(walk(&path)?);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}

/// What a service does first with a store, on a possibly damaged copy: panics are caught here
/// only to be reported as the test's failure.
fn use_store(dir: &Path, clock: &ManualClock) -> Result<&'static str, String> {
    let opened = match builder(clock).open(dir) {
        Ok(store) => store,
        Err(OpenError::Damaged { .. }) => return Ok("refused at open as damaged"),
        Err(_) => return Ok("refused at open"),
    };
    let reads = [
        read(&opened, |s| {
            s.begin(&scope("order-0007"), fp("req")).map(drop)
        }),
        read(&opened, |s| s.begin(&scope("new-key"), fp("req")).map(drop)),
        read(&opened, |s| s.get(&scope("order-0150")).map(drop)),
        read(&opened, |s| s.stats().map(drop)),
        read(&opened, |s| s.abandoned(10).map(drop)),
    ];
    Ok(if reads.iter().all(|r| matches!(r, Read::Fine)) {
        "opened and answered"
    } else if reads.iter().any(|r| matches!(r, Read::Damaged)) {
        "opened, and a read said the file is damaged"
    } else {
        "opened, and a read failed"
    })
}

enum Read {
    Fine,
    Damaged,
    Failed,
}

fn read(store: &Store, call: impl FnOnce(&Store) -> Result<(), StoreError>) -> Read {
    match call(store) {
        Ok(()) => Read::Fine,
        Err(StoreError::Damaged { .. } | StoreError::CorruptRecord { .. }) => Read::Damaged,
        Err(_) => Read::Failed,
    }
}

#[test]
fn a_damaged_database_file_is_an_error_never_a_panic() -> TestResult {
    let base = tempfile::tempdir()?;
    let clock = clock();
    let original = base.path().join("original");
    make_store(&original, &clock)?;
    let len = std::fs::metadata(original.join("idemstore.redb"))?.len();
    // Page starts, page middles and the file's header, across the whole file.
    let mut offsets: Vec<u64> = (0..len)
        .step_by(4096)
        .chain((2048..len).step_by(8192))
        .collect();
    offsets.extend([0, 64, 256, 512, 1024]);
    offsets.sort_unstable();
    offsets.dedup();
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for (n, &offset) in offsets.iter().enumerate() {
        let dir = base.path().join(format!("case-{n}"));
        copy_store(&original, &dir)?;
        let file = dir.join("idemstore.redb");
        let mut bytes = std::fs::read(&file)?;
        let end = usize::try_from(offset)?.saturating_add(64).min(bytes.len());
        for b in &mut bytes[usize::try_from(offset)?..end] {
            *b ^= 0xa5;
        }
        std::fs::write(&file, &bytes)?;
        let outcome = catch_unwind(AssertUnwindSafe(|| use_store(&dir, &clock)))
            .map_err(|_| format!("a call panicked with 64 bytes flipped at offset {offset}"))??;
        *seen.entry(outcome).or_default() += 1;
        std::fs::remove_dir_all(&dir)?;
    }
    println!("{} offsets: {seen:?}", offsets.len());
    assert!(offsets.len() > 50);
    Ok(())
}
