//! Every segment of a log directory read back with every frame it holds (feature `cli`), for
//! tools that show or check the log without replaying it.
//!
//! Unlike recovery, which reads only what lies past the checkpoint, this reads every valid
//! frame of every segment, checkpointed ones included, and says where each segment's frames
//! stop and whether a valid frame follows that stop (damage, not a torn tail). It only reads.

use std::io;

use crate::storage::LogDir;

use super::format::{HeaderProblem, SegmentHeader, Stop, decode_frame, later_frame, scan};
use super::log::segment_index;

/// One segment file as read.
#[derive(Debug)]
pub(crate) struct SegmentView<'a> {
    /// The file's name in the log directory.
    pub(crate) name: &'a str,
    /// Its header, or why it has none (a segment torn before its first sync, or being
    /// rewritten for reuse, holds nothing).
    pub(crate) header: Result<SegmentHeader, HeaderProblem>,
    /// Its valid frames in order: offset, sequence number, payload.
    pub(crate) frames: Vec<(u64, u64, &'a [u8])>,
    /// Where the frames stop, if before the end of the file.
    pub(crate) stop: Option<u64>,
    /// A valid frame after the stop: `(offset, seq)`. The stop is then damage in the middle.
    pub(crate) later: Option<(u64, u64)>,
}

/// Calls `f` with every segment of `dir`, in the order they were activated (segment number),
/// segments without a valid header last.
pub(crate) fn for_each_segment<E: From<io::Error>>(
    dir: &dyn LogDir,
    mut f: impl FnMut(SegmentView<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let mut files = Vec::new();
    for name in dir.list()? {
        if segment_index(&name).is_none() {
            continue;
        }
        let file = dir.open(&name)?;
        let len = file.len()?;
        let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        file.read_at(0, &mut bytes)?;
        let order = SegmentHeader::decode(&bytes).map_or(u64::MAX, |h| h.number);
        files.push((order, name, bytes));
    }
    files.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    for (_, name, bytes) in &files {
        let view = match scan(bytes) {
            Err(problem) => SegmentView {
                name,
                header: Err(problem),
                frames: Vec::new(),
                stop: None,
                later: None,
            },
            Ok(scanned) => {
                let stop = match scanned.stop {
                    Stop::EndOfFile => None,
                    Stop::Invalid { offset } => Some(offset),
                };
                let next_seq = scanned
                    .frames
                    .last()
                    .map_or(scanned.header.first_seq, |f| f.seq.saturating_add(1));
                let later = stop
                    .and_then(|at| later_frame(bytes, at, scanned.header.number, next_seq))
                    .map(|f| (f.offset as u64, f.seq));
                SegmentView {
                    name,
                    header: Ok(scanned.header),
                    frames: scanned
                        .frames
                        .iter()
                        .map(|f| (f.offset as u64, f.seq, f.payload))
                        .collect(),
                    stop: stop.map(|s| s as u64),
                    later,
                }
            }
        };
        f(view)?;
    }
    Ok(())
}

/// One operation of a decoded frame: table, key, and the value (`None`: a delete).
pub(crate) type DecodedOp<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);

/// A frame's operations in order, every group it carries flattened.
///
/// # Errors
/// The decoder's message, for a payload that passed its CRC but does not decode.
pub(crate) fn frame_ops(payload: &[u8]) -> Result<Vec<DecodedOp<'_>>, String> {
    let groups = decode_frame(payload).map_err(|e| e.to_string())?;
    let mut ops = Vec::new();
    for group in groups {
        for op in group.ops {
            let table = group.tables.get(usize::from(op.table)).ok_or_else(|| {
                format!(
                    "an operation names table {} of {}",
                    op.table,
                    group.tables.len()
                )
            })?;
            ops.push((*table, op.key, op.value));
        }
    }
    Ok(ops)
}
