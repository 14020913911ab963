//! Helpers shared by the integration tests.
#![allow(dead_code, unreachable_pub)]

#[cfg(any(feature = "nats", feature = "testing"))]
pub mod frames;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(any(feature = "postgres", feature = "nats"))]
pub mod proxy;
#[cfg(feature = "http")]
pub mod service;
#[cfg(feature = "testing")]
pub mod ship;

use std::path::Path;
use std::time::Duration;

use idemstore::redb::{ReadableTable, ReadableTableMetadata, TableDefinition};
use idemstore::{Builder, Fingerprint, ManualClock, Scope, Store, Sweep, Timestamp};

/// The full test name (`module::test`) of test `$name` in the calling module: what a test
/// that runs this binary as a child passes with `--exact`. libtest names a test by its path
/// below the crate, so the crate's own name is cut from `module_path!()`.
#[macro_export]
macro_rules! child_test {
    ($name:literal) => {
        $crate::common::below_crate(module_path!(), $name)
    };
}

/// `module` (a `module_path!()`) without its first segment, the crate, then `::name`.
pub fn below_crate(module: &str, name: &str) -> String {
    let (_crate, path) = module
        .split_once("::")
        .expect("a test module below the crate root");
    format!("{path}::{name}")
}

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The business table the tests write orders to.
pub const ORDERS: TableDefinition<&str, &str> = TableDefinition::new("orders");

pub const LEASE: Duration = Duration::from_secs(30);
pub const TTL: Duration = Duration::from_secs(3600);

/// A manual clock at a fixed, realistic start time.
pub fn clock() -> ManualClock {
    ManualClock::new(Timestamp::from_millis(1_764_000_000_000))
}

/// A store for tests: a manual clock, and no background sweeper (tests evict explicitly, so
/// that what is evicted, and when, is theirs to decide).
pub fn builder(clock: &ManualClock) -> Builder {
    Store::builder()
        .lease(LEASE)
        .ttl(TTL)
        .table(ORDERS)
        .clock(clock.clone())
        .sweep(Sweep::Off)
}

pub fn open(dir: &Path, clock: &ManualClock) -> Result<Store, idemstore::OpenError> {
    builder(clock).open(dir.join("idem"))
}

pub fn scope(key: &str) -> Scope {
    Scope::new("tenant-a", "create_order", key).expect("test scopes are valid")
}

pub fn fp(s: &str) -> Fingerprint {
    Fingerprint::of_bytes(s.as_bytes())
}

/// Every row of the orders table.
pub fn orders(store: &Store) -> Result<Vec<(String, String)>, Box<dyn std::error::Error>> {
    let read = store.read()?;
    let table = read.open_table(ORDERS)?;
    let mut rows = Vec::new();
    for entry in table.iter()? {
        let (k, v) = entry?;
        rows.push((k.value().to_owned(), v.value().to_owned()));
    }
    Ok(rows)
}

pub fn order_count(store: &Store) -> Result<u64, Box<dyn std::error::Error>> {
    Ok(store.read()?.open_table(ORDERS)?.len()?)
}

/// `len` bytes that LZ4 cannot shrink, for tests that need a response to take its size on
/// disk and in the log (stored bodies of 256 bytes or more are compressed when that helps).
pub fn incompressible(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ len as u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}
