//! A walk through idemstore on an embedded store in `./idemstore-data/quickstart`:
//! claim → commit → replay → mismatch → a crashed attempt recovered → 16 threads racing one key.
//!
//! Run it with `cargo run --example quickstart`. Run it twice: the second run first replays
//! the previous run's order from disk.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemstore::redb::{ReadableTableMetadata, TableDefinition};
use idemstore::{Begin, Fingerprint, ManualClock, Response, Scope, Store, Timestamp};
use serde::Serialize;

/// The business table: order id → description. Written in the same transaction as the record.
const ORDERS: TableDefinition<&str, &str> = TableDefinition::new("orders");

/// The validated command a client sends; its fingerprint tells retries from new requests.
#[derive(Serialize)]
struct CreateOrder<'a> {
    item: &'a str,
    quantity: u32,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new("idemstore-data").join("quickstart");
    let store = Store::builder().table(ORDERS).open(&dir)?;
    println!("store opened in {}", dir.display());

    // Each run uses its own key; the previous run's key, if any, is replayed from disk.
    let marker = dir.join("last-key");
    if let Ok(previous) = std::fs::read_to_string(&marker) {
        let scope = Scope::new("acct_42", "create_order", previous.trim())?;
        let command = CreateOrder {
            item: "widget",
            quantity: 3,
        };
        if let Begin::Replay(r) = store.begin(&scope, Fingerprint::of(&command)?)? {
            println!(
                "0. previous run's key {}: replayed from disk: {} {}",
                previous.trim(),
                r.status(),
                String::from_utf8_lossy(r.body())
            );
        }
    }
    let run = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let key = format!("order-{run}");
    std::fs::write(&marker, &key)?;

    let scope = Scope::new("acct_42", "create_order", &key)?;
    let command = CreateOrder {
        item: "widget",
        quantity: 3,
    };
    let fingerprint = Fingerprint::of(&command)?;

    // 1. The first attempt claims the key, does the work, commits row + response together.
    let Begin::Claimed(claim) = store.begin(&scope, fingerprint)? else {
        return Err("a new key should be claimed".into());
    };
    println!(
        "1. claimed {scope} (fence {}, attempt {})",
        claim.fence(),
        claim.attempt()
    );
    let order_id = format!("ord_{run}");
    let body = format!("{{\"order\":\"{order_id}\",\"item\":\"widget\",\"quantity\":3}}");
    let stored = claim.commit(move |tx| {
        tx.insert(&ORDERS, order_id.as_str(), "widget x3")?;
        Ok(Response::new(201, body.into_bytes())
            .with_header("content-type", b"application/json".to_vec()))
    })?;
    println!(
        "   committed: {} {}",
        stored.status(),
        String::from_utf8_lossy(stored.body())
    );

    // 2. The client timed out and retries with the same key: it gets the same response.
    match store.begin(&scope, fingerprint)? {
        Begin::Replay(replayed) => {
            assert_eq!(replayed, stored);
            println!(
                "2. retry replayed byte for byte: {}",
                String::from_utf8_lossy(replayed.body())
            );
        }
        other => return Err(format!("expected a replay, got {other:?}").into()),
    }

    // 3. The same key with a different request is refused.
    let changed = Fingerprint::of(&CreateOrder {
        item: "widget",
        quantity: 300,
    })?;
    match store.begin(&scope, changed)? {
        Begin::Mismatch => {
            println!("3. same key, quantity 300 instead of 3: refused (Mismatch, 422)")
        }
        other => return Err(format!("expected a mismatch, got {other:?}").into()),
    }

    // 4. A crashed attempt: the holder dies mid-work; after its lease the next one recovers.
    recovery_demo(&dir.join("recovery"), run)?;

    // 5. Sixteen threads race one key: exactly one does the work.
    let race = Scope::new("acct_42", "create_order", format!("race-{run}"))?;
    let side_effects = Arc::new(AtomicU32::new(0));
    let (claimed, in_progress, replayed) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicU32::new(0)),
    );
    let start = Arc::new(std::sync::Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let (store, race, side_effects, start) = (
                store.clone(),
                race.clone(),
                side_effects.clone(),
                start.clone(),
            );
            let (claimed, in_progress, replayed) =
                (claimed.clone(), in_progress.clone(), replayed.clone());
            std::thread::spawn(move || -> Result<(), idemstore::Error> {
                start.wait();
                match store.begin(&race, fingerprint)? {
                    Begin::Claimed(claim) => {
                        claimed.fetch_add(1, Ordering::SeqCst);
                        side_effects.fetch_add(1, Ordering::SeqCst); // the "charge"
                        let id = format!("race-order-{run}");
                        claim.commit(move |tx| {
                            tx.insert(&ORDERS, id.as_str(), "raced")?;
                            Ok(Response::new(201, b"raced".to_vec()))
                        })?;
                    }
                    Begin::InProgress { .. } => {
                        in_progress.fetch_add(1, Ordering::SeqCst);
                    }
                    Begin::Replay(_) => {
                        replayed.fetch_add(1, Ordering::SeqCst);
                    }
                    Begin::Recovered(_) | Begin::Mismatch | Begin::Expired { .. } => {}
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a racing thread panicked")??;
    }
    println!(
        "5. 16 threads raced one key: {} claimed, {} told in progress (409), {} replayed; side effects: {}",
        claimed.load(Ordering::SeqCst),
        in_progress.load(Ordering::SeqCst),
        replayed.load(Ordering::SeqCst),
        side_effects.load(Ordering::SeqCst)
    );

    let orders = store.read()?.open_table(ORDERS)?.len()?;
    println!(
        "orders table now holds {orders} rows; stats: {:?}",
        store.stats()?
    );
    Ok(())
}

/// Shows a take-over with an injected clock instead of waiting 30 seconds.
fn recovery_demo(dir: &std::path::Path, run: u128) -> Result<(), Box<dyn std::error::Error>> {
    let clock = ManualClock::new(Timestamp::from_millis(1_764_000_000_000));
    let store = Store::builder()
        .clock(clock.clone())
        .table(ORDERS)
        .open(dir)?;
    let scope = Scope::new("acct_42", "send_invoice", format!("invoice-{run}"))?;
    let fingerprint = Fingerprint::of_bytes(b"invoice 2026-11 for acct_42");

    let Begin::Claimed(mut first) = store.begin(&scope, fingerprint)? else {
        return Err("a new key should be claimed".into());
    };
    first.checkpoint(b"pdf rendered; email not sent".to_vec())?;
    let downstream = first.downstream_key();
    drop(first); // the process "crashes": no commit, no release
    println!(
        "4. attempt 1 checkpointed and crashed; a retry now is told: {:?}",
        store.begin(&scope, fingerprint)?
    );

    clock.advance(Duration::from_secs(30)); // the lease runs out
    let Begin::Recovered(second) = store.begin(&scope, fingerprint)? else {
        return Err("an expired lease should be recovered".into());
    };
    println!(
        "   after the lease: Recovered as attempt {} with checkpoint {:?}; downstream key unchanged: {}",
        second.attempt(),
        String::from_utf8_lossy(second.last_checkpoint().unwrap_or_default()),
        second.downstream_key() == downstream
    );
    second.commit(|_| Ok(Response::new(200, b"invoice sent".to_vec())))?;
    Ok(())
}
