//! Errors from replaying the write-ahead log at open.

use std::path::PathBuf;

/// The log could not be replayed; the store was not opened and nothing was changed except what
/// replay had already applied (which is safe to apply again).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecoveryError {
    /// A log file could not be read.
    #[error("cannot read the log file {path}: {source}; check permissions and the disk")]
    Io {
        /// The file (or directory).
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The log is damaged before its end: valid frames follow a bad one, so dropping the bad
    /// one would silently lose acknowledged writes.
    #[error(
        "the log is damaged in the middle, in {segment} at offset {offset}: {detail}. Writes after this point were acknowledged, so idemstore will not drop them silently: restore the store directory from a backup, or, to accept losing every write from this point on, move this segment and every later one out of the log directory and reopen"
    )]
    Corrupt {
        /// The segment file.
        segment: PathBuf,
        /// Byte offset of the bad frame.
        offset: u64,
        /// What is wrong.
        detail: String,
    },
    /// Frames between the last checkpoint and the oldest segment are gone.
    #[error(
        "the log is missing frames {expected} and on: the oldest segment left, {segment}, starts at frame {found}; a segment file was removed. Restore the store directory from a backup"
    )]
    Missing {
        /// The oldest segment found.
        segment: PathBuf,
        /// The first frame recovery needs.
        expected: u64,
        /// The first frame it found.
        found: u64,
    },
    /// A segment file does not fit the log's chain: it starts at a frame an older segment
    /// already holds, or its header contradicts the segments around it. Replaying around it
    /// could hide acknowledged frames, so the store was not opened.
    #[error(
        "the log directory holds a segment that does not belong to this log's chain, {segment}: {detail}. The store was not opened and the log was not changed. If the file was copied in from elsewhere (another store, an older backup), move it out of the log directory and reopen; if the whole directory was restored, restore it from one backup"
    )]
    Stray {
        /// The segment file.
        segment: PathBuf,
        /// How it contradicts the chain.
        detail: String,
    },
    /// A segment is in a log format this build does not read.
    #[error(
        "the log segment {segment} is in log format {found}, and this build reads format {supported}. Nothing was changed. Open the store with the idemstore version that wrote it and close it cleanly (a clean close checkpoints the whole log into the database file); then remove the segment files from the log directory, and this build opens the store"
    )]
    OtherFormat {
        /// The segment file.
        segment: PathBuf,
        /// The format its header names.
        found: u32,
        /// The format this build reads and writes.
        supported: u32,
    },
    /// A frame writes a table that is not registered.
    #[error(
        "the log writes table {table:?} (frame {seq} in {segment} at offset {offset}), which is not registered; register it with Builder::table, with the key and value types it had, and reopen"
    )]
    UnknownTable {
        /// The table's name.
        table: String,
        /// The frame's sequence number.
        seq: u64,
        /// The segment file.
        segment: PathBuf,
        /// Byte offset of the frame.
        offset: u64,
    },
    /// A frame passed its checksum but its payload does not decode.
    #[error(
        "frame {seq} in {segment} at offset {offset} has a valid checksum but an unreadable payload ({detail}); it was written by an incompatible version: open the store with the version that wrote it"
    )]
    BadPayload {
        /// The frame's sequence number.
        seq: u64,
        /// The segment file.
        segment: PathBuf,
        /// Byte offset of the frame.
        offset: u64,
        /// The decoder's message.
        detail: String,
    },
    /// redb failed while replaying.
    #[error("redb failed while replaying the log: {0}; reopen to retry (replay is safe to repeat)")]
    Apply(#[source] redb::Error),
}
