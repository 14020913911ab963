//! The local store's side of the outbox contract ([`Outbox`]): what the relay reads and
//! settles, and the dead letters, on tokio (the blocking reads on its blocking pool).

use crate::api::backend::blocking;
use crate::api::store::Store;
use crate::engine::request;
use crate::error::StoreError;
use crate::model::message::{DeadLetter, Message};
use crate::protocol::outbox::{Outbox, sealed, sealed::Turn};

impl Outbox for Store {
    async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, StoreError> {
        let store = self.clone();
        blocking(move || store.engine().dead_letters(limit)).await
    }

    async fn retry_dead_letter(&self, seq: u64) -> Result<Option<Message>, StoreError> {
        self.engine()
            .run_async(request::retry_dead(seq))
            .await
            .and_then(|requeued| requeued)
    }

    async fn drop_dead_letter(&self, seq: u64) -> Result<bool, StoreError> {
        self.engine()
            .run_async(request::drop_dead(seq))
            .await
            .and_then(|dropped| dropped)
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
        blocking(move || store.engine().pending_messages(None, limit, &skip)).await
    }

    async fn settle(
        &self,
        (): &mut (),
        delivered: Vec<u64>,
        dead: Vec<DeadLetter>,
    ) -> Result<(), StoreError> {
        let settlement = crate::engine::Settlement { delivered, dead };
        self.engine()
            .run_async(request::settle(settlement))
            .await
            .and_then(|settled| settled)
    }

    async fn end_turn(&self, (): ()) {}
}
