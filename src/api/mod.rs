//! The facades a caller holds: [`Store`], [`Claim`] and their builder, async twins and the lease keeper.
//!
//! They build engine requests and map the answers; they know nothing of jobs, contexts or tables.

pub(crate) mod any_error;
#[cfg(feature = "tokio")]
pub(crate) mod async_api;
#[cfg(feature = "tokio")]
mod backend;
pub(crate) mod builder;
pub(crate) mod claim;
pub(crate) mod outbox;
#[cfg(feature = "tokio")]
mod outbox_contract;
mod restore;
mod standby;
pub(crate) mod store;

pub use any_error::Error;
pub use builder::Builder;
pub use claim::{Begin, Claim, CommitError};
pub use standby::{Standby, StandbyStatus, TakeOverError};
pub use store::Store;
