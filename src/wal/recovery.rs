//! Reading the log back at open: replay every frame after the last checkpoint, drop a torn
//! tail, refuse damage in the middle.
//!
//! A frame after a bad one is damage, never a tail: the writer syncs each frame before writing
//! the next, so a crash can only tear the very last one. Dropping anything before a valid frame
//! would silently lose acknowledged writes, so that case is an error naming the segment and
//! offset.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::RecoveryError;
use crate::storage::{LogDir, LogFile};

use super::format::{
    FRAME_HEADER_LEN, HEADER_LEN, SegmentHeader, Stop, damaged_len, frame_at, later_frame, scan,
};
use super::log::{FreeFile, LogStart, segment_index};

/// What opening found in the log and did about it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecoveryReport {
    /// Frames after the last checkpoint, replayed into redb.
    pub frames_replayed: u64,
    /// Payload bytes of those frames.
    pub bytes_replayed: u64,
    /// Bytes of a torn frame at the end of the log that were dropped (it was never
    /// acknowledged: its sync had not returned).
    pub bytes_dropped: u64,
    /// Where the torn frame was, if there was one: segment file name and offset.
    pub torn_tail: Option<(String, u64)>,
    /// How long reading and replaying took.
    pub duration: Duration,
}

/// A frame to replay, with where it is for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplayFrame<'a> {
    pub(crate) segment: &'a str,
    pub(crate) offset: u64,
    pub(crate) seq: u64,
    pub(crate) payload: &'a [u8],
}

/// The result of reading the log.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub(crate) report: RecoveryReport,
    /// The last sequence number replayed, or the checkpoint if none was.
    pub(crate) last_seq: u64,
    /// Where the next log starts. Its files may be reused only once the replayed frames are
    /// durable in redb.
    pub(crate) start: LogStart,
}

struct Candidate {
    name: String,
    file: Box<dyn LogFile>,
    header: Option<SegmentHeader>,
}

/// Replays every frame after `checkpoint` through `apply`, in order.
pub(crate) fn recover(
    dir: &dyn LogDir,
    dir_path: &Path,
    checkpoint: u64,
    segment_bytes: u64,
    apply: &mut dyn FnMut(ReplayFrame<'_>) -> Result<(), RecoveryError>,
) -> Result<Recovered, RecoveryError> {
    let started = Instant::now();
    let io = |name: &str| {
        let path = dir_path.join(name);
        move |source| RecoveryError::Io { path, source }
    };
    let mut names: Vec<(u64, String)> = dir
        .list()
        .map_err(io(""))?
        .into_iter()
        .filter_map(|name| segment_index(&name).map(|i| (i, name)))
        .collect();
    names.sort();
    let next_file = names.last().map_or(0, |(i, _)| i.saturating_add(1));

    let mut candidates = Vec::with_capacity(names.len());
    for (_, name) in names {
        let file = dir.open(&name).map_err(io(&name))?;
        let mut head = [0u8; HEADER_LEN];
        let header = if file.len().map_err(io(&name))? >= HEADER_LEN as u64 {
            file.read_at(0, &mut head).map_err(io(&name))?;
            SegmentHeader::decode(&head).ok()
        } else {
            None
        };
        candidates.push(Candidate { name, file, header });
    }
    let next_number = candidates
        .iter()
        .filter_map(|c| c.header.map(|h| h.number))
        .max()
        .map_or(1, |n| n.saturating_add(1));

    // Segments with a valid header, in the order they were activated.
    let mut valid: Vec<&Candidate> = candidates.iter().filter(|c| c.header.is_some()).collect();
    valid.sort_by_key(|c| c.header.map(|h| h.number));
    let first_seq = |c: &Candidate| c.header.map_or(0, |h| h.first_seq);

    let mut report = RecoveryReport::default();
    // Saturating: every number here comes from disk, and damage must not make it panic.
    let mut expected = checkpoint.saturating_add(1);
    // The newest segment that starts at or before the first frame to replay; every segment
    // before it holds checkpointed frames only.
    let from = valid.iter().rposition(|c| first_seq(c) <= expected);
    if from.is_none() {
        if let Some(first) = valid.first() {
            return Err(RecoveryError::Missing {
                segment: dir_path.join(&first.name),
                expected,
                found: first_seq(first),
            });
        }
    }
    let live = &valid[from.unwrap_or(valid.len())..];
    for (i, candidate) in live.iter().enumerate() {
        let name = candidate.name.as_str();
        let len = candidate.file.len().map_err(io(name))?;
        let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        candidate.file.read_at(0, &mut bytes).map_err(io(name))?;
        let scanned = scan(&bytes).map_err(|problem| RecoveryError::Corrupt {
            segment: dir_path.join(name),
            offset: 0,
            detail: format!("its header changed while open ({problem:?})"),
        })?;
        let first_new = expected;
        for frame in scanned.frames.iter().filter(|f| f.seq >= first_new) {
            apply(ReplayFrame {
                segment: name,
                offset: frame.offset as u64,
                seq: frame.seq,
                payload: frame.payload,
            })?;
            report.frames_replayed += 1;
            report.bytes_replayed += frame.payload.len() as u64;
            expected = frame.seq.saturating_add(1);
        }
        let corrupt = |offset: usize, detail: String| RecoveryError::Corrupt {
            segment: dir_path.join(name),
            offset: offset as u64,
            detail,
        };
        let stop_offset = match scanned.stop {
            Stop::EndOfFile => bytes.len(),
            Stop::Invalid { offset } => offset,
        };
        match live.get(i + 1) {
            // A sealed segment must end exactly where the next one starts.
            Some(next) => {
                if expected != first_seq(next) {
                    return Err(corrupt(
                        stop_offset,
                        format!(
                            "frame {expected} is missing or damaged, and segment {} continues at frame {}",
                            next.name,
                            first_seq(next)
                        ),
                    ));
                }
            }
            // The last segment may end in a torn frame, and only in one.
            None => {
                let number = candidate.header.map_or(0, |h| h.number);
                if let Some(frame) = frame_at(&bytes, stop_offset, number) {
                    return Err(corrupt(
                        stop_offset,
                        format!("frame {} is out of order (expected {expected})", frame.seq),
                    ));
                }
                if let Some(frame) = later_frame(&bytes, stop_offset, number, expected) {
                    return Err(corrupt(
                        stop_offset,
                        format!(
                            "a damaged frame is followed by valid frame {} at offset {}",
                            frame.seq, frame.offset
                        ),
                    ));
                }
                let end_marker = bytes
                    .get(stop_offset..stop_offset + FRAME_HEADER_LEN)
                    .is_none_or(|b| b.iter().all(|&x| x == 0));
                if !end_marker {
                    report.bytes_dropped = damaged_len(&bytes, stop_offset) as u64;
                    report.torn_tail = Some((name.to_owned(), stop_offset as u64));
                }
            }
        }
    }

    let free = candidates
        .into_iter()
        .map(|c| FreeFile {
            name: c.name,
            file: c.file,
        })
        .collect();
    report.duration = started.elapsed();
    Ok(Recovered {
        report,
        last_seq: expected.saturating_sub(1),
        start: LogStart {
            free,
            next_seq: expected,
            next_number,
            next_file,
            segment_bytes,
        },
    })
}
