//! `GET /stats`, one shape on both backends: what a tenant may see (its charges, its side
//! effects, the store's health) and what the operator sees (every tenant's side effects and
//! the store's counters, with its log shipping and its restore window: null when it does not
//! ship, or was never restored). A field one backend does not have is there with 0 or null, so
//! a dashboard reads both the same way; `backend` says which one answered.

use std::time::Duration;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idemstore::{ShipState, Shipping, ShippingStats, Stats, Unreachable};
use serde_json::{Value, json};

use super::auth::Caller;
use super::problem;
use super::processor::Processor;

/// Which store answers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Backend {
    Local,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::Postgres => "postgres",
        }
    }
}

/// Who asks, with what only a tenant's view needs: its charge rows, counted by the backend.
pub(crate) enum Viewer<'a> {
    Tenant {
        tenant: &'a str,
        charges: Result<u64, String>,
    },
    Operator,
}

impl<'a> Viewer<'a> {
    /// The viewer for `caller`; `count` (a tenant's charges) runs only for a tenant.
    pub(crate) async fn of<F, Fut>(caller: &'a Caller, count: F) -> Viewer<'a>
    where
        F: FnOnce(&'a str) -> Fut,
        Fut: std::future::Future<Output = Result<u64, String>>,
    {
        match caller {
            Caller::Tenant(tenant) => Viewer::Tenant {
                tenant,
                charges: count(tenant).await,
            },
            Caller::Operator => Viewer::Operator,
        }
    }
}

/// What `/stats` answers, from the store's stats.
pub(crate) async fn answer(
    backend: Backend,
    viewer: Viewer<'_>,
    stats: Result<Stats, String>,
    processor: &Processor,
) -> Response {
    let tenant = match &viewer {
        Viewer::Tenant { tenant, .. } => Some(*tenant),
        Viewer::Operator => None,
    };
    let Some(side_effects) = processor.side_effects(tenant).await else {
        return unavailable("the processor's ledger cannot be read right now; try again shortly");
    };
    let stats = match stats {
        Ok(stats) => stats,
        Err(e) => {
            tracing::error!(error = %e, "stats failed");
            return unavailable(
                "the store's statistics cannot be read right now; try again shortly",
            );
        }
    };
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    let health = json!({
        "writable": stats.poisoned.is_none(),
        "restores": stats.restores,
        "since_checkpoint_secs": secs(stats.since_checkpoint),
    });
    if let Viewer::Tenant { tenant, charges } = viewer {
        let charges = match charges {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(error = %e, "reading the charges failed");
                return unavailable("the charges cannot be read right now; try again shortly");
            }
        };
        return Json(json!({
            "backend": backend.name(),
            "tenant": tenant,
            "charges": charges,
            "processor": { "side_effects": side_effects.of_tenant },
            "health": health,
        }))
        .into_response();
    }
    let (charge_calls, lookups) = processor.calls();
    Json(json!({
        "backend": backend.name(),
        "processor": {
            "side_effects": side_effects.all,
            "charge_calls": charge_calls,
            "lookups": lookups,
        },
        "health": health,
        "store": store(&stats),
    }))
    .into_response()
}

/// The store's counters, by the names of [`Stats`]' fields.
fn store(stats: &Stats) -> Value {
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    json!({
        "in_progress": stats.in_progress,
        "completed": stats.completed,
        "tombstones": stats.tombstones,
        "oldest_in_progress_secs": secs(stats.oldest_in_progress),
        "outbox_pending": stats.outbox_pending,
        "oldest_pending_message_secs": secs(stats.oldest_pending_message),
        "dead_letters": stats.dead_letters,
        "log_bytes_since_checkpoint": stats.log_bytes_since_checkpoint,
        "claims": stats.claims,
        "recoveries": stats.recoveries,
        "replays": stats.replays,
        "in_progress_answers": stats.in_progress_answers,
        "mismatches": stats.mismatches,
        "stale_rejections": stats.stale_rejections,
        "groups_committed": stats.groups_committed,
        "writer_requests": stats.writer_requests,
        "shipping": stats.shipping.as_ref().map(shipping),
        "restore_window": stats.restore_window.as_ref().map(|w| json!({
            "guarantee": w.guarantee.as_str(),
            "last_frame": w.last_frame,
            "restored_at_ms": w.restored_at.as_millis(),
            "ends_at_ms": w.ends_at.as_millis(),
        })),
    })
}

/// Log shipping (`--ship`), by the names of [`ShippingStats`]' fields: the state an operator
/// alerts on (anything but `shipping`) and how far the replica is behind.
fn shipping(shipping: &ShippingStats) -> Value {
    let mode = match shipping.mode {
        Shipping::Async => "async",
        Shipping::Sync(Unreachable::Refuse) => "sync",
        Shipping::Sync(Unreachable::FallBack) => "sync-fallback",
        _ => "other",
    };
    let state = match shipping.state {
        ShipState::Claiming => "claiming",
        ShipState::Shipping => "shipping",
        ShipState::CatchingUp => "catching_up",
        ShipState::Unreachable => "unreachable",
        ShipState::Fenced => "fenced",
        _ => "other",
    };
    json!({
        "mode": mode,
        "state": state,
        "last_error": shipping.last_error,
        "durable_frame": shipping.durable_frame,
        "shipped_frame": shipping.shipped_frame,
        "lag_frames": shipping.lag_frames,
        "lag_secs": shipping.lag.as_secs_f64(),
        "lag_p50_secs": shipping.lag_p50.as_secs_f64(),
        "lag_p99_secs": shipping.lag_p99.as_secs_f64(),
        "frames_shipped": shipping.frames_shipped,
        "snapshots": shipping.snapshots,
        "last_snapshot": shipping.last_snapshot,
        "overflows": shipping.overflows,
        "snapshot_failures": shipping.snapshot_failures,
        "snapshot_error": shipping.snapshot_error,
    })
}

fn unavailable(detail: &str) -> Response {
    problem(StatusCode::SERVICE_UNAVAILABLE, "store-unavailable", detail)
}
