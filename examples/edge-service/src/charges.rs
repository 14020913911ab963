//! `POST /charges`, `GET /charges/{id}` and `GET /stats`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use idemstore::http::{IdempotentRequest, Tenant};
use idemstore::redb::TableDefinition;
use idemstore::{BoxError, Claim, Protocol};
use serde::{Deserialize, Serialize};

use super::auth::Caller;
use super::processor::{Outcome, ProcessorCharge};
use super::stats::{self, Backend, Viewer};
use super::{App, problem};

/// The event every recorded charge publishes (its payload: the charge as JSON).
pub(crate) const CHARGES_CREATED: &str = "charges.created";

/// `tenant/charge id` → the charge as JSON. Written in the same commit as the response.
pub(crate) const CHARGES: TableDefinition<&str, &[u8]> = TableDefinition::new("charges");

/// The request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateCharge {
    /// In minor units (cents).
    amount: u64,
    currency: String,
    customer: String,
}

/// The charge as stored and answered.
#[derive(Debug, Serialize, Deserialize)]
struct Charge {
    id: String,
    amount: u64,
    currency: String,
    customer: String,
    processor_charge: String,
    /// Which attempt of the request completed it (2 or more: a recovery).
    attempt: u32,
}

/// A validated command, or what is wrong with it (answered 400).
fn validate(body: &[u8]) -> Result<CreateCharge, String> {
    let command: CreateCharge = serde_json::from_slice(body).map_err(|e| {
        format!(
            "the body is not a charge: {e}; send {{\"amount\": 1900, \"currency\": \"eur\", \"customer\": \"cus_1\"}}"
        )
    })?;
    let currency_ok =
        command.currency.len() == 3 && command.currency.chars().all(|c| c.is_ascii_lowercase());
    if command.amount == 0 || !currency_ok || command.customer.is_empty() {
        return Err("amount must be a positive integer in minor units, currency three lowercase letters, customer non-empty".to_owned());
    }
    Ok(command)
}

/// Creates a charge once per `Idempotency-Key`, however often the client retries.
pub(crate) async fn create(
    State(app): State<App>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    idem: IdempotentRequest,
    body: Bytes,
) -> Response {
    let recorded = match charge(&app.charging(), &tenant, &idem, &body).await {
        Ok(recorded) => recorded,
        Err(answer) => return answer,
    };
    // The charge row and the response: one transaction.
    idem.commit(move |tx| recorded.commit(tx))
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// What the charge handlers of every backend share.
pub(crate) struct Charging {
    pub(crate) processor: super::processor::Processor,
    pub(crate) lease: Duration,
    pub(crate) pause_after_charge: bool,
}

/// Everything of `POST /charges` before the commit, on any backend: validates the body,
/// charges the processor with the request's downstream key, and answers the charge to record,
/// or the response to send (the claim then released or left in progress as the outcome says).
pub(crate) async fn charge<P: Protocol>(
    app: &Charging,
    tenant: &str,
    idem: &IdempotentRequest<P>,
    body: &[u8],
) -> Result<Recorded, Response> {
    let tenant = tenant.to_owned();
    let command = match validate(body) {
        Ok(command) => command,
        Err(why) => {
            // Nothing happened: give the key up, so the client can fix the body and retry
            // with the same key (Stripe stores no result for a request that failed validation).
            if let Err(e) = idem.release().await {
                return Err(e.into_response());
            }
            return Err(problem(StatusCode::BAD_REQUEST, "invalid-charge", &why));
        }
    };
    if let Some(why) = idem.recovery() {
        tracing::info!(
            key = idem.scope().key(),
            attempt = idem.attempt(),
            %why,
            checkpoint = ?idem.last_checkpoint().map(|c| String::from_utf8_lossy(&c).into_owned()),
            "recovering a request an earlier attempt may have run"
        );
    }
    // The processor deduplicates on this key, the same for every attempt: a recovery that asks
    // again gets the first attempt's charge instead of making a second one.
    let processor_key = idem.downstream_key().to_owned();
    let outcome = app
        .processor
        .charge(
            &tenant,
            &processor_key,
            command.amount,
            &command.currency,
            &command.customer,
        )
        .await;
    if app.pause_after_charge {
        // Test hook: the charge is made and nothing is committed; the test kills us here.
        println!("PAUSED {}", idem.scope().key());
        std::future::pending::<()>().await;
    }
    let processor_charge = match outcome {
        Outcome::Charged(c) | Outcome::AlreadyCharged(c) => c,
        Outcome::Unavailable(why) => {
            // Nothing was charged: give the key back, so the retry runs the charge again.
            tracing::warn!(
                key = idem.scope().key(),
                why,
                "the processor is unavailable"
            );
            if let Err(e) = idem.release().await {
                return Err(e.into_response());
            }
            let mut answer = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "processor-unavailable",
                "the payment processor could not take the charge and nothing was charged; retry with the same Idempotency-Key after the Retry-After seconds",
            );
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            return Err(answer);
        }
        Outcome::TimedOut => {
            // The charge may or may not exist: leave the claim in progress. Retries get 409
            // until the lease ends; the first after it recovers and asks the processor again.
            if let Err(e) = idem.leave_in_progress() {
                return Err(e.into_response());
            }
            let mut answer = problem(
                StatusCode::GATEWAY_TIMEOUT,
                "processor-timeout",
                "the payment processor did not answer; retry with the same Idempotency-Key after the Retry-After seconds",
            )
            .into_response();
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, app.lease.as_secs().max(1).into());
            return Err(answer);
        }
    };
    Recorded::of(&tenant, &processor_key, processor_charge, idem.attempt()).map_err(|e| {
        // Unreachable for this struct; if it ever happens, the charge exists and its
        // outcome is unknown to the client: leave the key in progress for a recovery.
        tracing::error!(error = %e, "a charge did not serialize");
        idemstore::http::HandlerError::Aborted(e.into()).into_response()
    })
}

/// A charge as it is stored: its row and the response a retry replays.
pub(crate) struct Recorded {
    pub(crate) row: String,
    pub(crate) json: Vec<u8>,
    location: String,
}

impl Recorded {
    /// The record of the charge the processor made for `downstream_key`, completed by attempt
    /// `attempt` of the request.
    pub(crate) fn of(
        tenant: &str,
        downstream_key: &str,
        made: ProcessorCharge,
        attempt: u32,
    ) -> Result<Recorded, serde_json::Error> {
        let charge = Charge {
            id: format!("ch_{}", &downstream_key[..16]),
            amount: made.amount,
            currency: made.currency,
            customer: made.customer,
            processor_charge: made.id,
            attempt,
        };
        Ok(Recorded {
            row: format!("{tenant}/{}", charge.id),
            location: format!("/charges/{}", charge.id),
            json: serde_json::to_vec(&charge)?,
        })
    }

    /// Writes the charge row, publishes `charges.created` through the outbox, and answers the
    /// response, all in the commit's transaction: the event exists if and only if the charge
    /// is recorded.
    fn commit(self, tx: &mut idemstore::Tx<'_>) -> Result<idemstore::Response, BoxError> {
        tx.insert(&CHARGES, self.row.as_str(), self.json.as_slice())?;
        tx.publish(CHARGES_CREATED, self.json.clone())?;
        Ok(self.response())
    }

    /// The response every retry replays.
    pub(crate) fn response(self) -> idemstore::Response {
        idemstore::Response::new(201, self.json)
            .with_header("content-type", "application/json")
            .with_header("location", self.location)
    }
}

/// Completes a charge its request abandoned (a processor timeout the client never retried,
/// a process that died after the charge): the completer hands it over as a recovery. The
/// processor is asked, by the request's downstream key, what it did: a charge it made is
/// recorded (row and response, one transaction), and a key it never charged is given back.
/// The processor is only read here; it is never asked to charge again.
pub(crate) async fn complete(app: App, claim: Claim) -> Result<(), BoxError> {
    let key = claim.downstream_key();
    match app.processor.lookup(&key).await {
        Some(made) => {
            let tenant = claim.scope().tenant().to_owned();
            let recorded = Recorded::of(&tenant, &key, made, claim.attempt())?;
            let scope = claim.scope().clone();
            claim.commit_async(move |tx| recorded.commit(tx)).await?;
            tracing::info!(%scope, "completed an abandoned charge");
        }
        None => {
            let scope = claim.scope().clone();
            claim.release_async().await?;
            tracing::info!(%scope, "an abandoned charge was never made; its key is released");
        }
    }
    Ok(())
}

/// A charge of the caller's, by id.
pub(crate) async fn show(
    State(app): State<App>,
    Extension(Tenant(tenant)): Extension<Tenant>,
    Path(id): Path<String>,
) -> Response {
    let store = app.store.clone();
    let row = format!("{tenant}/{id}");
    let found = tokio::task::spawn_blocking(move || -> Result<Option<Vec<u8>>, String> {
        let charges = store
            .read()
            .map_err(|e| e.to_string())?
            .open_table(CHARGES)
            .map_err(|e| e.to_string())?;
        let value = charges.get(row.as_str()).map_err(|e| e.to_string())?;
        Ok(value.map(|v| v.value().to_vec()))
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    match found {
        Ok(Some(json)) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Ok(None) => problem(
            StatusCode::NOT_FOUND,
            "no-such-charge",
            &format!("no charge {id} for this account"),
        )
        .into_response(),
        Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable", &e).into_response(),
    }
}

/// `GET /stats` (see `stats`).
pub(crate) async fn stats(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let viewer = Viewer::of(&caller, |tenant| count_charges(&app, tenant)).await;
    let store = app.store.clone();
    let stats = match tokio::task::spawn_blocking(move || store.stats()).await {
        Ok(stats) => stats.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    stats::answer(Backend::Local, viewer, stats, &app.processor).await
}

/// The caller's charge rows (keys `tenant/...`).
async fn count_charges(app: &App, tenant: &str) -> Result<u64, String> {
    let store = app.store.clone();
    let prefix = format!("{tenant}/");
    tokio::task::spawn_blocking(move || -> Result<u64, String> {
        let read = store.read().map_err(|e| e.to_string())?;
        let charges = read.open_table(CHARGES).map_err(|e| e.to_string())?;
        let mut n = 0;
        for entry in charges
            .range(prefix.as_str()..)
            .map_err(|e| e.to_string())?
        {
            let (key, _) = entry.map_err(|e| e.to_string())?;
            if !key.value().starts_with(&prefix) {
                break;
            }
            n += 1;
        }
        Ok(n)
    })
    .await
    .map_err(|e| e.to_string())?
}
