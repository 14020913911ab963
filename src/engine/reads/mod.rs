//! The read path: `begin` before the writer, reads through the indexes, and the overlay of
//! records acknowledged but not yet published.

pub(super) mod begin;
pub(super) mod overlay;
pub(super) mod scan;
