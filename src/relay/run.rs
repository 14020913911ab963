//! The relay's task: it takes the turn, reads the outbox, has a pass (`pass.rs`) deliver the
//! batch, and settles what was delivered or given up on.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::config::RelayConfig;
use super::counters::{Counters, RelayStats};
use super::pass::{Failing, Outage, PassEnd, deliver_pass};
use super::sink::Sink;
use crate::error::StoreError;
use crate::model::backoff::Backoff;
use crate::protocol::outbox::Outbox;
use crate::protocol::outbox::sealed::Turn;

/// A running relay. Dropping it stops the task after its current delivery; [`Relay::stop`]
/// waits for that.
#[derive(Debug)]
pub struct Relay {
    counters: Arc<Counters>,
    stop: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Relay {
    /// Starts the relay on the current tokio runtime: it delivers `store`'s outbox (a local
    /// [`Store`](crate::Store) or a [`PgStore`](crate::PgStore)) to `sink` until stopped.
    ///
    /// Over PostgreSQL, every instance may start a relay; one at a time delivers (see the
    /// [module docs](crate::relay)).
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start<B: Outbox, S: Sink>(store: &B, sink: S, config: RelayConfig) -> Relay {
        let counters = Arc::new(Counters::default());
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(
            store.clone(),
            Arc::new(sink),
            config,
            counters.clone(),
            stopped,
        ));
        Relay {
            counters,
            stop,
            task: Some(task),
        }
    }

    /// What the relay has done since it started.
    pub fn stats(&self) -> RelayStats {
        self.counters.snapshot()
    }

    /// Stops the relay and waits for its task to end (after the delivery in progress, and the
    /// settlement of what was delivered).
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn run<B: Outbox, S: Sink>(
    store: B,
    sink: Arc<S>,
    config: RelayConfig,
    counters: Arc<Counters>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut relay = Delivery::new(&store, &sink, &config, &counters);
    while !*stopped.borrow() {
        if let Next::Pause(wait) = relay.step().await {
            pause(&mut stopped, wait).await;
        }
    }
    if let Some(held) = relay.handle.take() {
        store.end_turn(held).await;
    }
}

/// What the relay does after a step: go on at once, or wait first (unless stopped).
enum Next {
    Again,
    Pause(Duration),
}

/// One relay's delivery state, carried from pass to pass while it holds the turn.
struct Delivery<'a, B: Outbox, S: Sink> {
    store: &'a B,
    sink: &'a Arc<S>,
    config: &'a RelayConfig,
    counters: &'a Counters,
    failing: HashMap<u64, Failing>,
    /// Seqs settled but possibly still in the published snapshot (until the writer's epoch
    /// is published): never delivered twice because of that lag.
    settled: HashSet<u64>,
    outage: Outage,
    store_retry: Backoff,
    /// What the backend needs to hold or wait for the turn (over PostgreSQL, a connection).
    handle: Option<B::Handle>,
}

impl<'a, B: Outbox, S: Sink> Delivery<'a, B, S> {
    fn new(
        store: &'a B,
        sink: &'a Arc<S>,
        config: &'a RelayConfig,
        counters: &'a Counters,
    ) -> Self {
        Delivery {
            store,
            sink,
            config,
            counters,
            failing: HashMap::new(),
            settled: HashSet::new(),
            outage: Outage::default(),
            store_retry: Backoff::new(config.first_backoff, config.max_backoff),
            handle: None,
        }
    }

    /// Takes the turn, waits out an outage, or makes one pass.
    async fn step(&mut self) -> Next {
        match self.store.take_turn(&mut self.handle).await {
            Ok(Turn::Ours) => {}
            Ok(Turn::Theirs) => {
                // Another relay delivers: what this one knew of attempts is stale.
                self.failing.clear();
                self.settled.clear();
                self.outage = Outage::default();
                self.store_retry.reset();
                return Next::Pause(self.config.standby_poll.max(Duration::from_millis(1)));
            }
            Err(e) => return self.store_failed(&e, "taking the turn to deliver"),
        }
        if self.handle.is_none() {
            return Next::Again;
        }
        // The sink is down: nothing to read until it is worth trying again. Waited out in
        // short steps, each taking the turn again: over PostgreSQL that keeps the lock's
        // session from looking silent to the server through a long outage.
        if let Some(at) = self.outage.retry_at {
            let left = at.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                return Next::Pause(left.min(self.config.idle_poll.max(BLOCKED_POLL)));
            }
        }
        self.pass().await
    }

    /// Reads a batch, delivers it and settles what it could.
    async fn pass(&mut self) -> Next {
        let (store, config) = (self.store, self.config);
        let Some(held) = self.handle.as_mut() else {
            return Next::Again;
        };
        Counters::add(&self.counters.passes, 1);
        // The store's backoff is reset only once a whole pass went through (read, and
        // settled if anything was delivered): a read that works between settlements that
        // fail would otherwise undo the doubling.
        let waiting = waiting_subjects(&self.failing);
        let pending = match store.pending(held, config.batch, &waiting).await {
            Ok(pending) => pending,
            // The turn may be gone with its connection: take it again before going on.
            Err(e) => return self.store_failed(&e, "reading the outbox"),
        };
        let in_snapshot: HashSet<u64> = pending.iter().map(|m| m.seq).collect();
        self.settled.retain(|seq| in_snapshot.contains(seq));
        let full = pending.len() >= config.batch;
        let pass = deliver_pass(
            &pending,
            &self.settled,
            (&mut self.failing, &mut self.outage),
            self.sink,
            config,
            self.counters,
        )
        .await;
        let (wake, pass_end, failed) = (pass.next_retry, pass.end, pass.failed);
        let progressed = !pass.delivered.is_empty() || !pass.dead.is_empty();
        if progressed {
            let seqs: Vec<u64> = pass
                .delivered
                .iter()
                .copied()
                .chain(pass.dead.iter().map(|d| d.message.seq))
                .collect();
            let Some(held) = self.handle.as_mut() else {
                return Next::Again;
            };
            if let Err(e) = store.settle(held, pass.delivered, pass.dead).await {
                // Delivered but still in the outbox: delivered again later, same ids.
                return self.store_failed(&e, "settling delivered messages");
            }
            // A dead letter's count goes only now: had the settlement failed, it would have
            // been buried again after one more attempt, not after max_attempts more.
            for seq in &seqs {
                self.failing.remove(seq);
            }
            self.settled.extend(seqs);
        }
        self.store_retry.reset();
        // A full batch may hide more: read again at once after progress, or when a subject
        // failed in this pass (the next read leaves it out, and reaches past it).
        if (full && (progressed || failed)) || (pass_end == PassEnd::OutOfTime && progressed) {
            return Next::Again;
        }
        Next::Pause(next_look(config, wake, progressed))
    }

    /// The store failed: drop the turn (it may be gone with its connection) and back off.
    fn store_failed(&mut self, e: &StoreError, doing: &str) -> Next {
        store_failed(self.counters, e, doing);
        self.handle = None;
        Next::Pause(self.store_retry.failed())
    }
}

/// How long to wait before reading again after a pass that settled what it could. Messages
/// waiting out a backoff: look again when the first (`wake`) is due, or sooner for new
/// messages of other subjects, but not every idle_poll when nothing moved (each look reads the
/// batch again, payloads and all).
fn next_look(config: &RelayConfig, wake: Option<Instant>, progressed: bool) -> Duration {
    let now = Instant::now();
    let cap = if progressed {
        config.idle_poll
    } else {
        config.idle_poll.max(BLOCKED_POLL)
    };
    let sleep = wake.map_or(config.idle_poll, |at| {
        at.saturating_duration_since(now)
            .min(cap.max(Duration::from_millis(1)))
    });
    sleep.max(Duration::from_millis(1))
}

/// How often a relay whose pending messages all wait out a backoff reads the outbox again
/// for new ones.
const BLOCKED_POLL: Duration = Duration::from_millis(100);

/// The subjects whose failed message waits out its backoff, sorted: the next read leaves
/// them out, so that a subject that keeps failing cannot fill the batch and hide every other
/// subject's messages behind its own until they are dead-lettered.
fn waiting_subjects(failing: &HashMap<u64, Failing>) -> Vec<String> {
    let now = Instant::now();
    let mut subjects: Vec<String> = failing
        .values()
        .filter(|f| f.retry_at > now)
        .map(|f| f.subject.clone())
        .collect();
    subjects.sort_unstable();
    subjects.dedup();
    subjects
}

fn store_failed(counters: &Counters, error: &StoreError, doing: &str) {
    tracing::warn!(%error, "outbox relay: {doing} failed; trying again");
    counters.error(format!("{doing}: {error}"));
}

/// Sleeps for `wait`, or less if the relay is stopped meanwhile.
async fn pause(stopped: &mut watch::Receiver<bool>, wait: Duration) {
    let _ = tokio::time::timeout(wait, stopped.wait_for(|stop| *stop)).await;
}
