//! The tables the store may write: its own and the business tables registered at open.
//!
//! Writes travel through the engine as bytes (table, key, value), so they can be buffered per
//! request, logged and replayed without the code that made them. This module turns those bytes
//! back into typed redb calls. It must never write a table that was not registered.

use std::any::TypeId;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Bound;

use redb::{
    Key, ReadableTable, ReadableTableMetadata, Table, TableDefinition, Value, WriteTransaction,
};

use crate::error::{BadTableReason, TxError};

use super::open_tables::OpenTables;
use super::write_set::WriteOp;

/// Index of a table in the registry. Stable for one open store only; the log names tables.
pub(crate) type TableId = u16;

/// Names starting with this are the store's own tables.
pub(crate) const RESERVED_PREFIX: &str = "idemstore.";

/// Key/value pairs read from a table, as bytes.
pub(crate) type RawEntries = Vec<(Vec<u8>, Vec<u8>)>;

/// What the engine can do with a table without knowing its types.
pub(crate) trait TableOps: Send + Sync + fmt::Debug {
    fn name(&self) -> &str;
    /// `"K, V"` as redb names the types, for error messages.
    fn type_names(&self) -> String;
    /// The key and value types, for cheap type checks.
    fn type_ids(&self) -> (TypeId, TypeId);
    /// Creates the table if it does not exist (fails if it exists with other types).
    fn create(&self, txn: &WriteTransaction) -> Result<(), redb::Error>;
    /// The table, opened in `txn`: redb lets a transaction hold a table open once at a time.
    fn open<'txn>(
        &self,
        txn: &'txn WriteTransaction,
    ) -> Result<Box<dyn OpenTable + 'txn>, redb::Error>;
    fn compare(&self, a: &[u8], b: &[u8]) -> Ordering;
    fn len(&self, txn: &redb::ReadTransaction) -> Result<u64, redb::Error>;
    /// Copies every entry of the table as the snapshot `from` sees it into `to` (a backup),
    /// creating it there; the entries copied. Typed, because redb orders a table's keys by
    /// its key type: bytes inserted through another type would be out of order.
    fn copy(&self, from: &redb::ReadTransaction, to: &WriteTransaction)
    -> Result<u64, redb::Error>;
}

/// What the engine can do with a table open in a write transaction, as bytes.
pub(crate) trait OpenTable {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, redb::Error>;
    /// Entries with keys in `(start, end)`, in key order, at most `limit`.
    fn range(
        &self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<RawEntries, redb::Error>;
    /// Applies puts (`Some(value)`) and deletes (`None`), in order.
    fn apply(&mut self, ops: &mut dyn Iterator<Item = RawOp<'_>>) -> Result<(), redb::Error>;
}

/// A put (`Some(value)`) or delete (`None`) of one key, borrowed from a write set or a log
/// frame.
pub(crate) type RawOp<'a> = (&'a [u8], Option<&'a [u8]>);

/// A registered `TableDefinition<K, V>`, with its types kept in the type parameters.
struct Typed<K, V> {
    name: String,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> fmt::Debug for Typed<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table").field("name", &self.name).finish()
    }
}

impl<K: Key + 'static, V: Value + 'static> Typed<K, V> {
    fn definition(&self) -> TableDefinition<'_, K, V> {
        TableDefinition::new(&self.name)
    }
}

pub(crate) fn type_names<K: Key + 'static, V: Value + 'static>() -> String {
    format!("{}, {}", K::type_name().name(), V::type_name().name())
}

impl<K: Key + 'static, V: Value + 'static> TableOps for Typed<K, V> {
    fn name(&self) -> &str {
        &self.name
    }

    fn type_names(&self) -> String {
        type_names::<K, V>()
    }

    fn type_ids(&self) -> (TypeId, TypeId) {
        (TypeId::of::<K>(), TypeId::of::<V>())
    }

    fn create(&self, txn: &WriteTransaction) -> Result<(), redb::Error> {
        txn.open_table(self.definition())?;
        Ok(())
    }

    fn open<'txn>(
        &self,
        txn: &'txn WriteTransaction,
    ) -> Result<Box<dyn OpenTable + 'txn>, redb::Error> {
        Ok(Box::new(Opened(txn.open_table(self.definition())?)))
    }

    fn compare(&self, a: &[u8], b: &[u8]) -> Ordering {
        K::compare(a, b)
    }

    fn len(&self, txn: &redb::ReadTransaction) -> Result<u64, redb::Error> {
        Ok(txn.open_table(self.definition())?.len()?)
    }

    fn copy(
        &self,
        from: &redb::ReadTransaction,
        to: &WriteTransaction,
    ) -> Result<u64, redb::Error> {
        let mut copy = to.open_table(self.definition())?;
        let source = match from.open_table(self.definition()) {
            Ok(source) => source,
            // Not in the file (an open creates every registered table): nothing to copy.
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        let mut rows = 0;
        for entry in source.iter()? {
            let (key, value) = entry?;
            copy.insert(key.value(), value.value())?;
            rows += 1;
        }
        debug_assert_eq!(rows, source.len()?, "a snapshot's table does not change");
        Ok(rows)
    }
}

/// A registered table open in a write transaction, with its types.
struct Opened<'txn, K: Key + 'static, V: Value + 'static>(Table<'txn, K, V>);

impl<K: Key + 'static, V: Value + 'static> OpenTable for Opened<'_, K, V> {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, redb::Error> {
        let found = self.0.get(K::from_bytes(key))?;
        Ok(found.map(|guard| V::as_bytes(&guard.value()).as_ref().to_vec()))
    }

    fn range(
        &self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        limit: usize,
    ) -> Result<RawEntries, redb::Error> {
        let bounds = (start.map(K::from_bytes), end.map(K::from_bytes));
        let mut out = Vec::new();
        for entry in self.0.range::<K::SelfType<'_>>(bounds)?.take(limit) {
            let (k, v) = entry?;
            out.push((
                K::as_bytes(&k.value()).as_ref().to_vec(),
                V::as_bytes(&v.value()).as_ref().to_vec(),
            ));
        }
        Ok(out)
    }

    fn apply(&mut self, ops: &mut dyn Iterator<Item = RawOp<'_>>) -> Result<(), redb::Error> {
        for (key, value) in ops {
            match value {
                Some(value) => {
                    self.0.insert(K::from_bytes(key), V::from_bytes(value))?;
                }
                None => {
                    self.0.remove(K::from_bytes(key))?;
                }
            }
        }
        Ok(())
    }
}

/// Every table the store may touch, by id and by name.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    tables: Vec<Box<dyn TableOps>>,
    /// Whose each table is, by id.
    owners: Vec<Internal>,
    by_name: HashMap<String, TableId>,
}

impl Registry {
    /// Registers a table; registering the same definition twice is harmless.
    pub(crate) fn register<K: Key + 'static, V: Value + 'static>(
        &mut self,
        name: &str,
        internal: Internal,
    ) -> Result<TableId, BadTableReason> {
        if matches!(internal, Internal::No) && name.starts_with(RESERVED_PREFIX) {
            return Err(BadTableReason::Reserved);
        }
        if let Some(&id) = self.by_name.get(name) {
            let registered = self.tables[usize::from(id)].type_names();
            return if registered == type_names::<K, V>() {
                Ok(id)
            } else {
                Err(BadTableReason::Duplicate { registered })
            };
        }
        let id = TableId::try_from(self.tables.len()).map_err(|_| BadTableReason::TooMany)?;
        self.tables.push(Box::new(Typed::<K, V> {
            name: name.to_owned(),
            _types: PhantomData,
        }));
        self.owners.push(internal);
        self.by_name.insert(name.to_owned(), id);
        Ok(id)
    }

    /// The id of the business table `name`, checked against the types `K` and `V`: the one
    /// check that both the writer's `Tx` and a reader's `ReadTx` make.
    pub(crate) fn business<K: Key + 'static, V: Value + 'static>(
        &self,
        name: &str,
    ) -> Result<TableId, TxError> {
        let unknown = || TxError::UnknownTable {
            name: name.to_owned(),
        };
        if name.starts_with(RESERVED_PREFIX) {
            return Err(unknown());
        }
        let id = self.id(name).ok_or_else(unknown)?;
        let table = self.table(id);
        // Comparing type ids is cheap; the names are built only for the error.
        if table.type_ids() != (TypeId::of::<K>(), TypeId::of::<V>()) {
            return Err(TxError::TableTypeMismatch {
                name: name.to_owned(),
                registered: table.type_names(),
                requested: type_names::<K, V>(),
            });
        }
        Ok(id)
    }

    pub(crate) fn id(&self, name: &str) -> Option<TableId> {
        self.by_name.get(name).copied()
    }

    pub(crate) fn table(&self, id: TableId) -> &dyn TableOps {
        self.tables[usize::from(id)].as_ref()
    }

    /// The tables a store of this build has: every registered one but format 2's.
    pub(crate) fn tables(&self) -> impl Iterator<Item = &dyn TableOps> {
        self.tables
            .iter()
            .zip(&self.owners)
            .filter(|(_, owner)| **owner != Internal::Legacy)
            .map(|(t, _)| t.as_ref())
    }

    /// Applies a request's writes through the epoch's open tables (a business table is opened
    /// by its first write of the epoch and stays open until the epoch ends).
    pub(crate) fn apply<'txn>(
        &self,
        txn: &'txn WriteTransaction,
        open: &mut OpenTables<'txn>,
        ops: &[WriteOp],
    ) -> Result<(), redb::Error> {
        let mut rest = ops;
        while let Some(first) = rest.first() {
            let run = rest
                .iter()
                .position(|op| op.table != first.table)
                .unwrap_or(rest.len());
            let mut ops = rest[..run]
                .iter()
                .map(|op| (op.key.as_slice(), op.value.as_deref()));
            if !open.apply(first.table, &mut ops)? {
                open.apply_business(first.table, || self.table(first.table).open(txn), &mut ops)?;
            }
            rest = &rest[run..];
        }
        Ok(())
    }
}

/// Whose a registered table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Internal {
    /// One of the store's own tables (their names use the reserved prefix).
    Yes,
    /// A table of format 2 and before: a format-2 log replays into it before the store moves
    /// to format 3; never created in a store.
    Legacy,
    /// A business table.
    No,
}
