//! The store's own tables, opened once per group.
//!
//! Every claim and commit reads and writes the records table and one or two indexes; opening
//! them for every access cost about nine `open_table` calls per pair. A group opens them once,
//! reads and applies through them, and closes them before its transaction commits.

use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use super::layout::InternalTables;
use super::registry::{RawEntries, RawOp, Registry, TableId};

pub(crate) type RawTable<'txn> = Table<'txn, &'static [u8], &'static [u8]>;

/// The internal tables of one group's transaction, indexed by their table id (the registry
/// gives them the first ids).
pub(crate) struct OpenTables<'txn> {
    tables: Vec<RawTable<'txn>>,
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
        Ok(OpenTables { tables })
    }

    fn get(&self, id: TableId) -> Option<&RawTable<'txn>> {
        self.tables.get(usize::from(id))
    }

    /// The value of `key` in internal table `id`; `None` in the outer option if `id` is not
    /// an internal table.
    pub(crate) fn read(
        &self,
        id: TableId,
        key: &[u8],
    ) -> Option<Result<Option<Vec<u8>>, redb::Error>> {
        let table = self.get(id)?;
        Some(
            table
                .get(key)
                .map(|found| found.map(|v| v.value().to_vec()))
                .map_err(Into::into),
        )
    }

    /// Entries of internal table `id` in `(start, end)`, at most `limit`; `None` if `id` is not
    /// an internal table.
    pub(crate) fn range(
        &self,
        id: TableId,
        start: std::ops::Bound<&[u8]>,
        end: std::ops::Bound<&[u8]>,
        limit: usize,
    ) -> Option<Result<RawEntries, redb::Error>> {
        let table = self.get(id)?;
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
}
