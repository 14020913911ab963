//! The appending side of the log: one frame per group, then one `fdatasync`.
//!
//! Segments are preallocated (written with zeros and synced when created) because overwriting
//! allocated blocks syncs faster than growing a file: `fdatasync` then has no size or extent
//! change to flush. A checkpoint hands segments whose frames are all in redb back to a free
//! list, and the next segment reuses one under a new segment number. This module must never
//! have two unsynced frames at once: recovery relies on it to tell a torn tail from damage.

use std::io;

use crate::storage::{LogDir, LogFile};

use super::format::{FRAME_HEADER_LEN, HEADER_LEN, MAX_PAYLOAD, SegmentHeader, encode_frame};

/// Zeros written per call while preallocating.
const ZERO_CHUNK: usize = 1 << 20;
/// Zero bytes written after every frame: where the next frame header would be, a length of
/// zero marks the clean end of the log.
const END_MARKER: u64 = FRAME_HEADER_LEN as u64;

/// A segment file in use.
#[derive(Debug)]
struct Segment {
    name: String,
    file: Box<dyn LogFile>,
    number: u64,
    /// Sequence number of the last frame written to it, if any.
    last_seq: Option<u64>,
    /// Where the next frame goes.
    end: u64,
    /// The file's length.
    capacity: u64,
}

/// A segment file not in use: its frames are all checkpointed.
#[derive(Debug)]
pub(crate) struct FreeFile {
    pub(crate) name: String,
    pub(crate) file: Box<dyn LogFile>,
}

/// Where a new log starts after recovery.
#[derive(Debug)]
pub(crate) struct LogStart {
    /// Files left from before, all of whose frames are in redb: reused before creating any.
    pub(crate) free: Vec<FreeFile>,
    pub(crate) next_seq: u64,
    /// Above every segment number ever written in this directory.
    pub(crate) next_number: u64,
    /// Above every segment file's index.
    pub(crate) next_file: u64,
    pub(crate) segment_bytes: u64,
}

/// The segment files not in use, and how to make more.
#[derive(Debug)]
struct Files {
    dir: Box<dyn LogDir>,
    free: Vec<FreeFile>,
    next_number: u64,
    next_file: u64,
    segment_bytes: u64,
}

impl Files {
    /// Takes a free file (or creates one), sizes it for `frame_len`, and writes and syncs a
    /// new header: the segment is then ready for frames starting at `first_seq`.
    fn activate(&mut self, first_seq: u64, frame_len: u64) -> io::Result<Segment> {
        let needed = (HEADER_LEN as u64 + frame_len + END_MARKER).max(self.segment_bytes);
        let (FreeFile { name, mut file }, fresh) = match self.free.pop() {
            Some(free) => (free, Fresh::No),
            None => {
                let name = segment_name(self.next_file);
                self.next_file += 1;
                let file = self.dir.create(&name)?;
                (FreeFile { name, file }, Fresh::Yes)
            }
        };
        let len = file.len()?;
        if len < needed {
            // A new file, or a frame larger than a segment: grow it with zeros first.
            preallocate(file.as_mut(), len, needed)?;
        }
        if fresh == Fresh::Yes {
            // The file's directory entry must survive a crash before frames go into it.
            self.dir.sync()?;
        }
        let number = self.next_number;
        self.next_number += 1;
        // The header and an end marker: whatever the file held in its previous life after the
        // header must not read as this life's first frame.
        let mut head = SegmentHeader { number, first_seq }.encode().to_vec();
        head.resize(HEADER_LEN + FRAME_HEADER_LEN, 0);
        file.write_at(0, &head)?;
        file.sync_data()?;
        Ok(Segment {
            name,
            file,
            number,
            last_seq: None,
            end: HEADER_LEN as u64,
            capacity: len.max(needed),
        })
    }
}

/// Whether a file was just created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fresh {
    Yes,
    No,
}

#[derive(Debug)]
pub(crate) struct Log {
    files: Files,
    active: Segment,
    /// Full segments whose frames are not all checkpointed yet, oldest first.
    sealed: Vec<Segment>,
    next_seq: u64,
    /// Frame bytes appended since the last checkpoint.
    since_checkpoint: u64,
    buf: Vec<u8>,
}

/// The file name of segment file `index`.
pub(crate) fn segment_name(index: u64) -> String {
    format!("seg-{index:08}.log")
}

/// The index in a segment file name, if `name` is one.
pub(crate) fn segment_index(name: &str) -> Option<u64> {
    name.strip_prefix("seg-")?
        .strip_suffix(".log")?
        .parse()
        .ok()
}

impl Log {
    /// Activates a segment and returns a log ready to append at `start.next_seq`.
    pub(crate) fn start(dir: Box<dyn LogDir>, start: LogStart) -> io::Result<Log> {
        let mut files = Files {
            dir,
            free: start.free,
            next_number: start.next_number,
            next_file: start.next_file,
            segment_bytes: start.segment_bytes,
        };
        let active = files.activate(start.next_seq, 0)?;
        Ok(Log {
            files,
            active,
            sealed: Vec::new(),
            next_seq: start.next_seq,
            since_checkpoint: 0,
            buf: Vec::new(),
        })
    }

    /// Appends one frame and syncs it. Returns its sequence number; the frame's size on disk is
    /// 16 bytes more than the payload.
    pub(crate) fn append(&mut self, payload: &[u8]) -> io::Result<u64> {
        if payload.is_empty() || payload.len() > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a log frame of {} bytes is outside 1 ..= 1 GiB",
                    payload.len()
                ),
            ));
        }
        let frame_len = (FRAME_HEADER_LEN + payload.len()) as u64;
        if self.active.end + frame_len + END_MARKER > self.active.capacity {
            let next = self.files.activate(self.next_seq, frame_len)?;
            let full = std::mem::replace(&mut self.active, next);
            self.sealed.push(full);
        }
        let seq = self.next_seq;
        self.buf.clear();
        encode_frame(&mut self.buf, self.active.number, seq, payload);
        // Zeros after the frame, in the same write: the end of the log then reads as an end
        // marker, not as a torn frame, even in a file reused from an earlier life.
        self.buf.resize(self.buf.len() + FRAME_HEADER_LEN, 0);
        self.active.file.write_at(self.active.end, &self.buf)?;
        self.active.file.sync_data()?;
        self.active.end += frame_len;
        self.active.last_seq = Some(seq);
        self.next_seq += 1;
        self.since_checkpoint += frame_len;
        Ok(seq)
    }

    /// The sequence number of the last frame appended (or the one before the first).
    pub(crate) fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    pub(crate) fn since_checkpoint(&self) -> u64 {
        self.since_checkpoint
    }

    /// Every frame up to `seq` is durable in redb: recycle the segments that hold only such
    /// frames.
    ///
    /// Free files beyond `keep_free` are deleted: enough are kept to write one checkpoint
    /// interval without creating files, and a burst that needed more does not hold disk space
    /// for ever. A failure to delete is ignored (the file is a reusable spare, not data).
    pub(crate) fn checkpointed(&mut self, seq: u64, keep_free: usize) {
        self.since_checkpoint = 0;
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.sealed)
            .into_iter()
            .partition(|s| s.last_seq.is_none_or(|last| last <= seq));
        self.sealed = keep;
        self.files.free.extend(done.into_iter().map(|s| FreeFile {
            name: s.name,
            file: s.file,
        }));
        while self.files.free.len() > keep_free {
            if let Some(extra) = self.files.free.pop() {
                drop(extra.file);
                let _ = self.files.dir.remove(&extra.name);
            }
        }
    }
}

/// Writes zeros from `from` to `to` and syncs them.
fn preallocate(file: &mut dyn LogFile, from: u64, to: u64) -> io::Result<()> {
    let zeros = vec![0u8; ZERO_CHUNK];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZERO_CHUNK as u64) as usize;
        file.write_at(at, &zeros[..n])?;
        at += n as u64;
    }
    file.sync_data()
}
