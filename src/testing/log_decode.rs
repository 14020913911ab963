//! The body of the `wal_decode` fuzz target: arbitrary bytes read as a log segment.

use std::path::Path;

use crate::storage::LogDir;
use crate::testing::{SimDisk, Violation};
use crate::wal::format::{HEADER_LEN, Stop, decode_frame, later_frame, scan};
use crate::wal::recover;

/// Reads `bytes` as a log segment, both with the pure scan and through recovery, and checks
/// that neither panics, that frames come back contiguous and in sequence, and that no frame is
/// ever returned after a bad one. Returns how many frames were read.
///
/// # Errors
/// A [`Violation`] describing the broken property (the fuzz target panics with it).
pub fn check_log_decode(bytes: &[u8]) -> Result<usize, Violation> {
    let fail = |m: String| Err(Violation(m));
    let Ok(scanned) = scan(bytes) else {
        return recovered_frames(bytes).map(|_| 0);
    };
    let mut expected_offset = HEADER_LEN;
    let mut expected_seq = scanned.header.first_seq;
    for frame in &scanned.frames {
        if frame.offset != expected_offset {
            return fail(format!(
                "frame at {} where {} was expected",
                frame.offset, expected_offset
            ));
        }
        if frame.seq != expected_seq {
            return fail(format!(
                "frame {} where {} was expected",
                frame.seq, expected_seq
            ));
        }
        if frame.end() > bytes.len() {
            return fail(format!("frame at {} runs past the end", frame.offset));
        }
        // Payloads of valid frames decode or fail cleanly.
        let _ = decode_frame(frame.payload);
        expected_offset = frame.end();
        expected_seq = expected_seq.saturating_add(1);
    }
    match scanned.stop {
        Stop::EndOfFile if expected_offset != bytes.len() => {
            return fail("the scan ended before the end of the file without a stop".into());
        }
        Stop::Invalid { offset } if offset != expected_offset => {
            return fail(format!(
                "stopped at {offset}, after the last frame at {expected_offset}"
            ));
        }
        Stop::Invalid { offset } => {
            if let Some(later) = later_frame(bytes, offset, scanned.header.number, expected_seq)
                && later.offset <= offset
            {
                return fail(format!(
                    "a later frame at {} is not after {offset}",
                    later.offset
                ));
            }
        }
        Stop::EndOfFile => {}
    }
    let replayed = recovered_frames(bytes)?;
    if let Some(replayed) = replayed
        && replayed > scanned.frames.len()
    {
        return fail(format!(
            "recovery replayed {replayed} frames of a segment with {} valid ones",
            scanned.frames.len()
        ));
    }
    Ok(scanned.frames.len())
}

/// Runs recovery over `bytes` as the only segment; `None` if it refused the log (an error, not a
/// panic, which is allowed for damaged input).
fn recovered_frames(bytes: &[u8]) -> Result<Option<usize>, Violation> {
    let disk = SimDisk::new();
    disk.set_file("wal/seg-00000000.log", bytes.to_vec());
    let dir = disk.log_dir("wal");
    let mut seqs = Vec::new();
    let result = recover(
        &dir as &dyn LogDir,
        Path::new("wal"),
        crate::wal::Checkpoint {
            seq: 0,
            segment: None,
        },
        None,
        64 * 1024,
        &mut |frame| {
            seqs.push(frame.seq);
            Ok(())
        },
    );
    if seqs.windows(2).any(|w| w[1] != w[0] + 1) {
        return Err(Violation(format!(
            "recovery replayed frames out of order: {seqs:?}"
        )));
    }
    Ok(result.ok().map(|_| seqs.len()))
}

/// A valid log segment with these payloads as frames `first_seq`, `first_seq + 1`, ..., for
/// fuzzing the paths behind a valid header (a fuzzer cannot forge its CRC). Empty payloads are
/// skipped (a frame's payload is never empty).
pub fn build_segment(number: u64, first_seq: u64, payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = crate::wal::format::SegmentHeader { number, first_seq }
        .encode()
        .to_vec();
    let mut seq = first_seq;
    for payload in payloads.iter().filter(|p| !p.is_empty()) {
        crate::wal::format::encode_frame(&mut bytes, number, seq, payload);
        seq = seq.wrapping_add(1);
    }
    bytes
}
