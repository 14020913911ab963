//! Getting back to what was acknowledged: catching up with the log at open and replaying its
//! frames, for opening and for the writer's restore in place (`writer::restore`).

pub(super) mod catch_up;
pub(super) mod migrate;
pub(super) mod partitions;
pub(super) mod replay;

use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::OpenError;
use crate::model::panic::panic_message;

/// Runs a step of opening or recovering that reads the database file, turning a panic inside
/// redb (a damaged file) into an error.
pub(in crate::engine) fn guarded<T>(
    storage: &crate::storage::Storage,
    step: impl FnOnce() -> Result<T, OpenError>,
) -> Result<T, OpenError> {
    catch_unwind(AssertUnwindSafe(step)).unwrap_or_else(|panic| {
        Err(OpenError::Damaged {
            path: storage.db_path(),
            detail: panic_message(panic.as_ref()),
        })
    })
}
