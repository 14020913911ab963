//! The values: what a caller builds, what the state machine decides on, and what it answers.
//!
//! Nothing here does I/O or knows the engine; every other floor may import this one.

pub(crate) mod backoff;
pub(crate) mod begin;
pub(crate) mod claim;
pub(crate) mod clock;
pub(crate) mod config;
pub(crate) mod decision;
pub(crate) mod execution;
pub(crate) mod fingerprint;
pub(crate) mod hex;
pub(crate) mod invalid;
pub mod limits;
pub(crate) mod maintenance;
pub(crate) mod memory;
pub(crate) mod message;
pub(crate) mod outcomes;
pub(crate) mod pace;
pub(crate) mod panic;
pub(crate) mod record;
pub(crate) mod replica;
pub(crate) mod response;
// Public for the protocol's model checker (`testing::handover`), unreachable without it.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub(crate) mod restore;
pub(crate) mod scope;
pub(crate) mod settings;
pub(crate) mod stats;
// The writer rules are kept by the replicas (`replica::JetStream`, feature `nats`;
// `testing::MemoryReplica`): a build with neither uses only the shipper's part of them.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
#[cfg_attr(not(any(feature = "nats", feature = "testing")), allow(dead_code))]
pub(crate) mod writer_epoch;
