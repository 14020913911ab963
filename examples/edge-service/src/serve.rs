//! The server: bounds on slow clients, and a clean stop on SIGTERM or SIGINT.
//!
//! `axum::serve` sets no header-read timeout and no connection cap, so a client that sends its
//! headers a byte a second keeps its connection (and a file descriptor) forever. This accept
//! loop runs hyper's HTTP/1 server with:
//!
//! - a **header timeout** (`--header-timeout-secs`, 10 s): the whole request head must arrive
//!   within it, counted from the moment the connection waits for a request. The same timer
//!   bounds an idle keep-alive connection: hyper starts it as soon as the previous response is
//!   written.
//! - a **connection cap** (`--max-connections`, 1024): a connection past it is closed at once,
//!   before a byte is read; the ones being served are not slowed.
//!
//! On SIGTERM (what systemd, Kubernetes and other supervisors send) or SIGINT, the stop goes:
//! no new connections; the idempotency layer's drain begins (`idemstore::http::Drain`: new
//! covered requests refused, their keys free); in-flight handlers get up to `--drain-secs`
//! (20 s) to finish and store their responses; a handler still running then is named in the
//! log, with its key, because its outcome is unknown and its key stays in progress. A second
//! signal stops at once.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use idemstore::http::{Drain, Drained};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The server's limits (flags `--header-timeout-secs`, `--max-connections`, `--drain-secs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) header_timeout: Duration,
    pub(crate) max_connections: usize,
    pub(crate) drain: Duration,
}

/// Serves `router` on `listener` until SIGTERM or SIGINT, then stops as the module docs say.
/// `drain` is the stop of the router's idempotency layer.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    drain: Drain,
    limits: Limits,
    mut stop: Stop,
) -> std::io::Result<()> {
    let mut server = http1::Builder::new();
    server
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = GracefulShutdown::new();
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            signal = stop.next() => {
                tracing::info!(signal, "stopping: no new connections or covered requests");
                break;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(
                max = limits.max_connections,
                "a connection past the cap was closed"
            );
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = connections.watch(server.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    drain.start();
    let deadline = tokio::time::Instant::now() + limits.drain;
    let finished = async {
        // Connections finish their requests in flight and close; idle ones close now.
        if tokio::time::timeout_at(deadline, connections.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(drain = ?limits.drain, "connections were still open at the drain limit");
        }
        // Claimed requests run on tasks of their own: wait for those too, up to the limit.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        drain.finish(left).await
    };
    let drained = tokio::select! {
        drained = finished => drained,
        signal = stop.next() => {
            tracing::warn!(signal, "a second stop signal: not waiting for requests in flight");
            return Ok(());
        }
    };
    match drained {
        Drained::AllFinished => tracing::info!("every request in flight finished"),
        Drained::LimitPassed { in_progress } => {
            for scope in in_progress {
                tracing::warn!(
                    tenant = scope.tenant(),
                    operation = scope.operation(),
                    key = scope.key(),
                    "left in progress at the drain limit: its outcome is unknown, and a retry after the lease recovers it"
                );
            }
        }
    }
    Ok(())
}

/// The stop signals, SIGTERM and SIGINT, listened for from before the service says it is
/// listening (a signal before then would otherwise kill it outright).
pub(crate) struct Stop {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Stop {
    pub(crate) fn install() -> std::io::Result<Stop> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Stop {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Stop {})
    }

    /// The next stop signal's name.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}
