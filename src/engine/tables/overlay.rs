//! Records that are durable (in the log) but not yet published to redb.
//!
//! In `Wal` mode a group is acknowledged as soon as its log frame is synced, but redb commits
//! (which is what makes data visible to read transactions) happen once per epoch of several
//! groups: a redb commit costs the same whether it carries one group or ten. Until then, the
//! records those groups wrote are kept here, so that `begin` and `get` see every acknowledged
//! write. Business tables have no overlay: a snapshot of them asks the writer to publish first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

/// What the overlay knows of a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Overlaid {
    /// The latest durable write put this record.
    Put(Vec<u8>),
    /// The latest durable write deleted it.
    Deleted,
    /// No unpublished write touched it: read redb.
    Absent,
}

#[derive(Debug, Default)]
pub(crate) struct Overlay {
    records: RwLock<HashMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Whether durable groups exist that redb readers cannot see yet (any table).
    unpublished: AtomicBool,
}

impl Overlay {
    pub(crate) fn lookup(&self, key: &[u8]) -> Overlaid {
        match self.records.read().get(key) {
            Some(Some(value)) => Overlaid::Put(value.clone()),
            Some(None) => Overlaid::Deleted,
            None => Overlaid::Absent,
        }
    }

    /// Adds a durable group's record writes. Called before the group is answered.
    pub(crate) fn add(&self, records: impl Iterator<Item = (Vec<u8>, Option<Vec<u8>>)>) {
        let mut map = self.records.write();
        map.extend(records);
        self.unpublished.store(true, Ordering::SeqCst);
    }

    /// Called after the redb commit that published everything added so far.
    pub(crate) fn published(&self) {
        self.records.write().clear();
        self.unpublished.store(false, Ordering::SeqCst);
    }

    pub(crate) fn is_unpublished(&self) -> bool {
        self.unpublished.load(Ordering::SeqCst)
    }
}
