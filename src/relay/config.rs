//! The relay's settings.

use std::time::Duration;

use crate::model::backoff::Doubling;

/// How the relay reads, retries and gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayConfig {
    /// Messages read from the outbox per pass. Default 256.
    pub batch: usize,
    /// Failed attempts after which a message moves to the dead letters. Default 10.
    ///
    /// Attempts are counted in the relay's memory only: a restarted relay (or, over
    /// PostgreSQL, the relay that takes over from another) counts a message's attempts from
    /// zero again, so a poison message may be tried up to `max_attempts` more times per
    /// restart before it is dead-lettered.
    pub max_attempts: u32,
    /// The wait after a message's first failure; it doubles (with jitter) up to `max_backoff`.
    /// Default 100 ms.
    pub first_backoff: Duration,
    /// The longest wait between attempts of one message. Default 30 s.
    pub max_backoff: Duration,
    /// How long one delivery may wait for the sink. An attempt with no answer by then is
    /// treated as the sink being down (as [`Unavailable`](super::Unavailable)): delivery
    /// pauses and the attempt is not counted against the message. Keep it above the sink's
    /// own timeouts (for [`JetStreamSink`](super::JetStreamSink), twice the JetStream
    /// context's, 5 s by default: one for the publish, one for the ack). Default 15 s.
    pub attempt_timeout: Duration,
    /// How long the relay sleeps when the outbox is empty before looking again. Default 10 ms.
    pub idle_poll: Duration,
    /// Over PostgreSQL, how often a relay that does not hold the outbox's lock tries to take
    /// it (one `pg_try_advisory_lock` on its own connection, which never waits): the longest
    /// a take-over waits after the holder's connection goes. Default 1 s.
    pub standby_poll: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch: 256,
            max_attempts: 10,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(15),
            idle_poll: Duration::from_millis(10),
            standby_poll: Duration::from_secs(1),
        }
    }
}

impl RelayConfig {
    /// Sets [`RelayConfig::max_attempts`] (at least 1).
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Sets the first and the longest wait between attempts.
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.first_backoff = first;
        self.max_backoff = max.max(first);
        self
    }

    /// Sets [`RelayConfig::attempt_timeout`].
    #[must_use]
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// Sets [`RelayConfig::standby_poll`].
    #[must_use]
    pub fn standby_poll(mut self, poll: Duration) -> Self {
        self.standby_poll = poll;
        self
    }

    /// Sets [`RelayConfig::idle_poll`].
    #[must_use]
    pub fn idle_poll(mut self, poll: Duration) -> Self {
        self.idle_poll = poll;
        self
    }

    /// Sets [`RelayConfig::batch`] (at least 1).
    #[must_use]
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// The doubling from `first_backoff` to `max_backoff`, for a message's attempts and for
    /// the store's.
    pub(crate) fn retries(&self) -> Doubling {
        Doubling::new(self.first_backoff, self.max_backoff)
    }
}
