//! A log written whole from shipped frames: how a restore hands the stream's tail to the
//! store's ordinary recovery.
//!
//! The frames go, in order, into one new segment file (of whatever size they need), which is
//! synced once at the end, with its directory. The store's first open then replays them past
//! the snapshot's checkpoint, exactly as after a crash, through the tables the application
//! registers: the restore itself needs no table's types.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use crate::wal::format::{FRAME_HEADER_LEN, HEADER_LEN, SegmentHeader, encode_frame};

/// The segment a restore writes (its number in the new log directory).
pub(crate) const TAIL_SEGMENT: u64 = 1;

/// Writes one segment of consecutive frames.
pub(crate) struct TailWriter {
    out: BufWriter<File>,
    next_seq: u64,
    buf: Vec<u8>,
    /// Where the next frame begins (after [`TailWriter::finish`]: where the end marker is).
    end: u64,
}

impl TailWriter {
    /// A segment written to `file` (new and empty) whose first frame is `first_seq`.
    pub(crate) fn create(file: File, first_seq: u64) -> io::Result<TailWriter> {
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let header = SegmentHeader {
            number: TAIL_SEGMENT,
            first_seq,
        };
        out.write_all(&header.encode())?;
        Ok(TailWriter {
            out,
            next_seq: first_seq,
            buf: Vec::new(),
            end: HEADER_LEN as u64,
        })
    }

    /// Goes on with a segment whose last counted frame ends at `end` (the end marker a
    /// [`TailWriter::finish`] wrote there), next frame `next_seq`: a standby following the
    /// stream. Whatever lies past `end` (frames of a step that failed part way, which the
    /// standby never counted) is cut off first, so the segment stays one chain.
    pub(crate) fn reopen(path: &Path, next_seq: u64, end: u64) -> io::Result<TailWriter> {
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        if end < HEADER_LEN as u64 || end + FRAME_HEADER_LEN as u64 > len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is {len} bytes, too short to be a restored log ending at {end}",
                    path.display()
                ),
            ));
        }
        file.set_len(end)?;
        file.seek(SeekFrom::Start(end))?;
        Ok(TailWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            next_seq,
            buf: Vec::new(),
            end,
        })
    }

    /// Appends the frame `seq`, which must be the next one.
    pub(crate) fn append(&mut self, seq: u64, payload: &[u8]) -> io::Result<()> {
        if seq != self.next_seq {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame {seq} where frame {} was next", self.next_seq),
            ));
        }
        if payload.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame {seq} is empty"),
            ));
        }
        self.buf.clear();
        encode_frame(&mut self.buf, TAIL_SEGMENT, seq, payload);
        self.out.write_all(&self.buf)?;
        self.next_seq += 1;
        self.end += self.buf.len() as u64;
        Ok(())
    }

    /// Ends the log (an end marker) and syncs the file. Returns where the end marker is (what
    /// [`TailWriter::reopen`] goes on from).
    pub(crate) fn finish(mut self) -> io::Result<u64> {
        self.out.write_all(&[0u8; FRAME_HEADER_LEN])?;
        let file = self
            .out
            .into_inner()
            .map_err(io::IntoInnerError::into_error)?;
        file.sync_all()?;
        Ok(self.end)
    }
}
