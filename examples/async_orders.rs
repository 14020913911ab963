//! The async API in the shape `tokio-rusqlite` users know from `call`: async functions whose
//! closures are plain synchronous code run on the store's writer thread, next to a runtime that
//! never blocks on the store.
//!
//! `cargo run --example async_orders --features tokio`

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemstore::redb::{ReadableTableMetadata, TableDefinition};
use idemstore::{Begin, Fingerprint, Response, Scope, Store};

const ORDERS: TableDefinition<u64, &str> = TableDefinition::new("orders");
/// A keyless counter row, written with `write_async` (the `call` of this store).
const SEQUENCE: TableDefinition<&str, u64> = TableDefinition::new("sequence");

/// Handles one "create order" request: claim, do the (simulated) slow part outside the store,
/// then commit the order row and the response together.
async fn create_order(
    store: &Store,
    customer: &str,
    key: &str,
    charges: &AtomicU32,
) -> Result<String, idemstore::Error> {
    let scope = Scope::new(customer, "create_order", key)?;
    let fingerprint = Fingerprint::of(&("widget", 3u32))?;
    // Duplicates wait for the first attempt instead of getting a 409.
    match store
        .begin_or_wait_async(&scope, fingerprint, Duration::from_secs(5))
        .await?
    {
        Begin::Claimed(claim) | Begin::Recovered(claim) => {
            tokio::time::sleep(Duration::from_millis(20)).await; // the payment processor
            charges.fetch_add(1, Ordering::SeqCst);
            let response = claim
                .commit_async(|tx| {
                    // Plain synchronous code on the writer, like tokio-rusqlite's `call`.
                    let next = tx.get(&SEQUENCE, "order")?.map_or(1, |v| v.value() + 1);
                    tx.insert(&SEQUENCE, "order", next)?;
                    tx.insert(&ORDERS, next, "widget x3")?;
                    Ok(Response::new(201, format!("order {next}").into_bytes()))
                })
                .await?;
            Ok(format!(
                "created: {}",
                String::from_utf8_lossy(response.body())
            ))
        }
        Begin::Replay(stored) => Ok(format!(
            "replayed: {}",
            String::from_utf8_lossy(stored.body())
        )),
        Begin::InProgress { retry_after } => Ok(format!("409, retry after {retry_after:?}")),
        Begin::Mismatch => Ok("422: key reused for another request".to_owned()),
        Begin::Expired { .. } => Ok("410: completed long ago".to_owned()),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new("idemstore-data").join("async-orders");
    let store = Store::builder().table(ORDERS).table(SEQUENCE).open(&dir)?;
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    let charges = Arc::new(AtomicU32::new(0));

    // Eight copies of the same request at once (a client retrying hard), and two others.
    let mut tasks = Vec::new();
    for i in 0..10 {
        let (store, charges) = (store.clone(), charges.clone());
        let key = if i < 8 {
            format!("dup-{run}")
        } else {
            format!("other-{run}-{i}")
        };
        tasks.push(tokio::spawn(async move {
            create_order(&store, "acct_7", &key, &charges).await
        }));
    }
    for (i, task) in tasks.into_iter().enumerate() {
        println!("request {i}: {}", task.await??);
    }
    println!(
        "processor charges: {} (8 duplicates + 2 others)",
        charges.load(Ordering::SeqCst)
    );

    let total = store.read()?.open_table(ORDERS)?.len()?;
    println!("orders stored in {}: {total}", dir.display());
    Ok(())
}
