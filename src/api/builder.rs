//! Opening a store: settings and the business tables it may write.

use std::path::Path;
use std::time::Duration;

use redb::{Key, TableDefinition, TableHandle, Value};

use crate::api::store::Store;
use crate::engine::Tables;
use crate::error::OpenError;
use crate::model::clock::Clock;
use crate::model::config::{Config, Durability, LoosePermissions, MetricLabels, SelfHeal, Sweep};
use crate::model::replica::Shipping;
use crate::storage::Storage;
use crate::wal::ship::{Replica, ShipOptions};
use std::sync::Arc;

/// Settings for [`Store::open`](crate::Store::open). Every setting is checked at `open`; an
/// invalid one is an [`OpenError::InvalidConfig`], never a panic later.
#[derive(Debug)]
pub struct Builder {
    config: Config,
    tables: Tables,
    bad_table: Option<OpenError>,
    shipping: Option<ShipOptions>,
}

impl Default for Builder {
    fn default() -> Self {
        Self::new()
    }
}

impl Builder {
    /// A builder with every setting at its default.
    pub fn new() -> Self {
        Builder {
            config: Config::default(),
            tables: Tables::new(),
            bad_table: None,
            shipping: None,
        }
    }

    /// How long a completed record answers retries after it completed. Choose it longer than
    /// the longest retry source (SDK retries, offline mobile clients, queue redelivery).
    ///
    /// Default = 24 hours. Valid: 1 ms ..= 3650 days.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.config.ttl = ttl;
        self
    }

    /// How long to keep a tombstone after a completed record's TTL: a compact marker (scope,
    /// fingerprint, completed_at) without the response, so that a retry arriving after the TTL
    /// is told [`Begin::Expired`](crate::Begin::Expired) ("this completed; its response is no
    /// longer kept") instead of running the operation a second time.
    ///
    /// The trade-off: a tombstone costs about 80 bytes of disk per key for this long, and a
    /// client can no longer reuse the key for a new operation until it goes; without
    /// tombstones, a retry after the TTL is treated as a new request and runs again.
    ///
    /// Default = 0 (off). Valid: 0 ..= 3650 days.
    #[must_use]
    pub fn tombstone_ttl(mut self, ttl: Duration) -> Self {
        self.config.tombstone_ttl = ttl;
        self
    }

    /// How long after a restore a key this store has no live record of is answered
    /// [`Begin::Recovered`](crate::Begin::Recovered) (its claim's
    /// [`recovery`](crate::Claim::recovery) is [`Recovery::Restored`](crate::Recovery::Restored))
    /// instead of `Claimed`, when the restore may lack writes the old store acknowledged: a
    /// [`Store::backup`](crate::Store::backup) copy (always), or a replica shipped
    /// asynchronously. The claim is a normal one; its handler checks downstream with
    /// [`Claim::downstream_key`](crate::Claim::downstream_key), which is the key the old
    /// store's attempt passed on, rather than running the operation a second time. The window
    /// starts when the restored store first opens, and a reopen does not restart it.
    ///
    /// The default is the TTL. A retry of a request the old store acknowledged can arrive as
    /// long as the old store would have replayed it, which is the TTL after it completed, and
    /// it completed before the restore; a later retry would have run again on the old store
    /// too. The TTL is the setting already chosen to outlast the retries (SDK retries within
    /// minutes, queue redeliveries within hours, a person retrying by hand), so the window
    /// follows it. A shorter window saves downstream checks (every new key in the window is a
    /// recovery, which costs its handler one downstream call with the key) at the risk of a
    /// late retry running blind; with tombstones, `ttl + tombstone_ttl` also covers the retries
    /// the old store would have refused as expired.
    ///
    /// Default = the TTL. Valid: 0 ..= 3650 days; `Duration::ZERO` turns it off.
    #[must_use]
    pub fn restore_window(mut self, window: Duration) -> Self {
        self.config.restore.window = Some(window);
        self
    }

    /// How long a claim holds its key before another attempt may take it over. Choose it longer
    /// than the work normally takes; long work should [`extend`](crate::Claim::extend) it.
    ///
    /// Default = 30 seconds. Valid: 1 ms ..= 7 days.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// Registers a business table that commit and write closures may write. Tables are created
    /// at open if absent; opening fails if a table exists with other key or value types.
    ///
    /// Names starting with `idemstore.` are reserved.
    #[must_use]
    pub fn table<K: Key + 'static, V: Value + 'static>(
        mut self,
        table: TableDefinition<'_, K, V>,
    ) -> Self {
        let name = table.name();
        if let Err(reason) = self.tables.register::<K, V>(name) {
            self.bad_table.get_or_insert(OpenError::BadTable {
                name: name.to_owned(),
                reason,
            });
        }
        self
    }

    /// The clock that leases and TTLs are measured by.
    ///
    /// Default = [`SystemClock`](crate::SystemClock). Tests pass a
    /// [`ManualClock`](crate::ManualClock).
    #[must_use]
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = std::sync::Arc::new(clock);
        self
    }

    /// Background eviction of expired records.
    ///
    /// Default = [`Sweep::Every`] 10 s, batches of 1,000. [`Sweep::Off`] leaves eviction to
    /// [`Store::evict_expired`](crate::Store::evict_expired).
    #[must_use]
    pub fn sweep(mut self, sweep: Sweep) -> Self {
        self.config.sweep = sweep;
        self
    }

    /// Whether a poisoned store recovers in place on its own (see [`SelfHeal`]).
    ///
    /// Default = [`SelfHeal::Backoff`] from 100 ms to 30 s. Valid: 1 ms <= first <= max <=
    /// 1 hour.
    #[must_use]
    pub fn self_heal(mut self, self_heal: SelfHeal) -> Self {
        self.config.self_heal = self_heal;
        self
    }

    /// What opening an existing store whose files other users may read does (see
    /// [`LoosePermissions`]).
    ///
    /// Default = [`LoosePermissions::Warn`].
    #[must_use]
    pub fn loose_permissions(mut self, policy: LoosePermissions) -> Self {
        self.config.loose_permissions = policy;
        self
    }

    /// Which labels the store's metrics carry (feature `metrics`; see [`MetricLabels`]): opt
    /// in to a `tenant` label on `idemstore_begin_total` here.
    ///
    /// Default = [`MetricLabels::Bounded`] (no tenant, no key).
    #[must_use]
    pub fn metric_labels(mut self, labels: MetricLabels) -> Self {
        self.config.metric_labels = labels;
        self
    }

    /// How groups are made durable.
    ///
    /// Default = [`Durability::Wal`].
    #[must_use]
    pub fn durability(mut self, durability: Durability) -> Self {
        self.config.durability = durability;
        self
    }

    /// The largest encoded response (body, headers and their framing) a commit may store.
    ///
    /// Default = 1 MiB. Valid: 1 KiB ..= 64 MiB.
    #[must_use]
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.config.max_response_bytes = bytes;
        self
    }

    /// The largest checkpoint a claim may store.
    ///
    /// Default = 64 KiB. Valid: 0 ..= 16 MiB.
    #[must_use]
    pub fn max_checkpoint_bytes(mut self, bytes: usize) -> Self {
        self.config.max_checkpoint_bytes = bytes;
        self
    }

    /// The most requests the writer takes into one group (one transaction, one sync).
    ///
    /// Default = 1024. Valid: 1 ..= 65536. `1` turns group commit off.
    #[must_use]
    pub fn max_batch(mut self, requests: usize) -> Self {
        self.config.max_batch = requests;
        self
    }

    /// Size of one write-ahead log segment file. Segments are preallocated and reused after a
    /// checkpoint; a group larger than a segment gets a segment of its own size.
    ///
    /// Default = 8 MiB. Valid: 64 KiB ..= 1 GiB.
    #[must_use]
    pub fn log_segment_bytes(mut self, bytes: u64) -> Self {
        self.config.segment_bytes = bytes;
        self
    }

    /// Log bytes after which a checkpoint makes redb durable and lets the log be reused. A
    /// larger value means fewer checkpoints and a longer replay after a crash: a reopen
    /// replays about 60 MB of log a second on the bench machine (`benches/recovery.rs`), so
    /// the default keeps a reopen after a SIGKILL under a second.
    ///
    /// Default = 48 MiB. Valid: at least one log segment.
    #[must_use]
    pub fn checkpoint_bytes(mut self, bytes: u64) -> Self {
        self.config.checkpoint_bytes = bytes;
        self
    }

    /// The memory the store may hold for its data, in bytes: half of it is redb's page cache,
    /// the rest bounds what the writer keeps between publishes (an epoch's writes, one group,
    /// one log frame). What it does not bound: a single response up to
    /// [`max_response_bytes`](Self::max_response_bytes), the number of callers waiting, and the
    /// allocator's overhead. `cargo bench --bench memory` measures the peak RSS it gives.
    ///
    /// Default = 64 MiB, sized for an edge box (512 MB to 2 GB shared with the service). A
    /// larger budget pays off when the working set of keys read back (replays, lookups) is
    /// larger than the cache and the disk is slow. Valid: at least 4 MiB.
    #[must_use]
    pub fn memory_budget(mut self, bytes: usize) -> Self {
        self.config.memory_budget = bytes;
        self
    }

    /// Time after which a checkpoint runs even if little was logged (also when idle).
    ///
    /// Default = 2 s. Valid: 1 ms ..= 1 hour.
    #[must_use]
    pub fn checkpoint_interval(mut self, interval: Duration) -> Self {
        self.config.checkpoint_interval = interval;
        self
    }

    /// Ships the log to `replica` (a stream of its own for this store), in `mode`: every frame
    /// once it is synced locally, and snapshots that keep a restore's tail short. With
    /// [`Shipping::Async`] the store acknowledges after the local sync and the replica lags
    /// behind; with [`Shipping::Sync`] only after the replica's acknowledgement too (see
    /// [`Unreachable`](crate::Unreachable) for what happens while it is away). The README's
    /// "Surviving the loss of the box" says what each mode loses and what a handler must do.
    ///
    /// Needs [`Durability::Wal`] (the log is what is shipped). A synchronous store that refuses
    /// while the replica is away waits at open, up to [`Builder::ship_timeouts`]' second limit,
    /// for the replica to hold every frame.
    ///
    /// Default = no shipping.
    #[must_use]
    pub fn ship(mut self, replica: impl Replica, mode: Shipping) -> Self {
        self.shipping = Some(ShipOptions {
            replica: Arc::new(replica),
            mode,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            open_timeout: DEFAULT_OPEN_TIMEOUT,
            snapshot_bytes: DEFAULT_SNAPSHOT_BYTES,
        });
        self
    }

    /// How long a synchronous frame waits for the replica's acknowledgement before the
    /// [`Unreachable`](crate::Unreachable) policy applies (`ack`), and how long a synchronous,
    /// refusing store's open waits for the replica to catch up (`open`). Ignored without
    /// [`Builder::ship`]. A clean close (the last handle dropped) also waits up to `ack` for
    /// an answering replica to take what is not shipped yet, in either mode.
    ///
    /// Default = 5 s and 60 s. Valid: 1 ms ..= 1 hour each.
    #[must_use]
    pub fn ship_timeouts(mut self, ack: Duration, open: Duration) -> Self {
        if let Some(shipping) = &mut self.shipping {
            shipping.ack_timeout = ack;
            shipping.open_timeout = open;
        }
        self
    }

    /// Log shipped after which the store sends a new snapshot, so that a restore replays at
    /// most about this much (or as much as the last snapshot's size, if that is larger: a
    /// snapshot costs its size to send). Ignored without [`Builder::ship`].
    ///
    /// Default = 64 MiB. Valid: 64 KiB ..= 64 GiB.
    #[must_use]
    pub fn ship_snapshot_bytes(mut self, bytes: u64) -> Self {
        if let Some(shipping) = &mut self.shipping {
            shipping.snapshot_bytes = bytes;
        }
        self
    }

    /// Opens (or creates) the store in directory `dir`, creating the directory if absent.
    ///
    /// The directory is locked first (an exclusive lock on its `idemstore.lock`, which names
    /// this process for others' messages) and stays locked until the last handle of the store
    /// is dropped, across every reopen of the database file in between: one writer per store
    /// directory, always. redb's own lock on the file is not enough, because a reopen lets go
    /// of it for a moment.
    ///
    /// # Errors
    /// [`OpenError`] for an invalid setting, a path that cannot be used, a directory another
    /// store holds ([`OpenError::AlreadyOpen`], naming the holder: in this process or another),
    /// a file of another format, or a table that cannot be registered.
    pub fn open(self, dir: impl AsRef<Path>) -> Result<Store, OpenError> {
        self.open_on(|| Storage::directory(dir.as_ref()))
    }

    /// Opens (or creates) the store on a simulated disk, for crash and fault tests.
    ///
    /// # Errors
    /// As [`Builder::open`].
    #[cfg(feature = "testing")]
    pub fn open_simulated(
        self,
        disk: &crate::storage::sim_disk::SimDisk,
    ) -> Result<Store, OpenError> {
        self.open_on(|| Ok(Storage::Simulated(disk.clone())))
    }

    /// Checks the settings, then opens `storage`: a bad setting locks and creates nothing.
    fn open_on(
        self,
        storage: impl FnOnce() -> Result<Storage, OpenError>,
    ) -> Result<Store, OpenError> {
        if let Some(e) = self.bad_table {
            return Err(e);
        }
        self.config.validate()?;
        if let Some(shipping) = &self.shipping {
            check_shipping(&self.config, shipping)?;
        }
        Store::open_with(storage()?, self.config, self.tables, self.shipping)
    }
}

/// How long a synchronous frame waits for the replica, by default.
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a synchronous, refusing store's open waits for the replica, by default.
const DEFAULT_OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// Log shipped between snapshots, by default.
const DEFAULT_SNAPSHOT_BYTES: u64 = 64 << 20;

/// The shipping settings' ranges, and the durability they need.
fn check_shipping(config: &Config, shipping: &ShipOptions) -> Result<(), OpenError> {
    let invalid =
        |setting: &'static str, reason: String| Err(OpenError::InvalidConfig { setting, reason });
    if config.durability != Durability::Wal {
        return invalid(
            "ship",
            "log shipping ships the write-ahead log: it needs Durability::Wal".into(),
        );
    }
    let range = Duration::from_millis(1)..=Duration::from_secs(3600);
    for (name, value) in [
        ("ship_timeouts (ack)", shipping.ack_timeout),
        ("ship_timeouts (open)", shipping.open_timeout),
    ] {
        if !range.contains(&value) {
            return invalid(name, format!("{value:?} is outside 1 ms ..= 1 hour"));
        }
    }
    if !(64 << 10..=64 << 30).contains(&shipping.snapshot_bytes) {
        return invalid(
            "ship_snapshot_bytes",
            format!("{} is outside 64 KiB ..= 64 GiB", shipping.snapshot_bytes),
        );
    }
    Ok(())
}
