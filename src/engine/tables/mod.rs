//! The tables and access to them: the registry of user tables, the store's own tables and
//! their key layout, the partitions of completed records, the overlay of records acknowledged
//! but not yet published, the transactions a request and a reader see, and the redb file.

pub(super) mod database;
pub(super) mod layout;
pub(super) mod meta;
pub(super) mod open_tables;
pub(super) mod overlay;
pub(super) mod partitions;
pub(super) mod read_tx;
pub(super) mod registry;
pub(super) mod restore_mark;
pub(super) mod tx;
pub(super) mod write_set;
