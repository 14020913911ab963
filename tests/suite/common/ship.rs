//! Helpers of the log-shipping tests (`shipping.rs`, `handover.rs`): a pair committed with
//! one order row, waits for a shipping state, a lost box and a restore, on the in-memory
//! replica.

use std::path::Path;
use std::time::{Duration, Instant};

use idemstore::testing::MemoryReplica;
use idemstore::{Begin, ManualClock, Response, ShipState, Shipping, Store, Takeover};

use super::{ORDERS, TestResult, builder, fp, order_count, scope};

/// How long a test waits for shipping to reach a state.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Claims `key` and commits it with one order row.
pub fn pair(store: &Store, key: &str) -> Result<(), Box<dyn std::error::Error>> {
    pair_with(store, key, b"ok")
}

pub fn pair_with(store: &Store, key: &str, body: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
    match store.begin(&scope(key), fp(key))? {
        // A store restored from an asynchronous stream answers unknown keys as recoveries for
        // a while (`restore_window.rs`); for these tests either is a claim to do the work.
        Begin::Claimed(claim) | Begin::Recovered(claim) => {
            let body = body.to_vec();
            let key = key.to_owned();
            claim.commit(move |tx| {
                tx.insert(&ORDERS, key.as_str(), "order")?;
                Ok(Response::new(201, body))
            })?;
            Ok(())
        }
        other => Err(format!("{key}: expected a claim, got {other:?}").into()),
    }
}

/// Polls until `check` holds, for at most [`PATIENCE`].
pub fn until(what: &str, mut check: impl FnMut() -> bool) -> TestResult {
    let started = Instant::now();
    while !check() {
        if started.elapsed() > PATIENCE {
            return Err(format!("waited {PATIENCE:?} for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

pub fn state(store: &Store) -> Option<ShipState> {
    store.stats().ok()?.shipping.map(|s| s.state)
}

/// Everything synced locally is acknowledged.
pub fn caught_up(store: &Store) -> bool {
    store
        .stats()
        .ok()
        .and_then(|s| s.shipping)
        .is_some_and(|s| {
            s.state == ShipState::Shipping
                && s.shipped_frame >= s.durable_frame
                && s.lag_frames == 0
        })
}

pub fn shipping(
    clock: &ManualClock,
    replica: &MemoryReplica,
    mode: Shipping,
) -> idemstore::Builder {
    builder(clock).ship(replica.handle(), mode)
}

/// The box is lost: no clean close, no release of the stream, and nothing more from it (its
/// shipper's threads, still running in this process, are cut off from the stream).
pub fn lose(store: Store, replica: &MemoryReplica) {
    replica.cut_off();
    std::mem::forget(store);
}

/// Restores `replica` into `dir` (taking the stream over) and opens it without shipping.
pub fn restore(
    replica: &MemoryReplica,
    dir: &Path,
    clock: &ManualClock,
) -> Result<Store, Box<dyn std::error::Error>> {
    Store::restore(&replica.handle(), dir, Takeover::Yes)?;
    Ok(builder(clock).open(dir)?)
}

/// Every key replays, with one order row each.
pub fn all_replay(store: &Store, keys: &[String]) -> TestResult {
    for key in keys {
        match store.begin(&scope(key), fp(key))? {
            Begin::Replay(response) => assert_eq!(response.status(), 201, "{key}"),
            other => return Err(format!("{key}: expected a replay, got {other:?}").into()),
        }
    }
    assert_eq!(order_count(store)?, keys.len() as u64);
    Ok(())
}

/// Opens `builder` as the primary in `dir/primary`, commits the pair "first", and waits for
/// the first snapshot the stream begins with.
pub fn first_snapshot(
    builder: idemstore::Builder,
    dir: &tempfile::TempDir,
    replica: &MemoryReplica,
) -> Result<Store, Box<dyn std::error::Error>> {
    let primary = builder.open(dir.path().join("primary"))?;
    pair(&primary, "first")?;
    until("the first snapshot", || replica.snapshot_seq().is_some())?;
    Ok(primary)
}

/// Waits until the replica holds every frame `primary` synced; returns the last one.
pub fn shipped_all(primary: &Store) -> Result<u64, Box<dyn std::error::Error>> {
    until("the primary to ship everything", || caught_up(primary))?;
    Ok(primary.stats()?.shipping.ok_or("no stats")?.durable_frame)
}

pub fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}
