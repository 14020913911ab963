//! Records that are durable (in the log) but not yet published to redb.
//!
//! In `Wal` mode a group is acknowledged as soon as its log frame is synced, but redb commits
//! (which is what makes data visible to read transactions) happen once per epoch of several
//! groups: a redb commit costs the same whether it carries one group or ten. Until then, the
//! records those groups wrote are kept here, by table and key as the writer wrote them, so that
//! `begin` and `get` see every acknowledged write. Business tables have no overlay: a snapshot
//! of them asks the writer to publish first.

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

/// The record tables the overlay holds writes of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordTable {
    /// `idemstore.claims`, by scope.
    Claims,
    /// `idemstore.done`, by partition and scope.
    Done,
}

/// One write to a record table, as a group made it durable.
pub(crate) type RecordWrite = (RecordTable, Vec<u8>, Option<Vec<u8>>);

type Map = HashMap<Vec<u8>, Option<Vec<u8>>>;

#[derive(Debug, Default)]
pub(crate) struct Overlay {
    tables: RwLock<(Map, Map)>,
    /// Whether durable groups exist that redb readers cannot see yet (any table).
    unpublished: AtomicBool,
}

fn found(map: &Map, key: &[u8]) -> Overlaid {
    match map.get(key) {
        Some(Some(value)) => Overlaid::Put(value.clone()),
        Some(None) => Overlaid::Deleted,
        None => Overlaid::Absent,
    }
}

impl Overlay {
    /// What the overlay holds of one claims key and of several done keys, all read at one
    /// moment: a reader that then reads redb for the keys found absent sees every write that
    /// was acknowledged before this call.
    pub(crate) fn lookup(&self, claim: &[u8], done: &[Vec<u8>]) -> (Overlaid, Vec<Overlaid>) {
        if !self.is_unpublished() {
            return (Overlaid::Absent, vec![Overlaid::Absent; done.len()]);
        }
        let tables = self.tables.read();
        let (claims, dones) = &*tables;
        (
            found(claims, claim),
            done.iter().map(|key| found(dones, key)).collect(),
        )
    }

    /// Adds a durable group's record writes. Called before the group is answered.
    pub(crate) fn add(&self, writes: impl Iterator<Item = RecordWrite>) {
        let mut tables = self.tables.write();
        let (claims, done) = &mut *tables;
        for (table, key, value) in writes {
            match table {
                RecordTable::Claims => claims.insert(key, value),
                RecordTable::Done => done.insert(key, value),
            };
        }
        self.unpublished.store(true, Ordering::SeqCst);
    }

    /// Called after the redb commit that published everything added so far.
    pub(crate) fn published(&self) {
        let mut tables = self.tables.write();
        tables.0.clear();
        tables.1.clear();
        self.unpublished.store(false, Ordering::SeqCst);
    }

    pub(crate) fn is_unpublished(&self) -> bool {
        self.unpublished.load(Ordering::SeqCst)
    }
}
