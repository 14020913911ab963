//! The workload the benches share. One **pair** is what a service does per request with a new
//! idempotency key: a `begin` that claims it, then a `commit` that writes a ~100-byte business
//! row and stores a ~200-byte response, in one transaction. Keys are spread over 16 tenants.
#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use idemstore::redb::TableDefinition;
use idemstore::{Begin, BoxError, Execution, Fingerprint, Response, Scope, Store, Tx};

/// The business table every pair writes its row to, keyed by the pair's idempotency key.
pub const ORDERS: TableDefinition<&str, &[u8]> = TableDefinition::new("orders");
/// The same rows keyed by an order number the service hands out in order (`Row::ByNumber`).
pub const ORDERS_BY_NUMBER: TableDefinition<u64, &[u8]> = TableDefinition::new("orders_by_number");

/// How a pair's business row is keyed: by the idempotency key (random when the keys are),
/// or by an order number the service hands out in order, as most services key their rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    ByKey,
    ByNumber,
}

impl Row {
    /// `by-key` or `by-number` from the environment variable `name` (default `by-number`).
    pub fn from_env(name: &str) -> Row {
        match std::env::var(name).as_deref() {
            Ok("by-key") => Row::ByKey,
            Ok("by-number") | Err(_) => Row::ByNumber,
            Ok(other) => panic!("{name}={other:?}: by-key or by-number"),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Row::ByKey => "keyed by the idempotency key",
            Row::ByNumber => "keyed by an order number",
        }
    }
}
/// The business row of a pair.
pub const ROW: [u8; 100] = [7; 100];
/// The stored response of a pair.
pub const BODY: [u8; 200] = [b'r'; 200];

/// splitmix64's output step: a bijection of 64-bit words whose outputs look random. The
/// benches' random keys all come from it.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A UUID's canonical text (36 characters, lowercase hex with dashes) from its two halves,
/// the version already in `hi`; the RFC 9562 variant is set here.
pub fn uuid_text(hi: u64, lo: u64) -> String {
    let lo = (lo & 0x3fff_ffff_ffff_ffff) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

/// The scope of a pair: `key` under tenant `tenant % 16`.
pub fn scope(tenant: u64, key: String) -> Scope {
    Scope::new(format!("tenant-{}", tenant % 16), "create_order", key).expect("a valid scope")
}

/// The work of a pair: the ~100-byte order row under `key`, and the ~200-byte response.
fn order(key: String) -> impl FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static {
    move |tx| {
        tx.insert(&ORDERS, key.as_str(), ROW.as_slice())?;
        Ok(Response::new(201, BODY.to_vec()))
    }
}

/// The next order number (`Row::ByNumber`), for every store of the process.
fn next_order_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One pair on `scope`, which must be new, its row keyed as `row` says.
pub fn pair_with(store: &Store, scope: &Scope, row: Row) {
    if row == Row::ByKey {
        return pair(store, scope);
    }
    let key = scope.key().to_owned();
    let Begin::Claimed(claim) = store
        .begin(scope, Fingerprint::of_bytes(key.as_bytes()))
        .expect("begin")
    else {
        panic!("{scope} was not new");
    };
    let number = next_order_number();
    claim
        .commit(move |tx| {
            tx.insert(&ORDERS_BY_NUMBER, number, ROW.as_slice())?;
            Ok(Response::new(201, BODY.to_vec()))
        })
        .expect("commit");
}

/// One pair on `scope`, which must be new.
pub fn pair(store: &Store, scope: &Scope) {
    let key = scope.key().to_owned();
    let Begin::Claimed(claim) = store
        .begin(scope, Fingerprint::of_bytes(key.as_bytes()))
        .expect("begin")
    else {
        panic!("{scope} was not new");
    };
    claim.commit(order(key)).expect("commit");
}

/// [`pair`] through the async API.
#[cfg(feature = "tokio")]
pub async fn pair_async(store: &Store, scope: &Scope) {
    let key = scope.key().to_owned();
    let Begin::Claimed(claim) = store
        .begin_async(scope, Fingerprint::of_bytes(key.as_bytes()))
        .await
        .expect("begin")
    else {
        panic!("{scope} was not new");
    };
    claim.commit_async(order(key)).await.expect("commit");
}

/// The same request as [`pair`] in one step (`Store::execute`): the work is local.
pub fn execute(store: &Store, scope: &Scope) {
    let key = scope.key().to_owned();
    let fingerprint = Fingerprint::of_bytes(key.as_bytes());
    let done = store
        .execute(scope, fingerprint, order(key))
        .expect("execute");
    assert!(
        matches!(done, Execution::Executed(_)),
        "{scope} was not new"
    );
}

/// `count` pairs from `threads` client threads, client `t` as tenant `t % 16` and the `i`th
/// pair on key `key(i)`. Returns pairs per second.
pub fn pairs_from_threads(
    store: &Store,
    threads: u64,
    count: u64,
    key: impl Fn(u64) -> String + Sync,
) -> f64 {
    let next = AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (next, key) = (&next, &key);
            s.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        break;
                    }
                    pair(store, &scope(t, key(i)));
                }
            });
        }
    });
    count as f64 / started.elapsed().as_secs_f64()
}

/// Median time of a 512-byte overwrite plus `fdatasync` (`syncs` of them) in a 1 MiB file
/// under `dir`: the disk's own sync time in this run, to read a bench's figures against. The
/// same probe as `peers` prints (which makes 400).
pub fn fdatasync_median(dir: &std::path::Path, syncs: u64) -> std::time::Duration {
    use std::io::{Seek, SeekFrom, Write};
    let path = dir.join("fdatasync-probe");
    let mut f = std::fs::File::create(&path).expect("probe file");
    f.write_all(&vec![0u8; 1 << 20]).expect("preallocate");
    f.sync_all().expect("sync");
    let mut times = Vec::with_capacity(syncs.max(1) as usize);
    for i in 0..syncs.max(1) {
        f.seek(SeekFrom::Start((i * 512) % (1 << 20)))
            .expect("seek");
        f.write_all(&[i as u8; 512]).expect("write");
        let t = Instant::now();
        f.sync_data().expect("fdatasync");
        times.push(t.elapsed());
    }
    let _ = std::fs::remove_file(path);
    times.sort();
    times[times.len() / 2]
}

/// A random UUIDv4 key in the canonical text form: 122 bits drawn from `state`, which it
/// advances (seed each client thread with a `state` of its own).
pub fn uuid_v4(state: &mut u64) -> String {
    let hi = mix(*state);
    let lo = mix(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
    *state = state.wrapping_add(0x3c6e_f372_fe94_f82a);
    uuid_text((hi & !0xf000) | 0x4000, lo)
}
