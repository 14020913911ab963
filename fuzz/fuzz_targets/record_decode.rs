//! Bytes read as a stored record: never a panic, and a record that decodes re-encodes to the
//! same record.
//!
//! Half the inputs are raw bytes; the other half damage a valid record (bit flips,
//! truncation), because random bytes rarely get past a record's version, state and lengths.
#![no_main]

use arbitrary::Arbitrary;
use idemstore::testing::{check_record_decode, damage, sample_records};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum Input {
    Raw(Vec<u8>),
    Damaged {
        sample: u8,
        flips: Vec<(u16, u8)>,
        truncate: Option<u16>,
    },
}

fuzz_target!(|input: Input| {
    let bytes = match input {
        Input::Raw(bytes) => bytes,
        Input::Damaged {
            sample,
            flips,
            truncate,
        } => {
            let samples = sample_records();
            let mut bytes = samples[usize::from(sample) % samples.len()].clone();
            damage(&mut bytes, &flips, truncate);
            bytes
        }
    };
    if let Err(violation) = check_record_decode(&bytes) {
        panic!("{violation}");
    }
});
