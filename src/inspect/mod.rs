//! Reading a store's directory without opening the store (feature `cli`): what the `idemstore`
//! command-line tool shows an operator.
//!
//! An [`Inspector`] opens the database with [`redb::ReadOnlyDatabase`] and reads the log's
//! segments with files opened for reading: it never creates, writes, replays or truncates
//! anything, so a store can be looked at after a crash exactly as the crash left it. What the
//! log holds past the last checkpoint (acknowledged writes a replay would apply at the next
//! open) is laid over the database's tables in memory, so answers match what the store would
//! say once opened.
//!
//! An inspector locks the store's directory shared for as long as it lives (no store opens
//! meanwhile), and a store open in a running process, which holds the lock exclusively, cannot
//! be inspected: [`InspectError::InUse`] names the process (ask the service's own stats
//! instead).
//!
//! ```
//! use idemstore::inspect::{Filter, Inspector, LogDamage, StateFilter};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # drop(idemstore::Store::open(dir.path())?);
//! let inspector = Inspector::open(dir.path(), LogDamage::Refuse)?;
//! let stuck = inspector.records(&Filter {
//!     state: StateFilter::InProgress,
//!     tenant: None,
//!     older_than: Some(std::time::Duration::from_secs(300)),
//!     limit: 100,
//! })?;
//! assert!(stuck.is_empty());
//! assert!(inspector.verify()?.is_sound());
//! # Ok(())
//! # }
//! ```
//!
//! - `open`: the read-only view (database and log overlay);
//! - `records`: records, listings and the summary;
//! - `log`: every frame of the log;
//! - `verify`: the consistency checks;
//! - `error`: why a directory cannot be inspected;
//! - `below`: the stores below a directory that is not one, for its error to name.

mod below;
mod error;
mod log;
mod open;
mod records;
mod verify;

pub use crate::error::Holder;
pub use error::InspectError;
pub use log::{FrameStatus, LogFrame, LogOp, OpKind, SegmentDamage};
pub use open::{Closed, FrameAt, Inspector, LogDamage};
pub use records::{Entry, Filter, StateFilter, Summary};
pub use verify::{Problem, Verification};
