//! The storage engine: the redb file, the table registry, and the writer thread.
//!
//! The engine owns every write. Callers hand it jobs; reads that need no write use redb read
//! transactions directly and never wait for the writer. It must never answer a job before the
//! job's group is durable.

pub(crate) mod context;
pub(crate) mod counters;
pub(crate) mod job;
pub(crate) mod lifecycle;
mod log_thread;
mod meta;
pub(crate) mod open_tables;
mod overlay;
pub(crate) mod poison;
pub(crate) mod registry;
pub(crate) mod sweeper;
pub(crate) mod tables;
pub(crate) mod watchers;
pub(crate) mod write_set;
mod writer;

use std::sync::Arc;

use parking_lot::RwLock;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::{JoinHandle, ThreadId};
use std::time::Instant;

use redb::{Database, ReadableDatabase, TableDefinition};

use crate::config::{Config, Durability};
use crate::error::{OpenError, RecoveryError, StoreError};
use crate::record::Record;
use crate::scope::Scope;
use crate::storage::{LogDir, Storage};
use crate::wal::{self, Log, RecoveryReport};

use self::context::Needs;
use self::counters::Counters;
use self::job::{ExclusiveTask, Job, Keep, Task, Work};
use self::log_thread::LogThread;
use self::overlay::{Overlaid, Overlay};
use self::poison::Poison;
use self::registry::Registry;
use self::tables::{InternalTables, RECORDS};
use self::writer::Writer;

/// Queued requests per request the writer takes into a group: room for the next group to
/// gather while one is being synced, and back-pressure beyond it.
const QUEUE_PER_BATCH: usize = 4;

/// Frames replayed per redb transaction during recovery (committed without a sync; the final
/// checkpoint makes them durable together).
const REPLAY_FRAMES_PER_TXN: u64 = 4096;

/// What the engine's handle and its writer thread both hold.
#[derive(Debug, Clone)]
pub(crate) struct Shared {
    /// Read-locked only for the instant a transaction begins; write-locked by the writer
    /// for compaction, which needs the database to itself.
    pub(crate) db: Arc<RwLock<Database>>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) tables: InternalTables,
    pub(crate) config: Arc<Config>,
    pub(crate) poison: Arc<Poison>,
    pub(crate) counters: Arc<Counters>,
    /// Records acknowledged but not yet published to redb.
    pub(crate) overlay: Arc<Overlay>,
    /// Claims held and callers waiting, per scope, in this process.
    pub(crate) watchers: Arc<watchers::Watchers>,
}

#[derive(Debug)]
pub(crate) struct Engine {
    shared: Shared,
    storage: Storage,
    recovery: RecoveryReport,
    /// The background sweeper, once started (it needs the engine's `Arc`).
    sweeper: parking_lot::Mutex<Option<sweeper::Sweeper>>,
    /// `None` only while dropping: closing it is what stops the writer.
    queue: Option<SyncSender<Box<dyn Job>>>,
    writer: Option<JoinHandle<()>>,
    writer_id: ThreadId,
}

impl Engine {
    pub(crate) fn open(
        storage: Storage,
        config: Config,
        registry: Registry,
        tables: InternalTables,
    ) -> Result<Engine, OpenError> {
        let db = storage.database()?;
        let checkpoint = meta::set_up(&db, &registry, &storage.db_path())?.log_checkpoint;

        // Replay whatever the log holds past the checkpoint, in either durability mode: a store
        // last opened with the log must not lose it when reopened without.
        let log_dir = match config.durability {
            Durability::Wal => Some(storage.log_dir()?),
            Durability::Redb => storage.existing_log_dir()?,
        };
        let mut log_start = None;
        let mut recovery = RecoveryReport::default();
        if let Some(dir) = log_dir {
            let (report, start) =
                replay(&db, &registry, dir.as_ref(), &storage, &config, checkpoint)?;
            recovery = report;
            if config.durability == Durability::Wal {
                let log = Log::start(dir, start).map_err(|source| OpenError::Io {
                    path: storage.log_path(),
                    source,
                })?;
                log_start = Some(log);
            }
        }
        let next_fence = meta::load(&db)?.next_fence;

        let db = Arc::new(RwLock::new(db));
        let registry = Arc::new(registry);
        let config = Arc::new(config);
        let poison = Arc::new(Poison::default());
        let counters = Arc::new(Counters::default());
        let overlay = Arc::new(Overlay::default());
        let watchers = Arc::new(watchers::Watchers::default());
        let log_thread = match log_start {
            Some(log) => Some(
                LogThread::start(log, overlay.clone(), counters.clone(), poison.clone())
                    .map_err(OpenError::Thread)?,
            ),
            None => None,
        };
        let (queue, receiver) = sync_channel(config.max_batch.saturating_mul(QUEUE_PER_BATCH));
        let shared = Shared {
            db,
            registry,
            tables,
            config,
            poison,
            counters,
            overlay,
            watchers,
        };
        let writer = Writer::new(shared.clone(), next_fence, receiver, log_thread);
        let handle = std::thread::Builder::new()
            .name("idemstore-writer".into())
            .spawn(move || writer.run())
            .map_err(OpenError::Thread)?;
        Ok(Engine {
            shared,
            storage,
            recovery,
            sweeper: parking_lot::Mutex::new(None),
            queue: Some(queue),
            writer_id: handle.thread().id(),
            writer: Some(handle),
        })
    }

    /// Starts the sweeper, if the settings ask for one.
    pub(crate) fn start_sweeper(self: &Arc<Self>) -> Result<(), OpenError> {
        if let crate::config::Sweep::Every { interval, batch } = self.shared.config.sweep {
            let sweeper = sweeper::Sweeper::start(Arc::downgrade(self), interval, batch)
                .map_err(OpenError::Thread)?;
            *self.sweeper.lock() = Some(sweeper);
        }
        Ok(())
    }

    pub(crate) fn watchers(&self) -> &watchers::Watchers {
        &self.shared.watchers
    }

    pub(crate) fn config(&self) -> &Config {
        &self.shared.config
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.shared.registry
    }

    pub(crate) fn tables(&self) -> InternalTables {
        self.shared.tables
    }

    pub(crate) fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Runs `work` on the writer with the database to itself, after everything acknowledged
    /// so far is published and checkpointed.
    pub(crate) fn exclusive<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Database) -> R + Send + 'static,
    ) -> Result<R, StoreError> {
        let (answer, receiver) = sync_channel(1);
        self.submit(ExclusiveTask::boxed(work, move |result| {
            let _ = answer.send(result);
        }))?;
        receiver.recv().map_err(|_| self.stopped())?
    }

    /// Evicts up to `limit` expired records (the store's `evict_expired` and the sweeper), and
    /// counts what it removed.
    pub(crate) fn evict(&self, limit: usize) -> Result<lifecycle::Evicted, StoreError> {
        let evicted = self.call(move |tx, ctx| lifecycle::evict_expired(tx, ctx, limit))??;
        Counters::add(&self.shared.counters.evicted, evicted.removed as u64);
        Counters::add(
            &self.shared.counters.tombstones_removed,
            evicted.tombstones_removed as u64,
        );
        Ok(evicted)
    }

    /// The size of the database file, in bytes.
    pub(crate) fn db_len(&self) -> Result<u64, StoreError> {
        self.storage
            .db_len()
            .map_err(|e| StoreError::Redb(Arc::new(redb::StorageError::Io(e).into())))
    }

    /// Runs `work` on the writer inside the next group and returns its answer once the group is
    /// durable.
    pub(crate) fn call<R: Send + 'static>(&self, work: impl Work<R>) -> Result<R, StoreError> {
        let (answer, receiver) = sync_channel(1);
        self.submit(Task::boxed(work, move |result| {
            // The caller may have given up waiting; nobody is left to tell.
            let _ = answer.send(result);
        }))?;
        receiver.recv().map_err(|_| self.stopped())?
    }

    /// `call` for async callers: the writer answers through a oneshot, and a full queue is
    /// waited on from the blocking pool, so a runtime worker never blocks.
    #[cfg(feature = "tokio")]
    pub(crate) async fn call_async<R: Send + 'static>(
        &self,
        work: impl Work<R>,
    ) -> Result<R, StoreError> {
        let (answer, receiver) = tokio::sync::oneshot::channel();
        let job = Task::boxed(work, move |result| {
            let _ = answer.send(result);
        });
        self.shared.poison.check()?;
        let queue = self.queue.as_ref().ok_or(StoreError::Closed)?.clone();
        self.shared.counters.queued.fetch_add(1, Ordering::Relaxed);
        let sent = match queue.try_send(job) {
            Ok(()) => Ok(()),
            Err(std::sync::mpsc::TrySendError::Full(job)) => {
                tokio::task::spawn_blocking(move || queue.send(job).map_err(|_| ()))
                    .await
                    .unwrap_or(Err(()))
            }
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => Err(()),
        };
        if sent.is_err() {
            self.shared.counters.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(self.stopped());
        }
        receiver.await.map_err(|_| self.stopped())?
    }

    fn submit(&self, job: Box<dyn Job>) -> Result<(), StoreError> {
        self.shared.poison.check()?;
        if std::thread::current().id() == self.writer_id {
            return Err(StoreError::Reentrant);
        }
        let queue = self.queue.as_ref().ok_or(StoreError::Closed)?;
        self.shared.counters.queued.fetch_add(1, Ordering::Relaxed);
        queue.send(job).map_err(|_| {
            self.shared.counters.queued.fetch_sub(1, Ordering::Relaxed);
            self.stopped()
        })
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.shared.counters
    }

    /// The error for a writer that is gone: poisoned if it died, closed otherwise.
    fn stopped(&self) -> StoreError {
        self.shared
            .poison
            .check()
            .err()
            .unwrap_or(StoreError::Closed)
    }

    /// A redb snapshot that includes every acknowledged write: if durable groups are not yet
    /// published to redb, the writer publishes them first.
    pub(crate) fn snapshot(&self) -> Result<redb::ReadTransaction, StoreError> {
        self.shared.poison.check()?;
        if self.shared.overlay.is_unpublished() {
            self.call(|_, ctx| {
                ctx.need(Needs::Published);
                (Keep::Nothing, ())
            })?;
        }
        Ok(self.shared.db.read().begin_read()?)
    }

    /// A redb snapshot of what is published, without asking the writer for anything: at most
    /// one epoch behind the acknowledged state. For monitoring.
    pub(crate) fn published_snapshot(&self) -> Result<redb::ReadTransaction, StoreError> {
        self.shared.poison.check()?;
        Ok(self.shared.db.read().begin_read()?)
    }

    /// The stored record of a scope (expired records included): from the overlay if a durable
    /// group not yet published wrote it, else from a redb read transaction.
    pub(crate) fn read_record(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        self.shared.poison.check()?;
        // The overlay first, then redb: the writer publishes (commits) before it clears the
        // overlay, so a record missing here is in any snapshot begun after this lookup.
        if let Some(found) = self.overlaid(scope) {
            return found;
        }
        record_in(&self.shared.db.read(), scope)
    }

    /// [`Engine::read_record`] if it can run without waiting: `None` while the file is held
    /// exclusively (by a compaction). For async callers, whose runtime worker must not wait
    /// that long; a read of cached pages takes microseconds.
    #[cfg(feature = "tokio")]
    pub(crate) fn try_read_record(
        &self,
        scope: &Scope,
    ) -> Option<Result<Option<Record>, StoreError>> {
        if let Err(e) = self.shared.poison.check() {
            return Some(Err(e));
        }
        if let Some(found) = self.overlaid(scope) {
            return Some(found);
        }
        let db = self.shared.db.try_read()?;
        Some(record_in(&db, scope))
    }

    /// Holds the file as a compaction does, for tests of what waits on it.
    #[cfg(all(test, feature = "tokio"))]
    pub(crate) fn hold_exclusively(&self) -> parking_lot::RwLockWriteGuard<'_, Database> {
        self.shared.db.write()
    }

    /// The scope's record as a durable group not yet published left it, if one did.
    fn overlaid(&self, scope: &Scope) -> Option<Result<Option<Record>, StoreError>> {
        match self.shared.overlay.lookup(scope.encode()) {
            Overlaid::Put(bytes) => Some(decode_record(scope, &bytes)),
            Overlaid::Deleted => Some(Ok(None)),
            Overlaid::Absent => None,
        }
    }
}

/// The scope's record in redb's published state.
fn record_in(db: &Database, scope: &Scope) -> Result<Option<Record>, StoreError> {
    let txn = db.begin_read()?;
    let table = txn.open_table(TableDefinition::<&[u8], &[u8]>::new(RECORDS))?;
    match table.get(scope.encode())? {
        Some(bytes) => decode_record(scope, bytes.value()),
        None => Ok(None),
    }
}

fn decode_record(scope: &Scope, bytes: &[u8]) -> Result<Option<Record>, StoreError> {
    Record::decode(bytes)
        .map(Some)
        .map_err(|source| StoreError::CorruptRecord {
            scope: scope.to_string(),
            source,
        })
}

/// Replays the log past `checkpoint` into redb, then makes redb durable with quick-repair and
/// records the new checkpoint, so the log's files may be reused. Returns the report and where
/// the next log starts.
fn replay(
    db: &Database,
    registry: &Registry,
    dir: &dyn LogDir,
    storage: &Storage,
    config: &Config,
    checkpoint: u64,
) -> Result<(RecoveryReport, wal::LogStart), OpenError> {
    let path = storage.log_path();
    let apply_error = |e: redb::Error| OpenError::Recovery(RecoveryError::Apply(e));
    let begin = || -> Result<redb::WriteTransaction, redb::Error> {
        let mut txn = db.begin_write()?;
        txn.set_durability(redb::Durability::None)?;
        Ok(txn)
    };
    let mut txn = Some(begin().map_err(apply_error)?);
    let mut in_txn = 0u64;
    let recovered = wal::recover(dir, &path, checkpoint, config.segment_bytes, &mut |frame| {
        let current = match txn.as_ref() {
            Some(current) => current,
            None => txn.insert(begin().map_err(RecoveryError::Apply)?),
        };
        wal::replay_frame(registry, current, frame, &path)?;
        in_txn += 1;
        if in_txn == REPLAY_FRAMES_PER_TXN {
            if let Some(full) = txn.take() {
                full.commit().map_err(|e| RecoveryError::Apply(e.into()))?;
            }
            in_txn = 0;
        }
        Ok(())
    })?;
    let mut txn = match txn {
        Some(txn) => txn,
        None => begin().map_err(apply_error)?,
    };
    if recovered.last_seq == checkpoint {
        txn.abort().map_err(|e| apply_error(e.into()))?;
    } else {
        let started = Instant::now();
        txn.set_durability(redb::Durability::Immediate)
            .map_err(|e| apply_error(e.into()))?;
        txn.set_quick_repair(true);
        meta::set_log_checkpoint(&txn, recovered.last_seq).map_err(apply_error)?;
        txn.commit().map_err(|e| apply_error(e.into()))?;
        let mut report = recovered.report;
        report.duration += started.elapsed();
        return Ok((report, recovered.start));
    }
    Ok((recovered.report, recovered.start))
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The sweeper first: it must not start a pass on a closing store.
        drop(self.sweeper.lock().take());
        // Closing the queue stops the writer once it has answered everything queued.
        self.queue = None;
        // Waiting for it makes drop-then-reopen work: the file is closed when drop returns. The
        // last handle can be dropped on the writer itself (inside a closure), which must not
        // wait for itself; it exits on its own right after.
        if std::thread::current().id() != self.writer_id {
            if let Some(writer) = self.writer.take() {
                let _ = writer.join();
            }
        }
    }
}
