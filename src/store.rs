//! The store handle: `begin`, plain writes and reads, eviction.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest `begin_or_wait` waits when asked for more than the clock can represent.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

use crate::builder::Builder;
use crate::claim::{Begin, Claim};
use crate::clock::Timestamp;
use crate::config::Config;
use crate::decision::{Decision, decide};
use crate::engine::Engine;
use crate::engine::context::Needs;

use crate::engine::job::Keep;
use crate::engine::lifecycle::{self, BeginAnswer, Evicted, Forget, ForgetRefusal, UserFailure};
use crate::engine::registry::Registry;
use crate::engine::tables::InternalTables;
use crate::engine::tables::{LEASES, RECORDS, index_bound_after, split_index_key};
use crate::error::{
    BeginError, BoxError, CompactError, ForgetError, OpenError, StoreError, WriteError,
};
use crate::fingerprint::Fingerprint;
use crate::read::ReadTx;
use crate::record::{Record, RecordState, Visibility};
use crate::scope::Scope;
use crate::stats::Stats;
use crate::storage::Storage;
use crate::tx::Tx;
use crate::wal::RecoveryReport;
use redb::{ReadableTable, TableDefinition};

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

/// How many entries the store's tables hold (O(1) to read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Records, in progress or completed (expired but not yet evicted ones included).
    pub records: u64,
    /// Completed records waiting in the expiry index.
    pub expiry_entries: u64,
    /// In-progress records in the lease index.
    pub lease_entries: u64,
    /// Tombstones waiting in the tombstone index.
    pub tombstone_entries: u64,
}

/// In-progress work whose lease expired: its outcome is unknown, and no attempt holds it.
///
/// A reconciler drives it to completion: [`Store::begin`] with the same fingerprint takes it
/// over as [`Begin::Recovered`], with the attempt count and the last checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Abandoned {
    /// The scope.
    pub scope: Scope,
    /// The fingerprint of the request that claimed it (pass it to `begin` to take it over).
    pub fingerprint: Fingerprint,
    /// The last holder's fence.
    pub fence: u64,
    /// Attempts so far.
    pub attempt: u32,
    /// When it was first claimed.
    pub created_at: Timestamp,
    /// When the last lease ended.
    pub lease_until: Timestamp,
    /// The last checkpoint stored, if any.
    pub checkpoint: Option<Vec<u8>>,
}

/// What [`Store::compact`] did to the database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// The file's size before, in bytes.
    pub bytes_before: u64,
    /// The file's size after, in bytes.
    pub bytes_after: u64,
}

impl Compacted {
    /// Bytes given back to the file system.
    pub fn reclaimed(&self) -> u64 {
        self.bytes_before.saturating_sub(self.bytes_after)
    }
}

/// The settings a store was opened with that callers size their work by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// How long a claim holds its key before another attempt may take it over.
    pub lease: Duration,
    /// How long a completed record answers retries.
    pub ttl: Duration,
    /// The largest encoded response a commit may store.
    pub max_response_bytes: usize,
    /// The largest checkpoint a claim may store.
    pub max_checkpoint_bytes: usize,
}

/// Where `begin`'s read path left a request.
pub(crate) enum ReadPath {
    /// Answered without writing.
    Answered(Begin),
    /// A claim or take-over: the writer must decide.
    Writer,
}

/// The span every `begin` runs in.
pub(crate) fn begin_span(scope: &Scope) -> tracing::Span {
    tracing::debug_span!(
        "idemstore.begin",
        tenant = scope.tenant(),
        operation = scope.operation(),
        key = scope.key(),
    )
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
        registry: Registry,
        tables: InternalTables,
    ) -> Result<Store, OpenError> {
        let engine = Arc::new(Engine::open(storage, config, registry, tables).inspect_err(
            |e| {
                tracing::error!(error = %e, "idemstore could not open");
            },
        )?);
        let report = engine.recovery();
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
        engine.start_sweeper()?;
        Ok(Store {
            inner: Arc::new(Inner { engine }),
        })
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The lease, TTL and size limits the store was opened with.
    pub fn limits(&self) -> Limits {
        let config = self.engine().config();
        Limits {
            lease: config.lease,
            ttl: config.ttl,
            max_response_bytes: config.max_response_bytes,
            max_checkpoint_bytes: config.max_checkpoint_bytes,
        }
    }

    /// Decides, atomically, what to do with a request for `scope` (the table in the crate
    /// docs). Only a claim or a take-over writes; every other outcome is answered from a read
    /// transaction when possible and never waits for a sync.
    ///
    /// # Errors
    /// [`BeginError`] if storage fails or the store is poisoned; nothing was claimed.
    pub fn begin(&self, scope: &Scope, fingerprint: Fingerprint) -> Result<Begin, BeginError> {
        let span = begin_span(scope);
        let _entered = span.enter();
        let answer = match self.read_path(scope, fingerprint) {
            Ok(ReadPath::Answered(answer)) => Ok(answer),
            Ok(ReadPath::Writer) => {
                let decided = scope.clone();
                self.engine()
                    .call(move |tx, ctx| lifecycle::begin(tx, ctx, &decided, fingerprint))
                    .map_err(BeginError::from)
                    .and_then(|answer| Ok(self.writer_answer(scope, fingerprint, answer?)))
            }
            Err(e) => Err(e),
        };
        self.answered(answer)
    }

    /// Counts and traces a `begin` answer.
    pub(crate) fn answered(&self, answer: Result<Begin, BeginError>) -> Result<Begin, BeginError> {
        let answer = answer.inspect_err(|e| {
            tracing::warn!(error = %e, "begin failed");
        })?;
        self.engine().counters().answered(&answer);
        match &answer {
            Begin::Claimed(claim) | Begin::Recovered(claim) => tracing::debug!(
                outcome = if matches!(answer, Begin::Claimed(_)) {
                    "claimed"
                } else {
                    "recovered"
                },
                fence = claim.fence(),
                attempt = claim.attempt(),
            ),
            Begin::Replay(response) => {
                tracing::debug!(outcome = "replay", status = response.status())
            }
            Begin::InProgress { retry_after } => {
                tracing::debug!(
                    outcome = "in_progress",
                    retry_after_ms = retry_after.as_millis() as u64
                );
            }
            Begin::Mismatch => tracing::debug!(outcome = "mismatch"),
            Begin::Expired { .. } => tracing::debug!(outcome = "expired"),
        }
        Ok(answer)
    }

    /// `begin`'s first step, from a read transaction: answers everything that writes nothing.
    pub(crate) fn read_path(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Result<ReadPath, BeginError> {
        let now = self.engine().config().clock.now();
        let existing = self.engine().read_record(scope)?;
        Ok(self.path_for(existing, fingerprint, now))
    }

    /// [`Store::read_path`] if it can run without waiting for a compaction to finish.
    #[cfg(feature = "tokio")]
    pub(crate) fn try_read_path(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
    ) -> Option<Result<ReadPath, BeginError>> {
        let now = self.engine().config().clock.now();
        let existing = self.engine().try_read_record(scope)?;
        Some(
            existing
                .map(|existing| self.path_for(existing, fingerprint, now))
                .map_err(BeginError::from),
        )
    }

    /// What `begin` answers from the record it read, or that the writer must decide.
    fn path_for(
        &self,
        existing: Option<Record>,
        fingerprint: Fingerprint,
        now: Timestamp,
    ) -> ReadPath {
        match decide(
            existing.as_ref(),
            &fingerprint,
            now,
            self.engine().config().tombstone_ttl,
        ) {
            Decision::Replay => {
                if let Some(RecordState::Completed { response, .. }) = existing.map(|r| r.state) {
                    return ReadPath::Answered(Begin::Replay(response));
                }
            }
            Decision::InProgress { retry_after } => {
                return ReadPath::Answered(Begin::InProgress { retry_after });
            }
            Decision::Mismatch => return ReadPath::Answered(Begin::Mismatch),
            Decision::Expired { completed_at } => {
                return ReadPath::Answered(Begin::Expired { completed_at });
            }
            // Writes: the writer decides again inside its transaction, where racing claims
            // for the same scope are serialised and exactly one wins.
            Decision::Claim | Decision::TakeOver => {}
        }
        ReadPath::Writer
    }

    /// `begin`'s answer from the writer, with a claim bound to this store.
    pub(crate) fn writer_answer(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        answer: BeginAnswer,
    ) -> Begin {
        let claim = |held| Claim::new(self.clone(), scope.clone(), fingerprint, held);
        match answer {
            BeginAnswer::Claimed(held) => Begin::Claimed(claim(held)),
            BeginAnswer::Recovered(held) => Begin::Recovered(claim(held)),
            BeginAnswer::Replay(response) => Begin::Replay(response),
            BeginAnswer::InProgress { retry_after } => Begin::InProgress { retry_after },
            BeginAnswer::Mismatch => Begin::Mismatch,
            BeginAnswer::Expired { completed_at } => Begin::Expired { completed_at },
        }
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
    ) -> Result<Begin, BeginError> {
        let start = Instant::now();
        let deadline = start.checked_add(max_wait).unwrap_or(start + MAX_WAIT);
        loop {
            let watch = self.engine().watchers().watch(scope.encode());
            // Read before asking, so that a claim finishing in between is not missed.
            let seen = watch.slot.generation();
            match self.begin(scope, fingerprint)? {
                Begin::InProgress { .. } if watch.slot.worth_waiting(seen) => {
                    if !watch.slot.wait_past(seen, deadline) {
                        drop(watch);
                        return self.begin(scope, fingerprint);
                    }
                }
                other => return Ok(other),
            }
        }
    }

    /// The record of `scope` as `begin` sees it now: `None` if absent or past its TTL (and
    /// past its tombstone, if tombstones are on), a `Tombstone` if past its TTL but within the
    /// tombstone TTL, whether or not eviction has run yet.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails, the record is corrupt, or the store is poisoned.
    pub fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let now = self.engine().config().clock.now();
        let Some(record) = self.engine().read_record(scope)? else {
            return Ok(None);
        };
        Ok(
            match record.visibility(now, self.engine().config().tombstone_ttl) {
                Visibility::Live => Some(record),
                Visibility::Tombstone {
                    completed_at,
                    until,
                } => Some(Record {
                    state: RecordState::Tombstone {
                        completed_at,
                        until,
                    },
                    ..record
                }),
                Visibility::Gone => None,
            },
        )
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
        let answer = self
            .engine()
            .call(move |tx, _ctx| lifecycle::write(tx, Box::new(work)))?;
        answer.map_err(|failure| match failure {
            UserFailure::Aborted(e) => WriteError::Aborted(e),
            UserFailure::Panicked(message) => WriteError::Panicked { message },
        })
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
        let target = scope.clone();
        let answer = self
            .engine()
            .call(move |tx, ctx| lifecycle::forget(tx, ctx, &target, how))?;
        match answer {
            Ok(record) => {
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
            Err(ForgetRefusal::Absent) => Err(ForgetError::Absent {
                scope: scope.clone(),
            }),
            Err(ForgetRefusal::Stale(reason)) => Err(ForgetError::Stale(crate::StaleClaim {
                scope: scope.clone(),
                fence: match how {
                    Forget::Fence(fence) => fence,
                    Forget::Completed => 0,
                },
                reason,
            })),
            Err(ForgetRefusal::InProgress { fence }) => Err(ForgetError::InProgress {
                scope: scope.clone(),
                fence,
            }),
            Err(ForgetRefusal::Store(e)) => Err(e.into()),
        }
    }

    /// A read-only snapshot for reading business tables.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails or the store is poisoned.
    pub fn read(&self) -> Result<ReadTx, StoreError> {
        Ok(ReadTx::new(self.engine().snapshot()?, self.clone()))
    }

    /// Removes up to `limit` completed records whose TTL has passed, oldest first, through the
    /// expiry index (never a scan of the records). Runs through the writer like any write.
    /// In-progress records are never evicted.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails or the store is poisoned.
    pub fn evict_expired(&self, limit: usize) -> Result<Evicted, StoreError> {
        let evicted = self.engine().evict(limit)?;
        tracing::debug!(
            removed = evicted.removed,
            tombstones_removed = evicted.tombstones_removed,
            more = evicted.backlog == crate::Backlog::More,
            "evicted expired records"
        );
        Ok(evicted)
    }

    /// The store's state and activity: records by state (from the indexes, in constant time),
    /// the log, its health, and counters since open. For monitoring, it never waits for the
    /// writer (a stats endpoint must not hang behind a busy one): the records by state are as
    /// of the last publish of acknowledged writes to redb, a few milliseconds behind at most
    /// under load. [`Store::counts`] is exact (it asks the writer to publish first).
    ///
    /// It answers while the store is poisoned too ([`Stats::poisoned`] says why); only while
    /// the file itself cannot be read are the records by state missing (zero).
    ///
    /// # Errors
    /// [`StoreError`] if a record the stats read is corrupt.
    pub fn stats(&self) -> Result<Stats, StoreError> {
        let now = self.engine().config().clock.now();
        let published = self.engine().with_published(|txn| {
            let counts = self.counts_in(txn)?;
            let first = self.first_in_progress(txn)?;
            Ok((counts, first))
        });
        let (counts, first) = match published {
            Ok(found) => found,
            Err(e @ StoreError::CorruptRecord { .. }) => return Err(e),
            Err(_) => (Counts::default(), None),
        };
        let c = self.engine().counters();
        let since_checkpoint =
            (self.engine().config().durability == crate::Durability::Wal).then(|| {
                let last = c
                    .last_checkpoint_ms
                    .load(std::sync::atomic::Ordering::Relaxed);
                c.opened
                    .elapsed()
                    .saturating_sub(Duration::from_millis(last))
            });
        let loose_permissions = self.engine().loose_permissions().unwrap_or_default();
        Ok(Stats {
            in_progress: counts.lease_entries,
            completed: counts.expiry_entries,
            tombstones: counts.tombstone_entries,
            oldest_in_progress: first.map(|created_at| now.saturating_since(created_at)),
            log_bytes_since_checkpoint: c
                .log_since_checkpoint
                .load(std::sync::atomic::Ordering::Relaxed),
            since_checkpoint,
            waiting: self.engine().watchers().waiting(),
            poisoned: self.engine().writable().err().map(|e| e.to_string()),
            loose_permissions,
            ..Stats::default()
        }
        .counted(c))
    }

    /// `created_at` of the in-progress record whose lease ends first.
    fn first_in_progress(
        &self,
        txn: &redb::ReadTransaction,
    ) -> Result<Option<Timestamp>, StoreError> {
        let raw = |name| TableDefinition::<&[u8], &[u8]>::new(name);
        let leases = txn.open_table(raw(LEASES))?;
        let Some(first) = leases.first()? else {
            return Ok(None);
        };
        let Some((_, scope)) = split_index_key(first.0.value()) else {
            return Ok(None);
        };
        let records = txn.open_table(raw(RECORDS))?;
        Ok(records
            .get(scope)?
            .and_then(|bytes| Record::decode(bytes.value()).ok())
            .map(|record| record.created_at))
    }

    /// In-progress records whose lease has expired, oldest lease first, at most `limit`:
    /// work that a crashed or stuck attempt left unfinished. Read through the lease index (never
    /// a scan of the records), from a snapshot that includes every acknowledged write.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails, a record is corrupt, or the store is poisoned.
    pub fn abandoned(&self, limit: usize) -> Result<Vec<Abandoned>, StoreError> {
        let now = self.engine().config().clock.now();
        self.engine()
            .with_snapshot(|txn| Self::abandoned_in(txn, now, limit))
    }

    fn abandoned_in(
        txn: &redb::ReadTransaction,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Abandoned>, StoreError> {
        let raw = |name| TableDefinition::<&[u8], &[u8]>::new(name);
        let leases = txn.open_table(raw(LEASES))?;
        let records = txn.open_table(raw(RECORDS))?;
        let end = index_bound_after(now);
        let mut out = Vec::new();
        for entry in leases.range::<&[u8]>(..end.as_slice())? {
            if out.len() >= limit {
                break;
            }
            let (key, _) = entry?;
            let Some((lease_until, scope_bytes)) = split_index_key(key.value()) else {
                continue;
            };
            let Some(bytes) = records.get(scope_bytes)? else {
                continue;
            };
            let scope = Scope::decode(scope_bytes).map_err(|e| StoreError::Internal {
                message: format!("the lease index holds a malformed scope: {e}"),
            })?;
            let record =
                Record::decode(bytes.value()).map_err(|source| StoreError::CorruptRecord {
                    scope: scope.to_string(),
                    source,
                })?;
            if let RecordState::InProgress {
                lease_until: current,
                checkpoint,
            } = record.state
                && current == lease_until
            {
                out.push(Abandoned {
                    scope,
                    fingerprint: record.fingerprint,
                    fence: record.fence,
                    attempt: record.attempt,
                    created_at: record.created_at,
                    lease_until,
                    checkpoint,
                });
            }
        }
        Ok(out)
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
        self.engine().call(|_, ctx| {
            ctx.need(Needs::Checkpointed);
            (Keep::Nothing, ())
        })
    }

    /// Rewrites the database file to give back the space of deleted and overwritten data
    /// (after evicting many records, say). Runs on the writer between groups, after a
    /// checkpoint; requests wait meanwhile. Needs every read snapshot (`Store::read`) dropped.
    ///
    /// # Errors
    /// [`CompactError::SnapshotOpen`] while a snapshot is open; storage errors.
    pub fn compact(&self) -> Result<Compacted, CompactError> {
        let bytes_before = self.engine().db_len()?;
        let result = self.engine().exclusive(|db| {
            // redb compacts in passes; stop when a pass finds nothing more to move.
            for _ in 0..16 {
                if !db.compact()? {
                    break;
                }
            }
            Ok::<(), redb::CompactionError>(())
        })?;
        match result {
            Ok(()) => {
                let compacted = Compacted {
                    bytes_before,
                    bytes_after: self.engine().db_len()?,
                };
                tracing::info!(
                    bytes_before = compacted.bytes_before,
                    bytes_after = compacted.bytes_after,
                    "compacted the database file"
                );
                Ok(compacted)
            }
            Err(redb::CompactionError::TransactionInProgress) => Err(CompactError::SnapshotOpen),
            Err(e) => Err(CompactError::Storage(e.to_string())),
        }
    }

    /// How many records and index entries the store holds.
    ///
    /// # Errors
    /// [`StoreError`] if storage fails or the store is poisoned.
    pub fn counts(&self) -> Result<Counts, StoreError> {
        self.engine().with_snapshot(|txn| self.counts_in(txn))
    }

    fn counts_in(&self, txn: &redb::ReadTransaction) -> Result<Counts, StoreError> {
        let registry = self.engine().registry();
        let tables = self.engine().tables();
        let len = |id| registry.table(id).len(txn);
        Ok(Counts {
            records: len(tables.records)?,
            expiry_entries: len(tables.expiry)?,
            lease_entries: len(tables.leases)?,
            tombstone_entries: len(tables.tombstones)?,
        })
    }
}
