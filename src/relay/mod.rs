//! The outbox relay: delivers committed messages to a [`Sink`] (feature `tokio`).
//!
//! [`Tx::publish`](crate::Tx::publish) (or [`PgTx::publish`](crate::PgTx::publish) over
//! PostgreSQL) records a message in the commit's own transaction; the relay, a background
//! task next to the store, reads the outbox in commit order and hands each message to the
//! sink. It runs over either backend ([`Outbox`]):
//!
//! - **at least once**: a message leaves the outbox only after the sink accepted it, through a
//!   writer request; a crash in between delivers it again after the restart, with the same id;
//! - **in commit order per subject**: while a message waits for a retry, later messages of its
//!   subject wait too (other subjects go on);
//! - **retries** back off exponentially with jitter; after
//!   [`RelayConfig::max_attempts`] failures a message moves to the dead letters
//!   ([`Store::dead_letters`](crate::Store::dead_letters), `retry_dead_letter`,
//!   `drop_dead_letter`) with its last error, and its subject goes on;
//! - **an outage is not a failure of the message**: a sink that answers [`Unavailable`] (the
//!   broker is down) pauses all delivery with the same backoff, and counts no attempt, so a
//!   long outage sends nothing to the dead letters.
//!
//! Over PostgreSQL, several instances share one outbox: each may start a relay, and one at a
//! time delivers while the others stand by, polling every [`RelayConfig::standby_poll`]. How
//! the relay lock works, how a take-over happens and the narrower order promised there are in
//! `docs/design.md`, "The PostgreSQL backend".
//!
//! With a sink that deduplicates by id ([`JetStreamSink`], which sets `Nats-Msg-Id`), a message
//! is in the stream **exactly once**. The relay reads published snapshots only, so it never
//! shortens the writer's epochs: a message is seen at most one epoch (20 ms) after its commit.

mod config;
mod counters;
#[cfg(feature = "nats")]
mod nats;
mod pass;
mod run;
mod sink;

pub use self::config::RelayConfig;
pub use self::counters::RelayStats;
#[cfg(feature = "nats")]
pub use self::nats::JetStreamSink;
pub use self::run::Relay;
pub use self::sink::{Sink, Unavailable};
pub use crate::protocol::outbox::Outbox;
