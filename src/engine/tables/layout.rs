//! The store's own tables and the byte layout of their keys.
//!
//! Index keys start with a big-endian timestamp so that redb's byte order is time order: the
//! oldest entries come first in a range scan. Layouts are in `docs/design.md`.

use redb::{Key, Value};

use crate::error::{BadTableReason, StoreError};
use crate::model::clock::Timestamp;
use crate::model::record::Record;
use crate::model::scope::Scope;

use super::registry::{Internal, Registry, TableId};

/// scope (encoded) → record (see `record.rs`).
pub(crate) const RECORDS: &str = "idemstore.records";
/// expires_at (u64 BE) ‖ scope → empty: completed records by expiry, for eviction.
pub(crate) const EXPIRY: &str = "idemstore.expiry";
/// lease_until (u64 BE) ‖ scope → empty: in-progress records by lease end, for abandoned work.
pub(crate) const LEASES: &str = "idemstore.leases";
/// name → value: format version, fence counter, log checkpoint.
pub(crate) const META: &str = "idemstore.meta";
/// until (u64 BE) ‖ scope → empty: tombstones by the time they go, for eviction.
pub(crate) const TOMBSTONES: &str = "idemstore.tombstones";

/// seq (u64 BE) → message: the outbox, committed messages not yet delivered, in commit order.
pub(crate) const OUTBOX: &str = "idemstore.outbox";
/// seq (u64 BE) → dead letter: messages the relay gave up on.
pub(crate) const DEAD_LETTERS: &str = "idemstore.dead_letters";

/// Meta key: the store's format version (u64 LE).
pub(crate) const META_FORMAT: &[u8] = b"format_version";
/// Meta key: the next fence to hand out (u64 LE). Fences never repeat for the life of the file.
pub(crate) const META_NEXT_FENCE: &[u8] = b"next_fence";
/// Meta key: the next outbox seq to hand out (u64 LE; absent means 1).
pub(crate) const META_NEXT_MESSAGE: &[u8] = b"next_message";
/// Meta key: the sequence number of the last log frame durable in redb (u64 LE).
pub(crate) const META_LOG_CHECKPOINT: &[u8] = b"log_checkpoint";
/// Meta key: the number of the log segment that holds (or was about to hold) the frame after
/// the checkpoint (u64 LE), written with it: recovery reads the log from that segment on and
/// proves every later one continues the chain. Absent in stores whose last checkpoint predates
/// it: recovery then reads every segment.
pub(crate) const META_LOG_SEGMENT: &[u8] = b"log_segment";

/// The layout of records, indexes, meta and log this build writes.
///
/// 2: records in version 2 (varints, compressed bodies). A format-1 store is read as it is:
/// its records keep version 1 until they are next written, and the open raises the store's
/// version to 2, so a build that only knows 1 refuses it instead of misreading new records.
pub(crate) const FORMAT_VERSION: u32 = 2;

/// The oldest format this build opens.
pub(crate) const OLDEST_FORMAT: u32 = 1;

/// Whether this build opens a store of format `found`.
pub(crate) fn format_supported(found: u64) -> bool {
    (u64::from(OLDEST_FORMAT)..=u64::from(FORMAT_VERSION)).contains(&found)
}

/// Ids of the store's own tables, fixed because they are registered first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InternalTables {
    pub(crate) records: TableId,
    pub(crate) expiry: TableId,
    pub(crate) leases: TableId,
    pub(crate) meta: TableId,
    pub(crate) tombstones: TableId,
    pub(crate) outbox: TableId,
    pub(crate) dead_letters: TableId,
}

impl InternalTables {
    /// Their ids, in the order they were registered (0 to 6).
    pub(crate) fn ids(self) -> [TableId; 7] {
        [
            self.records,
            self.expiry,
            self.leases,
            self.meta,
            self.tombstones,
            self.outbox,
            self.dead_letters,
        ]
    }

    /// Registers the store's tables; call before any business table.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let mut reg = |name| {
            registry
                .register::<&[u8], &[u8]>(name, Internal::Yes)
                .unwrap_or_else(|_| unreachable!("internal tables are registered first"))
        };
        InternalTables {
            records: reg(RECORDS),
            expiry: reg(EXPIRY),
            leases: reg(LEASES),
            meta: reg(META),
            tombstones: reg(TOMBSTONES),
            outbox: reg(OUTBOX),
            dead_letters: reg(DEAD_LETTERS),
        }
    }
}

/// The tables a store will open: its own, then the business tables registered on the builder.
#[derive(Debug)]
pub(crate) struct Tables {
    pub(in crate::engine) registry: Registry,
    pub(in crate::engine) internal: InternalTables,
}

impl Tables {
    /// The store's own tables, and no business table yet.
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let internal = InternalTables::register(&mut registry);
        Tables { registry, internal }
    }

    /// Registers a business table that commit and write closures may write.
    pub(crate) fn register<K: Key + 'static, V: Value + 'static>(
        &mut self,
        name: &str,
    ) -> Result<(), BadTableReason> {
        self.registry.register::<K, V>(name, Internal::No).map(drop)
    }
}

/// Decodes a stored record, or says which scope's record is corrupt: the one way every read
/// of the records table (a lookup, the writer, eviction, the scans) turns bytes into a record.
pub(crate) fn decode_stored(scope: &[u8], bytes: &[u8]) -> Result<Record, StoreError> {
    Record::decode(bytes).map_err(|source| StoreError::CorruptRecord {
        scope: Scope::decode(scope).map_or_else(|_| format!("{scope:?}"), |s| s.to_string()),
        source,
    })
}

/// `at (u64 BE) ‖ scope`: the key of an expiry or lease index entry.
pub(crate) fn index_key(at: Timestamp, scope: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + scope.len());
    key.extend_from_slice(&at.as_millis().to_be_bytes());
    key.extend_from_slice(scope);
    key
}

/// Splits an index key into its timestamp and scope bytes.
pub(crate) fn split_index_key(key: &[u8]) -> Option<(Timestamp, &[u8])> {
    let (at, scope) = key.split_first_chunk::<8>()?;
    Some((Timestamp::from_millis(u64::from_be_bytes(*at)), scope))
}

/// The first index key after every entry at or before `at`.
pub(crate) fn index_bound_after(at: Timestamp) -> Vec<u8> {
    at.as_millis().saturating_add(1).to_be_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_keys_sort_by_time_then_scope() {
        let a = index_key(Timestamp::from_millis(255), b"zz");
        let b = index_key(Timestamp::from_millis(256), b"aa");
        assert!(a < b);
        assert!(b < index_bound_after(Timestamp::from_millis(256)));
        assert_eq!(
            split_index_key(&b),
            Some((Timestamp::from_millis(256), &b"aa"[..]))
        );
    }
}
