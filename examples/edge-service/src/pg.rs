//! The service on PostgreSQL (`--backend postgres --pg-url URL`, feature `postgres`): the same
//! routes and charge handling, with the claims, the charge rows and the responses in one
//! shared database, so several instances can serve the same clients behind a load balancer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Router, middleware};
use idemstore::http::{Drain, IdempotentRequest, Tenant};
use idemstore::sqlx::{self, Row};
use idemstore::{BoxError, Completer, CompleterTask, PgClaim, PgStore, Protocol, ProtocolClaim};

use super::auth::{self, Caller};
use super::charges::{self, Charging, Recorded};
use super::metrics;
use super::processor::Processor;
use super::stats::{self, Backend, Viewer};
use super::{Hooks, problem};

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct PgApp {
    pub(crate) store: PgStore,
    pub(crate) processor: Processor,
    pub(crate) lease: Duration,
    pub(crate) hooks: Hooks,
}

impl PgApp {
    fn charging(&self) -> Charging {
        Charging {
            processor: self.processor.clone(),
            lease: self.lease,
            pause_after_charge: self.hooks.pause_after_charge,
        }
    }
}

/// Opens the store (creating its tables and the charges table if needed).
pub(crate) async fn open(
    url: &str,
    lease: Duration,
    hooks: &Hooks,
) -> Result<PgStore, Box<dyn std::error::Error>> {
    let mut builder = PgStore::builder(url)
        .prefix(&std::env::var("EDGE_PG_PREFIX").unwrap_or_else(|_| "edge_".to_owned()))
        .lease(lease)
        // Each instance's share of the database's connections (PostgreSQL's default
        // max_connections is 100): `EDGE_PG_POOL`, default 16.
        .pool_size(
            std::env::var("EDGE_PG_POOL")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(16),
        );
    if let Some(clock) = &hooks.manual_clock {
        builder = builder.clock(clock.clone());
    }
    let store = builder.open().await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY, charge bytea NOT NULL)",
        charges_table()
    )))
    .execute(store.pool())
    .await?;
    Ok(store)
}

/// The charges table: `EDGE_PG_PREFIX` (default `edge_`) and `charges`; the prefix is
/// checked by the store before this is used.
fn charges_table() -> String {
    format!(
        "{}charges",
        std::env::var("EDGE_PG_PREFIX").unwrap_or_else(|_| "edge_".to_owned())
    )
}

pub(crate) fn router(
    app: PgApp,
    tokens: Arc<auth::Tokens>,
    wait: Duration,
    exporter: metrics::Exporter,
) -> (Router, Drain) {
    let (idempotency, drain) = super::idempotency(app.store.clone(), wait);
    let api = Router::new()
        .route("/charges", post(create))
        .route("/charges/{id}", get(show))
        .route_layer(idempotency)
        .route("/stats", get(stats))
        .layer(middleware::from_fn_with_state(tokens, auth::authenticate));
    let store = app.store.clone();
    let refresh = move || {
        let store = store.clone();
        // The exact count (one scan of the records table) is what sets the gauges here: at a
        // scrape's pace (seconds), not per request.
        async move { store.stats().await.map(drop).map_err(|e| e.to_string()) }
    };
    let router = Router::new()
        .merge(api)
        .with_state(app)
        .merge(metrics::route(exporter, refresh));
    (router, drain)
}

/// The completer of abandoned charges, as on the local store.
pub(crate) fn completer(app: &PgApp, every: Duration) -> CompleterTask {
    let app = app.clone();
    Completer::new(app.store.clone())
        .operation("POST /charges", move |claim| complete(app.clone(), claim))
        .every(every)
        .start()
}

/// `POST /charges`: the charge row and the response in one PostgreSQL transaction.
async fn create(
    State(app): State<PgApp>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    idem: IdempotentRequest<PgStore>,
    body: Bytes,
) -> Response {
    let recorded = match charges::charge(&app.charging(), &tenant, &idem, &body).await {
        Ok(recorded) => recorded,
        Err(answer) => return answer,
    };
    let mut tx = match idem.transaction().await {
        Ok(tx) => tx,
        Err(e) => return e.into_response(),
    };
    let inserted = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (id, charge) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
        charges_table()
    )))
    .bind(&recorded.row)
    .bind(&recorded.json)
    .execute(tx.conn())
    .await;
    if let Err(e) = inserted {
        // The charge exists downstream: leave the key in progress for a recovery.
        drop(tx);
        return idemstore::http::HandlerError::Aborted(e.into()).into_response();
    }
    // The event commits with the row and the response, as on the local store.
    if let Err(e) = tx.publish(charges::CHARGES_CREATED, recorded.json.clone()) {
        drop(tx);
        return idemstore::http::HandlerError::Aborted(e.into()).into_response();
    }
    idem.commit(tx, recorded.response())
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Finishes an abandoned charge: see `charges::complete`.
async fn complete(app: PgApp, claim: PgClaim) -> Result<(), BoxError> {
    let key = claim.downstream_key();
    match app.processor.lookup(&key).await {
        Some(made) => {
            let tenant = claim.scope().tenant().to_owned();
            let recorded = Recorded::of(&tenant, &key, made, claim.attempt())?;
            let mut tx = claim.transaction().await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {} (id, charge) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                charges_table()
            )))
            .bind(&recorded.row)
            .bind(&recorded.json)
            .execute(tx.conn())
            .await?;
            tx.publish(charges::CHARGES_CREATED, recorded.json.clone())?;
            tx.commit(recorded.response()).await?;
        }
        None => claim.release().await?,
    }
    Ok(())
}

/// `GET /charges/{id}`.
async fn show(
    State(app): State<PgApp>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path(id): Path<String>,
) -> Response {
    let found = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT charge FROM {} WHERE id = $1",
        charges_table()
    )))
    .bind(format!("{tenant}/{id}"))
    .fetch_optional(app.store.pool())
    .await;
    match found.and_then(|row| row.map(|r| r.try_get::<Vec<u8>, _>(0)).transpose()) {
        Ok(Some(json)) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Ok(None) => problem(
            StatusCode::NOT_FOUND,
            "no-such-charge",
            &format!("no charge {id} for this account"),
        ),
        Err(e) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "store-unavailable",
            &e.to_string(),
        ),
    }
}

/// `GET /stats` (see `stats`): the same shape as on the local store. The counters are this
/// instance's; the records, charges and side effects are everyone's.
async fn stats(State(app): State<PgApp>, Extension(caller): Extension<Caller>) -> Response {
    let viewer = Viewer::of(&caller, |tenant| count_charges(&app, tenant)).await;
    let stats = app.store.stats().await.map_err(|e| e.to_string());
    stats::answer(Backend::Postgres, viewer, stats, &app.processor).await
}

/// The caller's charge rows (ids `tenant/...`).
async fn count_charges(app: &PgApp, tenant: &str) -> Result<u64, String> {
    let row = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {} WHERE starts_with(id, $1)",
        charges_table()
    )))
    .bind(format!("{tenant}/"))
    .fetch_one(app.store.pool())
    .await
    .map_err(|e| e.to_string())?;
    let n: i64 = row.try_get(0).map_err(|e| e.to_string())?;
    Ok(u64::try_from(n).unwrap_or(0))
}
