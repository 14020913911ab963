//! The storage engine: the redb file, the table registry, and the writer thread.
//!
//! The engine owns every write. Callers hand it jobs; reads that need no write use redb read
//! transactions directly and never wait for the writer. It must never answer a job before the
//! job's group is durable.

mod backoff;
#[cfg(feature = "http")]
pub(crate) use backoff::random_fraction;
mod catch_up;
pub(crate) mod context;
pub(crate) mod counters;
mod database;
pub(crate) mod job;
pub(crate) mod lifecycle;
mod meta;
pub(crate) mod open_tables;
mod overlay;
pub(crate) mod poison;
pub(crate) mod registry;
mod replay;
pub(crate) mod sweeper;
pub(crate) mod tables;
pub(crate) mod watchers;
pub(crate) mod write_set;
mod writer;

use std::sync::Arc;

use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::{JoinHandle, ThreadId};

use redb::{Database, ReadableDatabase, TableDefinition};

use crate::config::Config;
use crate::error::{OpenError, StoreError};
use crate::record::Record;
use crate::scope::Scope;
use crate::storage::Storage;
use crate::wal::RecoveryReport;

use self::context::Needs;
use self::counters::Counters;
use self::database::DbSlot;
use self::job::{ExclusiveTask, Job, Keep, ReopenTask, Task, Work};
use self::overlay::{Overlaid, Overlay};
use self::poison::Poison;
use self::registry::Registry;
use self::tables::{InternalTables, RECORDS};
use self::writer::Writer;

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
    /// Records acknowledged but not yet published to redb.
    pub(crate) overlay: Arc<Overlay>,
    /// Claims held and callers waiting, per scope, in this process.
    pub(crate) watchers: Arc<watchers::Watchers>,
    /// What the last recovery (at open, or in place) found in the log.
    pub(crate) recovery: Arc<Mutex<RecoveryReport>>,
}

#[derive(Debug)]
pub(crate) struct Engine {
    shared: Shared,
    storage: Storage,
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
        check_permissions(&storage, &config)?;
        let db = storage.database()?;
        meta::set_up(&db, &registry, &storage.db_path())?;
        // Replay whatever the log holds past the checkpoint, in either durability mode: a store
        // last opened with the log must not lose it when reopened without.
        let caught_up = catch_up::catch_up(&db, &registry, &storage, &config)?;

        let registry = Arc::new(registry);
        let config = Arc::new(config);
        let poison = Arc::new(Poison::default());
        let counters = Arc::new(Counters::default());
        let overlay = Arc::new(Overlay::default());
        let (queue, receiver) = sync_channel(config.max_batch.saturating_mul(QUEUE_PER_BATCH));
        let shared = Shared {
            db: Arc::new(DbSlot::new(db)),
            registry,
            tables,
            config,
            poison,
            counters,
            overlay,
            watchers: Arc::new(watchers::Watchers::default()),
            recovery: Arc::new(Mutex::new(caught_up.report)),
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

    /// The store's files and directories that other users may read.
    pub(crate) fn loose_permissions(&self) -> std::io::Result<Vec<crate::storage::LooseFile>> {
        self.storage.loose_permissions()
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

    /// What the last recovery (at open, or in place) found in the log.
    pub(crate) fn recovery(&self) -> RecoveryReport {
        self.shared.recovery.lock().clone()
    }

    /// Recovers in place, as a reopen of the directory would (see `writer::restore`): after
    /// any failure, even while poisoned.
    pub(crate) fn reopen(&self) -> Result<RecoveryReport, StoreError> {
        let (answer, receiver) = sync_channel(1);
        self.send(ReopenTask::boxed(move |result| {
            let _ = answer.send(result);
        }))?;
        receiver.recv().map_err(|_| self.stopped())?
    }

    /// Whether writes are refused now, and why: the poison, if any.
    pub(crate) fn writable(&self) -> Result<(), StoreError> {
        self.shared.poison.check()
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

    /// Queues a job for the writer. A poisoned store's writer refuses it when it comes to it,
    /// not here: a request sent right after a failure is then answered by a store that has
    /// already recovered in place, rather than refused in a race with the recovery.
    fn submit(&self, job: Box<dyn Job>) -> Result<(), StoreError> {
        self.send(job)
    }

    /// Queues a job for the writer.
    fn send(&self, job: Box<dyn Job>) -> Result<(), StoreError> {
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
        if self.shared.overlay.is_unpublished() {
            self.call(|_, ctx| {
                ctx.need(Needs::Published);
                (Keep::Nothing, ())
            })?;
        }
        Ok(self.shared.db.read(&self.shared.poison)?.begin_read()?)
    }

    /// Runs `read` on a redb snapshot of what is published, without asking the writer for
    /// anything: at most one epoch behind the acknowledged state. For monitoring. The file
    /// stays locked for reading meanwhile, so a compaction waits for it to finish rather than
    /// fail on its snapshot.
    pub(crate) fn with_published<T>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let db = self.shared.db.read(&self.shared.poison)?;
        let txn = db.begin_read()?;
        read(&txn)
    }

    /// Runs `read` on a snapshot that includes every acknowledged write (see
    /// [`Engine::snapshot`]), holding the file as [`Engine::with_published`] does.
    pub(crate) fn with_snapshot<T>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if self.shared.overlay.is_unpublished() {
            self.call(|_, ctx| {
                ctx.need(Needs::Published);
                (Keep::Nothing, ())
            })?;
        }
        self.with_published(read)
    }

    /// The stored record of a scope (expired records included): from the overlay if a durable
    /// group not yet published wrote it, else from a redb read transaction. Answered while the
    /// store is poisoned too: reads never depend on the writer.
    pub(crate) fn read_record(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        // The overlay first, then redb: the writer publishes (commits) before it clears the
        // overlay, so a record missing here is in any snapshot begun after this lookup.
        if let Some(found) = self.overlaid(scope) {
            return found;
        }
        record_in(&*self.shared.db.read(&self.shared.poison)?, scope)
    }

    /// [`Engine::read_record`] if it can run without waiting: `None` while the file is held
    /// exclusively (by a compaction or a reopen). For async callers, whose runtime worker must
    /// not wait that long; a read of cached pages takes microseconds.
    #[cfg(feature = "tokio")]
    pub(crate) fn try_read_record(
        &self,
        scope: &Scope,
    ) -> Option<Result<Option<Record>, StoreError>> {
        if let Some(found) = self.overlaid(scope) {
            return Some(found);
        }
        Some(match self.shared.db.try_read(&self.shared.poison)? {
            Ok(db) => record_in(&db, scope),
            Err(e) => Err(e),
        })
    }

    /// Holds the file as a compaction does, for tests of what waits on it.
    #[cfg(all(test, feature = "tokio"))]
    pub(crate) fn hold_exclusively(&self) -> parking_lot::RwLockWriteGuard<'_, Option<Database>> {
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
    if config.loose_permissions == crate::config::LoosePermissions::Refuse {
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

impl Drop for Engine {
    fn drop(&mut self) {
        // The sweeper first: it must not start a pass on a closing store.
        drop(self.sweeper.lock().take());
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
mod tests {
    use crate::clock::{ManualClock, Timestamp};
    use crate::config::{SelfHeal, Sweep};
    use crate::error::{BeginError, StoreError};
    use crate::{Begin, Fingerprint, Response, Scope, Store};

    /// While poisoned (here with self-heal off, so it stays so), a store answers everything
    /// that only reads: a replay, `get`, business reads, stats (which say why). Writes are
    /// refused with the cause. `reopen` brings it back.
    #[test]
    fn a_poisoned_store_answers_reads_refuses_writes_and_comes_back_on_reopen()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = Store::builder()
            .clock(ManualClock::new(Timestamp::from_millis(1_000_000)))
            .sweep(Sweep::Off)
            .self_heal(SelfHeal::Off)
            .open(dir.path().join("idem"))?;
        let scope = Scope::new("t", "op", "done")?;
        let fingerprint = Fingerprint::of_bytes(b"request");
        let Begin::Claimed(claim) = store.begin(&scope, fingerprint)? else {
            return Err("a new key is claimed".into());
        };
        claim.commit(|_| Ok(Response::new(201, "stored")))?;

        let cause = StoreError::unknown("syncing the log", &"an injected failure");
        store.engine().shared.poison.set(&cause);
        assert!(
            matches!(store.begin(&scope, fingerprint)?, Begin::Replay(r) if r.body() == b"stored")
        );
        assert!(store.get(&scope)?.is_some());
        assert!(store.read().is_ok(), "business reads");
        let stats = store.stats()?;
        assert!(
            stats
                .poisoned
                .as_deref()
                .is_some_and(|c| c.contains("injected")),
            "{stats:?}"
        );
        let refused = store
            .begin(&Scope::new("t", "op", "new")?, fingerprint)
            .err()
            .ok_or("a poisoned store took a new claim")?;
        assert!(
            matches!(refused, BeginError::Store(StoreError::Poisoned { .. })),
            "{refused}"
        );
        assert!(store.writable().is_err());

        let report = store.reopen()?;
        assert_eq!(report.bytes_dropped, 0);
        assert!(store.writable().is_ok());
        assert!(matches!(
            store.begin(&Scope::new("t", "op", "new")?, fingerprint)?,
            Begin::Claimed(_)
        ));
        assert_eq!(store.stats()?.restores, 1);
        Ok(())
    }
}
