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
//! A lookup probes the partitions newest first. Sixteen consecutive partitions form a
//! [`generation`] with a filter of all their keys, and each partition has a filter of its own
//! ([`filter`]): a key in none of them (every new key) probes one filter block per generation
//! and reads no partition at all. The filters only ever say "maybe" too often, never "no"
//! wrongly, so answers are exact. A key stored in two partitions (claimed again after its
//! first record was gone) is found in the newer one first, which is the one that counts.
//!
//! This module holds the partitions in memory and decides which partition takes a record and
//! when one is sealed; the writer writes the records and the sealed partitions' rows.

mod filter;
pub(crate) mod generation;
pub(crate) mod hash;
pub(crate) mod info;
mod load;
mod partition;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use crate::model::clock::Timestamp;
use crate::model::record::Record;

use self::generation::{Generation, GenerationNo, generation_of};
use self::hash::KeyHasher;
use self::info::Info;
pub(crate) use self::load::load;
pub(crate) use self::partition::{Partition, PartitionNo};

/// The partitions and generations of one store, oldest first; the last partition is the open
/// one, if any is open.
#[derive(Debug, Default)]
pub(crate) struct Set {
    partitions: Vec<Arc<Partition>>,
    generations: Vec<Arc<Generation>>,
}

impl Set {
    /// The partitions, oldest first.
    pub(crate) fn partitions(&self) -> &[Arc<Partition>] {
        &self.partitions
    }

    /// The generations, oldest first.
    #[cfg(test)]
    pub(crate) fn generations(&self) -> &[Arc<Generation>] {
        &self.generations
    }

    /// The partitions of generation `g`, oldest first.
    fn of_generation(&self, g: GenerationNo) -> &[Arc<Partition>] {
        let from = self
            .partitions
            .partition_point(|p| generation_of(p.number()) < g);
        let to = self
            .partitions
            .partition_point(|p| generation_of(p.number()) <= g);
        &self.partitions[from..to]
    }

    fn generation(&self, g: GenerationNo) -> Option<&Arc<Generation>> {
        let at = self
            .generations
            .binary_search_by_key(&g, |x| x.number())
            .ok()?;
        Some(&self.generations[at])
    }
}

/// The partitions of one store.
#[derive(Debug)]
pub(crate) struct Partitions {
    hasher: KeyHasher,
    capacity: u64,
    set: RwLock<Arc<Set>>,
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
    /// An empty set; [`Partitions::replace`] fills it with what the file holds.
    pub(crate) fn new(hasher: KeyHasher, capacity: u64) -> Self {
        Partitions {
            hasher,
            capacity: capacity.max(1),
            set: RwLock::new(Arc::default()),
        }
    }

    /// Replaces what is held by what the file says (at open, and after a recovery in place
    /// replayed the log into it): partitions and generations, each ascending.
    pub(crate) fn replace(
        &self,
        partitions: Vec<Arc<Partition>>,
        generations: Vec<Arc<Generation>>,
    ) {
        debug_assert!(partitions.windows(2).all(|w| w[0].number() < w[1].number()));
        debug_assert!(
            generations
                .windows(2)
                .all(|w| w[0].number() < w[1].number())
        );
        debug_assert!(
            partitions.iter().rev().skip(1).all(|p| !p.is_open()),
            "only the newest partition is open"
        );
        debug_assert!(
            partitions.iter().all(|p| generations
                .binary_search_by_key(&generation_of(p.number()), |g| g.number())
                .is_ok()),
            "every partition's generation is held"
        );
        *self.set.write() = Arc::new(Set {
            partitions,
            generations,
        });
    }

    /// Records a partition takes before it is sealed.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The filter hash of an encoded scope.
    pub(crate) fn hash(&self, scope: &[u8]) -> u64 {
        self.hasher.hash(scope)
    }

    /// The partitions and generations as they are now.
    pub(crate) fn all(&self) -> Arc<Set> {
        self.set.read().clone()
    }

    /// The open partition, if there is one (the newest, while it takes records).
    pub(crate) fn open_one(&self) -> Option<Arc<Partition>> {
        self.all()
            .partitions
            .last()
            .filter(|p| p.is_open())
            .cloned()
    }

    /// The partition numbered `number`, if the store has it.
    pub(crate) fn get(&self, number: PartitionNo) -> Option<Arc<Partition>> {
        let set = self.all();
        let at = set
            .partitions
            .binary_search_by_key(&number, |p| p.number())
            .ok()?;
        Some(set.partitions[at].clone())
    }

    /// The partitions that may hold a key with this hash at `now`, newest first: those not all
    /// gone whose generation's filter and own filter both say "maybe".
    pub(crate) fn candidates(
        &self,
        hash: u64,
        now: Timestamp,
        tombstone_ttl: Duration,
    ) -> Vec<PartitionNo> {
        let mut out = Vec::new();
        let _ = self.find(hash, now, tombstone_ttl, |number| {
            out.push(number);
            Ok::<Option<()>, ()>(None)
        });
        out
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
        let set = self.all();
        for generation in set.generations.iter().rev() {
            if !generation.may_hold(hash) {
                continue;
            }
            for partition in set.of_generation(generation.number()).iter().rev() {
                if now >= partition.gone_from(tombstone_ttl) || !partition.may_hold(hash) {
                    continue;
                }
                if let Some(found) = read(partition.number())? {
                    return Ok(Some((partition.number(), found)));
                }
            }
        }
        Ok(None)
    }

    /// The partition a record completed at `now` goes to: the open one, unless it is full or
    /// older than `window`, in which case it is sealed and the next one opened.
    pub(crate) fn choose(&self, now: Timestamp, window: Duration) -> Chosen {
        {
            let set = self.set.read();
            if let Some(open) = set
                .partitions
                .last()
                .filter(|p| self.takes_more(p, now, window))
            {
                return Chosen {
                    number: open.number(),
                    sealed: None,
                };
            }
        }
        let mut held = self.set.write();
        let last = held.partitions.last().cloned();
        if let Some(open) = last.as_ref().filter(|p| self.takes_more(p, now, window)) {
            return Chosen {
                number: open.number(),
                sealed: None,
            };
        }
        let sealed = last.as_ref().filter(|p| p.is_open()).cloned();
        if let Some(p) = &sealed {
            p.seal();
        }
        let number = match &last {
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
        let mut next = Set {
            partitions: held.partitions.clone(),
            generations: held.generations.clone(),
        };
        next.partitions
            .push(Arc::new(Partition::open(number, self.capacity, now)));
        let g = generation_of(number);
        if next.generation(g).is_none() {
            next.generations
                .push(Arc::new(Generation::new(g, self.capacity)));
        }
        *held = Arc::new(next);
        Chosen { number, sealed }
    }

    fn takes_more(&self, p: &Partition, now: Timestamp, window: Duration) -> bool {
        p.is_open() && p.records() < self.capacity && now < p.first_at().saturating_add(window)
    }

    /// Counts a record written into partition `number` under a key with this hash (see
    /// [`Partition::note`]), in its generation's filter too.
    pub(crate) fn note(&self, number: PartitionNo, hash: u64, record: &Record) {
        let set = self.all();
        match set.partitions.binary_search_by_key(&number, |p| p.number()) {
            Ok(at) => set.partitions[at].note(hash, record),
            Err(_) => debug_assert!(
                false,
                "a record written into partition {number}, which is not held"
            ),
        }
        if let Some(generation) = set.generation(generation_of(number)) {
            generation.insert(hash);
        }
    }

    /// The row of a partition sealed now: its figures, its filter and its keys' hashes (which
    /// it hands over: memory keeps them only while a partition is open).
    pub(crate) fn sealed_row(partition: &Partition) -> Vec<u8> {
        let (info, filter) = partition.info();
        info.encode(&filter, &partition.take_hashes())
    }

    /// A sealed partition's row with its figures as they are now, its key hashes taken from
    /// the row it has (`old`); `None` if it has none (it is then read whole at open, and a row
    /// without its keys' hashes would hide them from its generation's filter).
    pub(crate) fn changed_row(partition: &Partition, old: Option<&[u8]>) -> Option<Vec<u8>> {
        let (_, _, hashes) = Info::decode(old?).ok()?;
        let (info, filter) = partition.info();
        Some(info.encode(&filter, &hashes))
    }

    /// The oldest partition whose records are all gone at `now`, if any: eviction's next.
    pub(crate) fn oldest_gone(
        &self,
        now: Timestamp,
        tombstone_ttl: Duration,
    ) -> Option<Arc<Partition>> {
        self.all()
            .partitions
            .iter()
            .find(|p| now >= p.gone_from(tombstone_ttl))
            .cloned()
    }

    /// The oldest partition that holds completed records, all past their TTL and not yet
    /// turned into tombstones, when the store keeps tombstones. It may be the open one: past
    /// every TTL in it, it is past its window too (a window is shorter than a TTL), so the
    /// next record would open a new one anyway; the caller seals it.
    pub(crate) fn oldest_expired(
        &self,
        now: Timestamp,
        tombstone_ttl: Duration,
    ) -> Option<Arc<Partition>> {
        if tombstone_ttl.is_zero() {
            return None;
        }
        self.all()
            .partitions
            .iter()
            .find(|p| {
                !p.is_tombstoned()
                    && p.expired_from() > Timestamp::default()
                    && now >= p.expired_from()
                    && now < p.gone_from(tombstone_ttl)
            })
            .cloned()
    }

    /// Forgets partition `number`: its records and its row are gone (and its generation with
    /// it, if it held no other partition).
    pub(crate) fn remove(&self, number: PartitionNo) {
        let mut held = self.set.write();
        let partitions: Vec<Arc<Partition>> = held
            .partitions
            .iter()
            .filter(|p| p.number() != number)
            .cloned()
            .collect();
        let g = generation_of(number);
        let emptied = !partitions.iter().any(|p| generation_of(p.number()) == g);
        let generations = held
            .generations
            .iter()
            .filter(|x| !(emptied && x.number() == g))
            .cloned()
            .collect();
        *held = Arc::new(Set {
            partitions,
            generations,
        });
    }

    /// Tombstones in every partition.
    pub(crate) fn tombstones(&self) -> u64 {
        self.all().partitions.iter().map(|p| p.tombstones()).sum()
    }

    /// Memory the filters take, generations' included.
    pub(crate) fn filter_bytes(&self) -> usize {
        let set = self.all();
        set.partitions
            .iter()
            .map(|p| p.filter_bytes())
            .sum::<usize>()
            + set
                .generations
                .iter()
                .map(|g| g.filter_bytes())
                .sum::<usize>()
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
