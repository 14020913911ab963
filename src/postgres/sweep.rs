//! The sweeper: a task that evicts due records in bounded batches, as the local store's
//! sweeper thread does. It holds the store weakly, so dropping the store stops it.

use std::sync::Weak;
use std::time::Duration;

use super::store::{Inner, PgStore};
use crate::model::maintenance::Backlog;

/// Batches per tick at most, so one tick never runs unbounded.
const BATCHES_PER_TICK: usize = 100;

pub(crate) fn start(
    inner: Weak<Inner>,
    interval: Duration,
    batch: usize,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval.max(Duration::from_millis(1)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let Some(inner) = inner.upgrade() else { return };
            let store = PgStore { inner };
            for _ in 0..BATCHES_PER_TICK {
                match store.evict(batch.max(1)).await {
                    Ok(evicted) if evicted.backlog == Backlog::More => {}
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "a sweep failed; the next tick tries again");
                        break;
                    }
                }
            }
        }
    })
}
