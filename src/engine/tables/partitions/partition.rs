//! One partition of completed records, as the store holds it in memory: its number, its
//! filter, and the times that say when every record in it is gone.
//!
//! Only the writer changes a partition, and only the open one gets new records; readers probe
//! the filter and read the times while it does. Every figure here is an upper bound of what
//! the partition holds (a write counted and then not kept only makes a bound looser), which is
//! all the lookups and eviction need: a lookup skips a partition only when every record it
//! could hold is gone, and eviction drops it only then.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::model::clock::Timestamp;
use crate::model::record::{Record, RecordState};

use super::filter::Filter;
use super::info::{Info, Stage};

/// A partition's number: the first four bytes (big-endian) of its records' keys.
pub(crate) type PartitionNo = u32;

/// Bits per key of a partition's own filter: about 2.5% false positives (a unit test measures
/// it). It is probed only where its generation's filter (`generation.rs`, 16 bits a key) says
/// "maybe", to tell which of the generation's sixteen partitions to read. 8 makes a full
/// partition's blocks a power of two exactly (at 10, 65,536 keys took 1,280 blocks, rounded
/// up to 2,048: 16 bits a key in memory).
pub(crate) const PARTITION_BITS: u64 = 8;

#[derive(Debug)]
pub(crate) struct Partition {
    number: PartitionNo,
    filter: Filter,
    /// Records written into it (puts counted, deletes not): at least what it holds.
    records: AtomicU64,
    /// When its first record was written (ms): the open partition is sealed a window after it.
    first_at: AtomicU64,
    /// The latest `expires_at` of a completed record in it (ms; 0 for none).
    max_expires: AtomicU64,
    /// The latest `until` of a tombstone in it (ms; 0 for none).
    max_until: AtomicU64,
    /// Tombstones in it: those written into it, or, once eviction has turned its completed
    /// records into tombstones, the count that pass made of all of them.
    tombstones: AtomicU64,
    /// Tombstones counted so far by the pass under way (see `tombstoned_through`).
    tombstone_tally: AtomicU64,
    stage: AtomicU8,
    /// The last key eviction turned into a tombstone, while it works through the partition
    /// (in memory only: after a restart it starts again, and skips what it did).
    tombstoned_through: Mutex<Option<Vec<u8>>>,
    /// The hashes of the keys written into it while it is open (at most its capacity, 8 bytes
    /// each), for its row: the generation's filter is rebuilt from rows at open.
    hashes: Mutex<Vec<u64>>,
}

const OPEN: u8 = 0;
const SEALED: u8 = 1;
const TOMBSTONED: u8 = 2;

impl Partition {
    /// A new, empty partition that takes new records, its filter sized for `capacity`.
    pub(crate) fn open(number: PartitionNo, capacity: u64, now: Timestamp) -> Self {
        Partition {
            number,
            filter: Filter::with_capacity(capacity, PARTITION_BITS),
            records: AtomicU64::new(0),
            first_at: AtomicU64::new(now.as_millis()),
            max_expires: AtomicU64::new(0),
            max_until: AtomicU64::new(0),
            tombstones: AtomicU64::new(0),
            tombstone_tally: AtomicU64::new(0),
            stage: AtomicU8::new(OPEN),
            tombstoned_through: Mutex::new(None),
            hashes: Mutex::new(Vec::new()),
        }
    }

    /// A sealed partition as its info row describes it.
    pub(crate) fn sealed(number: PartitionNo, info: &Info, filter: Filter) -> Self {
        Partition {
            number,
            filter,
            records: AtomicU64::new(info.records),
            first_at: AtomicU64::new(info.first_at.as_millis()),
            max_expires: AtomicU64::new(info.max_expires.as_millis()),
            max_until: AtomicU64::new(info.max_until.as_millis()),
            tombstones: AtomicU64::new(info.tombstones),
            tombstone_tally: AtomicU64::new(0),
            stage: AtomicU8::new(match info.stage {
                Stage::Sealed => SEALED,
                Stage::Tombstoned => TOMBSTONED,
            }),
            tombstoned_through: Mutex::new(None),
            hashes: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn number(&self) -> PartitionNo {
        self.number
    }

    /// Whether it still takes new records.
    pub(crate) fn is_open(&self) -> bool {
        self.stage.load(Ordering::Acquire) == OPEN
    }

    /// Whether its completed records were turned into tombstones already.
    pub(crate) fn is_tombstoned(&self) -> bool {
        self.stage.load(Ordering::Acquire) == TOMBSTONED
    }

    pub(crate) fn records(&self) -> u64 {
        self.records.load(Ordering::Acquire)
    }

    pub(crate) fn first_at(&self) -> Timestamp {
        Timestamp::from_millis(self.first_at.load(Ordering::Acquire))
    }

    /// Lowers the time of its first record to `at`, if that is earlier (a partition rebuilt
    /// from its records).
    pub(crate) fn note_first(&self, at: Timestamp) {
        self.first_at.fetch_min(at.as_millis(), Ordering::AcqRel);
    }

    /// Counts a record that cannot be read: nothing says when it goes, so the partition never
    /// counts as gone, and every lookup of its key reaches it (and reports it).
    pub(crate) fn note_unreadable(&self, hash: u64) {
        self.filter.insert(hash);
        self.hashes.lock().push(hash);
        self.records.fetch_add(1, Ordering::AcqRel);
        self.max_until.store(u64::MAX, Ordering::Release);
    }

    /// Whether a key with this hash may be in it.
    pub(crate) fn may_hold(&self, hash: u64) -> bool {
        self.filter.may_contain(hash)
    }

    /// When every completed record in it is past its TTL.
    pub(crate) fn expired_from(&self) -> Timestamp {
        Timestamp::from_millis(self.max_expires.load(Ordering::Acquire))
    }

    /// When every record in it is gone (past its TTL and any tombstone time): from then on no
    /// lookup needs it, and eviction drops it.
    pub(crate) fn gone_from(&self, tombstone_ttl: Duration) -> Timestamp {
        let completed = self.expired_from().saturating_add(tombstone_ttl);
        let tombstones = Timestamp::from_millis(self.max_until.load(Ordering::Acquire));
        completed.max(tombstones)
    }

    /// Counts a record written into it under a key with this hash. Called before the write is
    /// acknowledged, so that a reader who hears of it finds the key's bits and the times.
    pub(crate) fn note(&self, hash: u64, record: &Record) {
        self.filter.insert(hash);
        if self.is_open() {
            self.hashes.lock().push(hash);
        }
        self.records.fetch_add(1, Ordering::AcqRel);
        match &record.state {
            RecordState::Completed { expires_at, .. } => {
                self.max_expires
                    .fetch_max(expires_at.as_millis(), Ordering::AcqRel);
            }
            RecordState::Tombstone { until, .. } => {
                self.max_until
                    .fetch_max(until.as_millis(), Ordering::AcqRel);
                self.tombstones.fetch_add(1, Ordering::AcqRel);
            }
            RecordState::InProgress { .. } => {
                debug_assert!(false, "an in-progress record is never in a partition");
            }
        }
    }

    /// Raises the latest tombstone end to `until`: eviction turned a record into a tombstone.
    pub(crate) fn raise_until(&self, until: Timestamp) {
        self.max_until
            .fetch_max(until.as_millis(), Ordering::AcqRel);
    }

    /// The last key turned into a tombstone so far, if tombstoning is under way.
    pub(crate) fn tombstoned_through(&self) -> Option<Vec<u8>> {
        self.tombstoned_through.lock().clone()
    }

    /// A batch of tombstoning went through `key`, and found `tombstones` tombstones (made
    /// now, or there before); `first` if the pass starts with it.
    pub(crate) fn tombstoned_batch(&self, key: Vec<u8>, tombstones: u64, first: bool) {
        if first {
            self.tombstone_tally.store(0, Ordering::Release);
        }
        self.tombstone_tally.fetch_add(tombstones, Ordering::AcqRel);
        *self.tombstoned_through.lock() = Some(key);
    }

    /// Its tombstones.
    pub(crate) fn tombstones(&self) -> u64 {
        self.tombstones.load(Ordering::Acquire)
    }

    /// One of its tombstones was removed by hand.
    pub(crate) fn forgot_tombstone(&self) {
        let _ = self
            .tombstones
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Takes no more records.
    pub(crate) fn seal(&self) {
        let _ = self
            .stage
            .compare_exchange(OPEN, SEALED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Its completed records are tombstones now: the pass that made them counted them all.
    pub(crate) fn mark_tombstoned(&self) {
        self.tombstones.store(
            self.tombstone_tally.load(Ordering::Acquire),
            Ordering::Release,
        );
        self.stage.store(TOMBSTONED, Ordering::Release);
    }

    /// The hashes of the keys written while it was open, handed to its row once: a sealed
    /// partition's row keeps them, and memory does not.
    pub(crate) fn take_hashes(&self) -> Vec<u64> {
        std::mem::take(&mut *self.hashes.lock())
    }

    /// What its info row holds: the figures, and the filter folded to its size.
    pub(crate) fn info(&self) -> (Info, Filter) {
        let records = self.records();
        let info = Info {
            records,
            first_at: self.first_at(),
            max_expires: self.expired_from(),
            max_until: Timestamp::from_millis(self.max_until.load(Ordering::Acquire)),
            tombstones: self.tombstones(),
            stage: if self.is_tombstoned() {
                Stage::Tombstoned
            } else {
                Stage::Sealed
            },
        };
        (info, self.filter.folded_for(records))
    }

    /// Memory its filter takes.
    pub(crate) fn filter_bytes(&self) -> usize {
        self.filter.bytes()
    }
}
