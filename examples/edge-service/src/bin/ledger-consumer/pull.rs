//! The consuming loop: a durable JetStream pull consumer whose every message goes through the
//! inbox, then is acked. **Commit, then ack**: a crash between the two is a redelivery, which
//! the inbox answers with the stored outcome instead of applying the charge again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{AckKind, Message};
use futures_util::StreamExt;
use idemstore::{ExecuteError, Execution, Fingerprint, Store};

use super::ledger::{self, Event};

/// What the loop has done since the process started (the ledger itself is in the store).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Events applied to the ledger by this process.
    pub(crate) applied: AtomicU64,
    /// Redeliveries the inbox answered from its record (the effect did not run again).
    pub(crate) replayed: AtomicU64,
    /// Events refused: a payload that differs from the first one under the same id, an id
    /// that cannot be an inbox key, an event the ledger cannot apply. Terminated, not
    /// retried: a bug to look at.
    pub(crate) refused: AtomicU64,
    /// Deliveries handed back to the broker to try later (the store failed or was busy).
    pub(crate) retried: AtomicU64,
}

/// Test hook: after this process has applied this many events, it prints `COMMITTED <id>`
/// and stops before the ack, as a crash between commit and ack would.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Hang {
    Never,
    AfterApplying(u64),
}

/// Consumes until the process ends. A broken message stream (the server restarted, the
/// connection dropped) is opened again after a pause; the durable consumer on the server keeps
/// the position.
pub(crate) async fn run(
    store: Store,
    consumer: PullConsumer,
    name: String,
    counters: Arc<Counters>,
    hang: Hang,
) {
    loop {
        let mut messages = match consumer.messages().await {
            Ok(messages) => messages,
            Err(e) => {
                tracing::warn!(error = %e, "cannot pull from JetStream; trying again in 1 s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        while let Some(next) = messages.next().await {
            match next {
                Ok(message) => handle(&store, &name, &counters, hang, message).await,
                Err(e) => tracing::warn!(error = %e, "pulling from JetStream"),
            }
        }
    }
}

/// One delivery: through the inbox, then acked (or handed back, or terminated).
async fn handle(store: &Store, name: &str, counters: &Counters, hang: Hang, message: Message) {
    let Some(id) = event_id(&message) else {
        tracing::error!(subject = %message.subject, "a message with no id and no stream position; terminated");
        counters.refused.fetch_add(1, Ordering::Relaxed);
        let _ = message.ack_with(AckKind::Term).await;
        return;
    };
    let payload = message.payload.to_vec();
    let fingerprint = Fingerprint::of_bytes(&payload);
    let key = id.clone();
    let outcome = store
        .consume_async(name, &id, fingerprint, move |tx| {
            ledger::apply(tx, &key, Event::parse(&payload))
        })
        .await;
    let ack = match outcome {
        Ok(Execution::Executed(_)) => {
            let applied = counters.applied.fetch_add(1, Ordering::SeqCst) + 1;
            if let Hang::AfterApplying(n) = hang
                && applied >= n
            {
                println!("COMMITTED {id}");
                std::future::pending::<()>().await;
            }
            AckKind::Ack
        }
        // Applied before (its record says so), or so long ago that only a tombstone is left:
        // either way the effect happened once; ack so the broker stops redelivering.
        Ok(Execution::Replay(_) | Execution::Expired { .. }) => {
            counters.replayed.fetch_add(1, Ordering::Relaxed);
            AckKind::Ack
        }
        // Another delivery of the same event is being applied right now (a redelivery that
        // overtook a slow first one): let the broker bring it back after that.
        Ok(Execution::InProgress { retry_after }) => {
            counters.retried.fetch_add(1, Ordering::Relaxed);
            AckKind::Nak(Some(retry_after.max(Duration::from_millis(100))))
        }
        Ok(Execution::Mismatch) => {
            tracing::error!(%id, "an event arrived twice with different payloads; terminated");
            counters.refused.fetch_add(1, Ordering::Relaxed);
            AckKind::Term
        }
        Err(ExecuteError::BadScope(e)) => {
            tracing::error!(%id, error = %e, "the event id cannot be an inbox key; terminated");
            counters.refused.fetch_add(1, Ordering::Relaxed);
            AckKind::Term
        }
        // Applying it failed in a way a redelivery would repeat (the ledger refused it, the
        // code panicked): nothing was written, and retrying forever would only stall the
        // consumer. Terminate it and say so; an operator replays it from the stream.
        Err(
            e @ (ExecuteError::Aborted(_)
            | ExecuteError::Panicked(_)
            | ExecuteError::InvalidResponse(_)),
        ) => {
            tracing::error!(%id, error = %e, "the event cannot be applied; terminated");
            counters.refused.fetch_add(1, Ordering::Relaxed);
            AckKind::Term
        }
        // Nothing was applied (the store failed, or the outcome is unknown and the record
        // will tell on the next delivery): the broker delivers it again.
        Err(e) => {
            tracing::warn!(%id, error = %e, "the inbox failed; the event will be redelivered");
            counters.retried.fetch_add(1, Ordering::Relaxed);
            AckKind::Nak(Some(Duration::from_secs(1)))
        }
    };
    // A lost ack is a redelivery, which the inbox absorbs: no need to wait for the server.
    if let Err(e) = message.ack_with(ack).await {
        tracing::warn!(%id, error = %e, "the ack did not reach the server; expect a redelivery");
    }
}

/// The event's stable id: the `Nats-Msg-Id` the outbox relay set (the same on every
/// publication of the event), else the stream and its sequence there (stable too, but a
/// producer that publishes twice makes two of those).
fn event_id(message: &Message) -> Option<String> {
    if let Some(id) = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")) {
        return Some(id.to_string());
    }
    let info = message.info().ok()?;
    Some(format!("{}/{}", info.stream, info.stream_sequence))
}
