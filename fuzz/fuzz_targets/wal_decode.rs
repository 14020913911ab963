//! Bytes read as a log segment: never a panic, never a frame after a bad one.
//!
//! Half the inputs are raw bytes; the other half build a valid segment from the input's frames
//! and then damage it (bit flips, truncation), because a fuzzer cannot forge a header CRC and
//! would otherwise never get past the header.
#![no_main]

use arbitrary::Arbitrary;
use idemstore::testing::{build_segment, check_log_decode, damage};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Input {
    Raw(Vec<u8>),
    Damaged {
        number: u64,
        first_seq: u32,
        frames: Vec<Vec<u8>>,
        flips: Vec<(u16, u8)>,
        truncate: Option<u16>,
    },
}

fuzz_target!(|input: Input| {
    let bytes = match input {
        Input::Raw(bytes) => bytes,
        Input::Damaged {
            number,
            first_seq,
            frames,
            flips,
            truncate,
        } => {
            let mut bytes = build_segment(number, u64::from(first_seq), &frames);
            damage(&mut bytes, &flips, truncate);
            bytes
        }
    };
    if let Err(violation) = check_log_decode(&bytes) {
        panic!("{violation}");
    }
});
