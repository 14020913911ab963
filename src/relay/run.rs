//! The relay's task: passes over the outbox, deliveries, retries, settlements.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::config::RelayConfig;
use super::counters::{Counters, RelayStats};
use super::sink::{Sink, Unavailable};
use crate::error::StoreError;
use crate::model::backoff::Backoff;
use crate::model::message::{DeadLetter, Message};
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

/// A message's failed attempts so far (kept in memory: a restart starts the count again).
#[derive(Debug)]
struct Failing {
    attempts: u32,
    retry_at: Instant,
    /// Its subject, which waits with it.
    subject: String,
}

/// The sink's outage: how many attempts in a row found it [`Unavailable`], and when to try
/// again. Nothing is delivered before then, on any subject.
#[derive(Debug, Default)]
struct Outage {
    attempts: u32,
    retry_at: Option<Instant>,
}

/// Why an attempt failed.
enum Failure {
    /// This message's attempt failed (an error, a panic): counted.
    Message(String),
    /// The sink said it is down, or did not answer within the attempt timeout: not counted
    /// against the message.
    Unavailable(String),
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

/// The longest a pass delivers before it settles and reads again. Over PostgreSQL that is
/// also as long as a relay goes without touching its lock's connection, so it bounds how long
/// a relay that lost the lock (its session was ended on the server) keeps delivering.
const PASS_BUDGET: Duration = Duration::from_secs(1);

/// How often a relay whose pending messages all wait out a backoff reads the outbox again
/// for new ones.
const BLOCKED_POLL: Duration = Duration::from_millis(100);

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PassEnd {
    /// It went through the batch (or stopped for the sink's outage).
    Done,
    /// It ran out of [`PASS_BUDGET`] with messages left.
    OutOfTime,
}

/// What one pass over a batch did.
struct Pass {
    end: PassEnd,
    /// Seqs the sink accepted.
    delivered: Vec<u64>,
    /// Messages given up on.
    dead: Vec<DeadLetter>,
    /// The earliest retry due among messages that failed.
    next_retry: Option<Instant>,
    /// Whether a message failed, so that its subject now waits.
    failed: bool,
}

/// Delivers the batch in commit order, skipping subjects that have a message waiting for a
/// retry, so that no message overtakes an earlier one of its subject. While the sink is
/// unavailable, delivers nothing.
async fn deliver_pass<S: Sink>(
    pending: &[Message],
    settled: &HashSet<u64>,
    (failing, outage): (&mut HashMap<u64, Failing>, &mut Outage),
    sink: &Arc<S>,
    config: &RelayConfig,
    counters: &Counters,
) -> Pass {
    let mut pass = Pass {
        end: PassEnd::Done,
        delivered: Vec::new(),
        dead: Vec::new(),
        next_retry: None,
        failed: false,
    };
    let mut blocked: HashSet<&str> = HashSet::new();
    let started = Instant::now();
    for message in pending {
        if started.elapsed() > PASS_BUDGET {
            pass.end = PassEnd::OutOfTime;
            break;
        }
        if settled.contains(&message.seq) || blocked.contains(message.subject.as_str()) {
            continue;
        }
        if let Some(f) = failing.get(&message.seq)
            && f.retry_at > Instant::now()
        {
            blocked.insert(&message.subject);
            pass.next_retry = Some(pass.next_retry.map_or(f.retry_at, |t| t.min(f.retry_at)));
            continue;
        }
        let failure = match attempt(sink, message, config.attempt_timeout).await {
            Ok(()) => {
                *outage = Outage::default();
                failing.remove(&message.seq);
                pass.delivered.push(message.seq);
                Counters::add(&counters.delivered, 1);
                continue;
            }
            Err(failure) => failure,
        };
        let error = match failure {
            Failure::Message(error) => {
                // The sink answered: it is up, whatever it thought of this message.
                *outage = Outage::default();
                error
            }
            Failure::Unavailable(error) => {
                // Not this message's fault, and nothing else would get through: stop the
                // pass, count no attempt, and wait for the sink.
                counters.error(format!("delivering {}: {error}", message.id));
                Counters::add(&counters.unavailable, 1);
                outage.attempts += 1;
                let at = Instant::now() + config.retries().spread_after(outage.attempts);
                outage.retry_at = Some(at);
                pass.next_retry = Some(pass.next_retry.map_or(at, |t| t.min(at)));
                if outage.attempts == 1 {
                    tracing::warn!(%error, "outbox relay: the sink is unavailable; delivery paused");
                }
                return pass;
            }
        };
        counters.error(format!(
            "delivering {} to {}: {error}",
            message.id, message.subject
        ));
        let f = failing.entry(message.seq).or_insert_with(|| Failing {
            attempts: 0,
            retry_at: Instant::now(),
            subject: message.subject.clone(),
        });
        f.attempts += 1;
        if f.attempts >= config.max_attempts {
            tracing::warn!(id = %message.id, subject = %message.subject, attempts = f.attempts, %error, "outbox message moved to the dead letters");
            pass.dead.push(DeadLetter {
                message: message.clone(),
                attempts: f.attempts,
                last_error: error,
                dead_at: store_now(),
            });
            Counters::add(&counters.dead_lettered, 1);
            continue;
        }
        Counters::add(&counters.retried, 1);
        f.retry_at = Instant::now() + config.retries().spread_after(f.attempts);
        pass.next_retry = Some(pass.next_retry.map_or(f.retry_at, |t| t.min(f.retry_at)));
        pass.failed = true;
        blocked.insert(&message.subject);
    }
    pass
}

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

/// One delivery, on a task of its own so that a panicking sink fails the attempt, not the
/// relay; bounded by `timeout`.
async fn attempt<S: Sink>(
    sink: &Arc<S>,
    message: &Message,
    timeout: Duration,
) -> Result<(), Failure> {
    let (sink, owned) = (sink.clone(), message.clone());
    let task = tokio::spawn(async move {
        sink.deliver(&owned).await.map_err(|e| {
            if e.downcast_ref::<Unavailable>().is_some() {
                Failure::Unavailable(e.to_string())
            } else {
                Failure::Message(e.to_string())
            }
        })
    });
    let abort = task.abort_handle();
    match tokio::time::timeout(timeout, task).await {
        Ok(Ok(result)) => result,
        Ok(Err(join)) => Err(Failure::Message(format!("the sink panicked: {join}"))),
        // No answer says nothing against the message: a destination that hangs is down.
        Err(_) => {
            abort.abort();
            Err(Failure::Unavailable(format!(
                "no answer within {timeout:?}"
            )))
        }
    }
}

fn store_failed(counters: &Counters, error: &StoreError, doing: &str) {
    tracing::warn!(%error, "outbox relay: {doing} failed; trying again");
    counters.error(format!("{doing}: {error}"));
}

/// The time a dead letter is stamped with (wall clock: it is for operators).
fn store_now() -> crate::model::clock::Timestamp {
    use crate::model::clock::Clock as _;
    crate::model::clock::SystemClock.now()
}

/// Sleeps for `wait`, or less if the relay is stopped meanwhile.
async fn pause(stopped: &mut watch::Receiver<bool>, wait: Duration) {
    let _ = tokio::time::timeout(wait, stopped.wait_for(|stop| *stop)).await;
}
