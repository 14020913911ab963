//! A real NATS JetStream server for the tests: `IDEMSTORE_NATS_URL`, by default
//! `nats://127.0.0.1:4222`. An unreachable server fails the test (under `CI=true` and
//! elsewhere alike: a test never passes by skipping its subject); the message says how to
//! start it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;

/// The server's URL.
pub fn url() -> String {
    std::env::var("IDEMSTORE_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// JetStream on the test server; panics, saying how to start it, if it is unreachable.
pub async fn connect() -> jetstream::Context {
    let url = url();
    let connected = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(&url)).await;
    match connected {
        Ok(Ok(client)) => jetstream::new(client),
        other => {
            let why = match other {
                Ok(Err(e)) => e.to_string(),
                _ => "no answer within 5 s".to_owned(),
            };
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!(
                    "NATS JetStream at {url} is unreachable under CI ({why}); .ci/run starts it"
                );
            }
            panic!(
                "NATS JetStream at {url} is unreachable ({why}). Start it with \
                 `start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
                 -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server`, or set IDEMSTORE_NATS_URL"
            );
        }
    }
}

/// A name no other test (or run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs `f` on a thread of its own, outside any tokio runtime the caller may be in.
pub fn off_runtime(f: impl FnOnce() + Send + 'static) {
    if let Err(panic) = std::thread::spawn(f).join() {
        std::panic::resume_unwind(panic);
    }
}

/// A runtime for a test's own requests to the server.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime for the test's own requests")
}

/// Fails, saying how to start NATS, if it is unreachable: never a skip.
pub fn require() {
    off_runtime(|| {
        runtime().block_on(connect());
    });
}

/// Deletes what a store shipping to the stream `name` made on the server (its log stream, its
/// writer entry's bucket and its snapshot bucket), outside any tokio runtime the caller may be
/// in. Best effort: for a test's cleanup.
pub fn drop_replica(name: &str) {
    let names = [
        format!("IDEMSTORE_LOG_{name}"),
        format!("KV_IDEMSTORE_WRITER_{name}"),
        format!("OBJ_IDEMSTORE_SNAP_{name}"),
    ];
    off_runtime(move || {
        runtime().block_on(async {
            let connected =
                tokio::time::timeout(Duration::from_secs(5), async_nats::connect(url())).await;
            if let Ok(Ok(client)) = connected {
                let js = jetstream::new(client);
                for name in names {
                    let _ = js.delete_stream(name).await;
                }
            }
        });
    });
}
