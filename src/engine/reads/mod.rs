//! The read path: `begin` before the writer, and reads of records, stats and abandoned work
//! from the overlay and redb's published state.

pub(super) mod begin;
pub(super) mod scan;
