//! Wake-ups for `begin_or_wait`: one `LISTEN` connection per store, on the channel that every
//! completion and release notifies (in its own transaction, so only once it commits), fanned
//! out to the waiting callers in this process. A caller also polls, at a bounded interval, so
//! a notification missed while the listening connection was down delays it, never strands it.
//! A connection that hears nothing for a while is asked a `SELECT 1`; one that does not
//! answer within a call's limit is replaced, so that a silent connection (its socket open,
//! nothing coming) does not take the notifications with it for good.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::broadcast;

use super::bounds::Bounds;

/// How long the listener waits before connecting again after a failure.
const RECONNECT: Duration = Duration::from_secs(1);

/// The notifications of one store, and who waits for them.
#[derive(Debug)]
pub(crate) struct Wakeups {
    sender: broadcast::Sender<Arc<str>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    waiting: AtomicUsize,
}

/// A caller waiting for wake-ups; counted in `Stats::waiting` while it lives.
pub(crate) struct Waiter<'a> {
    pub(crate) receiver: broadcast::Receiver<Arc<str>>,
    wakeups: &'a Wakeups,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        self.wakeups.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Wakeups {
    pub(crate) fn new() -> Self {
        Wakeups {
            sender: broadcast::channel(1024).0,
            task: Mutex::new(None),
            waiting: AtomicUsize::new(0),
        }
    }

    /// Starts listening (once per store) and subscribes: a notification sent after this call
    /// reaches the caller (once the listening connection is up).
    pub(crate) fn subscribe(&self, pool: &PgPool, channel: &str, bounds: Bounds) -> Waiter<'_> {
        let mut task = self.task.lock();
        if task.as_ref().is_none_or(|t| t.is_finished()) {
            *task = Some(tokio::spawn(listen(
                pool.clone(),
                channel.to_owned(),
                self.sender.clone(),
                bounds,
            )));
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Waiter {
            receiver: self.sender.subscribe(),
            wakeups: self,
        }
    }

    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

impl Drop for Wakeups {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().take() {
            task.abort();
        }
    }
}

/// Listens on `channel` and forwards every payload, reconnecting after a failure, or after
/// the connection went silent.
async fn listen(
    pool: PgPool,
    channel: String,
    sender: broadcast::Sender<Arc<str>>,
    bounds: Bounds,
) {
    loop {
        match PgListener::connect_with(&pool).await {
            Ok(mut listener) => match listener.listen(&channel).await {
                Ok(()) => {
                    let failed = forward(&mut listener, &sender, bounds).await;
                    tracing::warn!(error = %failed, "the LISTEN connection failed; waiters poll until it is back");
                }
                Err(e) => tracing::warn!(error = %e, "LISTEN failed; waiters poll instead"),
            },
            Err(e) => tracing::warn!(error = %e, "no LISTEN connection; waiters poll instead"),
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

/// Forwards notifications until the connection fails or stays silent: after a quarter of
/// the silence bound without one, it must answer a `SELECT 1` within a call's limit.
async fn forward(
    listener: &mut PgListener,
    sender: &broadcast::Sender<Arc<str>>,
    bounds: Bounds,
) -> String {
    loop {
        match tokio::time::timeout(bounds.touch(), listener.recv()).await {
            Ok(Ok(notification)) => {
                let _ = sender.send(notification.payload().into());
            }
            Ok(Err(e)) => return e.to_string(),
            Err(_) => {
                let asked = sqlx::raw_sql("SELECT 1").execute(&mut *listener);
                match tokio::time::timeout(bounds.call, asked).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return e.to_string(),
                    Err(_) => return format!("no answer within {:?}", bounds.call),
                }
            }
        }
    }
}
