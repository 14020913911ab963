//! Reading business tables outside the writer, from a consistent snapshot.

use std::fmt;

use redb::{Key, ReadOnlyTable, TableDefinition, TableHandle, Value};

use crate::engine::registry::{RESERVED_PREFIX, type_names};
use crate::error::{ReadError, TxError};
use crate::store::Store;

/// A read-only snapshot of the store: everything acknowledged before it began, nothing after.
///
/// Reads never wait for the writer. Only registered business tables can be opened; the
/// store's own tables are reached through [`Store::get`].
pub struct ReadTx {
    txn: redb::ReadTransaction,
    store: Store,
}

impl fmt::Debug for ReadTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadTx").finish_non_exhaustive()
    }
}

impl ReadTx {
    pub(crate) fn new(txn: redb::ReadTransaction, store: Store) -> Self {
        ReadTx { txn, store }
    }

    /// Opens a registered business table with redb's full read API (`get`, `range`, `iter`,
    /// `len`).
    ///
    /// # Errors
    /// [`ReadError::Table`] if the table is not registered or registered with other types.
    pub fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        table: TableDefinition<'_, K, V>,
    ) -> Result<ReadOnlyTable<K, V>, ReadError> {
        let name = table.name();
        let registry = self.store.engine().registry();
        let id = registry
            .id(name)
            .filter(|_| !name.starts_with(RESERVED_PREFIX))
            .ok_or_else(|| TxError::UnknownTable {
                name: name.to_owned(),
            })?;
        let registered = registry.table(id).type_names();
        if registered != type_names::<K, V>() {
            return Err(TxError::TableTypeMismatch {
                name: name.to_owned(),
                registered,
                requested: type_names::<K, V>(),
            }
            .into());
        }
        Ok(self
            .txn
            .open_table(table)
            .map_err(crate::error::StoreError::from)?)
    }
}
