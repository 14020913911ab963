//! The read path: `begin` before the writer, reads through the indexes, the overlay of
//! records acknowledged but not yet published, and the claims this process holds.

pub(super) mod begin;
pub(super) mod overlay;
pub(super) mod scan;
pub(super) mod watchers;
