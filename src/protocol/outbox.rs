//! The outbox contract: what a backend gives the relay (batches of pending messages, a turn
//! to deliver, settlements) and an operator (the dead letters). Each backend implements it
//! beside its own outbox; the relay and the outbox conformance suite know only this.

use std::future::Future;

use crate::error::StoreError;
use crate::model::message::{DeadLetter, Message};

/// A backend whose outbox a [`Relay`](crate::relay::Relay) delivers: the local
/// [`Store`](crate::Store), or (feature `postgres`) a [`PgStore`](crate::PgStore).
///
/// Sealed: how a backend hands out batches and takes settlements back is the relay's own
/// business, and may change without a new major version.
///
/// Besides the relay's side, the contract holds what an operator does with the messages the
/// relay gave up on; the outbox conformance suite drives both. (The local [`Store`] has
/// blocking versions of these as inherent methods; here they are async on every backend.)
///
/// [`Store`]: crate::Store
pub trait Outbox: sealed::Source {
    /// Messages the relay gave up on, oldest first, at most `limit`.
    fn dead_letters(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<DeadLetter>, StoreError>> + Send;

    /// Puts the dead letter `seq` back at the end of the outbox (a new seq, the same id);
    /// the message as requeued, or `None` if there is no such dead letter.
    fn retry_dead_letter(
        &self,
        seq: u64,
    ) -> impl Future<Output = Result<Option<Message>, StoreError>> + Send;

    /// Deletes the dead letter `seq` for good; whether there was one.
    fn drop_dead_letter(&self, seq: u64) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

pub(crate) mod sealed {
    use super::{DeadLetter, Future, Message, StoreError};

    /// Whether this relay may deliver now.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Turn {
        /// It holds the right to deliver.
        Ours,
        /// Another relay does: wait and ask again.
        Theirs,
    }

    /// The relay's side of a backend. A relay delivers only while it holds the turn: a
    /// backend that several relays may read at once (PostgreSQL) gives it to one of them at
    /// a time; the local store, which one process owns, gives it always.
    pub trait Source: Clone + Send + Sync + 'static {
        /// What the relay keeps between passes to hold or wait for its turn (over
        /// PostgreSQL, a connection of its own).
        type Handle: Send + 'static;

        /// Whether the turn is this relay's, opening `handle` if it is `None`. Cheap when
        /// the turn is already held: the next read on the handle tells if it was lost.
        fn take_turn(
            &self,
            handle: &mut Option<Self::Handle>,
        ) -> impl Future<Output = Result<Turn, StoreError>> + Send;

        /// Up to `limit` pending messages, in seq order, none of a subject in `skip` (sorted:
        /// the subjects waiting out a backoff; leaving them out of the read keeps them from
        /// filling the batch and starving the others). An error means the turn may be lost:
        /// the relay drops its handle and takes the turn again.
        fn pending(
            &self,
            handle: &mut Self::Handle,
            limit: usize,
            skip: &[String],
        ) -> impl Future<Output = Result<Vec<Message>, StoreError>> + Send;

        /// Removes `delivered` from the outbox and moves `dead` to the dead letters, all
        /// or nothing. A seq no longer pending is skipped.
        fn settle(
            &self,
            handle: &mut Self::Handle,
            delivered: Vec<u64>,
            dead: Vec<DeadLetter>,
        ) -> impl Future<Output = Result<(), StoreError>> + Send;

        /// Gives the turn back as the relay stops.
        fn end_turn(&self, handle: Self::Handle) -> impl Future<Output = ()> + Send;
    }
}
