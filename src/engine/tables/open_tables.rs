//! The store's own tables, opened once per epoch, and the epoch's writes to them.
//!
//! Every claim and commit reads and writes the records table and one or two indexes; opening
//! them for every access cost about nine `open_table` calls per pair. An epoch opens them once,
//! reads and writes through them, and closes them before its transaction commits. A business
//! table is opened by the epoch's first write to it and kept open the same way.
//!
//! In `Wal` mode the epoch's writes to these tables are held here, by key, and applied to redb
//! once, in key order, when the epoch ends ([`OpenTables::flush`]). A pair whose claim and
//! commit share an epoch then costs the records table one insert instead of two, its lease
//! entry nothing but a removal that finds nothing, and the fence counter one insert per epoch
//! instead of one per claim. Every read here sees the held writes first, so a later group reads
//! what an earlier one wrote, exactly as it would from the transaction.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::ops::Bound;

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use super::layout::InternalTables;
use super::registry::{OpenTable, RawEntries, RawOp, Registry, TableId};

pub(crate) type RawTable<'txn> = Table<'txn, &'static [u8], &'static [u8]>;

/// When writes to the store's own tables reach the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Apply {
    /// As each group applies (`Redb` mode: the group's durable commit is the epoch's, and
    /// nothing else could restore writes that failed to apply at its end).
    AtOnce,
    /// At the end of the epoch, each key once (`Wal` mode: every group is in the log, so an
    /// epoch whose writes fail to apply is rebuilt from it).
    AtEpochEnd,
}

/// One table's writes held for the epoch: each key's latest value, or `None` for a delete.
type Held = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The internal tables of one epoch's transaction, indexed by their table id (the registry
/// gives them the first ids).
pub(crate) struct OpenTables<'txn> {
    tables: Vec<RawTable<'txn>>,
    apply: Apply,
    /// With [`Apply::AtEpochEnd`], the writes not yet in `tables`, by table id.
    held: Vec<Held>,
    /// Business tables, by table id, once the epoch has written them: opening one costs
    /// about as much as the write, and it stays open until the epoch ends.
    business: Vec<Option<Box<dyn OpenTable + 'txn>>>,
}

impl<'txn> OpenTables<'txn> {
    pub(crate) fn open(
        txn: &'txn WriteTransaction,
        registry: &Registry,
        internal: InternalTables,
        apply: Apply,
    ) -> Result<Self, redb::Error> {
        let ids = internal.ids();
        let mut tables = Vec::with_capacity(ids.len());
        for (index, id) in ids.into_iter().enumerate() {
            debug_assert_eq!(
                usize::from(id),
                index,
                "internal tables are registered first"
            );
            let name = registry.table(id).name();
            tables.push(txn.open_table(TableDefinition::<&[u8], &[u8]>::new(name))?);
        }
        let held = ids.iter().map(|_| Held::new()).collect();
        Ok(OpenTables {
            tables,
            apply,
            held,
            business: Vec::new(),
        })
    }

    /// A business table this epoch has open.
    fn open_business(&self, id: TableId) -> Option<&(dyn OpenTable + 'txn)> {
        self.business.get(usize::from(id))?.as_deref()
    }

    /// The value of `key` in table `id`; `None` in the outer option if `id` is a business
    /// table this epoch has not opened (read it from the transaction).
    pub(crate) fn read(
        &self,
        id: TableId,
        key: &[u8],
    ) -> Option<Result<Option<Vec<u8>>, redb::Error>> {
        let index = usize::from(id);
        let Some(table) = self.tables.get(index) else {
            return self.open_business(id).map(|table| table.get(key));
        };
        if let Some(held) = self.held[index].get(key) {
            return Some(Ok(held.clone()));
        }
        Some(
            table
                .get(key)
                .map(|found| found.map(|v| v.value().to_vec()))
                .map_err(Into::into),
        )
    }

    /// Entries of table `id` in `(start, end)`, at most `limit`, the held writes merged over
    /// the transaction's; `None` if `id` is a business table this epoch has not opened.
    pub(crate) fn range(
        &self,
        id: TableId,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Option<Result<RawEntries, redb::Error>> {
        let index = usize::from(id);
        let Some(table) = self.tables.get(index) else {
            return self
                .open_business(id)
                .map(|table| table.range(start, end, limit));
        };
        let held = &self.held[index];
        if holds_nothing(start, end) {
            // `BTreeMap::range` panics on an inverted range; redb's is empty.
            return Some(Ok(Vec::new()));
        }
        let read = || -> Result<RawEntries, redb::Error> {
            let mut stored = table.range::<&[u8]>((start, end))?;
            let mut next_stored = stored.next().transpose()?;
            let mut written = held.range::<[u8], _>((start, end)).peekable();
            let mut out = Vec::new();
            while out.len() < limit {
                let side = match (&next_stored, written.peek()) {
                    (None, None) => break,
                    (Some(_), None) => Side::Stored,
                    (None, Some(_)) => Side::Written,
                    (Some((s, _)), Some((w, _))) => match s.value().cmp(w.as_slice()) {
                        Ordering::Less => Side::Stored,
                        Ordering::Greater => Side::Written,
                        Ordering::Equal => Side::Both,
                    },
                };
                if side != Side::Written {
                    let taken = next_stored.take();
                    next_stored = stored.next().transpose()?;
                    if let (Side::Stored, Some((key, value))) = (side, taken) {
                        out.push((key.value().to_vec(), value.value().to_vec()));
                        continue;
                    }
                }
                // The held write, which hides a stored entry of the same key.
                if let Some((key, Some(value))) = written.next() {
                    out.push((key.clone(), value.clone()));
                }
            }
            Ok(out)
        };
        Some(read())
    }

    /// Applies ops to internal table `id`, or holds them for the epoch's end; `false`
    /// (nothing done) if it is not one.
    pub(crate) fn apply(
        &mut self,
        id: TableId,
        ops: &mut dyn Iterator<Item = RawOp<'_>>,
    ) -> Result<bool, redb::Error> {
        let index = usize::from(id);
        let Some(table) = self.tables.get_mut(index) else {
            return Ok(false);
        };
        match self.apply {
            Apply::AtOnce => {
                for (key, value) in ops {
                    write(table, key, value)?;
                }
            }
            Apply::AtEpochEnd => {
                let held = &mut self.held[index];
                for (key, value) in ops {
                    let value = value.map(<[u8]>::to_vec);
                    match held.get_mut(key) {
                        Some(slot) => *slot = value,
                        None => {
                            held.insert(key.to_vec(), value);
                        }
                    }
                }
            }
        }
        Ok(true)
    }

    /// Applies ops to business table `id`, opening it with `open` on its first write of the
    /// epoch.
    pub(crate) fn apply_business(
        &mut self,
        id: TableId,
        open: impl FnOnce() -> Result<Box<dyn OpenTable + 'txn>, redb::Error>,
        ops: &mut dyn Iterator<Item = RawOp<'_>>,
    ) -> Result<(), redb::Error> {
        debug_assert!(
            usize::from(id) >= self.tables.len(),
            "an internal table is applied by `apply`"
        );
        let index = usize::from(id);
        if self.business.len() <= index {
            self.business.resize_with(index + 1, || None);
        }
        let table = match &mut self.business[index] {
            Some(table) => table,
            slot @ None => slot.insert(open()?),
        };
        table.apply(ops)
    }

    /// Applies the held writes to the transaction, table by table in key order. An error
    /// leaves part of them applied: the caller must not publish the transaction.
    pub(crate) fn flush(&mut self) -> Result<(), redb::Error> {
        for (table, held) in self.tables.iter_mut().zip(&mut self.held) {
            for (key, value) in std::mem::take(held) {
                write(table, &key, value.as_deref())?;
            }
        }
        Ok(())
    }
}

/// Which of the two sorted sources a range takes its next entry from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Stored,
    Written,
    /// The same key in both: the held write wins.
    Both,
}

/// Whether no key lies in `(start, end)`: an inverted range, or one bounded twice by one key
/// but for both bounds inclusive.
fn holds_nothing(start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    match (start, end) {
        (Bound::Included(s), Bound::Included(e)) => s > e,
        (Bound::Included(s) | Bound::Excluded(s), Bound::Excluded(e))
        | (Bound::Excluded(s), Bound::Included(e)) => s >= e,
        (Bound::Unbounded, _) | (_, Bound::Unbounded) => false,
    }
}

fn write(table: &mut RawTable<'_>, key: &[u8], value: Option<&[u8]>) -> Result<(), redb::Error> {
    match value {
        Some(value) => {
            table.insert(key, value)?;
        }
        None => {
            table.remove(key)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ops::Bound;

    use redb::backends::InMemoryBackend;
    use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

    use super::*;

    /// SplitMix64, seeded: the same cases every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) % n
        }
    }

    fn as_ref(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
        bound.as_ref().map(Vec::as_slice)
    }

    fn key(n: u64) -> Vec<u8> {
        format!("k{n:03}").into_bytes()
    }

    fn bound(rng: &mut Rng, keys: u64) -> Bound<Vec<u8>> {
        match rng.below(3) {
            0 => Bound::Unbounded,
            1 => Bound::Included(key(rng.below(keys))),
            _ => Bound::Excluded(key(rng.below(keys))),
        }
    }

    /// Reads and ranges over held writes answer exactly what the same writes applied to the
    /// table would, for every mix of puts, overwrites and deletes over stored keys, any bounds
    /// and any limit; and the flush leaves the table holding exactly that.
    #[test]
    fn held_writes_read_and_range_as_the_table_would_after_them() {
        const KEYS: u64 = 40;
        let mut rng = Rng(7);
        for case in 0..200 {
            let db = Database::builder()
                .create_with_backend(InMemoryBackend::new())
                .expect("an in-memory database");
            let mut registry = Registry::default();
            let internal = InternalTables::register(&mut registry);
            let name = registry.table(internal.records).name().to_owned();
            let definition = TableDefinition::<&[u8], &[u8]>::new(&name);
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let txn = db.begin_write().expect("a write transaction");
            {
                let mut table = txn.open_table(definition).expect("the table");
                for _ in 0..rng.below(KEYS) {
                    let (k, v) = (key(rng.below(KEYS)), b"stored".to_vec());
                    table.insert(k.as_slice(), v.as_slice()).expect("insert");
                    model.insert(k, v);
                }
            }
            txn.commit().expect("commit");

            let txn = db.begin_write().expect("a write transaction");
            let mut open = OpenTables::open(&txn, &registry, internal, Apply::AtEpochEnd)
                .expect("open the tables");
            for step in 0..rng.below(3 * KEYS) {
                let k = key(rng.below(KEYS));
                let v = format!("v{step}").into_bytes();
                let value = (rng.below(3) > 0).then_some(v.as_slice());
                let mut ops = std::iter::once((k.as_slice(), value));
                assert!(open.apply(internal.records, &mut ops).expect("held"));
                match value {
                    Some(v) => model.insert(k, v.to_vec()),
                    None => model.remove(&k),
                };
                let probe = key(rng.below(KEYS));
                let read = open
                    .read(internal.records, &probe)
                    .expect("an internal table");
                assert_eq!(
                    read.expect("read"),
                    model.get(&probe).cloned(),
                    "case {case}"
                );
                let (start, end) = (bound(&mut rng, KEYS), bound(&mut rng, KEYS));
                let limit = rng.below(KEYS) as usize;
                let expected: RawEntries = if holds_nothing(as_ref(&start), as_ref(&end)) {
                    Vec::new()
                } else {
                    model
                        .range::<[u8], _>((as_ref(&start), as_ref(&end)))
                        .take(limit)
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect()
                };
                let ranged = open
                    .range(internal.records, as_ref(&start), as_ref(&end), limit)
                    .expect("an internal table")
                    .expect("range");
                assert_eq!(
                    ranged, expected,
                    "case {case}: {start:?}..{end:?} at most {limit}"
                );
            }
            open.flush().expect("flush");
            drop(open);
            txn.commit().expect("commit");
            let read = db.begin_read().expect("a read transaction");
            let table = read.open_table(definition).expect("the table");
            let stored: BTreeMap<Vec<u8>, Vec<u8>> = table
                .iter()
                .expect("iterate")
                .map(|entry| {
                    let (k, v) = entry.expect("an entry");
                    (k.value().to_vec(), v.value().to_vec())
                })
                .collect();
            assert_eq!(stored, model, "case {case}: the table after the flush");
        }
    }

    /// A business table is opened by its first write of the epoch and stays open: later
    /// writes, reads and ranges of the epoch go through the same handle (redb refuses a
    /// second open of a table in one transaction), in the table's own key order, and the
    /// writes are in the transaction once the epoch closes its tables.
    #[test]
    fn a_business_table_stays_open_for_the_epoch_after_its_first_write() {
        use crate::engine::tables::registry::Internal;

        let db = Database::builder()
            .create_with_backend(InMemoryBackend::new())
            .expect("an in-memory database");
        let mut registry = Registry::default();
        let internal = InternalTables::register(&mut registry);
        let orders = registry
            .register::<u64, &str>("orders", Internal::No)
            .expect("a business table");
        let definition = TableDefinition::<u64, &str>::new("orders");
        let txn = db.begin_write().expect("a write transaction");
        let mut open = OpenTables::open(&txn, &registry, internal, Apply::AtEpochEnd)
            .expect("open the tables");
        assert!(
            open.read(orders, &7u64.to_le_bytes()).is_none(),
            "not open yet"
        );

        let mut opened = 0;
        for (n, value) in [(300u64, "c"), (7, "a"), (20, "b")] {
            let key = n.to_le_bytes();
            let mut ops = std::iter::once((key.as_slice(), Some(value.as_bytes())));
            open.apply_business(
                orders,
                || {
                    opened += 1;
                    registry.table(orders).open(&txn)
                },
                &mut ops,
            )
            .expect("applied");
        }
        assert_eq!(opened, 1, "opened by the first write only");
        let read = open.read(orders, &20u64.to_le_bytes()).expect("open now");
        assert_eq!(read.expect("read"), Some(b"b".to_vec()));
        let all = open
            .range(orders, Bound::Unbounded, Bound::Unbounded, 10)
            .expect("open now")
            .expect("range");
        let keys: Vec<Vec<u8>> = all.into_iter().map(|(k, _)| k).collect();
        let in_order: Vec<Vec<u8>> = [7u64, 20, 300]
            .iter()
            .map(|n| n.to_le_bytes().to_vec())
            .collect();
        assert_eq!(keys, in_order, "u64 order, not byte order");
        open.flush().expect("flush");
        drop(open);
        txn.commit().expect("commit");
        let read = db.begin_read().expect("a read transaction");
        let table = read.open_table(definition).expect("the table");
        assert_eq!(table.len().expect("len"), 3);
        assert_eq!(table.get(300).expect("get").expect("present").value(), "c");
    }
}
