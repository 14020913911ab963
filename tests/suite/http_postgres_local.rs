//! Routes declared local on the PostgreSQL backend (`IdempotencyLayer::<PgStore>::local_work`):
//! no claim before the handler; its `LocalRequest<PgStore>::execute` claims, writes and stores
//! the response in one PostgreSQL transaction, or answers the duplicate. Needs the database at
//! `IDEMSTORE_PG_URL`; fails, never skips, without it.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use common::TestResult;
use common::http::*;
use idemstore::http::{IdempotencyLayer, LocalRequest};
use idemstore::sqlx::{self, AssertSqlSafe};
use idemstore::testing::postgres::{Prefix, unreachable};
use idemstore::{BoxError, PgStore, PgTx, Response, Sweep};

type Error = Box<dyn std::error::Error>;

async fn open(prefix: &Prefix) -> Result<(PgStore, String), Error> {
    let store = PgStore::builder(prefix.url())
        .prefix(prefix.name())
        .sweep(Sweep::Off)
        .open()
        .await
        .map_err(|e| -> Error { unreachable(prefix.url(), &e) })?;
    let table = prefix.table("orders");
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id text PRIMARY KEY)"
    )))
    .execute(store.pool())
    .await?;
    Ok((store, table))
}

/// POST /orders places one order row through `execute`, counting the closure's runs.
fn local_app(store: &PgStore, table: &str, runs: &Arc<AtomicU32>) -> Router {
    let (runs, insert) = (
        runs.clone(),
        format!("INSERT INTO {table} (id) VALUES ($1)"),
    );
    let handler = post(move |local: LocalRequest<PgStore>| async move {
        let id = format!("order-{}", local.scope().key());
        local
            .execute(async |tx: &mut PgTx| {
                runs.fetch_add(1, Ordering::SeqCst);
                sqlx::query(AssertSqlSafe(insert))
                    .bind(&id)
                    .execute(tx.conn())
                    .await?;
                Ok(Response::new(201, id.into_bytes()).with_header("content-type", "text/plain"))
            })
            .await
    });
    Router::new()
        .route("/orders", handler)
        .route_layer(IdempotencyLayer::new(store.clone()).local_work())
}

async fn orders(store: &PgStore, table: &str) -> Result<i64, Error> {
    Ok(
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(store.pool())
            .await?,
    )
}

/// Sixteen copies of one request at once: the work runs once, in the transaction that stores
/// its response; the copies that arrive while it is open wait on its row and replay it, and
/// any that arrived before the claim was visible are run by nobody else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_copies_run_the_work_once_and_the_rest_replay() -> TestResult {
    let prefix = Prefix::new("httploc");
    let (store, table) = open(&prefix).await?;
    let runs = Arc::new(AtomicU32::new(0));
    let app = local_app(&store, &table, &runs);
    assert_eq!(
        post_copies(&app, 16, "pg-local-1", "order-pg-local-1").await?,
        (1, 15)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "closure runs");
    assert_eq!(orders(&store, &table).await?, 1, "side effects");
    Ok(())
}

/// Another request under a used key is refused (422) without running; a failing closure
/// writes nothing and leaves the key free, so its retry runs.
#[tokio::test]
async fn a_mismatch_is_refused_and_a_failed_closure_leaves_the_key_free() -> TestResult {
    let prefix = Prefix::new("httplocf");
    let (store, table) = open(&prefix).await?;
    let runs = Arc::new(AtomicU32::new(0));
    let app = local_app(&store, &table, &runs);
    let first = send(&app, post_req("pg-local-k1", BODY)).await?;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let other = send(&app, post_req("pg-local-k1", r#"{"item": "gadget"}"#)).await?;
    assert_eq!(
        other.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        other.body
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let failing = Router::new()
        .route(
            "/orders",
            post(async |local: LocalRequest<PgStore>| {
                local
                    .execute(async |_: &mut PgTx| Err::<Response, BoxError>("no stock".into()))
                    .await
            }),
        )
        .route_layer(IdempotencyLayer::new(store.clone()).local_work());
    let failed = send(&failing, post_req("pg-local-k2", BODY)).await?;
    assert_eq!(
        failed.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        failed.body
    );
    let retried = send(&app, post_req("pg-local-k2", BODY)).await?;
    assert_eq!(retried.status, StatusCode::CREATED, "{}", retried.body);
    assert!(!retried.replayed());
    assert_eq!(orders(&store, &table).await?, 2);
    Ok(())
}
