//! What the PostgreSQL backend does beyond the conformance suite: its schema and prefix,
//! business SQL in the claim's transaction, and failures (timeouts, lost connections, a
//! failed commit). Needs the database at `IDEMSTORE_PG_URL`; fails, never skips, without it.

use std::time::Duration;

use idemstore::sqlx::{self, AssertSqlSafe, Row};
use idemstore::testing::postgres::{database_url, drop_prefixes, unique_prefix, unreachable};
use idemstore::{
    Begin, BoxError, ClaimError, CommitError, Fingerprint, ManualClock, PgOpenError, PgStore,
    Protocol, ProtocolClaim, Response, Scope, StoreError, Sweep, Timestamp,
};

type TestResult = Result<(), BoxError>;

/// Tables under one prefix, dropped when the test ends (pass or fail).
struct Prefix {
    url: String,
    name: String,
}

impl Prefix {
    fn new(tag: &str) -> Self {
        Prefix {
            url: database_url(),
            name: unique_prefix(tag),
        }
    }

    async fn open(&self, clock: &ManualClock) -> Result<PgStore, BoxError> {
        self.builder(clock)
            .open()
            .await
            .map_err(|e| unreachable(&self.url, &e))
    }

    fn builder(&self, clock: &ManualClock) -> idemstore::PgBuilder {
        PgStore::builder(&self.url)
            .prefix(&self.name)
            .clock(clock.clone())
            .sweep(Sweep::Off)
    }

    fn table(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.name)
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        drop_prefixes(&self.url, vec![self.name.clone()]);
    }
}

fn clock() -> ManualClock {
    ManualClock::new(Timestamp::from_millis(1_700_000_000_000))
}

fn scope(key: &str) -> Scope {
    Scope::new("tenant-a", "create_order", key).expect("a valid scope")
}

fn fp(request: &str) -> Fingerprint {
    Fingerprint::of_bytes(request.as_bytes())
}

fn claimed<C>(begin: Begin<C>) -> Result<C, BoxError> {
    match begin {
        Begin::Claimed(c) | Begin::Recovered(c) => Ok(c),
        other => Err(format!("expected a claim, got {}", other.outcome()).into()),
    }
}

async fn orders(store: &PgStore, prefix: &Prefix) -> Result<String, BoxError> {
    let table = prefix.table("orders");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id text PRIMARY KEY, item text NOT NULL)"
    )))
    .execute(store.pool())
    .await?;
    Ok(table)
}

async fn count(store: &PgStore, table: &str) -> Result<i64, BoxError> {
    Ok(
        sqlx::query(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(store.pool())
            .await?
            .try_get(0)?,
    )
}

#[tokio::test]
async fn a_prefix_that_is_not_a_plain_identifier_is_refused_before_connecting() {
    for bad in [
        "",
        "Robert'); DROP TABLE x; --",
        "9x_",
        "with space",
        "UPPER_",
    ] {
        // An unroutable URL: the prefix is refused before any connection is tried.
        let opened = PgStore::builder("postgres://nobody@127.0.0.1:1/none")
            .prefix(bad)
            .open()
            .await;
        assert!(
            matches!(opened, Err(PgOpenError::BadPrefix { .. })),
            "{bad}: {opened:?}"
        );
    }
}

#[tokio::test]
async fn the_migration_is_versioned_and_opening_again_changes_nothing() -> TestResult {
    let prefix = Prefix::new("mig");
    let clock = clock();
    // Four instances opening at once apply the migration once.
    let opened = futures_join(&prefix, &clock).await?;
    let store = &opened[0];
    let versions: Vec<i32> = sqlx::query(AssertSqlSafe(format!(
        "SELECT version FROM {} ORDER BY version",
        prefix.table("schema_version")
    )))
    .fetch_all(store.pool())
    .await?
    .iter()
    .map(|r| r.try_get(0))
    .collect::<Result<_, _>>()?;
    assert_eq!(versions, [1]);
    let claim = claimed(store.begin(&scope("k1"), fp("r")).await?)?;
    claim.complete(Response::new(201, "kept")).await?;
    let again = prefix.open(&clock).await?;
    match again.begin(&scope("k1"), fp("r")).await? {
        Begin::Replay(r) => assert_eq!(r.body(), b"kept"),
        other => return Err(format!("after reopening: {}", other.outcome()).into()),
    }
    Ok(())
}

async fn futures_join(prefix: &Prefix, clock: &ManualClock) -> Result<Vec<PgStore>, BoxError> {
    let mut opening = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let builder = prefix.builder(clock);
        opening.spawn(builder.open());
    }
    let mut stores = Vec::new();
    while let Some(opened) = opening.join_next().await {
        stores.push(opened??);
    }
    Ok(stores)
}

#[tokio::test]
async fn business_rows_commit_with_the_record_and_a_stale_commit_rolls_them_back() -> TestResult {
    let prefix = Prefix::new("biz");
    let clock = clock();
    let store = prefix.open(&clock).await?;
    let table = orders(&store, &prefix).await?;
    let insert = format!("INSERT INTO {table} (id, item) VALUES ($1, $2)");

    let claim = claimed(store.begin(&scope("o1"), fp("r")).await?)?;
    let mut tx = claim.transaction().await?;
    sqlx::query(AssertSqlSafe(insert.clone()))
        .bind("o1")
        .bind("widget")
        .execute(tx.conn())
        .await?;
    tx.commit(Response::new(201, "o1")).await?;
    assert_eq!(count(&store, &table).await?, 1);
    assert!(matches!(
        store.begin(&scope("o1"), fp("r")).await?,
        Begin::Replay(_)
    ));

    // The first holder outlives its lease; a retry takes over; the first one's commit is
    // refused and its business row rolled back with it.
    let first = claimed(store.begin(&scope("o2"), fp("r")).await?)?;
    clock.advance(store.limits().lease);
    let second = claimed(store.begin(&scope("o2"), fp("r")).await?)?;
    assert_eq!(second.attempt(), 2);
    let first_fence = first.fence();
    let mut tx = first.transaction().await?;
    sqlx::query(AssertSqlSafe(insert.clone()))
        .bind("o2-by-first")
        .bind("widget")
        .execute(tx.conn())
        .await?;
    match tx.commit(Response::new(201, "first")).await {
        Err(CommitError::Stale(stale)) => assert_eq!(stale.fence, first_fence),
        other => return Err(format!("a stale commit: {other:?}").into()),
    }
    assert_eq!(
        count(&store, &table).await?,
        1,
        "the stale commit's row is gone"
    );
    let mut tx = second.transaction().await?;
    sqlx::query(AssertSqlSafe(insert))
        .bind("o2")
        .bind("widget")
        .execute(tx.conn())
        .await?;
    tx.commit(Response::new(201, "second")).await?;
    assert_eq!(count(&store, &table).await?, 2);

    // A rollback gives the claim back, still held, and keeps nothing.
    let claim = claimed(store.begin(&scope("o3"), fp("r")).await?)?;
    let tx = claim.transaction().await?;
    let claim = tx.rollback().await;
    claim.release().await?;
    assert!(matches!(
        store.begin(&scope("o3"), fp("r")).await?,
        Begin::Claimed(_)
    ));
    Ok(())
}

#[tokio::test]
async fn a_commit_that_fails_leaves_the_key_in_progress() -> TestResult {
    let prefix = Prefix::new("fail");
    let clock = clock();
    let store = prefix.open(&clock).await?;
    let claim = claimed(store.begin(&scope("f1"), fp("r")).await?)?;
    let mut tx = claim.transaction().await?;
    // Business SQL that fails aborts the transaction; the completion then fails too.
    let failed = sqlx::query("INSERT INTO no_such_table_anywhere VALUES (1)")
        .execute(tx.conn())
        .await;
    assert!(failed.is_err());
    match tx.commit(Response::new(201, "never")).await {
        Err(CommitError::Store(StoreError::Backend { .. })) => {}
        other => return Err(format!("expected a backend error, got {other:?}").into()),
    }
    assert!(matches!(
        store.begin(&scope("f1"), fp("r")).await?,
        Begin::InProgress { .. }
    ));
    Ok(())
}

#[tokio::test]
async fn bad_input_gets_the_local_stores_errors() -> TestResult {
    let prefix = Prefix::new("bad");
    let clock = clock();
    let store = prefix
        .builder(&clock)
        .max_response_bytes(1024)
        .max_checkpoint_bytes(16)
        .open()
        .await
        .map_err(|e| unreachable(&prefix.url, &e))?;
    let mut claim = claimed(store.begin(&scope("b1"), fp("r")).await?)?;
    assert!(matches!(
        claim.checkpoint(vec![0; 17]).await,
        Err(ClaimError::CheckpointTooLarge { len: 17, max: 16 })
    ));
    assert!(matches!(
        claim.extend(Duration::ZERO).await,
        Err(ClaimError::InvalidLease { .. })
    ));
    let claim = match claim.complete(Response::new(200, vec![0u8; 2048])).await {
        Err(CommitError::InvalidResponse { claim, .. }) => *claim,
        other => return Err(format!("an oversized response: {other:?}").into()),
    };
    claim.complete(Response::new(200, "fits")).await?;
    let invalid = PgStore::builder(&prefix.url)
        .prefix(&prefix.name)
        .lease(Duration::ZERO)
        .open()
        .await;
    assert!(matches!(invalid, Err(PgOpenError::InvalidSetting { .. })));
    Ok(())
}

#[tokio::test]
async fn a_statement_blocked_past_the_timeout_fails_instead_of_hanging() -> TestResult {
    let prefix = Prefix::new("slow");
    let clock = clock();
    let store = prefix
        .builder(&clock)
        .timeout(Duration::from_millis(300))
        .open()
        .await
        .map_err(|e| unreachable(&prefix.url, &e))?;
    let claim = claimed(store.begin(&scope("s1"), fp("r")).await?)?;
    // Another session locks the record and sits on it.
    let blocker = sqlx::PgPool::connect(&prefix.url).await?;
    let mut locked = blocker.begin().await?;
    sqlx::query(AssertSqlSafe(format!(
        "SELECT 1 FROM {} WHERE key = 's1' FOR UPDATE",
        prefix.table("records")
    )))
    .execute(&mut *locked)
    .await?;
    let started = std::time::Instant::now();
    let answer = store.begin(&scope("s1"), fp("r")).await;
    assert!(
        matches!(answer, Err(StoreError::Backend { .. })),
        "{:?}",
        answer.map(|b| b.outcome())
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    locked.rollback().await?;
    claim.complete(Response::new(200, "after")).await?;
    Ok(())
}

#[tokio::test]
async fn the_pool_reconnects_after_its_connection_is_killed() -> TestResult {
    let prefix = Prefix::new("kill");
    let clock = clock();
    let store = prefix
        .builder(&clock)
        .pool_size(1)
        .open()
        .await
        .map_err(|e| unreachable(&prefix.url, &e))?;
    let claim = claimed(store.begin(&scope("c1"), fp("r")).await?)?;
    let pid: i32 = sqlx::query("SELECT pg_backend_pid()")
        .fetch_one(store.pool())
        .await?
        .try_get(0)?;
    let admin = sqlx::PgPool::connect(&prefix.url).await?;
    let killed: bool = sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&admin)
        .await?
        .try_get(0)?;
    assert!(killed);
    // pg_terminate_backend only signals: wait until the backend is gone.
    for _ in 0..200 {
        let alive: i64 = sqlx::query("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(&admin)
            .await?
            .try_get(0)?;
        if alive == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The only pooled connection is dead. A call that runs on it fails with a clear error
    // (never hangs, never a wrong answer); the pool replaces it, and the next calls succeed.
    match store.begin(&scope("c2"), fp("r")).await {
        Ok(begin) => {
            claimed(begin)?.release().await?;
        }
        Err(StoreError::Backend { message }) => assert!(!message.is_empty()),
        Err(other) => return Err(format!("a lost connection: {other:?}").into()),
    }
    claim.complete(Response::new(201, "after the kill")).await?;
    match store.begin(&scope("c1"), fp("r")).await? {
        Begin::Replay(r) => assert_eq!(r.body(), b"after the kill"),
        other => return Err(format!("expected Replay, got {}", other.outcome()).into()),
    }
    Ok(())
}

#[tokio::test]
async fn the_sweeper_evicts_what_is_due_in_batches() -> TestResult {
    let prefix = Prefix::new("sweep");
    let clock = clock();
    let store = prefix
        .builder(&clock)
        .ttl(Duration::from_secs(60))
        .sweep(Sweep::Every {
            interval: Duration::from_millis(20),
            batch: 2,
        })
        .open()
        .await
        .map_err(|e| unreachable(&prefix.url, &e))?;
    for i in 0..5 {
        let claim = claimed(store.begin(&scope(&format!("s{i}")), fp("r")).await?)?;
        claim.complete(Response::new(200, "done")).await?;
    }
    let held = claimed(store.begin(&scope("held"), fp("r")).await?)?;
    // Nothing is due yet: several sweeps later every record is still there.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(store.stats().await?.completed, 5);
    clock.advance(Duration::from_secs(61));
    // The sweeper runs on its own; wait (bounded) for it to have evicted all five.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats = store.stats().await?;
        // The counter follows the database's delete: wait for both.
        if stats.completed == 0 && stats.evicted == 5 {
            assert_eq!(
                stats.in_progress, 1,
                "in-progress records are never evicted"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sweeper did not run: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await?;
    Ok(())
}

#[tokio::test]
async fn only_a_waited_for_completion_notifies_and_its_waiter_gets_the_response() -> TestResult {
    let prefix = Prefix::new("notify");
    let clock = clock();
    let store = prefix.open(&clock).await?;
    let mut listener = sqlx::postgres::PgListener::connect(&prefix.url).await?;
    listener.listen(&prefix.table("done")).await?;

    // Nobody waits for this one: no notification (a notifying commit serializes).
    let alone = claimed(store.begin(&scope("n-alone"), fp("r")).await?)?;
    alone.complete(Response::new(201, "alone")).await?;

    let key = scope("n-waited");
    let holder = claimed(store.begin(&key, fp("r")).await?)?;
    let waiter = tokio::spawn({
        let (store, key) = (store.clone(), key.clone());
        async move {
            store
                .begin_or_wait(&key, fp("r"), Duration::from_secs(30))
                .await
        }
    });
    // Wait (bounded) until the waiter has asked to be notified.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let marked: Option<bool> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT waiters FROM {} WHERE key = 'n-waited'",
            prefix.table("records")
        )))
        .fetch_optional(store.pool())
        .await?;
        if marked == Some(true) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter never marked the key"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    holder.complete(Response::new(201, "waited")).await?;
    match waiter.await?? {
        Begin::Replay(r) => assert_eq!(r.body(), b"waited"),
        other => return Err(format!("the waiter got {}", other.outcome()).into()),
    }
    let first = tokio::time::timeout(Duration::from_secs(10), listener.recv()).await??;
    let expected: String = key.encode().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        first.payload(),
        expected,
        "the first notification is the waited key's"
    );
    assert!(listener.next_buffered().is_none(), "one notification");
    Ok(())
}
