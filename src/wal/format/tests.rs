//! The log format against its promises: frames round-trip, a scan stops where it must and
//! reads each byte about once, and payloads encode as they always did.

use std::cell::Cell;

use super::*;

thread_local! {
    /// Bytes hashed by [`crc`] on this thread.
    pub(super) static HASHED: Cell<usize> = const { Cell::new(0) };
}

/// Bytes `f` hashed.
fn hashed<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = HASHED.with(Cell::get);
    let out = f();
    (out, HASHED.with(Cell::get) - before)
}

/// The worst case for the search after a bad frame: 8 MiB of bytes in which every 16th
/// offset looks like a frame header with a plausible sequence number and a long payload
/// that fits in the segment. With one CRC over header and payload (format 1) each of those
/// half a million candidates hashed its quarter-megabyte payload: terabytes. Now the whole
/// segment must cost about one pass.
#[test]
fn the_search_after_a_bad_frame_hashes_each_byte_about_once() {
    let size = 8 << 20;
    let mut bytes = segment(9, 1, &[b"good"]);
    let stop = bytes.len();
    while bytes.len() < size {
        let mut fake = [0u8; 16];
        fake[0..4].copy_from_slice(&(256u32 << 10).to_le_bytes());
        fake[4..8].copy_from_slice(&0xdead_beef_u32.to_le_bytes());
        fake[8..16].copy_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(&fake);
    }
    let (scanned, by_scan) = hashed(|| scan(&bytes).map(|s| s.frames.len()));
    assert_eq!(scanned, Ok(1));
    let (later, by_search) = hashed(|| later_frame(&bytes, stop, 9, 2));
    assert_eq!(later, None);
    assert!(
        by_scan + by_search <= 2 * size,
        "a reopen hashed {} bytes of an {size}-byte segment",
        by_scan + by_search
    );
}

#[test]
fn a_frame_of_a_previous_life_fails_its_header_crc_before_its_payload_is_hashed() {
    let old = segment(1, 5, &[&[7u8; 100_000]]);
    let (found, cost) = hashed(|| frame_at(&old, HEADER_LEN, 2));
    assert_eq!(found, None);
    assert_eq!(cost, 8 + 16, "only the header was hashed");
    assert!(frame_at(&old, HEADER_LEN, 1).is_some());
}

fn segment(number: u64, first_seq: u64, payloads: &[&[u8]]) -> Vec<u8> {
    let mut bytes = SegmentHeader { number, first_seq }.encode().to_vec();
    for (i, p) in payloads.iter().enumerate() {
        encode_frame(&mut bytes, number, first_seq + i as u64, p);
    }
    bytes
}

#[test]
fn frames_round_trip_and_stop_at_zeros() {
    let mut bytes = segment(7, 100, &[b"one", b"two", b"three"]);
    let written = bytes.len();
    bytes.resize(4096, 0);
    let scan = scan(&bytes).expect("valid header");
    assert_eq!(
        scan.header,
        SegmentHeader {
            number: 7,
            first_seq: 100
        }
    );
    let seen: Vec<_> = scan.frames.iter().map(|f| (f.seq, f.payload)).collect();
    assert_eq!(
        seen,
        vec![(100, &b"one"[..]), (101, b"two"), (102, b"three")]
    );
    assert_eq!(scan.stop, Stop::Invalid { offset: written });
    assert_eq!(later_frame(&bytes, written, 7, 103), None);
}

#[test]
fn frames_of_a_previous_life_are_not_data() {
    let old = segment(1, 10, &[b"old-a", b"old-b", b"old-c"]);
    // Reused under number 2: a new header and one new frame over the old bytes.
    let mut bytes = old.clone();
    let mut fresh = segment(2, 50, &[b"new"]);
    let end = fresh.len();
    fresh.extend_from_slice(&old[end..]);
    bytes[..fresh.len()].copy_from_slice(&fresh);
    let scan = scan(&bytes).expect("valid header");
    assert_eq!(scan.frames.len(), 1);
    assert_eq!(
        later_frame(&bytes, end, 2, 51),
        None,
        "old frames fail the new CRC"
    );
}

#[test]
fn a_damaged_frame_followed_by_a_valid_one_is_found() {
    let mut bytes = segment(3, 1, &[b"aaaa", b"bbbb", b"cccc"]);
    let second = HEADER_LEN + FRAME_HEADER_LEN + 4;
    bytes[second + FRAME_HEADER_LEN] ^= 0xff; // flip a payload byte of frame 2
    let scan = scan(&bytes).expect("valid header");
    assert_eq!(scan.frames.len(), 1);
    assert_eq!(scan.stop, Stop::Invalid { offset: second });
    let later = later_frame(&bytes, second, 3, 2).expect("frame 3 is intact");
    assert_eq!(later.seq, 3);
    assert_eq!(damaged_len(&bytes, second), FRAME_HEADER_LEN + 4);
}

#[test]
fn a_torn_header_is_refused() {
    let bytes = segment(3, 1, &[b"x"]);
    for len in 0..HEADER_LEN {
        assert!(SegmentHeader::decode(&bytes[..len]).is_err());
    }
    let mut torn = bytes.clone();
    torn[20] ^= 1;
    assert_eq!(SegmentHeader::decode(&torn), Err(HeaderProblem::Checksum));
}

/// The encoding of format 2 as written before keys and values went through
/// `serialize_bytes`: serde's default, a sequence of `u8`s.
#[derive(Serialize)]
struct AsSequences<'a> {
    table: u16,
    key: &'a [u8],
    value: Option<&'a [u8]>,
}

#[test]
fn keys_and_values_encode_as_they_did_as_sequences() -> Result<(), postcard::Error> {
    let long = vec![0xa5; 300]; // a length that takes two varint bytes
    for (key, value) in [
        (&b"k"[..], Some(&b"value"[..])),
        (&long[..], Some(&long[..])),
        (&b""[..], None),
    ] {
        let op = PayloadOp {
            table: 3,
            key,
            value,
        };
        let before = AsSequences {
            table: 3,
            key,
            value,
        };
        assert_eq!(postcard::to_stdvec(&op)?, postcard::to_stdvec(&before)?);
    }
    Ok(())
}

#[test]
fn payload_round_trips_borrowing_its_bytes() -> Result<(), postcard::Error> {
    let payload = Payload {
        tables: vec!["idemstore.records", "orders"],
        ops: vec![
            PayloadOp {
                table: 1,
                key: b"k",
                value: Some(b"v"),
            },
            PayloadOp {
                table: 0,
                key: b"gone",
                value: None,
            },
        ],
    };
    let bytes = postcard::to_stdvec(&payload)?;
    assert_eq!(postcard::from_bytes::<Payload<'_>>(&bytes)?, payload);
    // A frame of two groups is a sequence: varint(2) then both payloads.
    let mut frame = vec![2];
    frame.extend_from_slice(&bytes);
    frame.extend_from_slice(&bytes);
    assert_eq!(decode_frame(&frame)?, vec![payload.clone(), payload]);
    Ok(())
}
