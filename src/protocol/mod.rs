//! The claim protocol as a trait: the state machine every backend keeps, whatever holds its
//! records (the traits need feature `tokio`).
//!
//! A backend is a [`Protocol`] (the store side: `begin`, `begin_or_wait`, eviction, the
//! abandoned-work listing, stats) and a [`ProtocolClaim`] (what a winner holds: `complete`,
//! `release`, `extend`, `checkpoint`, fenced). The HTTP layer, the extractor and the
//! [`Completer`](crate::Completer) are written against these traits, and
//! [`testing::conformance`](crate::testing::conformance) (feature `testing`) checks a backend
//! against them with real tasks racing the same keys.
//!
//! [`Begin`] here is the answer of any backend, generic over its claim type;
//! [`idemstore::Begin`](crate::Begin) is the same enum with the local store's
//! [`Claim`](crate::Claim) as the default, as `std::io::Result` is `std::result::Result` with
//! `io::Error`.
//!
//! Business writes are not part of the protocol: they are where backends differ. The local
//! store's claim commits through a redb [`Tx`](crate::Tx) (`Claim::commit`); another backend's
//! claim hands out its own transaction type. `complete` stores a response with no business
//! writes: the one commit every backend can make.
//!
//! The methods are async. On the local store the trait's methods are its `*_async` methods;
//! its inherent methods of the same names (`Store::begin`, `Claim::release`) are the blocking
//! ones, and a call that means the async one fails to compile rather than block.

// The generic forms of the answers, for code written against the traits: the only public
// items here. The crate root has the rest (the traits, `KeepAlive`, `Completer`) once each,
// and `Begin`/`CommitError` with the local claim as their default, as `io::Result` is
// `Result` with `io::Error`.
pub use crate::error::CommitError;
pub use crate::model::begin::Begin;

pub(crate) mod claim;
#[cfg(feature = "tokio")]
pub(crate) mod completer;
pub(crate) mod keep_alive;
#[cfg(feature = "tokio")]
pub(crate) mod outbox;
#[cfg(feature = "tokio")]
pub(crate) mod traits;

#[cfg(feature = "tokio")]
pub(crate) use self::traits::{Protocol, ProtocolClaim};
