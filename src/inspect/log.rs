//! Every frame of the log, for `dump-log`: where it is, its sequence number, its size and its
//! operations.

use std::io;

use crate::storage::LogDir;
use crate::wal::format::HeaderProblem;
use crate::wal::listing;

use super::error::InspectError;
use super::open::Inspector;

/// One operation of a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOp {
    /// The table it writes.
    pub table: String,
    /// The key, as stored (an encoded scope, an index key, or a business table's key).
    pub key: Vec<u8>,
    /// A put (with its value's size) or a delete.
    pub op: OpKind,
}

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OpKind {
    /// Inserts or overwrites the key.
    Put {
        /// The value's size in bytes.
        value_len: usize,
    },
    /// Removes the key.
    Delete,
}

/// Whether the database already holds a frame's writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameStatus {
    /// At or before the checkpoint: the database holds it durably, and its segment may be
    /// reused.
    Checkpointed,
    /// Past the checkpoint: the next open replays it.
    Pending,
}

/// One valid frame of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFrame {
    /// The segment file's name.
    pub segment: String,
    /// The frame's offset in the segment.
    pub offset: u64,
    /// Its sequence number.
    pub seq: u64,
    /// Its payload's size in bytes (the 20-byte header not included).
    pub size: u64,
    /// Checkpointed or pending replay.
    pub status: FrameStatus,
    /// Its operations, in order, or why the payload does not decode.
    pub ops: Result<Vec<LogOp>, String>,
}

/// Damage found in one segment: a valid frame after an invalid one, or a header this build
/// does not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentDamage {
    /// The segment file's name.
    pub segment: String,
    /// Where the damage is.
    pub offset: u64,
    /// What is wrong.
    pub detail: String,
}

/// Stops a walk of the log: a read error, or the caller's own.
enum Stopped<E> {
    Io(io::Error),
    Caller(E),
}

impl<E> From<io::Error> for Stopped<E> {
    fn from(e: io::Error) -> Self {
        Stopped::Io(e)
    }
}

impl Inspector {
    /// Calls `f` with every valid frame of every segment whose sequence number is at least
    /// `from`, segments in the order they were written; returns the damage found on the way.
    ///
    /// Frames after damage in a segment are not shown (they cannot be trusted to be frames);
    /// damage that spans segments (a missing segment) is in [`Inspector::log_damage`].
    ///
    /// # Errors
    /// [`InspectError::Io`] if a segment cannot be read, or what `f` returned.
    pub fn frames<E: From<InspectError>>(
        &self,
        from: u64,
        mut f: impl FnMut(&LogFrame) -> Result<(), E>,
    ) -> Result<Vec<SegmentDamage>, E> {
        let Some(log) = &self.log else {
            return Ok(Vec::new());
        };
        let mut damage = Vec::new();
        let walked = listing::for_each_segment(log as &dyn LogDir, |view| {
            if let Err(HeaderProblem::Version(found)) = view.header {
                damage.push(SegmentDamage {
                    segment: view.name.to_owned(),
                    offset: 0,
                    detail: format!(
                        "the segment is in log format {found}, which this build does not read"
                    ),
                });
            }
            for &(offset, seq, payload) in view.frames.iter().filter(|(_, seq, _)| *seq >= from) {
                let ops = listing::frame_ops(payload).map(|ops| {
                    ops.into_iter()
                        .map(|(table, key, value)| LogOp {
                            table: table.to_owned(),
                            key: key.to_vec(),
                            op: value
                                .map_or(OpKind::Delete, |v| OpKind::Put { value_len: v.len() }),
                        })
                        .collect()
                });
                let frame = LogFrame {
                    segment: view.name.to_owned(),
                    offset,
                    seq,
                    size: payload.len() as u64,
                    status: if seq <= self.checkpoint {
                        FrameStatus::Checkpointed
                    } else {
                        FrameStatus::Pending
                    },
                    ops,
                };
                f(&frame).map_err(Stopped::Caller)?;
            }
            if let (Some(stop), Some((offset, seq))) = (view.stop, view.later) {
                damage.push(SegmentDamage {
                    segment: view.name.to_owned(),
                    offset: stop,
                    detail: format!(
                        "a damaged frame is followed by valid frame {seq} at offset {offset}"
                    ),
                });
            }
            Ok(())
        });
        match walked {
            Ok(()) => Ok(damage),
            Err(Stopped::Caller(e)) => Err(e),
            Err(Stopped::Io(source)) => Err(E::from(InspectError::Io {
                path: log.path().to_path_buf(),
                source,
            })),
        }
    }
}
