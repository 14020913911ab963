//! One writer per store directory, within one process: a second `Store::open` of a directory
//! is refused, naming this process, for as long as the first store lives, reopens included.
//! (`tests/two_processes.rs` does the same across real processes.)

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{ORDERS, TestResult, clock, fp, open, scope};
use idemstore::{Begin, Holder, OpenError, Response};

#[test]
fn a_second_open_is_refused_naming_this_process_until_the_first_store_is_dropped() -> TestResult {
    let dir = tempfile::tempdir()?;
    let first = open(dir.path(), &clock())?;
    let refused = open(dir.path(), &clock())
        .err()
        .ok_or("a second store opened the directory")?;
    let OpenError::AlreadyOpen { path, holder } = &refused else {
        return Err(format!("expected AlreadyOpen, got {refused}").into());
    };
    assert_eq!(path, &dir.path().join("idem"));
    assert!(
        matches!(holder, Holder::Process { pid, .. } if *pid == std::process::id()),
        "{holder:?}"
    );
    let message = refused.to_string();
    assert!(
        message.contains(&format!("this process, process {}", std::process::id())),
        "{message}"
    );
    assert!(message.contains("drop it first"), "{message}");

    // A clone is the same store, and keeps the directory locked when the original goes.
    let clone = first.clone();
    drop(first);
    assert!(
        open(dir.path(), &clock()).is_err(),
        "a clone still holds it"
    );
    drop(clone);
    let again = open(dir.path(), &clock())?;
    assert!(again.writable().is_ok());
    Ok(())
}

#[test]
fn a_second_open_never_gets_in_while_the_first_store_reopens_under_load() -> TestResult {
    let dir = tempfile::tempdir()?;
    let store = open(dir.path(), &clock())?;
    let stop = Arc::new(AtomicBool::new(false));
    let reopener = {
        let (store, stop) = (store.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut reopened = 0u32;
            while !stop.load(Ordering::SeqCst) {
                if store.reopen().is_ok() {
                    reopened += 1;
                }
            }
            reopened
        })
    };
    let writer = {
        let (store, stop) = (store.clone(), Arc::clone(&stop));
        std::thread::spawn(move || -> Result<u32, idemstore::Error> {
            let mut written = 0;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("k{written}");
                if let Begin::Claimed(claim) = store.begin(&scope(&key), fp(&key))? {
                    claim.commit(move |tx| {
                        tx.insert(&ORDERS, key.as_str(), "paid")?;
                        Ok(Response::new(201, "ok"))
                    })?;
                }
                written += 1;
            }
            Ok(written)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut tries, mut opened) = (0u32, 0u32);
    while Instant::now() < deadline {
        tries += 1;
        match open(dir.path(), &clock()) {
            Ok(second) => {
                opened += 1;
                drop(second);
            }
            Err(OpenError::AlreadyOpen { .. }) => {}
            Err(e) => return Err(format!("refused for another reason: {e}").into()),
        }
    }
    stop.store(true, Ordering::SeqCst);
    let reopened = reopener.join().map_err(|_| "the reopener panicked")?;
    let written = writer.join().map_err(|_| "the writer panicked")??;
    println!("{tries} opens tried, {reopened} reopens, {written} writes");
    assert_eq!(
        opened, 0,
        "a second store opened the directory {opened} times"
    );
    assert!(reopened > 0, "the first store never reopened");
    store.writable()?;
    assert_eq!(common::order_count(&store)?, u64::from(written));
    Ok(())
}

#[test]
fn a_lock_file_left_by_a_crash_holds_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    drop(open(dir.path(), &clock())?);
    let lock = dir.path().join("idem").join("idemstore.lock");
    assert!(lock.is_file(), "the store has a lock file");
    assert_eq!(
        std::fs::read(&lock)?,
        b"",
        "a closed store's lock file names nobody"
    );
    // What a killed process leaves: its record, no lock.
    std::fs::write(&lock, "4000000000\nedge_service\n")?;
    let store = open(dir.path(), &clock())?;
    let text = std::fs::read_to_string(&lock)?;
    assert!(
        text.starts_with(&format!("{}\n", std::process::id())),
        "{text:?}"
    );
    drop(store);
    Ok(())
}
