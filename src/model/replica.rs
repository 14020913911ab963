//! Values of log shipping: how a store ships its log, what a restore may assume from it, and
//! who writes a stream. No I/O.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How a store ships its log to a replica ([`Builder::ship`](crate::Builder::ship)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Shipping {
    /// Acknowledge a group after its local sync; ship behind it. A lost box loses what was
    /// acknowledged but not yet shipped (the lag, in [`Stats`](crate::Stats)), so a restored
    /// store answers unknown keys as recoveries for a while (see the README's guarantees).
    /// An unreachable replica never stops the store: it runs local-only, the lag grows, and
    /// shipping catches up when the replica returns.
    Async,
    /// Acknowledge a group only after its local sync *and* the replica's acknowledgement of
    /// its frame; one acknowledgement serves every group of a frame. What happens while the
    /// replica is unreachable is the [`Unreachable`] policy.
    Sync(Unreachable),
}

/// What a store shipping synchronously does while its replica does not acknowledge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unreachable {
    /// The default: writes are refused (`StoreError::NotWritten`, or `OutcomeUnknown` for the
    /// groups whose frame was synced locally but not acknowledged) until the replica has
    /// everything again. Reads go on. Nothing is ever acknowledged that the replica lacks, so a
    /// restore loses nothing acknowledged.
    #[default]
    Refuse,
    /// Go on as [`Shipping::Async`] with an alert (the `shipping` state in the stats, the
    /// `idemstore_ship_alert` gauge) until the replica has caught up. The store stays
    /// available, and a restore must assume, as after asynchronous shipping, that the old box
    /// may have acknowledged more than the stream holds.
    FallBack,
}

/// What a restore may assume about what the old store acknowledged, as shipped with each
/// frame and snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Guarantee {
    /// Shipped synchronously, refusing while the replica was unreachable: the store
    /// acknowledged nothing the stream lacks.
    Complete,
    /// Shipped asynchronously (or synchronously with a fallback): the store may have
    /// acknowledged frames after the stream's last one.
    MayLag,
}

impl Guarantee {
    /// The name shipped in headers and metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            Guarantee::Complete => "complete",
            Guarantee::MayLag => "may-lag",
        }
    }

    /// The guarantee a header names; `None` for anything else.
    pub fn parse(text: &str) -> Option<Guarantee> {
        match text {
            "complete" => Some(Guarantee::Complete),
            "may-lag" => Some(Guarantee::MayLag),
            _ => None,
        }
    }
}

impl Shipping {
    /// Whether nothing is acknowledged before the replica holds it: synchronous shipping that
    /// refuses while the replica is away. Such a store waits for its replica at open and
    /// before it takes writes again, and its frames promise a restore they are complete.
    pub(crate) fn refuses(self) -> bool {
        self == Shipping::Sync(Unreachable::Refuse)
    }

    /// What a frame shipped in this mode promises a restore.
    pub(crate) fn guarantee(self) -> Guarantee {
        match self {
            Shipping::Sync(Unreachable::Refuse) => Guarantee::Complete,
            Shipping::Sync(Unreachable::FallBack) | Shipping::Async => Guarantee::MayLag,
        }
    }
}

/// The store that writes a stream: its host, process and directory. Two stores must never
/// write one stream; the second is refused with the first's identity.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WriterIdentity {
    /// The machine's host name (`/etc/hostname`, or `HOSTNAME`), or "unknown".
    pub host: String,
    /// The writing process.
    pub pid: u32,
    /// The store's directory, as the process opened it (made absolute).
    pub dir: PathBuf,
}

impl WriterIdentity {
    /// This process, writing the store at `dir`.
    pub fn this_process(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let dir = std::path::absolute(&dir).unwrap_or(dir);
        WriterIdentity {
            host: host_name(),
            pid: std::process::id(),
            dir,
        }
    }

    /// Whether `other` is this same store (host and directory), perhaps an earlier process of
    /// it that died: such a claim is this store's to take back.
    pub fn same_store(&self, other: &WriterIdentity) -> bool {
        self.host == other.host && self.dir == other.dir
    }
}

impl fmt::Display for WriterIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the store at {} on host {} (process {})",
            self.dir.display(),
            self.host,
            self.pid
        )
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// Where a stream stands when a store claims it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamPosition {
    /// The last frame the stream holds; 0 if it holds none.
    pub last_frame: u64,
    /// The frame the latest snapshot covers, if there is one.
    pub snapshot: Option<u64>,
}

/// A snapshot as a replica holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Every frame up to this one is in the snapshot; the stream goes on after it.
    pub seq: u64,
    /// What the store that made it was and promised.
    pub lineage: crate::model::restore::Lineage,
    /// The snapshot file's size.
    pub bytes: u64,
}

/// What shipping is doing (in [`ShippingStats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShipState {
    /// Claiming the stream (at open, or until the replica first answers).
    Claiming,
    /// Frames are shipped as they become durable.
    Shipping,
    /// The stream lacks frames this store no longer holds in memory (after an outage that
    /// outlasted the queue, at open after a crash, after a restore in place): a snapshot is
    /// being taken and sent, after which shipping goes on.
    CatchingUp,
    /// The replica does not answer; shipping tries again with backoff. An alert.
    Unreachable,
    /// Another store writes the stream: this one ships nothing more. An alert that needs an
    /// operator.
    Fenced,
}

/// Log shipping in [`Stats`](crate::Stats): how far the replica is behind the log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShippingStats {
    /// The mode the store ships in.
    pub mode: Shipping,
    /// What shipping is doing now.
    pub state: ShipState,
    /// The last error the replica answered with, if shipping is not healthy.
    pub last_error: Option<String>,
    /// The last frame synced locally.
    pub durable_frame: u64,
    /// The last frame the replica acknowledged (or a snapshot covers).
    pub shipped_frame: u64,
    /// Frames synced locally and not yet acknowledged by the replica.
    pub lag_frames: u64,
    /// How long the oldest of them has waited; zero when none waits.
    pub lag: Duration,
    /// The median and 99th percentile of the time from a frame's local sync to the replica's
    /// acknowledgement, over the last 4,096 frames shipped.
    pub lag_p50: Duration,
    /// See `lag_p50`.
    pub lag_p99: Duration,
    /// Frames acknowledged by the replica since open.
    pub frames_shipped: u64,
    /// Snapshots sent since open.
    pub snapshots: u64,
    /// The frame the last snapshot sent covers.
    pub last_snapshot: Option<u64>,
    /// Times the queue of unshipped frames outgrew its bound and was replaced by a snapshot.
    pub overflows: u64,
    /// Snapshots that could not be made here (a full disk) or sent since open; each is tried
    /// again. A snapshot made here failing leaves frames shipping: only a stream that needs
    /// one to go on (`CatchingUp`) waits for it.
    pub snapshot_failures: u64,
    /// Why the last snapshot failed, until one succeeds.
    pub snapshot_error: Option<String>,
}

impl crate::model::writer_epoch::SameStore for WriterIdentity {
    fn same_store(&self, other: &Self) -> bool {
        WriterIdentity::same_store(self, other)
    }
}
