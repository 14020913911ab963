//! The appending side of the log: one frame per group, then one `fdatasync`.
//!
//! Segments are preallocated (written with zeros and synced when created) because overwriting
//! allocated blocks syncs faster than growing a file: `fdatasync` then has no size or extent
//! change to flush. A checkpoint hands segments whose frames are all in redb back to a free
//! list, and the next segment reuses one under a new segment number. This module must never
//! have two unsynced frames at once: recovery relies on it to tell a torn tail from damage.
//!
//! An append fails in one of two ways, and the caller must tell them apart:
//! - [`AppendError::NotWritten`]: it failed before its sync (a full disk while a segment was
//!   being made, a refused write). Nothing new is durable; the next append writes at the same
//!   place. Retrying is safe.
//! - [`AppendError::Unknown`]: the sync failed. The frame may or may not be on disk, and after
//!   a failed `fdatasync` the page cache cannot be trusted to say which (PostgreSQL's lesson):
//!   the log must not be appended to again; the store recovers from what the files hold.

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

/// A segment that recovery found holding frames past the checkpoint: it stays until a
/// checkpoint covers `last_seq`.
#[derive(Debug)]
pub(crate) struct LiveFile {
    pub(crate) name: String,
    pub(crate) file: Box<dyn LogFile>,
    pub(crate) last_seq: u64,
}

/// Where a new log starts after recovery.
#[derive(Debug)]
pub(crate) struct LogStart {
    /// Files left from before, all of whose frames are in durable redb: reused before
    /// creating any.
    pub(crate) free: Vec<FreeFile>,
    /// Files holding frames past the checkpoint, oldest first.
    pub(crate) live: Vec<LiveFile>,
    /// Frame bytes in `live` past the checkpoint: the log a checkpoint has yet to cover.
    pub(crate) since_checkpoint: u64,
    pub(crate) next_seq: u64,
    /// Above every segment number ever written in this directory.
    pub(crate) next_number: u64,
    /// Above every segment file's index.
    pub(crate) next_file: u64,
    pub(crate) segment_bytes: u64,
}

impl LogStart {
    /// The start once a durable checkpoint covers every frame up to `seq`: every file is
    /// free, and the log goes on at `seq + 1` in a segment numbered above all before it.
    pub(crate) fn after_checkpoint(mut self, seq: u64) -> LogStart {
        self.free.extend(self.live.drain(..).map(|live| FreeFile {
            name: live.name,
            file: live.file,
        }));
        self.since_checkpoint = 0;
        self.next_seq = seq + 1;
        self
    }
}

/// Why an append did not make its frame durable.
#[derive(Debug)]
pub(crate) enum AppendError {
    /// Nothing new reached the disk durably: the frame was refused before its sync.
    NotWritten(io::Error),
    /// The sync of frame `seq` failed: it may or may not be durable, and reading it back
    /// cannot tell (the page cache may hold bytes the disk never will).
    Unknown { error: io::Error, seq: u64 },
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
    /// new header: the segment is then ready for frames starting at `first_seq`. On failure
    /// nothing is left behind that holds space: a file it created is deleted. On a full disk
    /// an attempt stops at the first refused write, so trying again with every frame costs
    /// little, and a segment is made as soon as space is freed.
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
        let prepared = self.prepare(file.as_mut(), needed, fresh);
        let len = match prepared {
            Ok(len) => len,
            Err(e) => {
                self.give_back(name, file, fresh);
                return Err(e);
            }
        };
        let number = self.next_number;
        self.next_number += 1;
        // The header and an end marker: whatever the file held in its previous life after the
        // header must not read as this life's first frame.
        let mut head = SegmentHeader { number, first_seq }.encode().to_vec();
        head.resize(HEADER_LEN + FRAME_HEADER_LEN, 0);
        if let Err(e) = file.write_at(0, &head).and_then(|()| file.sync_data()) {
            // A header that did reach the disk names a segment with no frames: recovery reads
            // it as empty, and a newer number supersedes it.
            self.give_back(name, file, fresh);
            return Err(e);
        }
        Ok(Segment {
            name,
            file,
            number,
            last_seq: None,
            end: HEADER_LEN as u64,
            capacity: len.max(needed),
        })
    }

    /// Grows the file to `needed` with zeros and, for a new file, makes its entry durable.
    fn prepare(&self, file: &mut dyn LogFile, needed: u64, fresh: Fresh) -> io::Result<u64> {
        let len = file.len()?;
        if len < needed {
            // A new file, or a frame larger than a segment: grow it with zeros first.
            preallocate(file, len, needed)?;
        }
        if fresh == Fresh::Yes {
            // The file's directory entry must survive a crash before frames go into it.
            self.dir.sync()?;
        }
        Ok(len)
    }

    /// After a failed activation: a file this log made is deleted (on a full disk, the zeros
    /// it holds are space the rest of the store needs); a reused one goes back to the free list.
    fn give_back(&mut self, name: String, file: Box<dyn LogFile>, fresh: Fresh) {
        match fresh {
            Fresh::Yes => {
                drop(file);
                if let Err(e) = self.dir.remove(&name) {
                    tracing::warn!(segment = name, error = %e, "could not delete a log segment that failed to be made");
                }
            }
            Fresh::No => self.free.push(FreeFile { name, file }),
        }
    }
}

/// Whether a file was just created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fresh {
    Yes,
    No,
}

/// A segment whose frames are not all checkpointed yet.
#[derive(Debug)]
struct Sealed {
    name: String,
    file: Box<dyn LogFile>,
    last_seq: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct Log {
    files: Files,
    /// The segment frames go to; `None` until one could be made.
    active: Option<Segment>,
    /// Full segments whose frames are not all checkpointed yet, oldest first.
    sealed: Vec<Sealed>,
    next_seq: u64,
    /// Frame bytes appended since the last checkpoint (with those recovery found).
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
    /// A log ready to append at `start.next_seq`. It makes its first segment now if it can;
    /// if it cannot (a full disk), appends fail with [`AppendError::NotWritten`] until one can
    /// be made, and reads of the store are not affected.
    pub(crate) fn start(dir: Box<dyn LogDir>, start: LogStart) -> Log {
        let mut files = Files {
            dir,
            free: start.free,
            next_number: start.next_number,
            next_file: start.next_file,
            segment_bytes: start.segment_bytes,
        };
        let active = match files.activate(start.next_seq, 0) {
            Ok(segment) => Some(segment),
            Err(e) => {
                tracing::warn!(error = %e, "could not make a log segment; writes fail until one can be made");
                None
            }
        };
        Log {
            files,
            active,
            sealed: start
                .live
                .into_iter()
                .map(|live| Sealed {
                    name: live.name,
                    file: live.file,
                    last_seq: Some(live.last_seq),
                })
                .collect(),
            next_seq: start.next_seq,
            since_checkpoint: start.since_checkpoint,
            buf: Vec::new(),
        }
    }

    /// Appends one frame and syncs it. Returns its sequence number; the frame's size on disk is
    /// [`FRAME_HEADER_LEN`] (20) bytes more than the payload.
    pub(crate) fn append(&mut self, payload: &[u8]) -> Result<u64, AppendError> {
        if payload.is_empty() || payload.len() > MAX_PAYLOAD {
            return Err(AppendError::NotWritten(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a log frame of {} bytes is outside 1 ..= 1 GiB",
                    payload.len()
                ),
            )));
        }
        let frame_len = (FRAME_HEADER_LEN + payload.len()) as u64;
        let seq = self.next_seq;
        let segment = segment_for(
            &mut self.files,
            &mut self.active,
            &mut self.sealed,
            seq,
            frame_len,
        )
        .map_err(AppendError::NotWritten)?;
        self.buf.clear();
        encode_frame(&mut self.buf, segment.number, seq, payload);
        // Zeros after the frame, in the same write: the end of the log then reads as an end
        // marker, not as a torn frame, even in a file reused from an earlier life.
        self.buf.resize(self.buf.len() + FRAME_HEADER_LEN, 0);
        // A failed write leaves `end` where it was: the next frame overwrites what reached the
        // file, and nothing of it was synced.
        segment
            .file
            .write_at(segment.end, &self.buf)
            .map_err(AppendError::NotWritten)?;
        let syncing = std::time::Instant::now();
        segment
            .file
            .sync_data()
            .map_err(|error| AppendError::Unknown { error, seq })?;
        crate::metrics::seconds(crate::metrics::LOG_SYNC_SECONDS, syncing.elapsed());
        segment.end += frame_len;
        assert!(
            segment.last_seq.is_none_or(|last| last < seq),
            "log frame {seq} appended after frame {:?} of its segment: frames are numbered in order",
            segment.last_seq
        );
        segment.last_seq = Some(seq);
        self.next_seq += 1;
        self.since_checkpoint += frame_len;
        Ok(seq)
    }

    /// The sequence number of the last frame appended (or the one before the first).
    pub(crate) fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// The number of the segment the next frame goes to, or one older: what a checkpoint
    /// records so that recovery reads the log from there (see `recovery::Checkpoint`). Frames
    /// go to the active segment, or to one activated after it with a higher number.
    pub(crate) fn next_frame_segment(&self) -> u64 {
        self.active
            .as_ref()
            .map_or(self.files.next_number, |s| s.number)
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

/// The segment to append a frame of `frame_len` bytes to: the active one if the frame fits,
/// else a new one starting at `next_seq` (the full one is sealed).
fn segment_for<'a>(
    files: &mut Files,
    active: &'a mut Option<Segment>,
    sealed: &mut Vec<Sealed>,
    next_seq: u64,
    frame_len: u64,
) -> io::Result<&'a mut Segment> {
    let fits = active
        .as_ref()
        .is_some_and(|s| s.end + frame_len + END_MARKER <= s.capacity);
    if !fits {
        let next = files.activate(next_seq, frame_len)?;
        if let Some(full) = active.replace(next) {
            sealed.push(Sealed {
                name: full.name,
                file: full.file,
                last_seq: full.last_seq,
            });
        }
    }
    active
        .as_mut()
        .ok_or_else(|| io::Error::other("no log segment is active"))
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
