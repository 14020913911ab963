//! # idemstore
//!
//! An embedded idempotency-key store: it makes a service's mutations safe to retry.
//!
//! A client that times out cannot know whether its request ran, so it retries with the same
//! `Idempotency-Key`. The store claims `(tenant, operation, key)` atomically before any work,
//! answers duplicates with the stored response (or "still running", or a refusal when the key is
//! reused for a different request), hands an expired claim to the next attempt as a *recovery*,
//! and commits the business writes and the completed record in **one** redb transaction.
//!
//! ```
//! use idemstore::{Begin, Fingerprint, Response, Scope, Store};
//! use redb::TableDefinition;
//!
//! const ORDERS: TableDefinition<u64, &str> = TableDefinition::new("orders");
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = Store::builder().table(ORDERS).open(dir.path().join("idem"))?;
//!
//! let scope = Scope::new("acct_42", "create_order", "6d4cbddc-9f7c-4e8c")?;
//! let command = ("widget", 3u32);
//! for _attempt in 0..2 {
//!     match store.begin(&scope, Fingerprint::of(&command)?)? {
//!         Begin::Claimed(claim) | Begin::Recovered(claim) => {
//!             let response = claim.commit(|tx| {
//!                 tx.insert(&ORDERS, 1, "widget x3")?; // same transaction as the record
//!                 Ok(Response::new(201, b"order 1".to_vec()))
//!             })?;
//!             assert_eq!(response.status(), 201);
//!         }
//!         Begin::Replay(stored) => assert_eq!(stored.body(), b"order 1"), // the retry
//!         Begin::InProgress { retry_after } => println!("409, retry in {retry_after:?}"),
//!         Begin::Mismatch => println!("422: key reused for another request"),
//!         Begin::Expired { .. } => println!("410: done long ago, response no longer kept"),
//!     }
//! }
//! let orders = store.read()?.open_table(ORDERS)?;
//! assert_eq!(redb::ReadableTableMetadata::len(&orders)?, 1); // one side effect
//! # Ok(())
//! # }
//! ```
//!
//! ## The state machine
//!
//! ```text
//! absent ──claim──> in_progress(fence n) ──commit──> completed(response) ──ttl──> evicted
//!                      │  │        └──release──> absent            (no side effect happened)
//!                      │  └──extend / checkpoint (fence-checked)
//!                      └──lease expires, next begin──> in_progress(fence n+1), "recovered"
//! ```
//!
//! | record found | fingerprint | [`Store::begin`] answers |
//! | --- | --- | --- |
//! | none, or completed past its TTL | – | [`Begin::Claimed`]; [`Begin::Recovered`] in a restore window ([`Recovery::Restored`]) |
//! | in progress, lease live | same | [`Begin::InProgress`], nothing written |
//! | in progress, lease expired | same | [`Begin::Recovered`], attempt + 1, previous checkpoint |
//! | completed | same | [`Begin::Replay`], byte for byte |
//! | any live record | different | [`Begin::Mismatch`], nothing written |
//!
//! ## Layout
//!
//! Floors, top to bottom. Code on a floor names only the floors below it (a doc link may point
//! anywhere); `.ci/floors.py` reads this list (and the engine's, in its `mod.rs`) and fails CI
//! on a path that points up or sideways, however it is written. This is the one map:
//! `docs/design.md` points here.
//!
//! 1. `testing` (feature `testing`): the crash harness and the conformance suites, over
//!    everything below.
//! 2. Adapters, beside each other:
//!    - `http` (feature `http`): the `Idempotency-Key` header as tower/axum middleware,
//!      generic over the protocol; the only place that knows HTTP statuses.
//!    - `relay` (feature `tokio`): the outbox's delivery to a sink (JetStream with `nats`).
//!    - `cli` (feature `cli`): the `idemstore` tool's whole source; a binary ships it by
//!      calling `cli::run`.
//! 3. Facades, beside each other:
//!    - `api`: what a caller holds of the local store (`Store`, `Claim`, `Builder`), and the
//!      store as a backend of the protocol; they build engine requests.
//!    - `postgres` (feature `postgres`): the same protocol over PostgreSQL, for several
//!      instances sharing one database ([`PgStore`]).
//!    - `inspect` (feature `cli`): a store's directory read without opening the store,
//!      through `engine`'s table layout, `wal` and `storage`; it writes nothing.
//!    - `replica` (feature `nats`): the write-ahead log shipped to NATS JetStream, and read
//!      back by a restore (`replica::JetStream`); an adapter, on this floor so that `cli`
//!      can restore from it. It names only `wal`'s shipping traits, `error` and `model`.
//! 4. `protocol`: the claim protocol as traits, what is written against them (`Completer`),
//!    and what both backends share: the claim model (`claim`), the outbox contract and the
//!    lease keep-alive.
//! 5. `engine`: one narrow interface (begin, execute, commit, release, extend, checkpoint,
//!    write, forget, evict, read, stats, compact, backup), in folders by what they do: `reads`,
//!    `requests`, `writer`, `recovery`, `tables`.
//! 6. `wal`: the write-ahead log: frames, segments, group commit's log thread, replay.
//! 7. `storage`: files and directories, the real ones and (feature `testing`) the simulated
//!    disk.
//! 8. `error`: what each operation can fail with.
//! 9. `model`: values (scope, fingerprint, record, response, clock, the state machine's
//!    `decision` and a claim's rules, backoff, limits) and what makes one invalid; no I/O.
//! 10. `metrics`: the metric names and the calls to the `metrics` facade; it names nothing.
//!
//! Formats and the reasoning behind them are in `docs/design.md`.

#![forbid(unsafe_code)]

mod api;
#[cfg(feature = "cli")]
pub mod cli;
mod engine;
mod error;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "cli")]
pub mod inspect;
mod metrics;
mod model;
#[cfg(feature = "postgres")]
mod postgres;
pub mod protocol;
#[cfg(feature = "tokio")]
pub mod relay;
#[cfg(feature = "nats")]
pub mod replica;
mod storage;
#[cfg(feature = "testing")]
pub mod testing;
mod wal;

pub use api::outbox::INBOX_OPERATION;
pub use api::{
    Begin, Builder, Claim, CommitError, Error, Standby, StandbyStatus, Store, TakeOverError,
};
pub use engine::{OwnedValue, ReadTx, Tx};
#[cfg(feature = "postgres")]
pub use error::PgOpenError;
pub use error::{
    BackupError, BadTableReason, BoxError, ClaimError, CompactError, CorruptRecord, ExecuteError,
    FingerprintError, ForgetError, Holder, OpenError, ReadError, RecoveryError, ReplicaError,
    ResponseError, RestoreError, ScopeError, StaleClaim, StaleReason, StoreError, TxError,
    WriteError,
};
pub use model::claim::Recovery;
pub use model::clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use model::config::{Durability, LooseFile, LoosePermissions, MetricLabels, SelfHeal, Sweep};
pub use model::execution::Execution;
pub use model::fingerprint::Fingerprint;
pub use model::limits::{self, Limits};
pub use model::maintenance::{
    Abandoned, BackedUp, Backlog, Compacted, Evicted, Forget, Restored, Takeover,
};
pub use model::message::{DeadLetter, Message, MessageError};
pub use model::record::{Record, RecordState};
pub use model::replica::{
    Guarantee, ShipState, Shipping, ShippingStats, SnapshotInfo, StreamPosition, Unreachable,
    WriterIdentity,
};
pub use model::response::Response;
pub use model::restore::{Lineage, RestoreWindow};
pub use model::scope::{Scope, ScopePart};
pub use model::stats::Stats;
#[cfg(feature = "postgres")]
pub use postgres::{PgBuilder, PgClaim, PgStore, PgTx};
#[cfg(feature = "tokio")]
pub use protocol::completer::{Completer, CompleterTask, Round};
pub use protocol::keep_alive::KeepAlive;
#[cfg(feature = "tokio")]
pub use protocol::traits::{Protocol, ProtocolClaim};
pub use wal::RecoveryReport;
pub use wal::ship::{Replica, ReplicaSource, ShippedFrame};

/// redb, re-exported so that table definitions use the same version the store was built with.
pub use redb;

/// sqlx, re-exported (feature `postgres`): its transaction and pool types are in
/// [`PgStore`]'s API, so business SQL uses the same version.
#[cfg(feature = "postgres")]
pub use sqlx;

/// The README's examples, compiled and run as doc tests so the front door never goes stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
