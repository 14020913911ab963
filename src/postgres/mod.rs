//! The PostgreSQL backend (feature `postgres`): the claim protocol over one shared database,
//! for services that run several instances. The public face is [`PgStore`] (its docs show the
//! transaction shape); this module owns the schema, the statements and the driver's errors,
//! and must never decide a `begin` outcome itself: the claiming statement decides what it
//! writes, and what writes nothing is decided by the same pure
//! [`decide`](crate::model::decision::decide) as the local store.
//!
//! Layout:
//! - `config`: the builder and its checks; `bounds`: every time limit, from two settings;
//! - `schema`: names from the prefix, the versioned migration;
//! - `sql`: every statement, built once per store;
//! - `store`: `begin`, eviction, listing, stats; `protocol`: the traits, `begin_or_wait`;
//! - `execute`: claim, business writes and completion in one transaction;
//! - `claim`: the fenced operations of a holder; `tx`: the transaction it hands out;
//! - `record`, `codec`: rows back into records and responses;
//! - `listen`: `LISTEN`/`NOTIFY` wake-ups; `sweep`: background eviction;
//! - `outbox`: published messages, the relay's lock and reads, the dead letters;
//! - `driver`: what the driver's errors mean, and the time limit on every call;
//! - `pooler`: what a pooler in front of the database must allow, checked at open.

mod batch;
mod bounds;
mod claim;
mod codec;
mod config;
mod driver;
mod execute;
mod listen;
mod outbox;
mod pooler;
mod protocol;
mod record;
mod schema;
mod sql;
mod store;
mod sweep;
mod tx;

pub use claim::PgClaim;
pub use config::PgBuilder;
pub use store::PgStore;
pub use tx::PgTx;

#[cfg(feature = "testing")]
pub(crate) use schema::Names;
#[cfg(feature = "testing")]
pub use sql::Planning;
#[cfg(feature = "testing")]
pub(crate) use sql::{EVICTION, Sql};
