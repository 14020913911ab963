//! The outbox and the dead letters in the store's own tables: recording what a commit
//! published, reading what is pending, and settling what the relay delivered or gave up on.
//!
//! Messages are keyed by a seq handed out from a counter in the meta table, written in the
//! same request as the messages, so that it survives (and is replayed) with them. Reads go
//! through published snapshots only: the relay never asks the writer to publish, so it does
//! not cut the writer's epochs short (a message waits at most one epoch, 20 ms, to be seen).

use redb::{
    ReadTransaction, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition,
};

use crate::error::StoreError;
use crate::model::clock::Timestamp;
use crate::model::message::{DeadLetter, Message, message_key};

use super::Request;
use crate::engine::Engine;
use crate::engine::tables::layout::{DEAD_LETTERS, META_NEXT_MESSAGE, OUTBOX};
use crate::engine::tables::tx::Tx;
use crate::engine::writer::context::Context;
use crate::engine::writer::job::Keep;

fn raw(name: &str) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
    TableDefinition::new(name)
}

/// The next seq, read through the request's transaction (it sees earlier requests' writes).
fn next_seq(tx: &Tx<'_>, ctx: &Context<'_>) -> Result<u64, StoreError> {
    let stored = tx.get_raw(ctx.tables.meta, META_NEXT_MESSAGE)?;
    Ok(stored
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map_or(1, u64::from_le_bytes))
}

/// Appends `messages` to the outbox with consecutive seqs (called after the request's work
/// succeeded, in the same request: its writes are kept together).
pub(crate) fn record(
    tx: &mut Tx<'_>,
    ctx: &Context<'_>,
    messages: Vec<(String, String, Vec<u8>)>,
) -> Result<(), StoreError> {
    if messages.is_empty() {
        return Ok(());
    }
    let mut seq = next_seq(tx, ctx)?;
    for (id, subject, payload) in messages {
        let message = Message {
            seq,
            id,
            subject,
            payload,
            committed_at: ctx.now,
        };
        tx.put_raw(ctx.tables.outbox, &message_key(seq), message.encode());
        seq += 1;
    }
    tx.put_raw(
        ctx.tables.meta,
        META_NEXT_MESSAGE,
        seq.to_le_bytes().to_vec(),
    );
    Ok(())
}

/// What the relay settles in one request.
#[cfg(feature = "tokio")]
#[derive(Debug, Default)]
pub(crate) struct Settlement {
    /// Seqs delivered: removed from the outbox.
    pub(crate) delivered: Vec<u64>,
    /// Messages given up on: moved to the dead letters.
    pub(crate) dead: Vec<DeadLetter>,
}

/// Removes delivered messages and moves dead ones, in one writer request. A seq no longer in
/// the outbox (settled before) is skipped.
#[cfg(feature = "tokio")]
pub(crate) fn settle(settlement: Settlement) -> Request<Result<(), StoreError>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        let run = |tx: &mut Tx<'_>| -> Result<(), StoreError> {
            let outbox = ctx.tables.outbox;
            for seq in settlement.delivered {
                tx.delete_raw(outbox, &message_key(seq));
            }
            for dead in settlement.dead {
                let key = message_key(dead.message.seq);
                if tx.get_raw(outbox, &key)?.is_some() {
                    tx.delete_raw(outbox, &key);
                    tx.put_raw(ctx.tables.dead_letters, &key, dead.encode());
                }
            }
            Ok(())
        };
        kept(run(tx))
    })
}

/// Puts a dead letter back at the end of the outbox (a new seq); `None` if there is none.
pub(crate) fn retry_dead(seq: u64) -> Request<Result<Option<Message>, StoreError>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        let run = |tx: &mut Tx<'_>| -> Result<Option<Message>, StoreError> {
            let key = message_key(seq);
            let Some(bytes) = tx.get_raw(ctx.tables.dead_letters, &key)? else {
                return Ok(None);
            };
            let dead =
                DeadLetter::decode(&key, &bytes).ok_or_else(|| corrupt(DEAD_LETTERS, seq))?;
            tx.delete_raw(ctx.tables.dead_letters, &key);
            let mut message = dead.message;
            message.seq = next_seq(tx, ctx)?;
            tx.put_raw(
                ctx.tables.outbox,
                &message_key(message.seq),
                message.encode(),
            );
            tx.put_raw(
                ctx.tables.meta,
                META_NEXT_MESSAGE,
                (message.seq + 1).to_le_bytes().to_vec(),
            );
            Ok(Some(message))
        };
        kept(run(tx))
    })
}

/// Deletes a dead letter; whether there was one.
pub(crate) fn drop_dead(seq: u64) -> Request<Result<bool, StoreError>> {
    Request::new(move |tx: &mut Tx<'_>, ctx: &mut Context<'_>| {
        let key = message_key(seq);
        match tx.get_raw(ctx.tables.dead_letters, &key) {
            Ok(Some(_)) => {
                tx.delete_raw(ctx.tables.dead_letters, &key);
                (Keep::Writes, Ok(true))
            }
            Ok(None) => (Keep::Nothing, Ok(false)),
            Err(e) => (Keep::Nothing, Err(e.into())),
        }
    })
}

fn kept<T>(result: Result<T, StoreError>) -> (Keep, Result<T, StoreError>) {
    match result {
        Ok(value) => (Keep::Writes, Ok(value)),
        Err(e) => (Keep::Nothing, Err(e)),
    }
}

fn corrupt(table: &str, seq: u64) -> StoreError {
    StoreError::Internal {
        message: format!("{table} entry {seq} does not decode; the file is damaged"),
    }
}

/// The outbox's size and age, for stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutboxCounts {
    pub(crate) pending: u64,
    pub(crate) oldest: Option<Timestamp>,
    pub(crate) dead_letters: u64,
}

pub(crate) fn counts_in(txn: &ReadTransaction) -> Result<OutboxCounts, StoreError> {
    let outbox = txn.open_table(raw(OUTBOX))?;
    let dead = txn.open_table(raw(DEAD_LETTERS))?;
    let oldest = match outbox.first()? {
        Some((k, v)) => Some(
            Message::decode(k.value(), v.value())
                .ok_or_else(|| corrupt(OUTBOX, 0))?
                .committed_at,
        ),
        None => None,
    };
    Ok(OutboxCounts {
        pending: outbox.len()?,
        oldest,
        dead_letters: dead.len()?,
    })
}

impl Engine {
    /// Up to `limit` pending messages with a seq after `after`, none of a subject in `skip`
    /// (sorted), in commit order, from the last published snapshot.
    #[cfg(feature = "tokio")]
    pub(crate) fn pending_messages(
        &self,
        after: Option<u64>,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<Message>, StoreError> {
        let db = self.shared.db.read(&self.shared.poison)?;
        let txn = db.begin_read()?;
        let outbox = txn.open_table(raw(OUTBOX))?;
        let start = after.map_or(0, |s| s.saturating_add(1));
        let mut out = Vec::new();
        for entry in outbox.range::<&[u8]>(message_key(start).as_slice()..)? {
            if out.len() >= limit {
                break;
            }
            let (k, v) = entry?;
            let seq = u64::from_be_bytes(k.value().try_into().unwrap_or_default());
            let message =
                Message::decode(k.value(), v.value()).ok_or_else(|| corrupt(OUTBOX, seq))?;
            if skip.binary_search(&message.subject).is_err() {
                out.push(message);
            }
        }
        Ok(out)
    }

    /// Up to `limit` dead letters, oldest first.
    pub(crate) fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        self.publish_acknowledged()?;
        let db = self.shared.db.read(&self.shared.poison)?;
        let txn = db.begin_read()?;
        let dead = txn.open_table(raw(DEAD_LETTERS))?;
        let mut out = Vec::new();
        for entry in dead.iter()?.take(limit) {
            let (k, v) = entry?;
            let seq = u64::from_be_bytes(k.value().try_into().unwrap_or_default());
            out.push(
                DeadLetter::decode(k.value(), v.value())
                    .ok_or_else(|| corrupt(DEAD_LETTERS, seq))?,
            );
        }
        Ok(out)
    }
}
