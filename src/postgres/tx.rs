//! [`PgTx`]: the PostgreSQL transaction a claim hands out, in which business SQL and the
//! completed record commit together.

use std::fmt;
use std::ops::{Deref, DerefMut};

use sqlx::{PgConnection, Postgres, Transaction};

use super::claim::PgClaim;
use super::driver::{backend, commit_failed, unknown};
use crate::error::{CommitError, StoreError};
use crate::model::message::{MessageError, Published};
use crate::model::response::Response;

/// A claim's open transaction: run business SQL in it (it derefs to
/// [`sqlx::Transaction`]), then [`commit`](PgTx::commit) a response.
///
/// `commit` runs `UPDATE <records> ... WHERE fence = <the claim's> AND state = in progress`
/// in this transaction, then `COMMIT`: the business rows and the completed record are
/// durable together, or neither is. If no row was updated (another attempt took the key
/// over), it rolls everything back and answers [`CommitError::Stale`]. Dropping a `PgTx`
/// rolls back; [`rollback`](PgTx::rollback) does so and gives the claim back.
///
/// [`publish`](PgTx::publish) adds outbox messages to the same commit.
pub struct PgTx {
    tx: Transaction<'static, Postgres>,
    claim: PgClaim,
    /// Messages published so far, inserted by `commit` just before the completion.
    published: Published,
}

impl fmt::Debug for PgTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTx")
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

impl Deref for PgTx {
    type Target = Transaction<'static, Postgres>;
    fn deref(&self) -> &Self::Target {
        &self.tx
    }
}

impl DerefMut for PgTx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.tx
    }
}

impl PgTx {
    pub(crate) fn new(tx: Transaction<'static, Postgres>, claim: PgClaim) -> Self {
        PgTx {
            tx,
            claim,
            published: Published::default(),
        }
    }

    /// Records a message in `<prefix>outbox`, in this transaction: it commits with the
    /// business rows and the completed record, or not at all (a rollback, a failed or stale
    /// commit leaves no message). A relay ([`Relay`](crate::relay::Relay) over this
    /// [`PgStore`](crate::PgStore)) delivers it after the commit, at least once. Returns its
    /// stable id, the same on every delivery attempt and the same as the local store would
    /// give: the claim's `downstream_key()`, a dash, and the message's index in this commit.
    ///
    /// The checks are the local [`Tx::publish`](crate::Tx::publish)'s. Messages are kept in
    /// memory until [`commit`](PgTx::commit), which inserts them all in one statement (one
    /// round trip however many there are) just before the completion.
    ///
    /// # Errors
    /// [`MessageError`] if the subject or payload is refused, or more than
    /// [`MAX_MESSAGES_PER_COMMIT`](crate::limits::MAX_MESSAGES_PER_COMMIT) were published;
    /// the transaction goes on, without that message.
    pub fn publish(
        &mut self,
        subject: &str,
        payload: impl Into<Vec<u8>>,
    ) -> Result<String, MessageError> {
        let prefix = self.claim.holding.downstream_key();
        self.published.add(&prefix, subject, payload.into())
    }

    /// The connection to run business SQL on: `query.execute(tx.conn())`.
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }

    /// The claim this transaction completes.
    pub fn claim(&self) -> &PgClaim {
        &self.claim
    }

    /// Stores `response` as the completed record in this transaction and commits it with
    /// every business write and every message published in it.
    ///
    /// What is durable when it fails:
    /// - [`CommitError::InvalidResponse`]: nothing (rolled back); the claim comes back.
    /// - [`CommitError::Stale`]: nothing (rolled back): another attempt holds the key.
    /// - [`CommitError::Store`] with [`StoreError::Backend`]: nothing (rolled back, or the
    ///   database refused the commit); the key stays in progress until its lease ends.
    /// - [`CommitError::Store`] with [`StoreError::OutcomeUnknown`]: the `COMMIT` was sent and
    ///   its answer lost. Everything or nothing is durable; `begin` for the key tells which
    ///   (a `Replay` means it committed). A `COMMIT` that never arrived leaves the session
    ///   in its transaction, holding the record's lock, until the server ends it: within
    ///   about a lease (see [`PgBuilder`](crate::PgBuilder), "Time limits").
    pub async fn commit(mut self, response: Response) -> Result<Response, CommitError<PgClaim>> {
        let started = std::time::Instant::now();
        let store = self.claim.store.clone();
        let limit = store.call_limit();
        if let Err(source) = response.validate(store.inner.config.max_response_bytes) {
            let claim = self.rollback().await;
            return Err(CommitError::InvalidResponse {
                source,
                claim: Box::new(claim),
            });
        }
        let published = self.published.take();
        let completion = if published.is_empty() {
            self.claim.completion(&response)
        } else {
            self.claim.completion_publishing(&response, published)
        };
        let updated = tokio::time::timeout(limit, completion.fetch_optional(&mut *self.tx)).await;
        let done = match updated {
            Ok(Ok(Some(done))) => done,
            Ok(Ok(None)) => {
                let claim = self.rollback().await;
                return Err(CommitError::Stale(claim.stale().await?));
            }
            Ok(Err(e)) => {
                let _ = self.rollback().await;
                return Err(CommitError::Store(backend("complete", &e)));
            }
            Err(_) => {
                let _ = self.rollback().await;
                return Err(CommitError::Store(StoreError::Backend {
                    message: format!("complete: no answer from the database within {limit:?}")
                        .into(),
                }));
            }
        };
        match tokio::time::timeout(limit, self.tx.commit()).await {
            Ok(Ok(())) => {
                self.claim.completed(&done, started);
                Ok(response)
            }
            Ok(Err(e)) => Err(CommitError::Store(commit_failed(&e))),
            Err(_) => Err(CommitError::Store(unknown(
                "commit",
                &format!("no answer from the database within {limit:?}"),
            ))),
        }
    }

    /// Rolls back every business write and gives the claim back, still held: release it (no
    /// side effect happened) or complete a failure response. A rollback that fails has rolled
    /// back all the same: the server drops the transaction when the connection closes, or
    /// within about a lease when it went silent.
    pub async fn rollback(self) -> PgClaim {
        let limit = self.claim.store.call_limit();
        if let Ok(Err(e)) = tokio::time::timeout(limit, self.tx.rollback()).await {
            tracing::debug!(error = %e, "rollback failed; the server drops the transaction");
        }
        self.claim
    }
}
