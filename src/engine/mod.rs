//! The storage engine: the redb file, the table registry, and the writer thread.
//!
//! The engine owns every write. Callers hand it jobs; reads that need no write use redb read
//! transactions directly and never wait for the writer. It must never answer a job before the
//! job's group is durable.

pub(crate) mod context;
pub(crate) mod counters;
pub(crate) mod job;
pub(crate) mod lifecycle;
pub(crate) mod poison;
pub(crate) mod registry;
pub(crate) mod tables;
pub(crate) mod write_set;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, sync_channel};
use std::thread::{JoinHandle, ThreadId};

use redb::{Database, DatabaseError, ReadableDatabase, ReadableTable, TableDefinition};

use crate::config::Config;
use crate::error::{OpenError, StoreError};
use crate::record::Record;
use crate::scope::Scope;
use crate::tx::Tx;

use self::context::Context;
use self::counters::Counters;
use self::job::{Job, Keep, Task};
use self::poison::Poison;
use self::registry::Registry;
use self::tables::{FORMAT_VERSION, InternalTables, META, META_FORMAT, META_NEXT_FENCE, RECORDS};
use self::writer::Writer;

/// The database file inside the store's directory.
pub(crate) const DB_FILE: &str = "idemstore.redb";

/// Queued requests per request the writer takes into a group: room for the next group to
/// gather while one is being synced, and back-pressure beyond it.
const QUEUE_PER_BATCH: usize = 4;

#[derive(Debug)]
pub(crate) struct Engine {
    db: Arc<Database>,
    registry: Arc<Registry>,
    tables: InternalTables,
    config: Arc<Config>,
    poison: Arc<Poison>,
    counters: Arc<Counters>,
    /// `None` only while dropping: closing it is what stops the writer.
    queue: Option<SyncSender<Box<dyn Job>>>,
    writer: Option<JoinHandle<()>>,
    writer_id: ThreadId,
}

impl Engine {
    pub(crate) fn open(
        dir: &Path,
        config: Config,
        registry: Registry,
        tables: InternalTables,
    ) -> Result<Engine, OpenError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| OpenError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(DB_FILE);
        let db = open_database(&path)?;
        let next_fence = set_up(&db, &registry)?;

        let db = Arc::new(db);
        let registry = Arc::new(registry);
        let config = Arc::new(config);
        let poison = Arc::new(Poison::default());
        let counters = Arc::new(Counters::default());
        let (queue, receiver) = sync_channel(config.max_batch.saturating_mul(QUEUE_PER_BATCH));
        let writer = Writer {
            db: db.clone(),
            registry: registry.clone(),
            tables,
            config: config.clone(),
            poison: poison.clone(),
            counters: counters.clone(),
            next_fence,
            queue: receiver,
        };
        let handle = std::thread::Builder::new()
            .name("idemstore-writer".into())
            .spawn(move || writer.run())
            .map_err(OpenError::Thread)?;
        Ok(Engine {
            db,
            registry,
            tables,
            config,
            poison,
            counters,
            queue: Some(queue),
            writer_id: handle.thread().id(),
            writer: Some(handle),
        })
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    pub(crate) fn tables(&self) -> InternalTables {
        self.tables
    }

    /// Runs `work` on the writer inside the next group and returns its answer once the group is
    /// durable.
    pub(crate) fn call<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Tx<'_>, &mut Context<'_>) -> (Keep, R) + Send + 'static,
    ) -> Result<R, StoreError> {
        let (answer, receiver) = sync_channel(1);
        self.submit(Task::boxed(work, move |result| {
            // The caller may have given up waiting; nobody is left to tell.
            let _ = answer.send(result);
        }))?;
        receiver.recv().map_err(|_| self.stopped())?
    }

    fn submit(&self, job: Box<dyn Job>) -> Result<(), StoreError> {
        self.poison.check()?;
        if std::thread::current().id() == self.writer_id {
            return Err(StoreError::Reentrant);
        }
        let queue = self.queue.as_ref().ok_or(StoreError::Closed)?;
        self.counters.queued.fetch_add(1, Ordering::Relaxed);
        queue.send(job).map_err(|_| {
            self.counters.queued.fetch_sub(1, Ordering::Relaxed);
            self.stopped()
        })
    }

    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The error for a writer that is gone: poisoned if it died, closed otherwise.
    fn stopped(&self) -> StoreError {
        self.poison.check().err().unwrap_or(StoreError::Closed)
    }

    pub(crate) fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        self.poison.check()?;
        Ok(self.db.begin_read()?)
    }

    /// The stored record of a scope, from a read transaction (expired records included).
    pub(crate) fn read_record(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let txn = self.begin_read()?;
        let table = txn.open_table(TableDefinition::<&[u8], &[u8]>::new(RECORDS))?;
        let Some(bytes) = table.get(scope.encode())? else {
            return Ok(None);
        };
        Record::decode(bytes.value())
            .map(Some)
            .map_err(|source| StoreError::CorruptRecord {
                scope: scope.to_string(),
                source,
            })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
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

fn open_database(path: &Path) -> Result<Database, OpenError> {
    Database::builder().create(path).map_err(|e| match e {
        DatabaseError::DatabaseAlreadyOpen => OpenError::AlreadyOpen {
            path: PathBuf::from(path),
        },
        source => OpenError::Database {
            path: PathBuf::from(path),
            source,
        },
    })
}

/// Creates every registered table, checks or writes the format version, and reads the fence
/// counter. Returns the next fence to hand out.
fn set_up(db: &Database, registry: &Registry) -> Result<u64, OpenError> {
    let setup = |e: redb::Error| OpenError::Setup(e);
    let txn = db.begin_write().map_err(|e| setup(e.into()))?;
    for table in registry.tables() {
        table.create(&txn).map_err(setup)?;
    }
    let next_fence = {
        let mut meta = txn
            .open_table(TableDefinition::<&[u8], &[u8]>::new(META))
            .map_err(|e| setup(e.into()))?;
        let format = meta
            .get(META_FORMAT)
            .map_err(|e| setup(e.into()))?
            .map(|v| read_u32(v.value()));
        match format {
            Some(Some(found)) if found == FORMAT_VERSION => {}
            Some(found) => {
                return Err(OpenError::UnsupportedFormat {
                    found: found.unwrap_or(u32::MAX),
                    supported: FORMAT_VERSION,
                });
            }
            None => {
                meta.insert(META_FORMAT, FORMAT_VERSION.to_le_bytes().as_slice())
                    .map_err(|e| setup(e.into()))?;
            }
        }
        meta.get(META_NEXT_FENCE)
            .map_err(|e| setup(e.into()))?
            .and_then(|v| read_u64(v.value()))
            .unwrap_or(1)
    };
    txn.commit().map_err(|e| setup(e.into()))?;
    Ok(next_fence)
}

fn read_u32(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

fn read_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}
