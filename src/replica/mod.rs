//! The log's replica on NATS JetStream (feature `nats`): [`JetStream`], a
//! [`Replica`](crate::Replica) a store ships its write-ahead log to, and a
//! [`ReplicaSource`](crate::ReplicaSource) a restore reads it back from.
//!
//! This module owns the server-side layout of a replica (a stream of frames, a writer entry,
//! a snapshot bucket, all named from the store's name) and the fencing that keeps one writer
//! per stream. It never touches the store's own files: what a frame or a snapshot holds is
//! the `wal`'s business, passed through as bytes.
//!
//! - `connect`: the [`JetStream`] type, its settings, the bounded call;
//! - `bridge`: the replica's own runtime thread, and the waits bounded by the time limit;
//! - `names`: the stream, subject and bucket names, from a validated store name;
//! - `messages`: the stream's messages (frames, chunks, take-over markers), built and parsed;
//! - `stream`: the log stream opened or created, its messages read, where it ends;
//! - `publish`: frames sent pipelined, deduplicated and fenced;
//! - `read`: frames read back, joined and checked for gaps;
//! - `entry`: the writer entry's format, read and written by compare-and-set;
//! - `writer`: what changes the entry (claim, release, take-over, snapshot commit);
//! - `snapshots`: the snapshot objects, and the frames they let go;
//! - `shipping`: the two traits, over the modules above;
//! - `errors`: what a NATS failure means (unreachable, or refused).
//!
//! Each module's doc holds its formats and the reasoning behind them.

mod bridge;
mod connect;
mod entry;
mod errors;
mod messages;
mod names;
mod publish;
mod read;
mod shipping;
mod snapshots;
mod stream;
mod writer;

pub use self::connect::JetStream;
pub(crate) use self::errors::outage;

/// Nanoseconds since the Unix epoch (0 on a clock before it): what makes the names this
/// replica gives (a claim's token, a snapshot's object, a message's id) unique in time.
fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
