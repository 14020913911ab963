//! The store's own tables, opened once per epoch, and the business tables it writes.
//!
//! Every claim and commit reads and writes the records table and one or two indexes; opening
//! them for every access cost about nine `open_table` calls per pair. An epoch opens them once,
//! reads and applies through them, and closes them before its transaction commits. A business
//! table is opened by the epoch's first write to it and kept open the same way: opened for
//! every group, it cost about 4,500 instructions per pair.

use std::ops::Bound;

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use super::layout::InternalTables;
use super::registry::{OpenTable, RawEntries, RawOp, Registry, TableId};

pub(crate) type RawTable<'txn> = Table<'txn, &'static [u8], &'static [u8]>;

/// The tables of one epoch's transaction: the internal ones indexed by their table id (the
/// registry gives them the first ids), and the business tables written so far.
pub(crate) struct OpenTables<'txn> {
    tables: Vec<RawTable<'txn>>,
    /// Business tables, by table id, once the epoch has written them; open until it ends.
    business: Vec<Option<Box<dyn OpenTable + 'txn>>>,
}

impl<'txn> OpenTables<'txn> {
    pub(crate) fn open(
        txn: &'txn WriteTransaction,
        registry: &Registry,
        internal: InternalTables,
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
        Ok(OpenTables {
            tables,
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
        let Some(table) = self.tables.get(usize::from(id)) else {
            return self.open_business(id).map(|table| table.get(key));
        };
        Some(
            table
                .get(key)
                .map(|found| found.map(|v| v.value().to_vec()))
                .map_err(Into::into),
        )
    }

    /// Entries of table `id` in `(start, end)`, at most `limit`; `None` if `id` is a business
    /// table this epoch has not opened.
    pub(crate) fn range(
        &self,
        id: TableId,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Option<Result<RawEntries, redb::Error>> {
        let Some(table) = self.tables.get(usize::from(id)) else {
            return self
                .open_business(id)
                .map(|table| table.range(start, end, limit));
        };
        let read = || -> Result<RawEntries, redb::Error> {
            let mut out = Vec::new();
            for entry in table.range::<&[u8]>((start, end))?.take(limit) {
                let (k, v) = entry?;
                out.push((k.value().to_vec(), v.value().to_vec()));
            }
            Ok(out)
        };
        Some(read())
    }

    /// Applies ops to internal table `id`; `false` (nothing done) if it is not one.
    pub(crate) fn apply(
        &mut self,
        id: TableId,
        ops: &mut dyn Iterator<Item = RawOp<'_>>,
    ) -> Result<bool, redb::Error> {
        let Some(table) = self.tables.get_mut(usize::from(id)) else {
            return Ok(false);
        };
        for (key, value) in ops {
            match value {
                Some(value) => {
                    table.insert(key, value)?;
                }
                None => {
                    table.remove(key)?;
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
}

#[cfg(test)]
mod tests {
    use std::ops::Bound;

    use redb::backends::InMemoryBackend;
    use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableDefinition};

    use super::*;

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
        let mut open = OpenTables::open(&txn, &registry, internal).expect("open the tables");
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
        drop(open);
        txn.commit().expect("commit");
        let read = db.begin_read().expect("a read transaction");
        let table = read.open_table(definition).expect("the table");
        assert_eq!(table.len().expect("len"), 3);
        assert_eq!(table.get(300).expect("get").expect("present").value(), "c");
    }
}
