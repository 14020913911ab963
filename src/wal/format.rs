//! The log's bytes: segment header, frame, and the scan that reads a segment back.
//!
//! This module owns the format documented in `docs/design.md` ("The write-ahead log") and is
//! pure: it works on byte slices, never on files, so the fuzzer can drive it directly. It must
//! never return a frame that follows a bad one.
//!
//! ```text
//! segment header, 64 bytes, little-endian:
//!   0  8  magic b"idemwal\0"
//!   8  4  format version (2)
//!  12  4  header length (64)
//!  16  8  segment number: unique per activation of a file, mixed into every frame's CRC
//!  24  8  sequence number of the segment's first frame
//!  32  4  CRC-32 of bytes 0..32
//!  36 28  zero
//! frame, from offset 64 on, back to back:
//!   0  4  payload length n (1 ..= 1 GiB)
//!   4  4  CRC-32 of the payload
//!   8  8  sequence number
//!  16  4  header CRC: CRC-32 of segment number (8, LE) ‖ bytes 0..16 of this frame
//!  20  n  payload (postcard, see `Payload`)
//! ```
//!
//! Mixing the segment number into the header CRC is what makes recycled segments safe: the
//! frames a file held in its previous life fail the CRC under its new number, so they read as
//! the end of the log, never as data.
//!
//! The header CRC is what keeps reading linear (format 2; format 1 had one CRC over header and
//! payload). To tell a torn tail from damage in the middle, recovery looks for a valid frame at
//! every offset after a bad one. With one CRC, every offset whose bytes merely looked like a
//! frame header cost a CRC over up to the rest of the segment, and stale frames and payload
//! bytes look like that often enough to make a reopen quadratic in the segment size (1.5 s for
//! a small store). Now each candidate costs a CRC of 24 bytes, and a payload is hashed only
//! behind a header that passed.

use serde::{Deserialize, Serialize};

/// First bytes of every segment.
pub(crate) const MAGIC: [u8; 8] = *b"idemwal\0";
/// The log format this build writes and reads.
pub(crate) const LOG_VERSION: u32 = 2;
/// Bytes before the first frame.
pub(crate) const HEADER_LEN: usize = 64;
/// Bytes before a frame's payload.
pub(crate) const FRAME_HEADER_LEN: usize = 20;
/// Largest payload a frame may carry.
pub(crate) const MAX_PAYLOAD: usize = 1 << 30;
/// The sector size crashes tear at; frames need no alignment, this is for reports and tests.
pub(crate) const SECTOR: usize = 512;

/// What a segment's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub(crate) number: u64,
    pub(crate) first_seq: u64,
}

impl SegmentHeader {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&LOG_VERSION.to_le_bytes());
        out[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.number.to_le_bytes());
        out[24..32].copy_from_slice(&self.first_seq.to_le_bytes());
        let crc = crc32fast::hash(&out[0..32]);
        out[32..36].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The header, if `bytes` starts with a valid one.
    pub(crate) fn decode(bytes: &[u8]) -> Result<SegmentHeader, HeaderProblem> {
        let header = bytes.get(..HEADER_LEN).ok_or(HeaderProblem::Short)?;
        if header[0..8] != MAGIC {
            return Err(HeaderProblem::NotALogSegment);
        }
        let stored_crc = u32::from_le_bytes(le(&header[32..36]));
        if crc32fast::hash(&header[0..32]) != stored_crc {
            return Err(HeaderProblem::Checksum);
        }
        let version = u32::from_le_bytes(le(&header[8..12]));
        if version != LOG_VERSION {
            return Err(HeaderProblem::Version(version));
        }
        Ok(SegmentHeader {
            number: u64::from_le_bytes(le(&header[16..24])),
            first_seq: u64::from_le_bytes(le(&header[24..32])),
        })
    }
}

/// Why a segment header was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderProblem {
    /// Fewer than 64 bytes.
    Short,
    /// The magic bytes are wrong: not a segment, or a header torn before it was ever synced.
    NotALogSegment,
    /// The header's CRC does not match: torn while being rewritten for reuse.
    Checksum,
    /// A valid header of another format version.
    Version(u32),
}

/// Copies a slice of known length into an array (the callers slice exactly N bytes).
fn le<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

/// CRC-32 of the pieces, in order. Tests count the bytes it hashes, to prove reads linear.
fn crc(pieces: &[&[u8]]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for piece in pieces {
        hasher.update(piece);
        #[cfg(test)]
        tests::HASHED.with(|n| n.set(n.get() + piece.len()));
    }
    hasher.finalize()
}

/// The header CRC of a frame whose first 16 bytes are `head`, in a segment numbered `number`.
fn header_crc(number: u64, head: &[u8]) -> u32 {
    crc(&[&number.to_le_bytes(), head])
}

/// Appends one frame (header and payload) to `out`.
pub(crate) fn encode_frame(out: &mut Vec<u8>, number: u64, seq: u64, payload: &[u8]) {
    // Payloads are bounded by MAX_PAYLOAD (checked by the writer before encoding).
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut head = [0u8; 16];
    head[0..4].copy_from_slice(&len.to_le_bytes());
    head[4..8].copy_from_slice(&crc(&[payload]).to_le_bytes());
    head[8..16].copy_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(&header_crc(number, &head).to_le_bytes());
    out.extend_from_slice(payload);
}

/// One frame found by a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    /// Offset of the frame's header in the segment.
    pub(crate) offset: usize,
    pub(crate) seq: u64,
    pub(crate) payload: &'a [u8],
}

impl Frame<'_> {
    pub(crate) fn end(&self) -> usize {
        self.offset + FRAME_HEADER_LEN + self.payload.len()
    }
}

/// The frame starting at `offset`, if a valid one does (right segment number, both CRCs
/// match). The header's CRC is checked first, so bytes that only look like a header cost 24
/// bytes of hashing, never a pass over the payload they claim.
pub(crate) fn frame_at(bytes: &[u8], offset: usize, number: u64) -> Option<Frame<'_>> {
    let head = bytes.get(offset..offset.checked_add(FRAME_HEADER_LEN)?)?;
    let len = u32::from_le_bytes(le(&head[0..4]));
    let n = usize::try_from(len).ok()?;
    if n == 0 || n > MAX_PAYLOAD {
        return None;
    }
    let start = offset + FRAME_HEADER_LEN;
    let payload = bytes.get(start..start.checked_add(n)?)?;
    if header_crc(number, &head[0..16]) != u32::from_le_bytes(le(&head[16..20])) {
        return None;
    }
    (crc(&[payload]) == u32::from_le_bytes(le(&head[4..8]))).then_some(Frame {
        offset,
        seq: u64::from_le_bytes(le(&head[8..16])),
        payload,
    })
}

/// Where a scan of one segment stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The segment ends exactly after the last frame.
    EndOfFile,
    /// No valid frame at `offset`: either the end of what was written (zeros, or bytes of the
    /// file's previous life) or a torn or damaged frame. The caller decides which, by looking
    /// for valid frames after it ([`later_frame`]).
    Invalid { offset: usize },
}

/// The frames of one segment, read from the start, stopping at the first invalid one or the
/// first whose sequence number breaks the run (`first_seq`, `first_seq + 1`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scan<'a> {
    pub(crate) header: SegmentHeader,
    pub(crate) frames: Vec<Frame<'a>>,
    pub(crate) stop: Stop,
}

/// Reads a segment's frames in order. Never returns a frame after an invalid one.
pub(crate) fn scan(bytes: &[u8]) -> Result<Scan<'_>, HeaderProblem> {
    let header = SegmentHeader::decode(bytes)?;
    let mut frames = Vec::new();
    let mut offset = HEADER_LEN;
    let mut expected = header.first_seq;
    let stop = loop {
        if offset == bytes.len() {
            break Stop::EndOfFile;
        }
        match frame_at(bytes, offset, header.number) {
            Some(frame) if frame.seq == expected => {
                offset = frame.end();
                frames.push(frame);
                // A run cannot continue past the last sequence number.
                let Some(next) = expected.checked_add(1) else {
                    break Stop::Invalid { offset };
                };
                expected = next;
            }
            _ => break Stop::Invalid { offset },
        }
    };
    Ok(Scan {
        header,
        frames,
        stop,
    })
}

/// The first valid frame of this segment that starts after `offset`, if any: a frame written
/// after a bad one, which means the bad one is damage in the middle of the log, not a torn tail.
///
/// Only one frame is ever unsynced at a time (the writer syncs each frame before writing the
/// next), so a crash can tear the last frame but never leave a valid frame behind a torn one.
///
/// Every offset is tried, since a damaged length field says nothing about where the next frame
/// starts; the cheap checks come first so that a CRC runs only on plausible candidates: a
/// later frame's sequence number is at least `min_seq` and below `min_seq` plus the bytes left
/// (each frame takes more than one byte), while the frames of a reused file's previous life are
/// all older. Zero bytes, the end marker and preallocated space, are skipped in runs. A
/// candidate then costs the 24-byte header CRC ([`frame_at`]), so the search is linear in the
/// bytes after `offset`.
pub(crate) fn later_frame(
    bytes: &[u8],
    offset: usize,
    number: u64,
    min_seq: u64,
) -> Option<Frame<'_>> {
    let last = bytes.len().checked_sub(FRAME_HEADER_LEN + 1)?;
    let max_seq = min_seq.saturating_add(bytes.len() as u64);
    let mut at = offset + 1;
    while at <= last {
        // A frame's length is non-zero, so one of its first four bytes is.
        if bytes[at..at + 4] == [0, 0, 0, 0] {
            match bytes[at + 4..].iter().position(|&b| b != 0) {
                // The first non-zero byte may be the last of a length field: back up three.
                Some(skip) => at = (at + 4 + skip).saturating_sub(3).max(at + 1),
                None => return None,
            }
            continue;
        }
        let seq = u64::from_le_bytes(le(&bytes[at + 8..at + 16]));
        if (min_seq..max_seq).contains(&seq)
            && let Some(frame) = frame_at(bytes, at, number)
        {
            return Some(frame);
        }
        at += 1;
    }
    None
}

/// How many bytes a torn or damaged frame at `offset` occupies: its declared extent when that
/// fits in the segment, else up to the end of the sector it starts in.
pub(crate) fn damaged_len(bytes: &[u8], offset: usize) -> usize {
    let declared = bytes
        .get(offset..offset + 4)
        .map(|b| u32::from_le_bytes(le(b)) as usize)
        .filter(|&n| n > 0 && n <= MAX_PAYLOAD)
        .map(|n| FRAME_HEADER_LEN + n)
        .filter(|&n| offset + n <= bytes.len());
    declared.unwrap_or_else(|| {
        let sector_end = (offset / SECTOR + 1) * SECTOR;
        sector_end.min(bytes.len()) - offset
    })
}

/// The payload of one frame: every write of one group, tables named, not numbered, so a log
/// replays into a store whose tables were registered in another order.
///
/// postcard encoding: `varint(#tables)`, each table `varint(len) ‖ UTF-8`; `varint(#ops)`, each
/// op `varint(table index) ‖ varint(len) ‖ key ‖ (0 | 1 ‖ varint(len) ‖ value)` where the
/// option tag 0 is a delete and 1 a put.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Payload<'a> {
    #[serde(borrow)]
    pub(crate) tables: Vec<&'a str>,
    #[serde(borrow)]
    pub(crate) ops: Vec<PayloadOp<'a>>,
}

/// One put or delete inside a [`Payload`].
///
/// Keys and values are written with `serialize_bytes`: serde's default for `&[u8]` is a
/// sequence of `u8`s, one serializer call per byte (7% of all instructions of a pair), and
/// postcard encodes both the same way (`varint(len) ‖ bytes`), so the format is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PayloadOp<'a> {
    /// Index into [`Payload::tables`].
    pub(crate) table: u16,
    #[serde(borrow, serialize_with = "bytes")]
    pub(crate) key: &'a [u8],
    /// `None` deletes the key.
    #[serde(borrow, serialize_with = "optional_bytes")]
    pub(crate) value: Option<&'a [u8]>,
}

/// `bytes` in one call, as bytes.
fn bytes<S: serde::Serializer>(bytes: &&[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_bytes(bytes)
}

/// An optional byte string, its bytes in one call.
fn optional_bytes<S: serde::Serializer>(
    value: &Option<&[u8]>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    /// Serializes as bytes, for `serialize_some`.
    struct Bytes<'a>(&'a [u8]);
    impl Serialize for Bytes<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(self.0)
        }
    }
    match value {
        Some(value) => serializer.serialize_some(&Bytes(value)),
        None => serializer.serialize_none(),
    }
}

/// Decodes a frame's payload: the payloads of the groups it carries, in order. The log
/// thread writes every group waiting for a sync as one frame, so a frame is
/// `varint(groups) ‖ payload ‖ payload ...`, the postcard encoding of a sequence.
pub(crate) fn decode_frame(bytes: &[u8]) -> Result<Vec<Payload<'_>>, postcard::Error> {
    postcard::from_bytes(bytes)
}

#[cfg(test)]
mod tests;
