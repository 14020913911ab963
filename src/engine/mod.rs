//! The storage engine: the redb file, the table registry, and the writer thread, behind one
//! narrow interface.
//!
//! The facades (`Store`, `Claim`, the async API) call the operations here and get domain
//! answers back (`Begin<Held>`, a response, a refusal); they never see a job, a context or a
//! table. Every write is a [`Request`] built by a constructor in `requests` and run by
//! [`Engine::run`] (or [`Engine::run_async`]) in the writer's next group; reads use redb read
//! transactions directly and never wait for the writer. The engine must never answer a request
//! before the request's group is durable.
//!
//! The folders and files, each named by what it does, top to bottom: each names only those
//! below it (`.ci/floors.py` checks this too).
//! 1. `upkeep` (eviction, checkpoints, compaction, recovery on request), the `sweeper`
//!    that runs it, `shipping` (the log's shipper started with the engine, and the snapshots
//!    it sends) and `rebuild` (a store rebuilt from a replica's snapshot and frames);
//! 2. `backup` (the store copied from one snapshot into a new directory; shipping's
//!    snapshots are made by its copier);
//! 3. `reads`: `begin` and `begin_or_wait` (the read path, then the writer), reads through
//!    the indexes, the overlay of acknowledged records not yet published;
//! 4. `requests`: each write a facade can ask for, what it does on the writer, and the queue
//!    that hands it over and waits for its answer;
//! 5. `writer`: the writer thread, its jobs, groups, epochs, checkpoints and restores;
//! 6. `recovery`: catching up with the log at open, and replaying it;
//! 7. `tables`: the registry, the store's own tables and key layout, transactions, the file;
//! 8. `counters`, `poison` (writes refused after a failure) and `watchers` (the claims held
//!    here, and who waits for them), which every floor may touch.

mod backup;
mod counters;
mod poison;
mod reads;
mod rebuild;
mod recovery;
mod requests;
mod shipping;
mod sweeper;
mod tables;
mod upkeep;
mod watchers;
mod writer;

pub(crate) use self::rebuild::{Followed, Position, build, finish, follow, lock, rebuild};
pub(crate) use self::requests::Request;
pub(crate) use self::requests::answers::{
    CommitRefusal, ForgetRefusal, Held, Refusal, UserFailure,
};
pub(crate) use self::tables::layout::Tables;
pub use self::tables::read_tx::ReadTx;
pub use self::tables::tx::{OwnedValue, Tx};
pub(crate) use self::watchers::HoldToken;

/// The store's table names, meta keys and index key layout, for reading a store's file
/// without an engine (`inspect`, feature `cli`): the layout is documented in `docs/design.md`
/// and is the one thing an offline reader must share with the engine.
#[cfg(feature = "cli")]
pub(crate) mod layout {
    pub(crate) use super::tables::layout::{
        CLAIMS, DONE, FORMAT_VERSION, META, META_FILTER_KEY, META_FORMAT, META_LOG_CHECKPOINT,
        META_LOG_SEGMENT, META_NEXT_FENCE, PARTITIONS, format_supported,
    };
    pub(crate) use super::tables::partitions::hash::KeyHasher;
    pub(crate) use super::tables::partitions::info::{
        Info as PartitionInfo, Stage as PartitionStage,
    };
    pub(crate) use super::tables::partitions::{done_key, partition_bounds, split_done_key};
}

/// The write requests the facades build, one constructor per operation.
pub(crate) mod request {
    #[cfg(feature = "tokio")]
    pub(crate) use super::requests::outbox::settle;
    pub(crate) use super::requests::outbox::{drop_dead, retry_dead};
    pub(crate) use super::requests::{
        checkpoint, checkpoint_log, commit, extend, forget, release, renew, write,
    };
}
#[cfg(feature = "tokio")]
pub(crate) use self::requests::outbox::Settlement;

use std::sync::Arc;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::{JoinHandle, ThreadId};

use parking_lot::Mutex;

use crate::error::OpenError;
use crate::model::config::Config;
use crate::model::limits::Limits;
use crate::model::pace::Pace;
use crate::storage::{Storage, SyncWatch};
use crate::wal::RecoveryReport;
use crate::wal::ship::{ShipOptions, Shipper};

use self::counters::Counters;
use self::poison::Poison;
use self::tables::database::DbSlot;
use self::tables::layout::InternalTables;
use self::tables::overlay::Overlay;
use self::tables::partitions::Partitions;
use self::tables::registry::Registry;
use self::writer::Writer;
use self::writer::job::Job;

/// Queued requests per request the writer takes into a group: room for the next group to
/// gather while one is being synced, and back-pressure beyond it.
const QUEUE_PER_BATCH: usize = 4;

/// What the engine's handle and its writer thread both hold.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    /// The redb file. Readers hold its lock only while they read; the writer takes it to
    /// compact, and to close and reopen the file when it recovers in place.
    pub(crate) db: Arc<DbSlot>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) tables: InternalTables,
    pub(crate) config: Arc<Config>,
    pub(crate) poison: Arc<Poison>,
    pub(crate) counters: Arc<Counters>,
    /// How long each operation's claims take to complete, for `InProgress` answers.
    pub(crate) pace: Arc<Pace>,
    /// Records acknowledged but not yet published to redb.
    pub(crate) overlay: Arc<Overlay>,
    /// The partitions of completed records, and their filters.
    pub(crate) partitions: Arc<Partitions>,
    /// Claims held and callers waiting, per scope, in this process.
    pub(crate) watchers: Arc<watchers::Watchers>,
    /// What the last recovery (at open, or in place) found in the log.
    pub(crate) recovery: Arc<Mutex<RecoveryReport>>,
    /// Whether a sync of the database file failed since it was last written whole.
    pub(crate) db_watch: Arc<SyncWatch>,
    /// The log's shipping to a replica, if the store ships.
    pub(crate) shipper: Option<Arc<Shipper>>,
}

#[derive(Debug)]
pub(crate) struct Engine {
    shared: Shared,
    storage: Storage,
    /// The background sweeper, once started (it needs the engine's `Arc`).
    sweeper: Mutex<Option<sweeper::Sweeper>>,
    /// `None` only while dropping: closing it is what stops the writer.
    queue: Option<SyncSender<Box<dyn Job>>>,
    writer: Option<JoinHandle<()>>,
    writer_id: ThreadId,
}

impl Engine {
    /// Opens the store's file, catches up with its log, and starts the writer (and the
    /// sweeper, if the settings ask for one).
    pub(crate) fn open(
        storage: Storage,
        config: Config,
        tables: Tables,
        shipping: Option<ShipOptions>,
    ) -> Result<Arc<Engine>, OpenError> {
        let engine = Arc::new(Self::start(storage, config, tables, shipping)?);
        engine.start_shipping()?;
        engine.start_sweeper()?;
        Ok(engine)
    }

    fn start(
        storage: Storage,
        config: Config,
        tables: Tables,
        shipping: Option<ShipOptions>,
    ) -> Result<Engine, OpenError> {
        let Tables { registry, internal } = tables;
        check_permissions(&storage, &config)?;
        let db_watch = Arc::new(SyncWatch::default());
        // redb panics on some damaged files; every step that reads the file is guarded, so
        // that a damaged store is an error that says so.
        let db = recovery::guarded(&storage, || {
            storage.database(config.memory().redb_cache, &db_watch)
        })?;
        let (caught_up, partitions, restored) = match prepare(&storage, &config, &registry, &db) {
            Ok(prepared) => prepared,
            Err(e) => {
                if db_watch.failed() {
                    // A sync of the file failed while it was set up, caught up or moved: its
                    // cached pages may never reach the disk, and the next open would read them
                    // back. Rewritten from what reads return, the file is a sound one again
                    // (the last commit whose header landed, or the one before it).
                    drop(db);
                    if let Err(rewrite) = storage.rewrite_database() {
                        tracing::error!(error = %rewrite, "rewriting the database after a failed sync at open failed; the next open tries again");
                    }
                }
                return Err(e);
            }
        };

        let durable = caught_up
            .log
            .as_ref()
            .map_or(0, |(_, start)| start.next_seq - 1);
        let mut config = config;
        config.restore = config.restore.opened(restored, config.ttl);
        let epoch = recovery::guarded(&storage, || tables::meta::writer_epoch(&db))?;
        let shipper = shipping::start(shipping, &storage, &config, epoch, durable)?;
        let config = Arc::new(config);
        let (queue, receiver) = sync_channel(config.max_batch.saturating_mul(QUEUE_PER_BATCH));
        let shared = Shared {
            db: Arc::new(DbSlot::new(db)),
            registry: Arc::new(registry),
            tables: internal,
            config,
            poison: Arc::default(),
            counters: Arc::default(),
            pace: Arc::default(),
            overlay: Arc::default(),
            partitions: Arc::new(partitions),
            watchers: Arc::default(),
            recovery: Arc::new(Mutex::new(caught_up.report)),
            db_watch,
            shipper,
        };
        let writer = Writer::new(
            shared.clone(),
            storage.clone(),
            caught_up.next_fence,
            receiver,
            caught_up.log,
        )
        .map_err(OpenError::Thread)?;
        let handle = std::thread::Builder::new()
            .name("idemstore-writer".into())
            .spawn(move || writer.run())
            .map_err(OpenError::Thread)?;
        Ok(Engine {
            shared,
            storage,
            sweeper: Mutex::new(None),
            queue: Some(queue),
            writer_id: handle.thread().id(),
            writer: Some(handle),
        })
    }

    /// Starts the sweeper, if the settings ask for one.
    fn start_sweeper(self: &Arc<Self>) -> Result<(), OpenError> {
        if let crate::model::config::Sweep::Every { interval, batch } = self.shared.config.sweep {
            let sweeper = sweeper::Sweeper::start(Arc::downgrade(self), interval, batch)
                .map_err(OpenError::Thread)?;
            *self.sweeper.lock() = Some(sweeper);
        }
        Ok(())
    }

    /// Stops the sweeper and waits for its pass in progress, so that it no longer holds the
    /// engine. Called when the last `Store` handle goes, before the engine is dropped. On the
    /// writer thread (a closure dropped the last handle) it does not wait: the sweeper may be
    /// waiting for the writer.
    pub(crate) fn stop_sweeper(&self) {
        let sweeper = self.sweeper.lock().take();
        if let Some(sweeper) = sweeper {
            if std::thread::current().id() == self.writer_id {
                sweeper.detach();
            } else {
                drop(sweeper);
            }
        }
    }

    /// The lease, TTL and size limits the store was opened with.
    pub(crate) fn limits(&self) -> Limits {
        let config = &self.shared.config;
        Limits {
            lease: config.lease,
            ttl: config.ttl,
            max_response_bytes: config.max_response_bytes,
            max_checkpoint_bytes: config.max_checkpoint_bytes,
        }
    }
}

/// Every step of opening that writes the file: its tables and metadata (a restore's window
/// stamped at its first open), the log replayed into it, an older format moved to this one,
/// and the partitions read back.
fn prepare(
    storage: &Storage,
    config: &Config,
    registry: &Registry,
    db: &redb::Database,
) -> Result<
    (
        recovery::catch_up::CaughtUp,
        Partitions,
        Option<crate::model::restore::RestoreMark>,
    ),
    OpenError,
> {
    recovery::guarded(storage, || {
        tables::meta::set_up(db, registry, &storage.db_path())
    })?;
    // Before anything is replayed or served: the window of a restored store starts at its
    // first open, durably, so a crash or a reopen does not restart it.
    let restored = recovery::guarded(storage, || {
        tables::restore_mark::start_window(
            db,
            config.clock.now(),
            config.restore.length(config.ttl),
        )
    })?;
    // Replay whatever the log holds past the checkpoint, in either durability mode: a store
    // last opened with the log must not lose it when reopened without.
    let caught_up = recovery::guarded(storage, || {
        recovery::catch_up::catch_up(db, registry, storage, config, None)
    })?;
    log_opened(&caught_up.report);
    // A store of an older format is moved to this one now that its log is in redb.
    let caught_up = recovery::guarded(storage, || {
        recovery::migrate::if_needed(db, config, caught_up)
    })?;
    let partitions = recovery::guarded(storage, || recovery::partitions::open(db, config))?;
    Ok((caught_up, partitions, restored))
}

/// Says what opening found in the log.
fn log_opened(report: &RecoveryReport) {
    tracing::info!(
        frames_replayed = report.frames_replayed,
        bytes_replayed = report.bytes_replayed,
        bytes_dropped = report.bytes_dropped,
        recovery_ms = report.duration.as_millis() as u64,
        "idemstore opened"
    );
    if let Some((segment, offset)) = &report.torn_tail {
        tracing::warn!(
            segment,
            offset,
            bytes = report.bytes_dropped,
            "dropped a torn frame at the end of the log (it was never acknowledged)"
        );
    }
}

/// Warns about (or refuses) an existing store that other users may read.
fn check_permissions(storage: &Storage, config: &Config) -> Result<(), OpenError> {
    let loose = storage
        .loose_permissions()
        .map_err(|source| OpenError::Io {
            path: storage.db_path(),
            source,
        })?;
    if loose.is_empty() {
        return Ok(());
    }
    if config.loose_permissions == crate::model::config::LoosePermissions::Refuse {
        return Err(OpenError::LoosePermissions { files: loose });
    }
    for file in &loose {
        tracing::warn!(
            path = %file.path.display(),
            mode = format!("{:o}", file.mode),
            "a file of the store is readable by other users: stored responses may leak; chmod 700 the directories and 600 the files"
        );
    }
    Ok(())
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The sweeper first: it must not start a pass on a closing store.
        drop(self.sweeper.lock().take());
        // The open partition gets its row, so the next open need not read it whole (its
        // start-up then reads rows only). Best effort: a store that cannot write (poisoned,
        // a full disk), or that is dropped on its own writer, leaves it to be read whole.
        if std::thread::current().id() != self.writer_id
            && self.shared.poison.check().is_ok()
            && self.shared.partitions.open_one().is_some()
        {
            let _ = self.run(requests::seal_open());
        }
        // Closing the queue stops the writer once it has answered everything queued.
        self.queue = None;
        // Waiting for it makes drop-then-reopen work: the file is closed when drop returns. The
        // last handle can be dropped on the writer itself (inside a closure), which must not
        // wait for itself; it exits on its own right after.
        if std::thread::current().id() != self.writer_id
            && let Some(writer) = self.writer.take()
        {
            let _ = writer.join();
        }
    }
}

#[cfg(test)]
mod tests;
