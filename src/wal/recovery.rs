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
    FRAME_HEADER_LEN, HEADER_LEN, HeaderProblem, LOG_VERSION, SegmentHeader, Stop, damaged_len,
    frame_at, later_frame, scan,
};
use super::log::{FreeFile, LiveFile, LogStart, segment_index};

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

impl Candidate {
    fn first_seq(&self) -> u64 {
        self.header.map_or(0, |h| h.first_seq)
    }

    fn number(&self) -> u64 {
        self.header.map_or(0, |h| h.number)
    }
}

/// Where one segment's frames ended.
struct SegmentEnd {
    /// The segment's bytes.
    bytes: Vec<u8>,
    /// Offset of the first byte after its last valid frame.
    stop: usize,
    /// Sequence number of the last frame past the checkpoint, if any.
    last_new: Option<u64>,
}

/// Where the log past the last checkpoint begins, as the database recorded it with the
/// checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// The last frame durable in the database: replay starts after it.
    pub(crate) seq: u64,
    /// The number of the segment that held (or was about to hold) frame `seq + 1` when the
    /// checkpoint was taken: every frame past the checkpoint is in it or in a newer segment.
    /// `None` for a store whose checkpoints predate the record: every segment is read.
    pub(crate) segment: Option<u64>,
}

/// Replays every frame after the checkpoint through `apply`, in order, and no frame after
/// `through` (a frame whose sync failed is not read back as if it were durable).
///
/// The steps: read every segment's header; take, in the order they were activated, the
/// segments that may hold frames past the checkpoint (from the one the checkpoint names, or
/// all of them); prove they form one chain (each starts where the one before it ended, none
/// starts at a frame an older one holds, none leaves a gap past the checkpoint), replaying as
/// it goes; and judge how the last one ends (only it may end in a torn frame). A segment that
/// does not fit the chain is refused by name, never skipped: skipping it could hide
/// acknowledged frames.
pub(crate) fn recover(
    dir: &dyn LogDir,
    dir_path: &Path,
    checkpoint: Checkpoint,
    through: Option<u64>,
    segment_bytes: u64,
    apply: &mut dyn FnMut(ReplayFrame<'_>) -> Result<(), RecoveryError>,
) -> Result<Recovered, RecoveryError> {
    let started = Instant::now();
    let (candidates, next_file) = read_headers(dir, dir_path)?;
    let next_number = candidates
        .iter()
        .filter_map(|c| c.header.map(|h| h.number))
        .max()
        .map_or(1, |n| n.saturating_add(1));
    let chain = pick_chain(&candidates, checkpoint, dir_path)?;

    // Saturating: every number here comes from disk, and damage must not make it panic.
    let mut walk = Walk {
        expected: checkpoint.seq.saturating_add(1),
        through: through.unwrap_or(u64::MAX),
        last_seen: None,
        report: RecoveryReport::default(),
    };
    let mut live_last: Vec<Option<u64>> = vec![None; candidates.len()];
    for (i, &index) in chain.iter().enumerate() {
        let candidate = &candidates[index];
        let end = walk.segment(candidate, dir_path, apply)?;
        live_last[index] = end.last_new;
        match chain.get(i + 1) {
            Some(&next) => {
                check_continues(candidate, &end, &candidates[next], walk.expected, dir_path)?
            }
            None => judge_tail(candidate, &end, walk.expected, dir_path, &mut walk.report)?,
        }
    }
    let Walk {
        expected,
        mut report,
        ..
    } = walk;

    let mut free = Vec::new();
    let mut live_files = Vec::new();
    for (candidate, last) in candidates.into_iter().zip(live_last) {
        match last {
            Some(last_seq) => live_files.push((
                candidate.number(),
                LiveFile {
                    name: candidate.name,
                    file: candidate.file,
                    last_seq,
                },
            )),
            None => free.push(FreeFile {
                name: candidate.name,
                file: candidate.file,
            }),
        }
    }
    live_files.sort_by_key(|(number, _)| *number);
    report.duration = started.elapsed();
    Ok(Recovered {
        last_seq: expected.saturating_sub(1),
        start: LogStart {
            free,
            live: live_files.into_iter().map(|(_, f)| f).collect(),
            since_checkpoint: report.bytes_replayed
                + report.frames_replayed * FRAME_HEADER_LEN as u64,
            next_seq: expected,
            next_number,
            next_file,
            segment_bytes,
        },
        report,
    })
}

/// The segments that may hold frames past the checkpoint, in activation (number) order: from
/// the one the checkpoint names on, or every segment for a checkpoint that names none. The
/// older ones hold checkpointed frames only; their headers must still agree with the chain
/// (a segment activated earlier cannot start later).
fn pick_chain(
    candidates: &[Candidate],
    checkpoint: Checkpoint,
    dir_path: &Path,
) -> Result<Vec<usize>, RecoveryError> {
    let mut valid: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].header.is_some())
        .collect();
    valid.sort_by_key(|&i| candidates[i].number());
    let from = checkpoint.segment.unwrap_or(0);
    let split = valid.partition_point(|&i| candidates[i].number() < from);
    let chain = valid.split_off(split);
    if let Some(&first) = chain.first() {
        let starts = candidates[first].first_seq();
        if let Some(&older) = valid.iter().find(|&&i| candidates[i].first_seq() > starts) {
            return Err(RecoveryError::Stray {
                segment: dir_path.join(&candidates[older].name),
                detail: format!(
                    "its header says segment {} starting at frame {}, but the newer segment {} (number {}) starts at frame {starts}",
                    candidates[older].number(),
                    candidates[older].first_seq(),
                    candidates[first].name,
                    candidates[first].number(),
                ),
            });
        }
    }
    Ok(chain)
}

/// The walk along the chain: what it expects next and what it has seen.
struct Walk {
    /// The next frame the log must hold (the first past the checkpoint, then on).
    expected: u64,
    /// No frame after this one is replayed.
    through: u64,
    /// The newest frame any segment of the chain held so far, checkpointed or not.
    last_seen: Option<(u64, String)>,
    report: RecoveryReport,
}

impl Walk {
    /// Checks that `candidate` fits after the segments before it, then replays its frames past
    /// the checkpoint (up to `through`), advancing `expected`.
    fn segment(
        &mut self,
        candidate: &Candidate,
        dir_path: &Path,
        apply: &mut dyn FnMut(ReplayFrame<'_>) -> Result<(), RecoveryError>,
    ) -> Result<SegmentEnd, RecoveryError> {
        let name = candidate.name.as_str();
        let first = candidate.first_seq();
        if let Some((seen, holder)) = &self.last_seen
            && first <= *seen
        {
            return Err(RecoveryError::Stray {
                segment: dir_path.join(name),
                detail: format!(
                    "it starts at frame {first}, but the older segment {holder} already holds frames up to {seen}"
                ),
            });
        }
        if first > self.expected {
            return Err(RecoveryError::Missing {
                segment: dir_path.join(name),
                expected: self.expected,
                found: first,
            });
        }
        let len = candidate.file.len().map_err(io(dir_path, name))?;
        let mut bytes = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX)];
        candidate
            .file
            .read_at(0, &mut bytes)
            .map_err(io(dir_path, name))?;
        let scanned = scan(&bytes).map_err(|problem| RecoveryError::Corrupt {
            segment: dir_path.join(name),
            offset: 0,
            detail: format!("its header changed while open ({problem:?})"),
        })?;
        let mut last_new = None;
        for frame in &scanned.frames {
            if frame.seq >= self.expected && frame.seq <= self.through {
                apply(ReplayFrame {
                    segment: name,
                    offset: frame.offset as u64,
                    seq: frame.seq,
                    payload: frame.payload,
                })?;
                self.report.frames_replayed += 1;
                self.report.bytes_replayed += frame.payload.len() as u64;
                last_new = Some(frame.seq);
            }
        }
        if let Some(last) = scanned.frames.last() {
            // Frames run on from the header's first frame (the scan stops at a break), so the
            // segment holds `first ..= last.seq`.
            debug_assert_eq!(scanned.frames[0].seq, first);
            self.last_seen = Some((last.seq, name.to_owned()));
            self.expected = self
                .expected
                .max(last.seq.min(self.through).saturating_add(1));
        }
        let stop = match scanned.stop {
            Stop::EndOfFile => bytes.len(),
            Stop::Invalid { offset } => offset,
        };
        Ok(SegmentEnd {
            bytes,
            stop,
            last_new,
        })
    }
}

/// Every segment file of the directory with its header, if it has a valid one; and the
/// index above every segment file's.
fn read_headers(dir: &dyn LogDir, dir_path: &Path) -> Result<(Vec<Candidate>, u64), RecoveryError> {
    let mut names: Vec<(u64, String)> = dir
        .list()
        .map_err(io(dir_path, ""))?
        .into_iter()
        .filter_map(|name| segment_index(&name).map(|i| (i, name)))
        .collect();
    names.sort();
    let next_file = names.last().map_or(0, |(i, _)| i.saturating_add(1));
    let mut candidates = Vec::with_capacity(names.len());
    for (_, name) in names {
        let file = dir.open(&name).map_err(io(dir_path, &name))?;
        let mut head = [0u8; HEADER_LEN];
        let header = if file.len().map_err(io(dir_path, &name))? >= HEADER_LEN as u64 {
            file.read_at(0, &mut head).map_err(io(dir_path, &name))?;
            match SegmentHeader::decode(&head) {
                Ok(header) => Some(header),
                // Taking it for a free file would overwrite frames this build cannot read.
                Err(HeaderProblem::Version(found)) => {
                    return Err(RecoveryError::OtherFormat {
                        segment: dir_path.join(&name),
                        found,
                        supported: LOG_VERSION,
                    });
                }
                // Torn before its first sync or while rewritten for reuse: it holds nothing.
                Err(
                    HeaderProblem::Short | HeaderProblem::NotALogSegment | HeaderProblem::Checksum,
                ) => None,
            }
        } else {
            None
        };
        candidates.push(Candidate { name, file, header });
    }
    Ok((candidates, next_file))
}

/// A sealed segment must end where the next one starts, or the frames between them must all
/// be checkpointed (a spare segment deleted after a checkpoint leaves such a gap). A next
/// segment that starts before this one's end is caught when the walk reaches it.
fn check_continues(
    candidate: &Candidate,
    end: &SegmentEnd,
    next: &Candidate,
    expected: u64,
    dir_path: &Path,
) -> Result<(), RecoveryError> {
    if next.first_seq() <= expected {
        return Ok(());
    }
    Err(RecoveryError::Corrupt {
        segment: dir_path.join(&candidate.name),
        offset: end.stop as u64,
        detail: format!(
            "frame {expected} is missing or damaged, and segment {} continues at frame {}",
            next.name,
            next.first_seq()
        ),
    })
}

/// The last segment may end in a torn frame, and only in one: a valid frame after the stop is
/// damage in the middle of the log.
fn judge_tail(
    candidate: &Candidate,
    end: &SegmentEnd,
    expected: u64,
    dir_path: &Path,
    report: &mut RecoveryReport,
) -> Result<(), RecoveryError> {
    let corrupt = |detail: String| RecoveryError::Corrupt {
        segment: dir_path.join(&candidate.name),
        offset: end.stop as u64,
        detail,
    };
    let number = candidate.number();
    if let Some(frame) = frame_at(&end.bytes, end.stop, number) {
        return Err(corrupt(format!(
            "frame {} is out of order (expected {expected})",
            frame.seq
        )));
    }
    if let Some(frame) = later_frame(&end.bytes, end.stop, number, expected) {
        return Err(corrupt(format!(
            "a damaged frame is followed by valid frame {} at offset {}",
            frame.seq, frame.offset
        )));
    }
    let end_marker = end
        .bytes
        .get(end.stop..end.stop + FRAME_HEADER_LEN)
        .is_none_or(|b| b.iter().all(|&x| x == 0));
    if !end_marker {
        report.bytes_dropped = damaged_len(&end.bytes, end.stop) as u64;
        report.torn_tail = Some((candidate.name.clone(), end.stop as u64));
    }
    Ok(())
}

/// Maps an I/O error on a file of the log directory.
fn io(dir_path: &Path, name: &str) -> impl FnOnce(std::io::Error) -> RecoveryError {
    let path = dir_path.join(name);
    move |source| RecoveryError::Io { path, source }
}
