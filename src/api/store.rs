//! The store handle: `begin`, plain writes and reads, maintenance. A facade over the engine: it
//! builds requests, binds granted claims to itself, and maps answers to errors.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::api::builder::Builder;
use crate::api::claim::Begin;
use crate::api::claim::Claim;
use crate::engine::{Engine, ForgetRefusal, Held, ReadTx, Tables, Tx, UserFailure, request};
use crate::error::{
    BackupError, BoxError, CompactError, ExecuteError, ForgetError, OpenError, StoreError,
    WriteError,
};
use crate::model::config::Config;
use crate::model::execution::Execution;
use crate::model::fingerprint::Fingerprint;
use crate::model::limits::Limits;
use crate::model::maintenance::{Abandoned, BackedUp, Compacted, Evicted, Forget};
use crate::model::record::Record;
use crate::model::response::Response;
use crate::model::scope::Scope;
use crate::model::stats::Stats;
use crate::storage::Storage;
use crate::wal::RecoveryReport;
use crate::wal::ship::ShipOptions;

/// An open idempotency store. Cheap to clone; every clone is the same store.
///
/// The store is closed when the last clone and the last [`Claim`] are dropped; drop waits for
/// the background sweeper and the writer to finish what they were doing, so the directory can
/// be reopened right after.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// What every clone of a [`Store`] shares. Its drop stops the sweeper before the engine goes:
/// the sweeper holds the engine while it evicts, and a store whose last handle is dropped must
/// close its file before `drop` returns.
struct Inner {
    engine: Arc<Engine>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.engine.stop_sweeper();
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Settings for opening a store.
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// Opens (or creates) a store in `dir` with default settings and no business tables.
    ///
    /// # Errors
    /// See [`Builder::open`].
    pub fn open(dir: impl AsRef<Path>) -> Result<Store, OpenError> {
        Builder::new().open(dir)
    }

    pub(crate) fn open_with(
        storage: Storage,
        config: Config,
        tables: Tables,
        shipping: Option<ShipOptions>,
    ) -> Result<Store, OpenError> {
        let engine = Engine::open(storage, config, tables, shipping).inspect_err(|e| {
            tracing::error!(error = %e, "idemstore could not open");
        })?;
        Ok(Store {
            inner: Arc::new(Inner { engine }),
        })
    }

    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.inner.engine
    }

    /// The lease, TTL and size limits the store was opened with.
    pub fn limits(&self) -> Limits {
        self.engine().limits()
    }

    /// Decides, atomically, what to do with a request for `scope` (the table in the crate
    /// docs). Only a claim or a take-over writes; every other outcome is answered from a read
    /// transaction when possible and never waits for a sync.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails or the store is poisoned; nothing was claimed.
    pub fn begin(&self, scope: &Scope, fingerprint: Fingerprint) -> Result<Begin, StoreError> {
        let begun = self.engine().begin(scope, fingerprint)?;
        Ok(self.bind(scope, fingerprint, begun))
    }

    /// A claim the engine granted, bound to this store.
    pub(crate) fn bind(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        begun: Begin<Held>,
    ) -> Begin {
        begun.map_claim(|held| Claim::new(self.clone(), scope.clone(), fingerprint, held))
    }

    /// Like [`Store::begin`], but when the scope is held by a live claim *of this process*,
    /// waits (up to `max_wait`) for that claim to finish instead of answering `InProgress`:
    /// then it answers `Replay` if the holder committed, or `Claimed` if it released (to one of
    /// the waiters; the others go on waiting for that one). After `max_wait`, or when no claim
    /// of this process holds the scope (a lease left by a crashed process), it answers as
    /// `begin` does. Waiting is on a notification from the claim itself: no polling.
    ///
    /// # Errors
    /// As [`Store::begin`].
    pub fn begin_or_wait(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        max_wait: Duration,
    ) -> Result<Begin, StoreError> {
        let begun = self.engine().begin_or_wait(scope, fingerprint, max_wait)?;
        Ok(self.bind(scope, fingerprint, begun))
    }

    /// Claims and commits in one step, for work that touches nothing outside this store: the
    /// closure runs on the writer, inside the transaction that stores its response as the
    /// completed record, so the pair costs one log frame and one sync instead of two.
    ///
    /// A duplicate gets [`Execution::Replay`], [`Execution::InProgress`] (a two-phase
    /// claim holds the key), [`Execution::Mismatch`] or [`Execution::Expired`], exactly as
    /// [`Store::begin`] would answer; the closure then does not run. No in-progress record is
    /// ever stored: if the process dies, or the closure fails, nothing of the request was
    /// written, and the retry runs it again.
    ///
    /// **Not for work with an external side effect.** A payment call, an email, a message
    /// sent from inside the closure would not be covered: there is no claim while it runs, so a
    /// crash before the commit forgets that it happened and the retry does it again. Use
    /// [`Store::begin`] and [`Claim::commit`](crate::Claim::commit) for that. The closure runs
    /// on the writer thread, as a commit closure does (see `docs/design.md`, "What a closure
    /// must not do").
    ///
    /// # Errors
    /// [`ExecuteError`]: the closure failed or panicked, its response was refused, or storage
    /// failed. In every case nothing of the request was written and the key is not held.
    pub fn execute<F>(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        work: F,
    ) -> Result<Execution, ExecuteError>
    where
        F: FnOnce(&mut Tx<'_>) -> Result<Response, BoxError> + Send + 'static,
    {
        let begun = self.engine().execute(scope, fingerprint, Box::new(work))?;
        Ok(Execution::from_begin(begun))
    }

    /// The record of `scope` as `begin` sees it now: `None` if absent or past its TTL (and
    /// past its tombstone, if tombstones are on), a `Tombstone` if past its TTL but within the
    /// tombstone TTL, whether or not eviction has run yet.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails, the record is corrupt, or the store is poisoned.
    pub fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        self.engine().get(scope)
    }

    /// Runs a business transaction that has no idempotency key, through the same writer and
    /// group commit as claims. Durable when it returns `Ok`; on error nothing of it was kept.
    ///
    /// # Errors
    /// See [`WriteError`].
    pub fn write<T, F>(&self, work: F) -> Result<T, WriteError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Tx<'_>) -> Result<T, BoxError> + Send + 'static,
    {
        written(self.engine().run(request::write(Box::new(work)))?)
    }

    /// Removes a scope's record, for an operator: an abandoned in-progress one by its fence
    /// (after finding out downstream that its attempt did nothing), or a completed one by force
    /// (so that the key can be used for a new request). Every removal is logged as an audit
    /// line (`idemstore::audit`, warning level) with the scope, the record's state and fence.
    /// Durable when it returns.
    ///
    /// # Errors
    /// See [`ForgetError`].
    pub fn forget(&self, scope: &Scope, how: Forget) -> Result<Record, ForgetError> {
        let answer = self.engine().run(request::forget(scope.clone(), how))?;
        let record = answer.map_err(|refusal| match refusal {
            ForgetRefusal::Absent => ForgetError::Absent {
                scope: scope.clone(),
            },
            ForgetRefusal::Stale(reason) => ForgetError::Stale(crate::StaleClaim {
                scope: scope.clone(),
                fence: match how {
                    Forget::Fence(fence) => fence,
                    Forget::Completed => 0,
                },
                reason,
            }),
            ForgetRefusal::InProgress { fence } => ForgetError::InProgress {
                scope: scope.clone(),
                fence,
            },
            ForgetRefusal::Store(e) => e.into(),
        })?;
        tracing::warn!(
            target: "idemstore::audit",
            tenant = scope.tenant(),
            operation = scope.operation(),
            key = scope.key(),
            fence = record.fence,
            attempt = record.attempt,
            state = record.state.name(),
            ?how,
            "forgot a record"
        );
        Ok(record)
    }

    /// A read-only snapshot for reading business tables.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails or the store is poisoned.
    pub fn read(&self) -> Result<ReadTx, StoreError> {
        self.engine().read()
    }

    /// Removes up to `limit` records that are gone, oldest first. Records are removed with
    /// their partition, once every record in it is gone (past its TTL and any tombstone time),
    /// in key order, never by a search: a record is kept up to an eighth of the TTL past its
    /// time (it answers nothing meanwhile). When tombstones are kept, the completed records of
    /// a partition whose TTLs have all passed are turned into tombstones too (their responses
    /// removed), and counted as removed. Runs through the writer like any write. In-progress
    /// records are never evicted.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails or the store is poisoned.
    pub fn evict_expired(&self, limit: usize) -> Result<Evicted, StoreError> {
        self.engine().evict(limit)
    }

    /// The store's state and activity: records by state (from the indexes, in constant time),
    /// the log, its health, and counters since open. For monitoring, it never waits for the
    /// writer (a stats endpoint must not hang behind a busy one): the records by state are as
    /// of the last publish of acknowledged writes to redb, a few milliseconds behind at most
    /// under load. [`Store::exact_stats`] is exact (it asks the writer to publish first).
    ///
    /// It answers while the store is poisoned too ([`Stats::poisoned`] says why); only while
    /// the file itself cannot be read are the records by state missing (zero).
    ///
    /// # Errors
    /// [`StoreError`] if a record the stats read is corrupt.
    pub fn stats(&self) -> Result<Stats, StoreError> {
        self.engine().stats()
    }

    /// [`Store::stats`] with the records by state exact: everything acknowledged is counted.
    /// Waits for the writer to publish what it has made durable.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails, a record is corrupt, or the store is poisoned.
    pub fn exact_stats(&self) -> Result<Stats, StoreError> {
        self.engine().exact_stats()
    }

    /// In-progress records whose lease has expired, oldest lease first, at most `limit`:
    /// work that a crashed or stuck attempt left unfinished. Read through the lease index (never
    /// a scan of the records), from a snapshot that includes every acknowledged write.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails, a record is corrupt, or the store is poisoned.
    pub fn abandoned(&self, limit: usize) -> Result<Vec<Abandoned>, StoreError> {
        self.engine().abandoned(limit)
    }

    /// What the last recovery found in the write-ahead log (at open, or in place after a
    /// failure): frames replayed, a torn tail dropped, time.
    pub fn recovery_report(&self) -> RecoveryReport {
        self.engine().recovery()
    }

    /// Recovers the store in place, as dropping it and opening the directory again would: the
    /// redb file is closed and reopened, and the log past the last checkpoint is replayed into
    /// it. Every acknowledged write is kept; requests wait meanwhile.
    ///
    /// A store recovers on its own after a failure (see
    /// [`Builder::self_heal`](crate::Builder::self_heal)); this is for an operator or a
    /// supervisor that wants it now, for example after freeing disk space, or with self-heal
    /// off. It works on a poisoned store.
    ///
    /// # Errors
    /// [`StoreError::Poisoned`] if recovering failed (the store stays poisoned: writes are
    /// refused, and it tries again as `self_heal` says).
    pub fn reopen(&self) -> Result<RecoveryReport, StoreError> {
        self.engine().reopen()
    }

    /// `Ok` while the store accepts writes; the reason it refuses them otherwise (it is
    /// poisoned and recovering). Cheap: for health checks and load shedding.
    ///
    /// # Errors
    /// [`StoreError::Poisoned`] while writes are refused.
    pub fn writable(&self) -> Result<(), StoreError> {
        self.engine().writable()
    }

    /// Checkpoints now: makes everything acknowledged durable in redb itself and lets the log
    /// reuse its segments. Happens on its own every `checkpoint_bytes` or
    /// `checkpoint_interval`, and when the store closes; call it before copying the database
    /// file, for example. A no-op in `Durability::Redb` mode.
    ///
    /// # Errors
    /// [`StoreError`] if the checkpoint fails (the store is then poisoned; the log still holds
    /// everything, and a reopen replays it).
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.engine().run(request::checkpoint_log())
    }

    /// Rewrites the database file to give back the space of deleted and overwritten data
    /// (after evicting many records, say). Runs on the writer between groups, after a
    /// checkpoint; requests wait meanwhile. Needs every read snapshot (`Store::read`) dropped.
    ///
    /// # Errors
    /// [`CompactError::SnapshotOpen`] while a snapshot is open; storage errors.
    pub fn compact(&self) -> Result<Compacted, CompactError> {
        self.engine().compact()
    }

    /// Copies the store, while it serves, into `dest`, a new store directory: its records, its
    /// business tables and its outbox, from one snapshot that holds every write acknowledged
    /// before this call (a write acknowledged while it runs may or may not be in it). The copy
    /// opens with [`Store::builder`] like any store, with the same tables registered, in
    /// either durability mode, and passes `idemstore verify`.
    ///
    /// The tables are copied row by row from a read snapshot on the calling thread, never as
    /// the file's bytes, so writers are not stopped: a backup costs the caller's thread, a
    /// read of every table, and disk space for a compacted copy. While it runs the snapshot is
    /// held, as by [`Store::read`]: [`Store::compact`] is refused meanwhile, and the file may
    /// grow by what is overwritten. The copy is written into a directory beside `dest`
    /// (`.NAME.backup-PID-N`), synced, and renamed to `dest`, so `dest` never holds part of a
    /// copy; a crash can leave that directory behind, to remove by hand. Its files are made
    /// readable by this user only, as the store's are; missing parents of `dest` are made.
    ///
    /// The copy is marked as a restore that may lag ([`Guarantee::MayLag`](crate::Guarantee)):
    /// this store goes on acknowledging writes the copy lacks, so when the copy is opened in
    /// its place, a retry of one of them would find no key there. For
    /// [`Builder::restore_window`](crate::Builder::restore_window) from the copy's first open
    /// (the TTL by default), a key it has no live record of is answered
    /// [`Begin::Recovered`](crate::Begin::Recovered) with
    /// [`Recovery::Restored`](crate::Recovery::Restored) instead of `Claimed`, and the
    /// handler checks downstream with the claim's downstream key, the one this store's attempt
    /// used. [`Stats::restore_window`](crate::Stats) shows the window.
    ///
    /// # Errors
    /// [`BackupError`]: `dest` exists and is not an empty directory; the store's file holds a
    /// table the store did not register (every business table must be, with
    /// [`Builder::table`]); writing the copy failed; or the store could not take its snapshot
    /// (poisoned, closed). Nothing is then left at `dest`.
    pub fn backup(&self, dest: impl AsRef<Path>) -> Result<BackedUp, BackupError> {
        self.engine().backup(dest.as_ref())
    }
}

/// A keyless write's answer as the caller sees it.
pub(crate) fn written<T>(answer: Result<T, UserFailure>) -> Result<T, WriteError> {
    answer.map_err(|failure| match failure {
        UserFailure::Aborted(e) => WriteError::Aborted(e),
        UserFailure::Panicked(message) => WriteError::Panicked { message },
    })
}
