//! Every integration test, in one test binary.
//!
//! Each file below was once a binary of its own. Each such binary linked the whole dependency
//! graph (redb, tokio, axum, sqlx, async-nats) again: 43 links of about 80 MB each, gigabytes
//! of disk and minutes of link time on a small machine, for no isolation the tests need. One
//! binary links once. A module that needs a feature is compiled only with it, as its
//! `required-features` entry used to say.
//!
//! Tests that run a child process run this same binary with the child's full test path
//! (`module::name`, see `common::child`).

mod common;
/// The edge service example, loaded once for the tests that run it as a child process.
#[cfg(feature = "http")]
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/edge-service/src/main.rs"]
mod edge_service;

#[cfg(feature = "tokio")]
mod async_api;
mod backup;
mod bad_input;
#[cfg(all(unix, feature = "http", feature = "nats"))]
mod box_handover;
#[cfg(all(unix, feature = "http", feature = "nats"))]
mod box_loss;
#[cfg(feature = "cli")]
mod cli;
mod compact;
#[cfg(feature = "tokio")]
mod completer;
#[cfg(feature = "testing")]
mod concurrent_crash;
#[cfg(all(feature = "testing", feature = "tokio"))]
mod conformance;
#[cfg(feature = "testing")]
mod crash_matrix;
mod damaged_file;
mod dir_lock;
#[cfg(feature = "testing")]
mod epoch_faults;
#[cfg(all(feature = "testing", feature = "tokio"))]
mod execute;
#[cfg(unix)]
mod format_fixture;
mod group_isolation;
#[cfg(feature = "testing")]
mod handover;
#[cfg(feature = "testing")]
mod handover_model;
#[cfg(feature = "http")]
mod http_answers;
#[cfg(feature = "http")]
mod http_concurrency;
#[cfg(feature = "http")]
mod http_drain;
#[cfg(all(feature = "http", feature = "testing"))]
mod http_faults;
#[cfg(feature = "http")]
mod http_fingerprints;
#[cfg(feature = "http")]
mod http_handlers;
#[cfg(feature = "http")]
mod http_local;
#[cfg(all(feature = "http", feature = "postgres", feature = "testing"))]
mod http_postgres_local;
#[cfg(feature = "http")]
mod http_retry_after;
#[cfg(feature = "http")]
mod http_service;
#[cfg(all(feature = "http", feature = "testing"))]
mod http_stalls;
mod lifecycle;
#[cfg(feature = "testing")]
mod memory;
#[cfg(all(feature = "nats", feature = "testing"))]
mod nats;
#[cfg(all(feature = "testing", feature = "nats"))]
mod nats_cluster;
#[cfg(all(feature = "testing", feature = "tokio"))]
mod outbox;
mod permissions;
#[cfg(all(feature = "postgres", feature = "testing"))]
mod pg_bouncer;
#[cfg(all(feature = "postgres", feature = "testing"))]
mod pg_locked_key;
#[cfg(all(feature = "postgres", feature = "testing"))]
mod pg_plans;
#[cfg(all(feature = "postgres", feature = "testing"))]
mod pg_silent_network;
#[cfg(all(
    feature = "http",
    feature = "nats",
    feature = "postgres",
    feature = "testing"
))]
mod pg_two_instances;
#[cfg(all(feature = "postgres", feature = "testing"))]
mod postgres;
mod process_kill;
#[cfg(all(feature = "http", feature = "nats", feature = "testing"))]
mod queue_crash;
mod race;
#[cfg(all(feature = "testing", feature = "tokio"))]
mod relay_outage;
mod reopen;
#[cfg(feature = "testing")]
mod replica_contract;
#[cfg(feature = "nats")]
mod replica_jetstream;
mod restore_window;
#[cfg(feature = "testing")]
mod retention;
#[cfg(feature = "testing")]
mod second_fault;
#[cfg(all(unix, feature = "http"))]
mod service_slow_clients;
#[cfg(all(unix, feature = "http"))]
mod service_stop;
#[cfg(feature = "testing")]
mod shipping;
mod stats;
mod ttl;
mod two_processes;
#[cfg(feature = "testing")]
mod wal;
#[cfg(feature = "testing")]
mod wal_decode;
