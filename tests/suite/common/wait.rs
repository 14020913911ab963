//! Waiting in tests for something another task or thread does: one helper, polling with a
//! deadline, so that a test on a loaded machine waits as long as it needs and a broken one
//! fails with what it waited for instead of hanging.

use std::time::{Duration, Instant};

/// How long any wait may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `done` every few milliseconds until it holds, or fails after [`DEADLINE`] naming
/// `what` it waited for.
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) -> Result<(), String> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > DEADLINE {
            return Err(format!("timed out after {DEADLINE:?} waiting for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}
