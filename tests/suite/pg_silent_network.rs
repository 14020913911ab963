//! A silent network between the PostgreSQL backend and its database: an in-test proxy
//! (`common::proxy`) holds a connection (both sockets open, nothing forwarded either way, as
//! in a partition or a frozen peer) or drops it, at the moment that hurts most. Each case ends
//! with the key answerable within about a lease and no side effect kept twice.
//!
//! The bounds under test come from the store's settings (`PgBuilder::lease` and `timeout`):
//! here a 4 s lease and a 500 ms timeout, so the server ends a silent session after 4 s.
//! Time in the database moves on a manual clock; real time passes only while a network
//! timeout runs, which is the subject. Needs the database at `IDEMSTORE_PG_URL`; fails,
//! never skips, without it.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::{Cut, Proxy};
use common::{fp, scope};
use idemstore::relay::{Relay, RelayConfig, Sink};
use idemstore::sqlx::{self, AssertSqlSafe, PgConnection, PgPool};
use idemstore::testing::postgres::{Prefix, relay_lock_holder, unreachable};
use idemstore::testing::wait;
use idemstore::{
    Begin, BoxError, CommitError, ManualClock, Message, PgStore, Protocol, ProtocolClaim, Response,
    Scope, StoreError, Sweep, Timestamp,
};
use parking_lot::Mutex;

type TestResult = Result<(), BoxError>;

const LEASE: Duration = Duration::from_secs(4);
const TIMEOUT: Duration = Duration::from_millis(500);
/// How long after a fault a case waits for the key to answer: the lease (the server's
/// silence bound), one call's limit, and room for a loaded machine.
const ANSWER_WITHIN: Duration = Duration::from_secs(9);

/// The `COMMIT` sqlx sends: a simple-protocol `Query` message (tag, length 11, the text).
const COMMIT: &[u8] = b"Q\0\0\0\x0bCOMMIT\0";

/// Whether a store reaches the database through the proxy or directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Proxy,
    Direct,
}

/// One case's world: the proxy, an admin pool straight to the database, the manual clock
/// every store of the case shares, and its prefix. In this order: dropping the proxy first
/// closes the held connections, so that the sessions they keep cannot block the drop of the
/// case's tables.
struct Net {
    proxy: Proxy,
    admin: PgPool,
    clock: ManualClock,
    prefix: Prefix,
}

impl Net {
    async fn new(tag: &str) -> Result<Net, BoxError> {
        let prefix = Prefix::new(tag);
        let url = prefix.url().to_owned();
        let options: sqlx::postgres::PgConnectOptions =
            url.parse().map_err(|e| unreachable(&url, &e))?;
        let upstream: SocketAddr =
            tokio::net::lookup_host((options.get_host(), options.get_port()))
                .await
                .map_err(|e| unreachable(&url, &e))?
                .next()
                .ok_or_else(|| unreachable(&url, &"the host resolves to no address"))?;
        let proxy = Proxy::start(upstream).await?;
        let admin = sqlx::postgres::PgPoolOptions::new()
            .acquire_timeout(Duration::from_secs(5))
            .connect(&url)
            .await
            .map_err(|e| unreachable(&url, &e))?;
        let clock = ManualClock::new(Timestamp::from_millis(1_700_000_000_000));
        Ok(Net {
            prefix,
            proxy,
            admin,
            clock,
        })
    }

    fn builder(&self, via: Via) -> idemstore::PgBuilder {
        let url = match via {
            Via::Proxy => self.proxy.url(self.prefix.url()),
            Via::Direct => self.prefix.url().to_owned(),
        };
        PgStore::builder(&url)
            .prefix(self.prefix.name())
            .lease(LEASE)
            .timeout(TIMEOUT)
            .clock(self.clock.clone())
            .sweep(Sweep::Off)
    }

    async fn open(&self, via: Via) -> Result<PgStore, BoxError> {
        self.builder(via)
            .open()
            .await
            .map_err(|e| unreachable(self.prefix.url(), &e))
    }

    /// The business table: one row per order, written in the claim's transaction.
    async fn orders(&self) -> Result<String, BoxError> {
        let table = self.prefix.table("orders");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id text PRIMARY KEY)"
        )))
        .execute(&self.admin)
        .await?;
        Ok(table)
    }

    async fn count(&self, table: &str) -> Result<i64, BoxError> {
        Ok(
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(&self.admin)
                .await?,
        )
    }

    /// The proxy's name for the session `pid`: its client port.
    async fn port_of(&self, pid: i32) -> Result<u16, BoxError> {
        let port: Option<i32> =
            sqlx::query_scalar("SELECT client_port FROM pg_stat_activity WHERE pid = $1")
                .bind(pid)
                .fetch_one(&self.admin)
                .await?;
        let port = port.ok_or("the session has no client port (not over TCP?)")?;
        Ok(u16::try_from(port)?)
    }

    /// The client ports of the sessions listening on this prefix's channel.
    async fn listening(&self) -> Result<Vec<u16>, BoxError> {
        let ports: Vec<Option<i32>> = sqlx::query_scalar(
            "SELECT client_port FROM pg_stat_activity WHERE query = 'LISTEN \"' || $1 || '\"'",
        )
        .bind(self.prefix.table("done"))
        .fetch_all(&self.admin)
        .await?;
        Ok(ports
            .into_iter()
            .flatten()
            .filter_map(|p| u16::try_from(p).ok())
            .collect())
    }

    /// The client port of the session holding this prefix's relay lock, if any.
    async fn relay_lock_port(&self) -> Result<Option<u16>, BoxError> {
        let holder = relay_lock_holder(&self.admin, self.prefix.name()).await?;
        Ok(holder
            .and_then(|(_, port)| port)
            .and_then(|p| u16::try_from(p).ok()))
    }
}

fn claimed<C>(begin: Begin<C>) -> Result<C, BoxError> {
    match begin {
        Begin::Claimed(c) | Begin::Recovered(c) => Ok(c),
        other => Err(format!("expected a claim, got {}", other.outcome()).into()),
    }
}

async fn insert(conn: &mut PgConnection, table: &str, id: &str) -> Result<(), BoxError> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (id) VALUES ($1)"
    )))
    .bind(id)
    .execute(conn)
    .await?;
    Ok(())
}

async fn backend_pid(conn: &mut PgConnection) -> Result<i32, BoxError> {
    Ok(sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await?)
}

/// Asks `store` for `scope` until it answers (a `Backend` error is the database not
/// answering: asked again), for at most [`ANSWER_WITHIN`] after `since`.
async fn answer(
    store: &PgStore,
    key: &Scope,
    since: Instant,
) -> Result<Begin<idemstore::PgClaim>, BoxError> {
    loop {
        let waiting = match store.begin(key, fp("r")).await {
            Ok(answer) => return Ok(answer),
            Err(StoreError::Backend { message }) => message.to_string(),
            Err(other) => return Err(other.into()),
        };
        if since.elapsed() > ANSWER_WITHIN {
            return Err(format!(
                "{key} still unanswerable {:?} after the fault: {waiting}",
                since.elapsed()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`answer`] past "in progress": what `begin` says once the row a silent session holds is
/// free (meanwhile the lock is seen and the key is answered in progress).
async fn settled(
    store: &PgStore,
    key: &Scope,
    since: Instant,
) -> Result<Begin<idemstore::PgClaim>, BoxError> {
    loop {
        match answer(store, key, since).await? {
            Begin::InProgress { .. } if since.elapsed() <= ANSWER_WITHIN => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Begin::InProgress { .. } => {
                return Err(format!(
                    "{key} still in progress {:?} after the fault",
                    since.elapsed()
                )
                .into());
            }
            other => return Ok(other),
        }
    }
}

/// The completion's `COMMIT` is lost on its way (`Cut::Before`: the server never sees it,
/// and its session sits idle in the transaction, holding the record's row lock) or its answer
/// is (`Cut::After`: it committed). The holder is told `OutcomeUnknown`; another instance
/// then gets an answer within about a lease: a take-over (`Recovered`) that commits the order
/// once, or the `Replay` of the commit that landed. Before the server ended silent sessions
/// in a transaction, the lock stayed until the kernel gave up (hours), and every begin of the
/// key timed out meanwhile.
async fn a_lost_commit(cut: Cut) -> TestResult {
    let net = Net::new("lostcommit").await?;
    let (holder, other) = (net.open(Via::Proxy).await?, net.open(Via::Direct).await?);
    let table = net.orders().await?;
    let key = scope("k");
    let claim = claimed(holder.begin(&key, fp("r")).await?)?;
    let mut tx = claim.transaction().await?;
    insert(tx.conn(), &table, "order-k").await?;
    let port = net.port_of(backend_pid(tx.conn()).await?).await?;
    assert!(
        net.proxy.hold_on(port, COMMIT, cut),
        "no proxied connection on {port}"
    );
    let lost = Instant::now();
    match tx.commit(Response::new(201, "first")).await {
        Err(CommitError::Store(StoreError::OutcomeUnknown { .. })) => {}
        other => return Err(format!("a commit without an answer: {other:?}").into()),
    }
    assert!(net.proxy.is_held(port), "the COMMIT never went out");
    net.clock.advance(LEASE);
    match (cut, settled(&other, &key, lost).await?) {
        (Cut::Before, Begin::Recovered(claim)) => {
            assert_eq!(claim.attempt(), 2);
            let mut tx = claim.transaction().await?;
            insert(tx.conn(), &table, "order-k").await?;
            tx.commit(Response::new(201, "second")).await?;
        }
        (Cut::After, Begin::Replay(stored)) => assert_eq!(stored.body(), b"first"),
        (_, answer) => return Err(format!("{cut:?}: got {}", answer.outcome()).into()),
    }
    eprintln!(
        "{cut:?}: answerable {:?} after the lost COMMIT",
        lost.elapsed()
    );
    assert_eq!(net.count(&table).await?, 1, "the order, once");
    // The holder's own instance answers too: its silent connection did not stay in its pool.
    assert!(matches!(
        answer(&holder, &key, lost).await?,
        Begin::Replay(_)
    ));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_lost_on_its_way_frees_the_key_within_about_a_lease() -> TestResult {
    a_lost_commit(Cut::Before).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_replayed() -> TestResult {
    a_lost_commit(Cut::After).await
}

/// The `LISTEN` connection goes silent: a waiter whose holder completes is answered by its
/// own poll (within about a second), one whose holder dies is answered when the lease ends,
/// and the store notices the silence and listens on a new connection (before, it waited on
/// the silent one for good, and every later waiter relied on its poll alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_listen_connection_delays_waiters_but_never_strands_them() -> TestResult {
    let net = Net::new("silentlisten").await?;
    let store = net.open(Via::Proxy).await?;
    let waited = |key: &'static str| {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .begin_or_wait(&scope(key), fp("r"), Duration::from_secs(30))
                .await
        })
    };
    let records = net.prefix.table("records");
    let marked = async |key: &str| -> Result<bool, BoxError> {
        let marked: Option<bool> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT waiters FROM {records} WHERE key = $1"
        )))
        .bind(key)
        .fetch_optional(&net.admin)
        .await?;
        Ok(marked == Some(true))
    };

    // A holder of `key`, and a waiter on it that has asked to be notified.
    let held = async |key: &'static str| -> Result<_, BoxError> {
        let holder = claimed(store.begin(&scope(key), fp("r")).await?)?;
        let waiter = waited(key);
        let what = format!("the waiter on {key} marked it");
        wait::within(&what, Duration::from_secs(5), async || marked(key).await).await?;
        Ok((holder, waiter))
    };

    let (holder, waiter) = held("done").await?;
    wait::within("listening", Duration::from_secs(5), async || {
        Ok(!net.listening().await?.is_empty())
    })
    .await?;
    let silent = net.listening().await?[0];
    assert!(
        net.proxy.hold(silent),
        "the LISTEN session is not the proxy's"
    );
    let completed = Instant::now();
    holder.complete(Response::new(201, "done")).await?;
    match tokio::time::timeout(Duration::from_secs(5), waiter).await??? {
        Begin::Replay(r) => assert_eq!(r.body(), b"done"),
        other => return Err(format!("the waiter got {}", other.outcome()).into()),
    }
    eprintln!(
        "a waiter answered {:?} after the completion, by its poll",
        completed.elapsed()
    );

    let (dead, waiter) = held("dead").await?;
    drop(dead); // the holder dies: its lease runs out
    net.clock.advance(LEASE);
    match tokio::time::timeout(Duration::from_secs(5), waiter).await??? {
        Begin::Recovered(claim) => claim.release().await?,
        other => return Err(format!("the waiter got {}", other.outcome()).into()),
    }

    wait::within(
        "listening again on a new connection",
        ANSWER_WITHIN,
        async || {
            Ok(net
                .listening()
                .await?
                .iter()
                .any(|p| *p != silent && net.proxy.ports().contains(p)))
        },
    )
    .await?;
    Ok(())
}

/// Every message any relay handed over, with who did.
#[derive(Default)]
struct Arrivals(Mutex<Vec<(String, &'static str)>>);

struct Counting {
    relay: &'static str,
    arrivals: Arc<Arrivals>,
}

impl Sink for Counting {
    async fn deliver(&self, message: &Message) -> Result<(), BoxError> {
        self.arrivals
            .0
            .lock()
            .push((message.id.clone(), self.relay));
        Ok(())
    }
}

/// The relay holding the outbox's lock goes silent (its connection held by the proxy): the
/// server ends that session within the silence bound, the lock goes with it, and a relay
/// takes over; every message arrives, and the only duplicates are of messages the silent
/// relay had handed over but could not settle (the documented take-over window). Before,
/// the server kept the silent session, and the lock, as long as TCP answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_whose_lock_connection_goes_silent_is_taken_over_within_a_bound() -> TestResult {
    let net = Net::new("silentrelay").await?;
    let (through, direct) = (net.open(Via::Proxy).await?, net.open(Via::Direct).await?);
    let mut committed = Vec::new();
    let mut commit = async |i: usize| -> TestResult {
        let claim = claimed(direct.begin(&scope(&format!("m{i}")), fp("r")).await?)?;
        let mut tx = claim.transaction().await?;
        committed.push(tx.publish("orders.placed", vec![1])?);
        tx.commit(Response::new(201, "ok")).await?;
        Ok(())
    };
    for i in 0..10 {
        commit(i).await?;
    }
    let arrivals = Arc::new(Arrivals::default());
    let config = RelayConfig::default()
        .idle_poll(Duration::from_millis(5))
        .standby_poll(Duration::from_millis(50));
    let sink = |relay| Counting {
        relay,
        arrivals: arrivals.clone(),
    };
    let silent = Relay::start(&through, sink("silent"), config);
    wait::within(
        "the first relay delivered",
        Duration::from_secs(10),
        async || Ok(arrivals.0.lock().len() >= 10),
    )
    .await?;
    let standby = Relay::start(&direct, sink("standby"), config);
    let port = net
        .relay_lock_port()
        .await?
        .ok_or("nobody holds the relay lock")?;
    assert!(
        net.proxy.hold(port),
        "the lock's connection is not the proxy's"
    );
    let held = Instant::now();
    let before = arrivals.0.lock().len();
    for i in 10..30 {
        commit(i).await?;
    }
    wait::within(
        "every message delivered after the silence",
        ANSWER_WITHIN,
        async || {
            let arrived = arrivals.0.lock();
            Ok(committed
                .iter()
                .all(|id| arrived.iter().any(|(a, _)| a == id)))
        },
    )
    .await?;
    eprintln!(
        "delivery went on {:?} after the lock's connection went silent",
        held.elapsed()
    );
    silent.stop().await;
    standby.stop().await;
    let arrived = arrivals.0.lock().clone();
    let mut seen = std::collections::HashSet::new();
    for (i, (id, _)) in arrived.iter().enumerate() {
        if !seen.insert(id) {
            // A second copy: the first went out before the silence (handed over by the
            // silent relay, never settled), never one delivered after the take-over.
            let first = arrived.iter().position(|(a, _)| a == id).unwrap_or(i);
            assert!(
                first < before || arrived[first].1 == "silent",
                "{id} delivered twice outside the take-over window: {arrived:?}"
            );
        }
    }
    Ok(())
}

/// Every connection of the pool fails at once while each is inside a holder's transaction,
/// first closed (a reset, a restarted middlebox), then silent (a partition: sockets open,
/// nothing answered). The commits fail within their limit, the pool replaces the
/// connections, and each key is answerable within about a lease: in progress while its
/// holder's lease runs, then recovered, its order committed once. Before, a silent
/// connection handed back to the pool waited there for an answer that never came, holding
/// its place: with every place taken, the pool had nothing left to hand out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_loses_every_connection_at_once_answers_within_about_a_lease() -> TestResult {
    const POOL: usize = 3;
    let net = Net::new("poolloss").await?;
    let store = net
        .builder(Via::Proxy)
        .pool_size(POOL as u32)
        .open()
        .await
        .map_err(|e| unreachable(net.prefix.url(), &e))?;
    let table = net.orders().await?;
    for (round, fault) in ["closed", "silent"].into_iter().enumerate() {
        let keys: Vec<String> = (0..POOL).map(|i| format!("{fault}-{i}")).collect();
        let mut txs = Vec::new();
        for key in &keys {
            let claim = claimed(store.begin(&scope(key), fp("r")).await?)?;
            let mut tx = claim.transaction().await?;
            insert(tx.conn(), &table, key).await?;
            txs.push(tx);
        }
        let lost = Instant::now();
        let cut = if fault == "closed" {
            net.proxy.drop_all()
        } else {
            net.proxy.hold_all()
        };
        assert_eq!(cut, POOL, "{fault}: the pool's connections");
        let commits: Vec<_> = txs
            .into_iter()
            .map(|tx| tokio::spawn(tx.commit(Response::new(201, "never"))))
            .collect();
        for commit in commits {
            match commit.await? {
                Err(CommitError::Store(
                    StoreError::Backend { .. } | StoreError::OutcomeUnknown { .. },
                )) => {}
                other => {
                    return Err(format!("{fault}: a commit on a lost connection: {other:?}").into());
                }
            }
        }
        assert!(
            lost.elapsed() < Duration::from_secs(4),
            "{fault}: the commits took {:?}",
            lost.elapsed()
        );
        for key in &keys {
            match answer(&store, &scope(key), lost).await? {
                Begin::InProgress { .. } => {}
                other => {
                    return Err(
                        format!("{fault}: within the lease, got {}", other.outcome()).into(),
                    );
                }
            }
        }
        net.clock.advance(LEASE);
        for key in &keys {
            let claim = match answer(&store, &scope(key), lost).await? {
                Begin::Recovered(claim) => claim,
                other => {
                    return Err(format!("{fault}: after the lease, got {}", other.outcome()).into());
                }
            };
            recommit(claim, &table, key, lost).await?;
        }
        eprintln!(
            "{fault}: answerable and recovered {:?} after the loss",
            lost.elapsed()
        );
        assert_eq!(
            net.count(&table).await?,
            ((round + 1) * POOL) as i64,
            "{fault}: each order once"
        );
    }
    Ok(())
}

/// Writes the order `id` again in a recovered claim's transaction and commits it. The old
/// transaction's row is in the way until its session ends (at once when its connection
/// closed, within the silence bound when it went silent): until then the write times out,
/// and is tried again.
async fn recommit(
    mut claim: idemstore::PgClaim,
    table: &str,
    id: &str,
    since: Instant,
) -> TestResult {
    loop {
        let mut tx = claim.transaction().await?;
        match insert(tx.conn(), table, id).await {
            Ok(()) => {
                tx.commit(Response::new(201, "recovered")).await?;
                return Ok(());
            }
            Err(e) if since.elapsed() < ANSWER_WITHIN => {
                eprintln!("{id}: writing the order again: {e}");
                claim = tx.rollback().await;
            }
            Err(e) => {
                return Err(format!("{id}: the order could not be written again ({e})").into());
            }
        }
    }
}
