//! The outbox over PostgreSQL: what a [`PgTx`](super::PgTx) publishes goes into
//! `<prefix>outbox` in the claim's own transaction; the relay reads it in seq order on a
//! connection of its own that holds the prefix's relay lock, and settles there; operators
//! list, retry and drop `<prefix>dead_letters`. This module never delivers anything: the
//! relay (`crate::relay`) does.

use std::fmt;
use std::time::Instant;

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};

use super::driver::{backend, timed};
use super::record::timestamp;
use super::store::PgStore;
use crate::error::StoreError;
use crate::model::message::{DeadLetter, Message};
use crate::protocol::outbox::{Outbox, sealed, sealed::Turn};

/// The first half of the relay lock's key (`pg_try_advisory_lock(int, int)`): "idem" in
/// ASCII, so that the key space is the store's own; the second half is a hash of the
/// outbox's table name. The two-key form never meets the one-key locks of the migration.
const RELAY_LOCK_CLASS: i32 = 0x6964_656d;

/// The right to deliver a prefix's outbox: a connection of its own (outside the pool) that
/// holds the session-level advisory lock of the prefix. Only one relay over the database
/// holds it; the others wait. PostgreSQL releases it when the connection goes, so a relay
/// that dies (or whose connection breaks) hands over without anyone cleaning up. Everything
/// the holder reads and settles goes through this connection: if it broke, the next read
/// fails, and the relay drops it and asks for the lock again.
pub struct Delivery {
    conn: PgConnection,
    lock: Lock,
    /// When a statement last ran on `conn`: the server ends the session after the silence
    /// bound without one, so a holder touches it more often.
    used: Instant,
}

/// Whether a relay's connection holds the relay lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lock {
    /// Another relay's connection holds it.
    Waiting,
    /// This one does, until it closes.
    Held,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery").finish_non_exhaustive()
    }
}

impl PgStore {
    /// Messages the relay gave up on, oldest first (by seq), at most `limit`: as
    /// [`Store::dead_letters`](crate::Store::dead_letters).
    ///
    /// # Errors
    /// [`StoreError::Backend`] if the database fails.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let inner = &self.inner;
        let rows = timed(
            self.call_limit(),
            "list dead letters",
            sqlx::query(AssertSqlSafe(inner.sql.dead_letters.clone()))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&inner.pool),
        )
        .await?;
        rows.iter().map(dead_letter_of).collect()
    }

    /// Puts the dead letter `seq` back in the outbox, at the end (a new seq; its id, payload
    /// and commit time kept, so a broker that saw it before still deduplicates it), in one
    /// statement. Returns the message as requeued; `None` if there is no such dead letter.
    /// As [`Store::retry_dead_letter`](crate::Store::retry_dead_letter).
    ///
    /// # Errors
    /// [`StoreError::Backend`] if the database fails (then nothing moved).
    pub async fn retry_dead_letter(&self, seq: u64) -> Result<Option<Message>, StoreError> {
        let inner = &self.inner;
        let row = timed(
            self.call_limit(),
            "retry a dead letter",
            sqlx::query(AssertSqlSafe(inner.sql.retry_dead.clone()))
                .bind(seq_i64(seq))
                .fetch_optional(&inner.pool),
        )
        .await?;
        row.as_ref().map(message_of).transpose()
    }

    /// Deletes the dead letter `seq` for good; whether there was one. As
    /// [`Store::drop_dead_letter`](crate::Store::drop_dead_letter).
    ///
    /// # Errors
    /// [`StoreError::Backend`] if the database fails.
    pub async fn drop_dead_letter(&self, seq: u64) -> Result<bool, StoreError> {
        let inner = &self.inner;
        let row = timed(
            self.call_limit(),
            "drop a dead letter",
            sqlx::query(AssertSqlSafe(inner.sql.drop_dead.clone()))
                .bind(seq_i64(seq))
                .fetch_optional(&inner.pool),
        )
        .await?;
        Ok(row.is_some())
    }

    /// A connection of the relay's own, outside the pool, on which it waits for the relay
    /// lock and, once it holds it, reads and settles.
    pub(crate) async fn relay_connection(&self) -> Result<Delivery, StoreError> {
        let options = self.inner.pool.connect_options();
        let mut conn = timed(
            self.call_limit(),
            "connect for the relay",
            PgConnection::connect_with(&options),
        )
        .await?;
        // The lock lives as long as the server thinks this session does. The session's TCP
        // keepalives end it when the relay's machine vanishes; this ends it when the relay
        // goes silent while its socket still answers (a stuck process, a proxy in between),
        // which the server cannot tell from a live peer otherwise: the lock then goes within
        // the silence bound, and another relay takes over. A holder touches its connection
        // more often than that (`hold_relay_lock`).
        let bounds = self.inner.config.bounds;
        let settings = format!("{}{}", bounds.session_statements(), bounds.idle_session());
        timed(
            self.call_limit(),
            "set the relay connection's time limits",
            sqlx::raw_sql(AssertSqlSafe(settings)).execute(&mut conn),
        )
        .await?;
        Ok(Delivery {
            conn,
            lock: Lock::Waiting,
            used: Instant::now(),
        })
    }

    /// Whether `delivery`'s connection holds the relay lock, trying to take it if not (one
    /// `pg_try_advisory_lock`, which never waits). Once held it is not asked again: the
    /// lock lives as long as the connection, and the next read tells if that went; but a
    /// connection unused for a while is touched (`SELECT 1`), so that the server does not end
    /// the session of a holder that is only waiting (for the sink, for a retry).
    pub(crate) async fn hold_relay_lock(
        &self,
        delivery: &mut Delivery,
    ) -> Result<bool, StoreError> {
        if delivery.lock == Lock::Held {
            if delivery.used.elapsed() >= self.inner.config.bounds.touch() {
                timed(
                    self.call_limit(),
                    "keep the relay lock",
                    sqlx::raw_sql("SELECT 1").execute(&mut delivery.conn),
                )
                .await?;
                delivery.used = Instant::now();
            }
            return Ok(true);
        }
        let held: bool = timed(
            self.call_limit(),
            "take the relay lock",
            sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
                .bind(RELAY_LOCK_CLASS)
                .bind(&self.inner.names.outbox)
                .fetch_one(&mut delivery.conn),
        )
        .await?;
        delivery.used = Instant::now();
        if held {
            delivery.lock = Lock::Held;
        }
        Ok(held)
    }
}

impl Delivery {
    /// Closes the lock's connection: the lock goes at once, and another relay takes over at
    /// its next poll.
    pub(crate) async fn close(self) {
        if let Err(e) = self.conn.close().await {
            tracing::debug!(error = %e, "closing the relay's connection failed; the server drops it");
        }
    }
}

impl PgStore {
    /// The first `limit` pending messages by seq, none of a subject in `skip`, read on the
    /// lock's connection.
    pub(crate) async fn pending_on(
        &self,
        delivery: &mut Delivery,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<Message>, StoreError> {
        let rows = timed(
            self.call_limit(),
            "read the outbox",
            sqlx::query(AssertSqlSafe(self.inner.sql.pending.clone()))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .bind(skip)
                .fetch_all(&mut delivery.conn),
        )
        .await?;
        delivery.used = Instant::now();
        rows.iter().map(message_of).collect()
    }

    /// Deletes the delivered messages and moves the dead ones, in one transaction on the
    /// lock's connection. A seq no longer in the outbox is skipped.
    pub(crate) async fn settle_on(
        &self,
        delivery: &mut Delivery,
        delivered: Vec<u64>,
        dead: Vec<DeadLetter>,
    ) -> Result<(), StoreError> {
        let (inner, limit) = (&self.inner, self.call_limit());
        let what = "settle delivered messages";
        let mut tx = timed(limit, what, delivery.conn.begin()).await?;
        if !delivered.is_empty() {
            let seqs: Vec<i64> = delivered.into_iter().map(seq_i64).collect();
            timed(
                limit,
                what,
                sqlx::query(AssertSqlSafe(inner.sql.delivered.clone()))
                    .bind(seqs)
                    .execute(&mut *tx),
            )
            .await?;
        }
        if !dead.is_empty() {
            let mut seqs = Vec::with_capacity(dead.len());
            let mut attempts = Vec::with_capacity(dead.len());
            let mut errors = Vec::with_capacity(dead.len());
            for letter in dead {
                seqs.push(seq_i64(letter.message.seq));
                attempts.push(i32::try_from(letter.attempts).unwrap_or(i32::MAX));
                // PostgreSQL's text has no NUL; a sink's error with one would fail the
                // whole settlement, every time.
                errors.push(letter.last_error.replace('\0', "\\0"));
            }
            timed(
                limit,
                what,
                sqlx::query(AssertSqlSafe(inner.sql.bury.clone()))
                    .bind(seqs)
                    .bind(attempts)
                    .bind(errors)
                    .bind(inner.config.now())
                    .execute(&mut *tx),
            )
            .await?;
        }
        timed(limit, what, tx.commit()).await?;
        delivery.used = Instant::now();
        Ok(())
    }
}

/// A seq as PostgreSQL's `bigint` (seqs come from an identity, so they fit).
fn seq_i64(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

fn message_of(row: &PgRow) -> Result<Message, StoreError> {
    let read = |e: sqlx::Error| backend("read an outbox message", &e);
    let seq: i64 = row.try_get("seq").map_err(read)?;
    let committed: i64 = row.try_get("committed_ms").map_err(read)?;
    Ok(Message {
        seq: u64::try_from(seq).unwrap_or(0),
        id: row.try_get("id").map_err(read)?,
        subject: row.try_get("subject").map_err(read)?,
        payload: row.try_get("payload").map_err(read)?,
        committed_at: timestamp(committed),
    })
}

fn dead_letter_of(row: &PgRow) -> Result<DeadLetter, StoreError> {
    let read = |e: sqlx::Error| backend("read a dead letter", &e);
    let attempts: i32 = row.try_get("attempts").map_err(read)?;
    let dead: i64 = row.try_get("dead_ms").map_err(read)?;
    Ok(DeadLetter {
        message: message_of(row)?,
        attempts: u32::try_from(attempts).unwrap_or(0),
        last_error: row.try_get("last_error").map_err(read)?,
        dead_at: timestamp(dead),
    })
}

impl Outbox for PgStore {
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        PgStore::dead_letters(self, limit).await
    }

    async fn retry_dead_letter(&self, seq: u64) -> Result<Option<Message>, StoreError> {
        PgStore::retry_dead_letter(self, seq).await
    }

    async fn drop_dead_letter(&self, seq: u64) -> Result<bool, StoreError> {
        PgStore::drop_dead_letter(self, seq).await
    }
}

impl sealed::Source for PgStore {
    type Handle = Delivery;

    async fn take_turn(&self, handle: &mut Option<Self::Handle>) -> Result<Turn, StoreError> {
        let delivery = match handle {
            Some(delivery) => delivery,
            None => handle.insert(self.relay_connection().await?),
        };
        Ok(if self.hold_relay_lock(delivery).await? {
            Turn::Ours
        } else {
            Turn::Theirs
        })
    }

    async fn pending(
        &self,
        handle: &mut Self::Handle,
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<Message>, StoreError> {
        self.pending_on(handle, limit, skip).await
    }

    async fn settle(
        &self,
        handle: &mut Self::Handle,
        delivered: Vec<u64>,
        dead: Vec<DeadLetter>,
    ) -> Result<(), StoreError> {
        self.settle_on(handle, delivered, dead).await
    }

    async fn end_turn(&self, handle: Self::Handle) {
        handle.close().await;
    }
}
