//! The shipper: a thread that sends durable frames to the replica, in order.
//!
//! The log thread hands over every frame once its local sync succeeded ([`Shipper::frame`]).
//! Asynchronously, that only queues it. Synchronously, the log thread then waits for the
//! replica's acknowledgement before it settles the frame's groups, so nothing is answered,
//! or seen by a reader, that the replica lacks; every group of the frame shares that wait.
//!
//! The queue is bounded. When the replica is away longer than the queue lasts, the queue is
//! dropped and the shipper *catches up* instead: a snapshot of the database (which holds every
//! frame up to the one it records) goes to the replica, and shipping goes on after it. The
//! same happens whenever the stream does not end where the next frame begins: at open after a
//! crash (frames synced locally that never reached the replica), or after a restore in place.
//! Snapshots are also taken on their own, to keep the tail a restore replays short: once the
//! log shipped since the last snapshot outgrows that snapshot (or `snapshot_bytes`).
//! Snapshots are made and sent on a thread of their own, so frames keep flowing meanwhile,
//! except while catching up, when frames past the gap wait for the snapshot.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{Replica, ShippedFrame};
use crate::error::ReplicaError;
use crate::metrics;
use crate::model::backoff::Doubling;
use crate::model::clock::Clock;
use crate::model::replica::{ShipState, Shipping, ShippingStats, Unreachable, WriterIdentity};
use crate::model::restore::{Lineage, RestoreWindow};

mod claim;
mod close;
mod kept;
mod snapshots;

/// How many recent frames the lag quantiles are taken over.
const LAG_WINDOW: usize = 4096;
/// The most payload bytes one publish carries.
const BATCH_BYTES: u64 = 4 << 20;

/// Makes a snapshot in the (new, empty) directory it is given: a store database holding every
/// frame up to the returned sequence number. Returns the file and that number. It holds the
/// database, never the store's engine: the last snapshot a closing store owes its replica is
/// made while the engine closes.
pub(crate) type MakeSnapshot = Box<dyn Fn(&Path) -> Result<(PathBuf, u64), String> + Send + Sync>;

/// The shipper's settings.
#[derive(Clone)]
pub(crate) struct ShipSettings {
    pub(crate) mode: Shipping,
    pub(crate) me: WriterIdentity,
    /// Unshipped frame bytes held at most; past it the queue is replaced by a snapshot.
    pub(crate) queue_bytes: u64,
    /// How long a synchronous frame waits for the replica before the policy applies.
    pub(crate) ack_timeout: Duration,
    /// How long a synchronous open waits for the replica to catch up.
    pub(crate) open_timeout: Duration,
    /// Log shipped after which a snapshot is due (or the last snapshot's size, if larger).
    pub(crate) snapshot_bytes: u64,
    /// Where snapshots are made (removed after each).
    pub(crate) snapshot_dir: PathBuf,
    /// The wait after a failed call, doubling up to the second.
    pub(crate) backoff: Doubling,
    /// The store's writer epoch (its metadata's): stamped on every frame and snapshot.
    pub(crate) epoch: u64,
    /// The store's restore window, if it was restored: while it is open, what it ships may
    /// lag whatever its mode (`model::restore::Lineage::shipping`).
    pub(crate) window: Option<RestoreWindow>,
    /// The store's clock: the time stamped on what it ships.
    pub(crate) clock: Arc<dyn Clock>,
}

/// Why a synchronous frame was not acknowledged.
#[derive(Debug, Clone)]
pub(crate) struct NotShipped(pub(crate) ReplicaError);

struct Queued {
    frame: ShippedFrame,
    synced: Instant,
}

struct State {
    state: ShipState,
    last_error: Option<ReplicaError>,
    /// Frames synced locally, not yet acknowledged, in order.
    queue: VecDeque<Queued>,
    queued_bytes: u64,
    /// Frames acknowledged since the last snapshot, in order (`kept.rs`).
    kept: VecDeque<Queued>,
    kept_bytes: u64,
    /// The last frame synced locally.
    durable: u64,
    /// The last frame the stream holds (acknowledged, or covered by a snapshot).
    shipped: u64,
    /// The stream does not go on where the queue begins: a snapshot must come first.
    needs_snapshot: bool,
    /// A snapshot is being made or sent.
    snapshotting: bool,
    since_snapshot: u64,
    last_snapshot_bytes: u64,
    last_snapshot: Option<u64>,
    lags: VecDeque<Duration>,
    frames_shipped: u64,
    snapshots: u64,
    overflows: u64,
    snapshot_failures: u64,
    snapshot_error: Option<String>,
    stopping: bool,
}

struct Inner {
    replica: Arc<dyn Replica>,
    settings: ShipSettings,
    state: Mutex<State>,
    changed: Condvar,
    make_snapshot: OnceLock<MakeSnapshot>,
}

/// Ships the log (see the module doc). Dropping it stops the threads after a last attempt to
/// ship what is queued, and gives the stream up.
pub(crate) struct Shipper {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Shipper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shipper").finish_non_exhaustive()
    }
}

impl Shipper {
    /// Starts shipping a log whose last durable frame is `durable`.
    pub(crate) fn start(
        replica: Arc<dyn Replica>,
        settings: ShipSettings,
        durable: u64,
    ) -> std::io::Result<Shipper> {
        let inner = Arc::new(Inner {
            replica,
            settings,
            state: Mutex::new(State {
                state: ShipState::Claiming,
                last_error: None,
                queue: VecDeque::new(),
                queued_bytes: 0,
                kept: VecDeque::new(),
                kept_bytes: 0,
                durable,
                shipped: 0,
                needs_snapshot: false,
                snapshotting: false,
                since_snapshot: 0,
                last_snapshot_bytes: 0,
                last_snapshot: None,
                lags: VecDeque::new(),
                frames_shipped: 0,
                snapshots: 0,
                overflows: 0,
                snapshot_failures: 0,
                snapshot_error: None,
                stopping: false,
            }),
            changed: Condvar::new(),
            make_snapshot: OnceLock::new(),
        });
        let frames = inner.clone();
        let snapshots = inner.clone();
        let threads = vec![
            std::thread::Builder::new()
                .name("idemstore-ship".into())
                .spawn(move || frames.run_frames())?,
            std::thread::Builder::new()
                .name("idemstore-snapshot".into())
                .spawn(move || snapshots.run_snapshots())?,
        ];
        Ok(Shipper { inner, threads })
    }

    /// Gives the shipper its way to make snapshots (the engine's, once it exists).
    pub(crate) fn set_snapshot_maker(&self, make: MakeSnapshot) {
        let _ = self.inner.make_snapshot.set(make);
        self.inner.changed.notify_all();
    }

    /// The mode this store ships in.
    pub(crate) fn mode(&self) -> Shipping {
        self.inner.settings.mode
    }

    /// How long a synchronous open waits for the replica to catch up.
    pub(crate) fn open_timeout(&self) -> Duration {
        self.inner.settings.open_timeout
    }

    /// Hands over a frame whose local sync succeeded. Asynchronously: queues it. Synchronously:
    /// also waits for the replica's acknowledgement; `Err` when it did not come and the policy
    /// is [`Unreachable::Refuse`] (the frame stays queued and is shipped once the replica
    /// returns).
    pub(crate) fn frame(&self, frame: ShippedFrame) -> Result<(), NotShipped> {
        let seq = frame.seq;
        let mut state = self.inner.state.lock();
        // Only these wake anyone: the frame thread waits for a queue, the snapshot thread for
        // a snapshot to be needed; nobody waits for `durable` alone to grow.
        let (was_empty, needed) = (state.queue.is_empty(), state.needs_snapshot);
        self.inner.enqueue(&mut state, frame);
        if was_empty || state.needs_snapshot != needed {
            self.inner.changed.notify_all();
        }
        let Shipping::Sync(policy) = self.inner.settings.mode else {
            return Ok(());
        };
        let deadline = Instant::now() + self.inner.settings.ack_timeout;
        loop {
            if state.shipped >= seq {
                return Ok(());
            }
            let failed = match state.state {
                ShipState::Fenced | ShipState::Unreachable | ShipState::Claiming => {
                    Some(state.error())
                }
                ShipState::CatchingUp | ShipState::Shipping => None,
            };
            let timed_out = Instant::now() >= deadline;
            if let Some(error) = failed.or_else(|| timed_out.then(|| timeout_error(&state))) {
                return match policy {
                    // The state and the alert gauge say so; one line per frame would flood.
                    Unreachable::FallBack => {
                        tracing::debug!(seq, error = %error, "the replica did not acknowledge a frame; acknowledged locally only (Unreachable::FallBack)");
                        Ok(())
                    }
                    _ => Err(NotShipped(error)),
                };
            }
            self.inner.changed.wait_until(&mut state, deadline);
        }
    }

    /// Whether the replica answers: a synchronous store that refuses while the replica is away
    /// takes new writes only then (frames in flight are fine: each waits for its own
    /// acknowledgement).
    pub(crate) fn ready(&self) -> Result<(), ReplicaError> {
        let state = self.inner.state.lock();
        match state.state {
            ShipState::Shipping => Ok(()),
            _ => Err(state.error()),
        }
    }

    /// Why the store may not write, if the stream's writer fenced it off.
    pub(crate) fn fenced(&self) -> Option<ReplicaError> {
        let state = self.inner.state.lock();
        (state.state == ShipState::Fenced).then(|| state.error())
    }

    /// Whether the replica answers and holds every frame synced so far.
    pub(crate) fn caught_up(&self) -> Result<(), ReplicaError> {
        let state = self.inner.state.lock();
        match state.state {
            _ if state.caught_up() => Ok(()),
            ShipState::Shipping | ShipState::CatchingUp => Err(timeout_error(&state)),
            _ => Err(state.error()),
        }
    }

    /// Waits up to `timeout` until the replica holds every frame synced so far.
    pub(crate) fn wait_caught_up(&self, timeout: Duration) -> Result<(), ReplicaError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.inner.state.lock();
        loop {
            if state.caught_up() {
                return Ok(());
            }
            if state.state == ShipState::Fenced {
                return Err(state.error());
            }
            if Instant::now() >= deadline {
                return Err(match state.state {
                    ShipState::Shipping | ShipState::CatchingUp => timeout_error(&state),
                    _ => state.error(),
                });
            }
            self.inner.changed.wait_until(&mut state, deadline);
        }
    }

    /// What shipping is doing, for the stats.
    pub(crate) fn stats(&self) -> ShippingStats {
        let state = self.inner.state.lock();
        let (p50, p99) = quantiles(&state.lags);
        ShippingStats {
            mode: self.inner.settings.mode,
            state: state.state,
            last_error: state.last_error.as_ref().map(ToString::to_string),
            durable_frame: state.durable,
            shipped_frame: state.shipped,
            lag_frames: state.durable.saturating_sub(state.shipped),
            lag: state
                .queue
                .front()
                .map_or(Duration::ZERO, |q| q.synced.elapsed()),
            lag_p50: p50,
            lag_p99: p99,
            frames_shipped: state.frames_shipped,
            snapshots: state.snapshots,
            last_snapshot: state.last_snapshot,
            overflows: state.overflows,
            snapshot_failures: state.snapshot_failures,
            snapshot_error: state.snapshot_error.clone(),
        }
    }
}

impl State {
    /// Sets the gauges from the state.
    fn report(&self) {
        let behind = self
            .queue
            .front()
            .map_or(Duration::ZERO, |q| q.synced.elapsed());
        metrics::gauge(metrics::SHIP_BEHIND_SECONDS, behind.as_secs_f64());
        let lost = matches!(self.last_error, Some(ReplicaError::Lost { .. }));
        let alert = lost || !matches!(self.state, ShipState::Shipping | ShipState::Claiming);
        metrics::gauge(metrics::SHIP_ALERT, if alert { 1.0 } else { 0.0 });
    }

    fn error(&self) -> ReplicaError {
        self.last_error
            .clone()
            .unwrap_or_else(|| ReplicaError::Unreachable {
                detail: "the replica has not answered yet".into(),
            })
    }

    /// Whether the replica answers and holds every frame synced so far.
    fn caught_up(&self) -> bool {
        self.state == ShipState::Shipping && self.shipped >= self.durable
    }

    /// The first frame the stream still lacks that the queue can give it: the queue's first,
    /// or the next one synced if the queue is empty.
    fn next_to_ship(&self) -> u64 {
        self.queue.front().map_or(self.durable + 1, |q| q.frame.seq)
    }

    /// Drops the queued frames at or before `seq`: the stream holds them.
    fn drop_through(&mut self, seq: u64) {
        while self.queue.front().is_some_and(|q| q.frame.seq <= seq) {
            if let Some(q) = self.queue.pop_front() {
                self.queued_bytes -= q.frame.payload.len() as u64;
            }
        }
    }

    /// Drops the whole queue (a snapshot will stand for it, or nobody will ship it).
    fn clear_queue(&mut self) {
        self.queue.clear();
        self.queued_bytes = 0;
    }

    /// The sequence number the next queued frame must have for the stream to stay whole.
    fn next_expected(&self) -> u64 {
        self.queue
            .back()
            .map_or(self.shipped + 1, |q| q.frame.seq + 1)
    }
}

fn timeout_error(state: &State) -> ReplicaError {
    ReplicaError::Unreachable {
        detail: format!(
            "no acknowledgement within the time limit (the replica holds frames up to {} of {})",
            state.shipped, state.durable
        ),
    }
}

impl Inner {
    fn enqueue(&self, state: &mut State, frame: ShippedFrame) {
        assert!(
            frame.seq > state.durable || state.durable == 0,
            "frame {} handed to the shipper after frame {}: frames come in order",
            frame.seq,
            state.durable
        );
        state.durable = frame.seq;
        if state.state == ShipState::Fenced {
            return;
        }
        if frame.seq != state.next_expected() && !state.needs_snapshot {
            tracing::info!(
                seq = frame.seq,
                expected = state.next_expected(),
                "the stream does not go on where this frame begins; a snapshot comes first"
            );
            state.needs_snapshot = true;
        }
        let len = frame.payload.len() as u64;
        if state.queued_bytes + len > self.settings.queue_bytes && !state.queue.is_empty() {
            tracing::warn!(
                queued_bytes = state.queued_bytes,
                "the replica is too far behind for the queue; it will get a snapshot instead"
            );
            state.clear_queue();
            state.needs_snapshot = true;
            state.overflows += 1;
        }
        // The queue stays in order, with no frame twice: `shipped` pops acknowledged
        // frames from its front by sequence number.
        assert!(
            state.queue.back().is_none_or(|q| q.frame.seq < frame.seq),
            "frame {} queued behind frame {:?}",
            frame.seq,
            state.queue.back().map(|q| q.frame.seq)
        );
        state.queued_bytes += len;
        state.queue.push_back(Queued {
            frame,
            synced: Instant::now(),
        });
    }

    /// Sleeps up to `wait` or until stopped; `false` if stopping.
    fn pause(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut state = self.state.lock();
        while !state.stopping && Instant::now() < deadline {
            self.changed.wait_until(&mut state, deadline);
        }
        !state.stopping
    }

    /// Claims the stream, then ships frames until stopped; claims it again when the broker
    /// lost it.
    fn run_frames(&self) {
        while self.claim_stream() && self.ship_frames() {}
    }

    /// Ships queued frames until stopped or fenced (`false`), or until the stream is lost
    /// and must be claimed again (`true`).
    fn ship_frames(&self) -> bool {
        let mut failures = 0;
        loop {
            let batch = {
                let mut state = self.state.lock();
                loop {
                    if state.stopping || state.state == ShipState::Fenced {
                        return false;
                    }
                    if state.state == ShipState::Claiming {
                        return true;
                    }
                    if !state.needs_snapshot && !state.queue.is_empty() {
                        break;
                    }
                    self.changed.wait(&mut state);
                }
                let mut bytes = 0;
                let batch: Vec<ShippedFrame> = state
                    .queue
                    .iter()
                    .take_while(|q| {
                        let take = bytes < BATCH_BYTES;
                        bytes += q.frame.payload.len() as u64;
                        take
                    })
                    .map(|q| q.frame.clone())
                    .collect();
                batch
            };
            match self.replica.publish(&batch, &self.lineage()) {
                Ok(()) => {
                    failures = 0;
                    self.shipped(&batch);
                }
                Err(e) => {
                    self.failed(&e);
                    if matches!(e, ReplicaError::Lost { .. }) {
                        return true;
                    }
                    failures += 1;
                    if !self.pause(self.settings.backoff.spread_after(failures)) {
                        return false;
                    }
                }
            }
        }
    }

    /// What this store's frames and snapshots carry now.
    fn lineage(&self) -> Lineage {
        let settings = &self.settings;
        Lineage::shipping(
            settings.mode.guarantee(),
            settings.epoch,
            settings.window,
            settings.clock.now(),
        )
    }

    /// The replica acknowledged `batch`.
    fn shipped(&self, batch: &[ShippedFrame]) {
        assert!(
            batch.windows(2).all(|w| w[0].seq < w[1].seq),
            "an acknowledged batch is in order, each frame once"
        );
        let now = Instant::now();
        let mut state = self.state.lock();
        for frame in batch {
            match state.queue.front() {
                Some(q) if q.frame.seq == frame.seq => {}
                // A snapshot or an overflow replaced the queue meanwhile.
                _ => break,
            }
            let Some(q) = state.queue.pop_front() else {
                break;
            };
            let len = q.frame.payload.len() as u64;
            state.queued_bytes -= len;
            state.since_snapshot += len;
            state.shipped = state.shipped.max(frame.seq);
            state.frames_shipped += 1;
            if state.lags.len() == LAG_WINDOW {
                state.lags.pop_front();
            }
            let lag = now.duration_since(q.synced);
            state.lags.push_back(lag);
            metrics::seconds(metrics::SHIP_LAG_SECONDS, lag);
            state.keep(q, self.settings.queue_bytes);
        }
        metrics::count(metrics::SHIP_FRAMES, batch.len() as u64);
        if state.state != ShipState::Shipping && !state.needs_snapshot {
            tracing::info!(
                shipped = state.shipped,
                "the replica answers again; shipping"
            );
            state.state = ShipState::Shipping;
            state.last_error = None;
        }
        if state.since_snapshot >= self.settings.snapshot_bytes.max(state.last_snapshot_bytes) {
            // Due, but not urgent: frames go on flowing while it is made.
            state.since_snapshot = 0;
            state.snapshotting = true;
        }
        state.report();
        drop(state);
        self.changed.notify_all();
    }
}

/// The median and 99th percentile of `lags`.
fn quantiles(lags: &VecDeque<Duration>) -> (Duration, Duration) {
    if lags.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    let mut sorted: Vec<Duration> = lags.iter().copied().collect();
    sorted.sort_unstable();
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}
