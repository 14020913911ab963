//! Reading business tables outside the writer, from a consistent snapshot.

use std::fmt;
use std::sync::Arc;

use redb::{Key, ReadOnlyTable, TableDefinition, TableHandle, Value};

use crate::error::{ReadError, StoreError};

use super::registry::Registry;

/// A read-only snapshot of the store: everything acknowledged before it began, nothing after.
///
/// Reads never wait for the writer. Only registered business tables can be opened; the
/// store's own tables are reached through [`Store::get`](crate::Store::get).
pub struct ReadTx {
    txn: redb::ReadTransaction,
    registry: Arc<Registry>,
}

impl fmt::Debug for ReadTx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadTx").finish_non_exhaustive()
    }
}

impl ReadTx {
    pub(crate) fn new(txn: redb::ReadTransaction, registry: Arc<Registry>) -> Self {
        ReadTx { txn, registry }
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
        self.registry.business::<K, V>(table.name())?;
        Ok(self.txn.open_table(table).map_err(StoreError::from)?)
    }
}
