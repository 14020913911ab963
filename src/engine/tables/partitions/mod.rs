//! Completed records in partitions by time, so that the cost of a pair does not grow with the
//! store (why, with measurements: "Partitions" in `docs/design.md`).
//!
//! Completed records live in one table, `idemstore.done`, under `partition (u32 BE) ‖ scope`.
//! New records go to the newest partition, the **open** one, which is sealed once it holds
//! [`capacity`](Partitions::capacity) records or a window of time (an eighth of the TTL) has
//! passed since its first: inserts with random keys land in a tree that fits the page cache,
//! whatever the store holds. A partition whose records are all gone is removed whole, in key
//! order, by eviction: no per-record index and no random page per removal.
//!
//! A lookup probes the partitions newest first. Each has a filter of the keys it may hold
//! ([`filter`]), so a key that is in none of them (every new key) reads no partition at all.
//! The filters only ever say "maybe" too often, never "no" wrongly, so answers are exact. A
//! key stored in two partitions (claimed again after its first record was gone) is found in
//! the newer one first, which is the one that counts.
//!
//! This module holds the partitions in memory and decides which partition takes a record and
//! when one is sealed; the writer writes the records and the sealed partitions' rows.

mod filter;
pub(crate) mod hash;
pub(crate) mod info;
mod load;
mod partition;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use crate::model::clock::Timestamp;

use self::hash::KeyHasher;
pub(crate) use self::load::load;
pub(crate) use self::partition::{Partition, PartitionNo};

/// The partitions of one store, oldest first; the last one is the open one, if any is open.
#[derive(Debug)]
pub(crate) struct Partitions {
    hasher: KeyHasher,
    capacity: u64,
    list: RwLock<Arc<[Arc<Partition>]>>,
}

/// What choosing the partition for a new record did.
#[derive(Debug)]
pub(crate) struct Chosen {
    /// The partition to write into.
    pub(crate) number: PartitionNo,
    /// The partition that was open until now and is sealed by this choice: its row must be
    /// written with the record.
    pub(crate) sealed: Option<Arc<Partition>>,
}

impl Partitions {
    /// The partitions found in the file (ascending), the last of them open if it takes
    /// records still.
    pub(crate) fn new(hasher: KeyHasher, capacity: u64, found: Vec<Arc<Partition>>) -> Self {
        debug_assert!(found.windows(2).all(|w| w[0].number() < w[1].number()));
        debug_assert!(
            found.iter().rev().skip(1).all(|p| !p.is_open()),
            "only the newest partition is open"
        );
        Partitions {
            hasher,
            capacity: capacity.max(1),
            list: RwLock::new(found.into()),
        }
    }

    /// Replaces what is held by what the file says (after a recovery in place replayed the
    /// log into it).
    pub(crate) fn replace(&self, found: Vec<Arc<Partition>>) {
        *self.list.write() = found.into();
    }

    /// Records a partition takes before it is sealed.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The filter hash of an encoded scope.
    pub(crate) fn hash(&self, scope: &[u8]) -> u64 {
        self.hasher.hash(scope)
    }

    /// The partitions as they are now, oldest first.
    pub(crate) fn all(&self) -> Arc<[Arc<Partition>]> {
        self.list.read().clone()
    }

    /// The partition numbered `number`, if the store has it.
    pub(crate) fn get(&self, number: PartitionNo) -> Option<Arc<Partition>> {
        let list = self.all();
        let at = list.binary_search_by_key(&number, |p| p.number()).ok()?;
        Some(list[at].clone())
    }

    /// The partitions that may hold a key with this hash at `now`, newest first: those not all
    /// gone whose filter says "maybe".
    pub(crate) fn candidates(
        &self,
        hash: u64,
        now: Timestamp,
        tombstone_ttl: Duration,
    ) -> Vec<PartitionNo> {
        self.all()
            .iter()
            .rev()
            .filter(|p| now < p.gone_from(tombstone_ttl) && p.may_hold(hash))
            .map(|p| p.number())
            .collect()
    }

    /// Looks a key up in the partitions that may hold it at `now`, newest first, with `read`
    /// (one partition's record, if it has one); the first record found is the answer.
    /// Partitions whose records are all gone are skipped: none of them could answer.
    pub(crate) fn find<T, E>(
        &self,
        hash: u64,
        now: Timestamp,
        tombstone_ttl: Duration,
        mut read: impl FnMut(PartitionNo) -> Result<Option<T>, E>,
    ) -> Result<Option<(PartitionNo, T)>, E> {
        for partition in self.all().iter().rev() {
            if now >= partition.gone_from(tombstone_ttl) || !partition.may_hold(hash) {
                continue;
            }
            if let Some(found) = read(partition.number())? {
                return Ok(Some((partition.number(), found)));
            }
        }
        Ok(None)
    }

    /// The partition a record completed at `now` goes to: the open one, unless it is full or
    /// older than `window`, in which case it is sealed and the next one opened.
    pub(crate) fn choose(&self, now: Timestamp, window: Duration) -> Chosen {
        {
            let list = self.list.read();
            if let Some(open) = list.last().filter(|p| self.takes_more(p, now, window)) {
                return Chosen {
                    number: open.number(),
                    sealed: None,
                };
            }
        }
        let mut list = self.list.write();
        let last = list.last().cloned();
        if let Some(open) = last.as_ref().filter(|p| self.takes_more(p, now, window)) {
            return Chosen {
                number: open.number(),
                sealed: None,
            };
        }
        let sealed = last.filter(|p| p.is_open());
        if let Some(p) = &sealed {
            p.seal();
        }
        let number = match list.last() {
            // The numbers never run out in practice (a partition a millisecond for 49 days);
            // if they did, the last one would simply go on taking records.
            Some(last) if last.number() == PartitionNo::MAX => {
                return Chosen {
                    number: last.number(),
                    sealed: None,
                };
            }
            Some(last) => last.number() + 1,
            None => 0,
        };
        let mut next: Vec<Arc<Partition>> = list.iter().cloned().collect();
        next.push(Arc::new(Partition::open(number, self.capacity, now)));
        *list = next.into();
        Chosen { number, sealed }
    }

    fn takes_more(&self, p: &Partition, now: Timestamp, window: Duration) -> bool {
        p.is_open() && p.records() < self.capacity && now < p.first_at().saturating_add(window)
    }

    /// Counts a record written into partition `number` (see [`Partition::note`]).
    pub(crate) fn note(
        &self,
        number: PartitionNo,
        hash: u64,
        record: &crate::model::record::Record,
    ) {
        match self.get(number) {
            Some(p) => p.note(hash, record),
            None => debug_assert!(
                false,
                "a record written into partition {number}, which is not held"
            ),
        }
    }

    /// The oldest partition whose records are all gone at `now`, if any: eviction's next.
    pub(crate) fn oldest_gone(
        &self,
        now: Timestamp,
        tombstone_ttl: Duration,
    ) -> Option<Arc<Partition>> {
        self.all()
            .iter()
            .find(|p| now >= p.gone_from(tombstone_ttl))
            .cloned()
    }

    /// The oldest partition that holds completed records, all past their TTL and not yet
    /// turned into tombstones, when the store keeps tombstones. It may be the open one: past every
    /// TTL in it, it is past its window too (a window is shorter than a TTL), so the next
    /// record would open a new one anyway; the caller seals it.
    pub(crate) fn oldest_expired(
        &self,
        now: Timestamp,
        tombstone_ttl: Duration,
    ) -> Option<Arc<Partition>> {
        if tombstone_ttl.is_zero() {
            return None;
        }
        self.all()
            .iter()
            .find(|p| {
                !p.is_tombstoned()
                    && p.expired_from() > Timestamp::default()
                    && now >= p.expired_from()
                    && now < p.gone_from(tombstone_ttl)
            })
            .cloned()
    }

    /// Forgets partition `number`: its records and its row are gone.
    pub(crate) fn remove(&self, number: PartitionNo) {
        let mut list = self.list.write();
        let next: Vec<Arc<Partition>> = list
            .iter()
            .filter(|p| p.number() != number)
            .cloned()
            .collect();
        *list = next.into();
    }

    /// Tombstones in every partition.
    pub(crate) fn tombstones(&self) -> u64 {
        self.all().iter().map(|p| p.tombstones()).sum()
    }

    /// Memory the filters take.
    pub(crate) fn filter_bytes(&self) -> usize {
        self.all().iter().map(|p| p.filter_bytes()).sum()
    }
}

/// `partition (u32 BE) ‖ scope`: a completed record's key in `idemstore.done`.
pub(crate) fn done_key(partition: PartitionNo, scope: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(4 + scope.len());
    key.extend_from_slice(&partition.to_be_bytes());
    key.extend_from_slice(scope);
    key
}

/// The partition and the scope of a key of `idemstore.done`.
pub(crate) fn split_done_key(key: &[u8]) -> Option<(PartitionNo, &[u8])> {
    let (partition, scope) = key.split_first_chunk::<4>()?;
    Some((u32::from_be_bytes(*partition), scope))
}

/// The first key of partition `number`, and the first key after it (`None` after the last
/// number): the bounds of a range over one partition.
pub(crate) fn partition_bounds(number: PartitionNo) -> (Vec<u8>, Option<Vec<u8>>) {
    (
        number.to_be_bytes().to_vec(),
        number.checked_add(1).map(|n| n.to_be_bytes().to_vec()),
    )
}

#[cfg(test)]
mod tests;
