//! The write-ahead log: how a group becomes durable with one small sequential sync, and how a
//! store comes back after a crash.
//!
//! The log holds effects, never code: every put and delete a group made, by table name, key
//! bytes and value bytes. It knows nothing of the engine that uses it: it takes a group as plain
//! operations ([`encode_group`]), appends and syncs frames on its own thread ([`LogThread`]),
//! and at open hands every frame past the checkpoint back as operations ([`recover`],
//! [`decode_frame`]); applying them is the caller's. It must never acknowledge a frame it has
//! not synced, and never replay a frame that follows a damaged one.
//!
//! - `format`: the bytes (segment header, frame, payload);
//! - `log`: appending to segments, their preallocation and reuse;
//! - `log_thread`: syncing groups while the writer runs the next ones;
//! - `recovery`: reading the segments back.

pub(crate) mod format;
#[cfg(feature = "cli")]
pub(crate) mod listing;
mod log;
mod log_thread;
mod recovery;
pub(crate) mod ship;

pub(crate) use self::format::{Payload, PayloadOp, decode_frame};
pub(crate) use self::log::{Log, LogStart, segment_name};
pub(crate) use self::log_thread::{
    FailedOutcome, Handoff, LogFailure, LogThread, Submission, Unsynced,
};
pub use self::recovery::RecoveryReport;
pub(crate) use self::recovery::{Checkpoint, ReplayFrame, recover};

/// One put (`value: Some`) or delete (`None`) of a group, as the log records it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Op<'a> {
    pub(crate) table: &'a str,
    pub(crate) key: &'a [u8],
    pub(crate) value: Option<&'a [u8]>,
}

/// Encodes a group's operations, in the order they were made, as one frame payload appended
/// to `out`.
pub(crate) fn encode_group<'a>(
    ops: impl IntoIterator<Item = Op<'a>>,
    out: &mut Vec<u8>,
) -> Result<(), postcard::Error> {
    let mut payload = Payload {
        tables: Vec::new(),
        ops: Vec::new(),
    };
    for op in ops {
        let index = match payload.tables.iter().position(|&name| name == op.table) {
            Some(index) => index,
            None => {
                payload.tables.push(op.table);
                payload.tables.len() - 1
            }
        };
        payload.ops.push(PayloadOp {
            // One entry per table a group wrote, and a store has at most 65,536 tables.
            table: u16::try_from(index).unwrap_or(u16::MAX),
            key: op.key,
            value: op.value,
        });
    }
    let buf = postcard::to_extend(&payload, std::mem::take(out))?;
    *out = buf;
    Ok(())
}

/// Decodes one group's payload (as [`encode_group`] made it).
pub(crate) fn decode_group(payload: &[u8]) -> Result<Payload<'_>, postcard::Error> {
    postcard::from_bytes(payload)
}

impl<'a> Payload<'a> {
    /// The payload's operations in order, with their tables by name; `Err(index)` for an op
    /// that names a table the payload does not list (damage).
    pub(crate) fn ops(&self) -> impl Iterator<Item = Result<Op<'a>, u16>> + '_ {
        self.ops
            .iter()
            .map(|op| match self.tables.get(usize::from(op.table)) {
                Some(&table) => Ok(Op {
                    table,
                    key: op.key,
                    value: op.value,
                }),
                None => Err(op.table),
            })
    }
}
