//! The outbox's dead letters, and the inbox: `Store::consume`.

use crate::api::store::Store;
use crate::engine::Tx;
use crate::engine::request;
use crate::error::{BoxError, ExecuteError, StoreError};
use crate::model::execution::Execution;
use crate::model::fingerprint::Fingerprint;
use crate::model::message::{DeadLetter, Message};
use crate::model::response::Response;
use crate::model::scope::Scope;

/// The operation part of every inbox scope: `(consumer, INBOX_OPERATION, message id)`.
pub const INBOX_OPERATION: &str = "idemstore.inbox";

impl Scope {
    /// The scope under which `consumer` applies the message `message_id` (see
    /// [`Store::consume`]): the consumer's name as the tenant, [`INBOX_OPERATION`], and the id.
    ///
    /// # Errors
    /// [`ScopeError`](crate::ScopeError) if the name or the id is empty, too long (128 and
    /// 255 bytes) or has control characters.
    pub fn inbox(consumer: &str, message_id: &str) -> Result<Scope, crate::ScopeError> {
        Scope::new(consumer, INBOX_OPERATION, message_id)
    }
}

impl Store {
    /// Applies a received message's effect **once**, however often the broker delivers it: the
    /// inbox side of exactly once across a queue. `work` runs, with its writes and the stored
    /// outcome committed together, only the first time `consumer` sees `message_id`; a
    /// redelivery gets [`Execution::Replay`] without running it. It is
    /// [`Store::execute`] on [`Scope::inbox`]`(consumer, message_id)`, so a message whose
    /// outcome has passed its TTL runs again: keep the TTL longer than the broker redelivers
    /// (JetStream: the consumer's `max_deliver` × `ack_wait`).
    ///
    /// The pattern is **commit, then ack**: ack the message after this returns `Executed` or
    /// `Replay`. A crash between the two is a redelivery, which the inbox absorbs. On
    /// `InProgress` (another delivery of the same message is being applied right now) do not
    /// ack: the broker delivers it again. `fingerprint` is of the message's payload: a
    /// different payload under the same id is `Mismatch`, a broker or producer bug to alert on.
    ///
    /// In a restored store's restore window (see
    /// [`Builder::restore_window`](crate::Builder::restore_window)) a redelivery of a message
    /// the old store applied, but the copy lacks, runs `work` again: its effect was local and
    /// went with the old store, and the messages `work` publishes get the ids the old store
    /// gave them, so a broker that deduplicates by id keeps one of each.
    ///
    /// # Errors
    /// As [`Store::execute`], and [`ExecuteError::BadScope`] for a consumer name or message
    /// id that cannot be a scope part.
    pub fn consume<F>(
        &self,
        consumer: &str,
        message_id: &str,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Execution, ExecuteError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static,
    {
        self.execute(&Scope::inbox(consumer, message_id)?, fingerprint, work)
    }

    /// [`Store::consume`] for async callers.
    ///
    /// # Errors
    /// As [`Store::consume`].
    #[cfg(feature = "tokio")]
    pub async fn consume_async<F>(
        &self,
        consumer: &str,
        message_id: &str,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Execution, ExecuteError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static,
    {
        let scope = Scope::inbox(consumer, message_id)?;
        self.execute_async(&scope, fingerprint, work).await
    }

    /// Messages the relay gave up on, oldest first, at most `limit`.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails.
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        self.engine().dead_letters(limit)
    }

    /// Puts the dead letter `seq` back in the outbox, at the end of the commit order (it gets a
    /// new seq, and keeps its id, so a broker that saw it before still deduplicates it).
    /// Returns the message as requeued; `None` if there is no such dead letter.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails.
    pub fn retry_dead_letter(&self, seq: u64) -> Result<Option<Message>, StoreError> {
        self.engine().run(request::retry_dead(seq))?
    }

    /// Deletes the dead letter `seq` for good; whether there was one.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails.
    pub fn drop_dead_letter(&self, seq: u64) -> Result<bool, StoreError> {
        self.engine().run(request::drop_dead(seq))?
    }
}
