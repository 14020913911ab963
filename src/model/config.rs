//! The store's settings, validated once at open.

use crate::model::limits::{MAX_BATCH, MAX_SEGMENT_BYTES, MIN_SEGMENT_BYTES};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::model::clock::{Clock, SystemClock};
use crate::model::invalid::InvalidSetting;
use crate::model::memory::{DEFAULT_MEMORY_BUDGET, MIN_MEMORY_BUDGET, MemoryShares};
use crate::model::settings::Settings;

/// How a group of requests is made durable before anyone hears of it.
///
/// Every mode acknowledges a write only once it will survive a crash of the process or the
/// machine; the modes differ in what they sync and how often.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// The default. Each group's writes are appended to a write-ahead log as one checksummed
    /// frame and made durable with one `fdatasync` of that small sequential write; only then is
    /// the group applied to redb (without a sync) and answered. A checkpoint makes redb durable
    /// every [`Builder::checkpoint_bytes`](crate::Builder::checkpoint_bytes) of log or
    /// [`Builder::checkpoint_interval`](crate::Builder::checkpoint_interval); opening after a
    /// crash replays the log written since.
    #[default]
    Wal,
    /// Each group is one durable redb commit: redb writes the group's pages and syncs the file
    /// before any request of the group is answered. No log. Slower per group, nothing to replay.
    Redb,
}

/// Whether (and how often) a background thread evicts expired records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sweep {
    /// No background eviction: call [`Store::evict_expired`](crate::Store::evict_expired)
    /// yourself (expired records answer nothing either way; they only take space).
    Off,
    /// Every `interval`, evict expired records in batches of `batch` until none is due (at
    /// most 100 batches a tick, so other requests are not held up for long). The embedded
    /// store removes records a partition at a time, once every record in it is gone (see
    /// [`Store::evict_expired`](crate::Store::evict_expired)); the PostgreSQL one removes
    /// each record once its TTL has passed.
    Every {
        /// Time between passes.
        interval: Duration,
        /// Records per batch (one writer request each).
        batch: usize,
    },
}

impl Default for Sweep {
    /// Every 10 seconds, batches of 1,000.
    fn default() -> Self {
        Sweep::Every {
            interval: Duration::from_secs(10),
            batch: 1_000,
        }
    }
}

/// Whether a poisoned store recovers in place on its own.
///
/// A store is poisoned when a write's outcome is unknown (a failed log sync) or its in-place
/// recovery failed: writes are refused until it has rebuilt a known state from its log, as a
/// reopen would. Reads and replays are answered meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SelfHeal {
    /// The writer recovers in place at once, then, if that fails, again after `first`,
    /// doubling up to `max` (with jitter), until it succeeds. The default: a full disk or a
    /// flaky device does not need a restart of the process.
    Backoff {
        /// The wait after the first failed attempt.
        first: Duration,
        /// The longest wait between attempts.
        max: Duration,
    },
    /// Only [`Store::reopen`](crate::Store::reopen) recovers a poisoned store (after one
    /// immediate attempt). For deployments that want an operator, or a supervisor, to decide.
    Off,
}

impl Default for SelfHeal {
    /// Backoff from 100 ms to 30 s.
    fn default() -> Self {
        SelfHeal::Backoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(30),
        }
    }
}

/// What `open` does with an existing store whose files other users may read.
///
/// A store holds every response it replays (charge ids, amounts, customer references). What
/// it creates is `0700` (directories) and `0600` (files) whatever the umask; a store made by
/// an older version, or changed by hand, may be looser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LoosePermissions {
    /// Open it, log a warning naming each path and its mode, and report them in
    /// `Stats::loose_permissions`. The default.
    #[default]
    Warn,
    /// Refuse to open it ([`OpenError::LoosePermissions`](crate::OpenError::LoosePermissions)),
    /// as PostgreSQL refuses a data directory others can read.
    Refuse,
}

/// Which labels the store's metrics carry (feature `metrics`; without it, nothing is emitted).
///
/// Every series a label value creates is kept by the exporter for the life of the process, so
/// labels are bounded by default: an outcome or a record state, never a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MetricLabels {
    /// Outcome and state labels only: a fixed number of series. The default.
    #[default]
    Bounded,
    /// Also a `tenant` label on `idemstore_begin_total`: per-tenant replay, conflict and
    /// mismatch rates, at one more series per tenant and outcome. Only for a bounded set of
    /// tenants (a few hundred), and only where tenant names may appear in monitoring.
    WithTenant,
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) ttl: Duration,
    pub(crate) tombstone_ttl: Duration,
    pub(crate) lease: Duration,
    pub(crate) max_response_bytes: usize,
    pub(crate) max_checkpoint_bytes: usize,
    pub(crate) max_batch: usize,
    pub(crate) durability: Durability,
    pub(crate) segment_bytes: u64,
    pub(crate) checkpoint_bytes: u64,
    pub(crate) checkpoint_interval: Duration,
    pub(crate) sweep: Sweep,
    pub(crate) self_heal: SelfHeal,
    pub(crate) loose_permissions: LoosePermissions,
    pub(crate) memory_budget: usize,
    pub(crate) metric_labels: MetricLabels,
    pub(crate) clock: Arc<dyn Clock>,
    /// How long after a restore unknown keys are recoveries (the setting), and the restore it
    /// applies to, read from the metadata when the store opens.
    pub(crate) restore: crate::model::restore::AfterRestore,
}

impl Default for Config {
    fn default() -> Self {
        let shared = Settings::default();
        Config {
            ttl: shared.ttl,
            tombstone_ttl: shared.tombstone_ttl,
            lease: shared.lease,
            max_response_bytes: shared.max_response_bytes,
            max_checkpoint_bytes: shared.max_checkpoint_bytes,
            max_batch: 1024,
            durability: Durability::default(),
            segment_bytes: 8 * 1024 * 1024,
            checkpoint_bytes: 48 * 1024 * 1024,
            checkpoint_interval: Duration::from_secs(2),
            sweep: Sweep::default(),
            self_heal: SelfHeal::default(),
            loose_permissions: LoosePermissions::default(),
            memory_budget: DEFAULT_MEMORY_BUDGET,
            metric_labels: MetricLabels::default(),
            clock: Arc::new(SystemClock),
            restore: crate::model::restore::AfterRestore::default(),
        }
    }
}

impl Config {
    /// How the memory budget is shared out.
    pub(crate) fn memory(&self) -> MemoryShares {
        MemoryShares::of(self.memory_budget)
    }

    /// How long the open partition takes completed records, from its first: an eighth of the
    /// TTL (at least a millisecond). A record is removed with its partition, so it is kept up
    /// to this much past its TTL; the partitions of one TTL are about eight at low rates.
    pub(crate) fn partition_window(&self) -> Duration {
        (self.ttl / 8).max(Duration::from_millis(1))
    }

    /// The first setting out of its range, in the order below.
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        self.validate_durations()?;
        self.validate_sizes()?;
        self.validate_log()?;
        self.validate_background()?;
        self.validate_memory()?;
        self.validate_checkpoint_interval()?;
        self.restore.validate()
    }

    /// The settings every backend shares: one rule each, in `model::settings`.
    fn validate_durations(&self) -> Result<(), InvalidSetting> {
        self.settings().validate()
    }

    /// The settings of [`Settings`] as this store holds them.
    fn settings(&self) -> Settings {
        Settings {
            ttl: self.ttl,
            tombstone_ttl: self.tombstone_ttl,
            lease: self.lease,
            max_response_bytes: self.max_response_bytes,
            max_checkpoint_bytes: self.max_checkpoint_bytes,
        }
    }

    /// How many requests a writer group takes.
    fn validate_sizes(&self) -> Result<(), InvalidSetting> {
        if !(1..=MAX_BATCH).contains(&self.max_batch) {
            return invalid(
                "max_batch",
                format!("{} is outside 1 ..= 65536", self.max_batch),
            );
        }
        Ok(())
    }

    /// The log's segments, and how much of it a checkpoint waits for.
    fn validate_log(&self) -> Result<(), InvalidSetting> {
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.segment_bytes) {
            return invalid(
                "log_segment_bytes",
                format!("{} is outside 64 KiB ..= 1 GiB", self.segment_bytes),
            );
        }
        if self.checkpoint_bytes < self.segment_bytes {
            return invalid(
                "checkpoint_bytes",
                format!(
                    "{} is smaller than a log segment ({}); set it to at least one segment",
                    self.checkpoint_bytes, self.segment_bytes
                ),
            );
        }
        Ok(())
    }

    /// The sweep's pace and the self-heal's backoff.
    fn validate_background(&self) -> Result<(), InvalidSetting> {
        if let Sweep::Every { interval, batch } = self.sweep {
            if interval < Duration::from_millis(1) || interval > Duration::from_secs(24 * 3600) {
                return invalid(
                    "sweep",
                    format!("an interval of {interval:?} is outside 1 ms ..= 1 day"),
                );
            }
            if !(1..=100_000).contains(&batch) {
                return invalid(
                    "sweep",
                    format!("a batch of {batch} is outside 1 ..= 100,000"),
                );
            }
        }
        if let SelfHeal::Backoff { first, max } = self.self_heal
            && (first < Duration::from_millis(1) || max < first || max > Duration::from_secs(3600))
        {
            return invalid(
                "self_heal",
                format!(
                    "backoff from {first:?} to {max:?}: valid is 1 ms <= first <= max <= 1 hour"
                ),
            );
        }
        Ok(())
    }

    fn validate_memory(&self) -> Result<(), InvalidSetting> {
        if self.memory_budget < MIN_MEMORY_BUDGET {
            return invalid(
                "memory_budget",
                format!(
                    "{} bytes is under the minimum of 4 MiB ({MIN_MEMORY_BUDGET} bytes)",
                    self.memory_budget
                ),
            );
        }
        Ok(())
    }

    fn validate_checkpoint_interval(&self) -> Result<(), InvalidSetting> {
        if self.checkpoint_interval.is_zero()
            || self.checkpoint_interval > Duration::from_secs(3600)
        {
            return invalid(
                "checkpoint_interval",
                format!("{:?} is outside 1 ms ..= 1 hour", self.checkpoint_interval),
            );
        }
        Ok(())
    }
}

fn invalid(setting: &'static str, reason: String) -> Result<(), InvalidSetting> {
    Err(InvalidSetting { setting, reason })
}

/// A file or directory of the store that users other than its owner may read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LooseFile {
    /// The path.
    pub path: PathBuf,
    /// Its permission bits (for example `0o644`).
    pub mode: u32,
}
