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

/// scope (encoded) → in-progress record: the claims being worked on. Small (the claims in
/// flight, and abandoned ones until they are taken over), so every access hits cached pages.
pub(crate) const CLAIMS: &str = "idemstore.claims";
/// partition (u32 BE) ‖ scope → completed record (or a tombstone): see `partitions`.
pub(crate) const DONE: &str = "idemstore.done";
/// partition (u32 BE) → a sealed partition's figures and filter (`partitions/info.rs`).
pub(crate) const PARTITIONS: &str = "idemstore.partitions";
/// name → value: format version, fence counter, log checkpoint, filter key.
pub(crate) const META: &str = "idemstore.meta";

/// Format 2 and before: scope → record, every record in one table.
pub(crate) const RECORDS_V2: &str = "idemstore.records";
/// Format 2 and before: expires_at (u64 BE) ‖ scope → empty.
pub(crate) const EXPIRY_V2: &str = "idemstore.expiry";
/// Format 2 and before: lease_until (u64 BE) ‖ scope → empty.
pub(crate) const LEASES_V2: &str = "idemstore.leases";
/// Format 2 and before: until (u64 BE) ‖ scope → empty.
pub(crate) const TOMBSTONES_V2: &str = "idemstore.tombstones";

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
/// Meta key: the key of the partitions' filter hash (16 bytes, random, made with the store;
/// see `partitions/hash.rs`).
pub(crate) const META_FILTER_KEY: &[u8] = b"filter_key";
/// Meta key: the number of the log segment that holds (or was about to hold) the frame after
/// the checkpoint (u64 LE), written with it: recovery reads the log from that segment on and
/// proves every later one continues the chain. Absent in stores whose last checkpoint predates
/// it: recovery then reads every segment.
pub(crate) const META_LOG_SEGMENT: &[u8] = b"log_segment";
/// Meta key: the last log frame whose writes this commit holds (u64 LE), written by every
/// epoch's commit in `Wal` mode, synced or not. A snapshot of the file holds every frame up to
/// the larger of this and `log_checkpoint`, which is what a snapshot shipped to a replica
/// records. Absent (older stores, or before the first epoch): `log_checkpoint` alone; the
/// frames replayed at open may be past both, which only makes a restore replay some again.
pub(crate) const META_LOG_APPLIED: &[u8] = b"log_applied";
/// Meta key: a restore not yet opened (version 2 ‖ guarantee ‖ last frame u64 LE ‖ inherited
/// window end ms u64 LE, 0 for none ‖ not-before ms u64 LE, 26 bytes; version 1 stores wrote
/// the first 10), written into a rebuilt store's file before its first open
/// (`restore_mark::set_pending`). That open replaces it with [`META_RESTORED`]. Absent in a
/// store that was never restored.
pub(crate) const META_RESTORE_PENDING: &[u8] = b"restore_pending";
/// Meta key: the restore the store was last rebuilt by, merged with the ones before it
/// (version 2 ‖ guarantee ‖ last frame u64 LE ‖ inherited window end ms u64 LE, 0 for none ‖
/// restored_at ms u64 LE, 26 bytes; version 1: version ‖ guarantee ‖ last frame ‖
/// restored_at, 18 bytes), stamped by its first open: the restore window runs from
/// `restored_at`, across reopens. Absent: the store was never restored.
pub(crate) const META_RESTORED: &[u8] = b"restored";
/// Meta key: the writer epoch the store ships at (u64 LE; absent means 0), written by the
/// take-over that made it its stream's writer (`model::writer_epoch`).
pub(crate) const META_WRITER_EPOCH: &[u8] = b"writer_epoch";

/// The layout of records, tables, meta and log this build writes.
///
/// 3: claims in their own table, completed records in partitions by time, no per-record
/// index (`partitions`). A store of format 1 or 2 (one records table, three indexes) is
/// moved to it once, at open, after its log is replayed (`recovery::migrate`).
/// 2: records in version 2 (varints, compressed bodies); version-1 records are read as
/// they are.
pub(crate) const FORMAT_VERSION: u32 = 3;

/// The oldest format this build opens.
pub(crate) const OLDEST_FORMAT: u32 = 1;

/// Whether this build opens a store of format `found`.
pub(crate) fn format_supported(found: u64) -> bool {
    (u64::from(OLDEST_FORMAT)..=u64::from(FORMAT_VERSION)).contains(&found)
}

/// Ids of the store's own tables, fixed because they are registered first.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InternalTables {
    pub(crate) claims: TableId,
    pub(crate) done: TableId,
    pub(crate) partitions: TableId,
    pub(crate) meta: TableId,
    pub(crate) outbox: TableId,
    pub(crate) dead_letters: TableId,
}

impl InternalTables {
    /// The ids of the tables every epoch opens, in the order they were registered (0 to 5).
    pub(crate) fn ids(self) -> [TableId; 6] {
        [
            self.claims,
            self.done,
            self.partitions,
            self.meta,
            self.outbox,
            self.dead_letters,
        ]
    }

    /// Registers the store's tables; call before any business table.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let mut reg = |name, owner| {
            registry
                .register::<&[u8], &[u8]>(name, owner)
                .unwrap_or_else(|_| unreachable!("internal tables are registered first"))
        };
        let tables = InternalTables {
            claims: reg(CLAIMS, Internal::Yes),
            done: reg(DONE, Internal::Yes),
            partitions: reg(PARTITIONS, Internal::Yes),
            meta: reg(META, Internal::Yes),
            outbox: reg(OUTBOX, Internal::Yes),
            dead_letters: reg(DEAD_LETTERS, Internal::Yes),
        };
        // Format 2's tables, so that a format-2 log replays into them before the store is
        // moved to format 3 (`recovery::migrate`); never created or opened otherwise.
        for name in [RECORDS_V2, EXPIRY_V2, LEASES_V2, TOMBSTONES_V2] {
            reg(name, Internal::Legacy);
        }
        debug_assert!(
            tables
                .ids()
                .iter()
                .enumerate()
                .all(|(i, &id)| usize::from(id) == i),
            "the tables every epoch opens come first"
        );
        tables
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

/// Splits a key of format 2's expiry, lease and tombstone indexes (`at (u64 BE) ‖ scope`) into
/// its timestamp and scope bytes.
pub(crate) fn split_index_key(key: &[u8]) -> Option<(Timestamp, &[u8])> {
    let (at, scope) = key.split_first_chunk::<8>()?;
    Some((Timestamp::from_millis(u64::from_be_bytes(*at)), scope))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_2_index_keys_split_into_time_and_scope() {
        let mut key = 256u64.to_be_bytes().to_vec();
        key.extend_from_slice(b"aa");
        assert_eq!(
            split_index_key(&key),
            Some((Timestamp::from_millis(256), &b"aa"[..]))
        );
        assert_eq!(split_index_key(b"short"), None);
    }
}
