//! `GET /metrics`: the store's metrics in Prometheus text format, on either backend (the
//! table is in the README, "Operating it").
//!
//! Outside the authentication layer, as scrapers expect: no label holds a tenant or a key, so
//! it shows volumes and health, never whose requests; serve it on an internal address only.
//! A build without the `metrics` feature answers 404 saying how to turn it on.

use std::future::Future;

use axum::Router;
use axum::http::StatusCode;
#[cfg(feature = "metrics")]
use axum::http::header;
#[cfg(feature = "metrics")]
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::get;

use super::problem;

/// The Prometheus recorder's handle, to render the page; none if another recorder was
/// installed first (in a test process, say), or in a build without the feature.
#[derive(Clone)]
pub(crate) struct Exporter {
    #[cfg(feature = "metrics")]
    handle: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

/// Installs the recorder. Call before the store opens, so that nothing it counts is lost.
pub(crate) fn install() -> Exporter {
    #[cfg(feature = "metrics")]
    {
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .inspect_err(|e| tracing::warn!(error = %e, "no /metrics"))
            .ok();
        Exporter { handle }
    }
    #[cfg(not(feature = "metrics"))]
    Exporter {}
}

/// The route. `refresh` reads the store's stats, which sets its gauges (records by state, the
/// oldest work in progress) on either backend, so that each scrape reads them fresh.
pub(crate) fn route<S, F, Fut>(exporter: Exporter, refresh: F) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    F: Fn() -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    Router::new().route(
        "/metrics",
        get(move || {
            let (exporter, refresh) = (exporter.clone(), refresh.clone());
            async move { page(&exporter, refresh).await }
        }),
    )
}

#[cfg(feature = "metrics")]
async fn page<F, Fut>(exporter: &Exporter, refresh: F) -> Response
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let Some(handle) = &exporter.handle else {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "no-metrics",
            "another metrics recorder was installed in this process",
        );
    };
    if let Err(e) = refresh().await {
        tracing::warn!(error = %e, "stats for /metrics failed");
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}

#[cfg(not(feature = "metrics"))]
async fn page<F, Fut>(exporter: &Exporter, refresh: F) -> Response
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let _ = (exporter, refresh);
    problem(
        StatusCode::NOT_FOUND,
        "no-metrics",
        "this build has no metrics: build the edge service with its `metrics` feature (on by default: `cargo run --release -p edge-service`; a `--no-default-features` build leaves it out)",
    )
}
