//! Waiting in a test for something another task, thread or process does: the one polling
//! helper of the crate's own tests, its conformance suites and their callers (feature `tokio`).
//!
//! It polls with a deadline, so that a test on a loaded machine waits as long as it needs and
//! a broken one fails naming what it waited for instead of hanging.
//!
//! Never wait with it for a lease to run out: leases run on the store's injected clock
//! ([`ManualClock`](crate::ManualClock)), which a test advances; polling real time for one
//! makes the test slow and flaky.

use std::time::{Duration, Instant};

use crate::error::BoxError;

/// How long [`eventually`] polls before it fails.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// The longest pause between two polls: the first ones come quickly, later ones back off to
/// this, so a check that queries a database does not flood it.
const LONGEST_PAUSE: Duration = Duration::from_millis(16);

/// Polls `check` until it answers `true`, for at most [`PATIENCE`].
///
/// A plain condition is `|| async { Ok(flag.load(Ordering::SeqCst)) }`.
///
/// # Errors
/// After [`PATIENCE`], or when `check` fails: a [`WaitError`] naming `what` was awaited.
pub async fn eventually(
    what: &str,
    check: impl AsyncFnMut() -> Result<bool, BoxError>,
) -> Result<(), WaitError> {
    within(what, PATIENCE, check).await
}

/// Polls `check` until it answers `true`, for at most `patience`: for a test whose bound is
/// part of what it shows.
///
/// # Errors
/// After `patience`, or when `check` fails: a [`WaitError`] naming `what` was awaited.
pub async fn within(
    what: &str,
    patience: Duration,
    mut check: impl AsyncFnMut() -> Result<bool, BoxError>,
) -> Result<(), WaitError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    let unmet = |failed| WaitError {
        what: what.to_owned(),
        patience,
        failed,
    };
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) if started.elapsed() > patience => return Err(unmet(None)),
            Ok(false) => {}
            Err(error) => return Err(unmet(Some(error))),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

/// A wait that ended without its condition: the deadline passed, or the check failed.
#[derive(Debug)]
pub struct WaitError {
    what: String,
    patience: Duration,
    failed: Option<BoxError>,
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, patience) = (&self.what, self.patience);
        match &self.failed {
            None => write!(f, "not so after {patience:?} of polling: {what}"),
            Some(error) => write!(f, "the check failed while waiting for {what}: {error}"),
        }
    }
}

impl std::error::Error for WaitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.failed
            .as_deref()
            .map(|error| error as &(dyn std::error::Error + 'static))
    }
}
