//! Where the relay reads messages from and settles them: the local store's outbox, or
//! (feature `postgres`) a PostgreSQL one shared by several instances.

use std::future::Future;

use crate::api::store::Store;
use crate::engine::{Settlement, request};
use crate::error::StoreError;
use crate::model::message::{DeadLetter, Message};

use self::sealed::Turn;

/// A backend whose outbox a [`Relay`](super::Relay) delivers: the local
/// [`Store`](crate::Store), or (feature `postgres`) a [`PgStore`](crate::PgStore).
///
/// Sealed: how a backend hands out batches and takes settlements back is the relay's own
/// business, and may change without a new major version.
pub trait OutboxSource: sealed::Source {}

impl OutboxSource for Store {}

#[cfg(feature = "postgres")]
impl OutboxSource for crate::postgres::PgStore {}

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

impl sealed::Source for Store {
    type Handle = ();

    async fn take_turn(&self, handle: &mut Option<()>) -> Result<Turn, StoreError> {
        *handle = Some(());
        Ok(Turn::Ours)
    }

    async fn pending(
        &self,
        (): &mut (),
        limit: usize,
        skip: &[String],
    ) -> Result<Vec<Message>, StoreError> {
        let (store, skip) = (self.clone(), skip.to_vec());
        tokio::task::spawn_blocking(move || store.engine().pending_messages(None, limit, &skip))
            .await
            .unwrap_or_else(|join| {
                Err(StoreError::Internal {
                    message: format!("reading the outbox failed to run: {join}"),
                })
            })
    }

    async fn settle(
        &self,
        (): &mut (),
        delivered: Vec<u64>,
        dead: Vec<DeadLetter>,
    ) -> Result<(), StoreError> {
        let settlement = Settlement { delivered, dead };
        self.engine()
            .run_async(request::settle(settlement))
            .await
            .and_then(|settled| settled)
    }

    async fn end_turn(&self, (): ()) {}
}

#[cfg(feature = "postgres")]
impl sealed::Source for crate::postgres::PgStore {
    type Handle = crate::postgres::Delivery;

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
