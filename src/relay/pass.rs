//! One pass over a batch of the outbox: deliveries in commit order, each failed attempt
//! counted against its message or, when the sink is down, against nothing.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::config::RelayConfig;
use super::counters::Counters;
use super::sink::{Sink, Unavailable};
use crate::model::message::{DeadLetter, Message};

/// The longest a pass delivers before it settles and reads again. Over PostgreSQL that is
/// also as long as a relay goes without touching its lock's connection, so it bounds how long
/// a relay that lost the lock (its session was ended on the server) keeps delivering.
const PASS_BUDGET: Duration = Duration::from_secs(1);

/// A message's failed attempts so far (kept in memory: a restart starts the count again).
#[derive(Debug)]
pub(super) struct Failing {
    attempts: u32,
    pub(super) retry_at: Instant,
    /// Its subject, which waits with it.
    pub(super) subject: String,
}

/// The sink's outage: how many attempts in a row found it [`Unavailable`], and when to try
/// again. Nothing is delivered before then, on any subject.
#[derive(Debug, Default)]
pub(super) struct Outage {
    attempts: u32,
    pub(super) retry_at: Option<Instant>,
}

/// Why an attempt failed.
enum Failure {
    /// This message's attempt failed (an error, a panic): counted.
    Message(String),
    /// The sink said it is down, or did not answer within the attempt timeout: not counted
    /// against the message.
    Unavailable(String),
}

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PassEnd {
    /// It went through the batch (or stopped for the sink's outage).
    Done,
    /// It ran out of [`PASS_BUDGET`] with messages left.
    OutOfTime,
}

/// What one pass over a batch did.
pub(super) struct Pass {
    pub(super) end: PassEnd,
    /// Seqs the sink accepted.
    pub(super) delivered: Vec<u64>,
    /// Messages given up on.
    pub(super) dead: Vec<DeadLetter>,
    /// The earliest retry due among messages that failed.
    pub(super) next_retry: Option<Instant>,
    /// Whether a message failed, so that its subject now waits.
    pub(super) failed: bool,
}

impl Pass {
    /// Notes a retry due `at`, keeping the earliest.
    fn retry_by(&mut self, at: Instant) {
        self.next_retry = Some(self.next_retry.map_or(at, |t| t.min(at)));
    }
}

/// Delivers the batch in commit order, skipping subjects that have a message waiting for a
/// retry, so that no message overtakes an earlier one of its subject. While the sink is
/// unavailable, delivers nothing.
pub(super) async fn deliver_pass<S: Sink>(
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
            pass.retry_by(f.retry_at);
            continue;
        }
        match attempt(sink, message, config.attempt_timeout).await {
            Ok(()) => {
                *outage = Outage::default();
                failing.remove(&message.seq);
                pass.delivered.push(message.seq);
                Counters::add(&counters.delivered, 1);
            }
            Err(Failure::Unavailable(error)) => {
                // Not this message's fault, and nothing else would get through: stop the
                // pass, count no attempt, and wait for the sink.
                pass.retry_by(sink_down(outage, message, &error, config, counters));
                return pass;
            }
            Err(Failure::Message(error)) => {
                // The sink answered: it is up, whatever it thought of this message.
                *outage = Outage::default();
                match count_failure(failing, message, error, config, counters) {
                    Verdict::Dead(letter) => pass.dead.push(letter),
                    Verdict::Retry(at) => {
                        pass.retry_by(at);
                        pass.failed = true;
                        blocked.insert(&message.subject);
                    }
                }
            }
        }
    }
    pass
}

/// The sink is down (it said so, or did not answer): one more attempt of the outage, and the
/// time to try the sink again.
fn sink_down(
    outage: &mut Outage,
    message: &Message,
    error: &str,
    config: &RelayConfig,
    counters: &Counters,
) -> Instant {
    counters.error(format!("delivering {}: {error}", message.id));
    Counters::add(&counters.unavailable, 1);
    outage.attempts += 1;
    let at = Instant::now() + config.retries().spread_after(outage.attempts);
    outage.retry_at = Some(at);
    if outage.attempts == 1 {
        tracing::warn!(%error, "outbox relay: the sink is unavailable; delivery paused");
    }
    at
}

/// What becomes of a message whose attempt failed.
enum Verdict {
    /// It has had `max_attempts`: given up on.
    Dead(DeadLetter),
    /// It is tried again at this time; its subject waits until then.
    Retry(Instant),
}

/// Counts a failed attempt against `message`, and decides whether it is tried again.
fn count_failure(
    failing: &mut HashMap<u64, Failing>,
    message: &Message,
    error: String,
    config: &RelayConfig,
    counters: &Counters,
) -> Verdict {
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
        let letter = DeadLetter {
            message: message.clone(),
            attempts: f.attempts,
            last_error: error,
            dead_at: store_now(),
        };
        Counters::add(&counters.dead_lettered, 1);
        return Verdict::Dead(letter);
    }
    Counters::add(&counters.retried, 1);
    f.retry_at = Instant::now() + config.retries().spread_after(f.attempts);
    Verdict::Retry(f.retry_at)
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

/// The time a dead letter is stamped with (wall clock: it is for operators).
fn store_now() -> crate::model::clock::Timestamp {
    use crate::model::clock::Clock as _;
    crate::model::clock::SystemClock.now()
}
