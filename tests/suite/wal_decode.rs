//! The `wal_decode` fuzz body on stable, seeded: arbitrary bytes and damaged real segments as
//! a log segment never panic and never yield a frame after a bad one.

use crate::common;

use common::{ORDERS, TestResult, builder, clock, fp, scope};
use idemstore::testing::{Rng, SimDisk, Tear, check_log_decode};
use idemstore::{Begin, Response};

const SEED: u64 = 0x1de4_5702;

/// A real segment with a few dozen frames, written by a store.
fn real_segment() -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let disk = SimDisk::new();
    let store = builder(&clock())
        .log_segment_bytes(64 * 1024)
        .open_simulated(&disk)?;
    for i in 0..30 {
        let Begin::Claimed(claim) = store.begin(&scope(&format!("k{i}")), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        claim.commit(move |tx| {
            tx.insert(&ORDERS, format!("o{i}").as_str(), "row")?;
            Ok(Response::new(200, vec![i as u8; 40 * i]))
        })?;
    }
    let image = disk.crash_image(Tear::Drop);
    let name = image
        .files()
        .into_iter()
        .find(|f| f.starts_with("wal/seg-"))
        .ok_or("no segment")?;
    Ok(image.file(&name).ok_or("segment vanished")?)
}

#[test]
fn damaged_real_segments_never_panic_or_yield_a_frame_after_a_bad_one() -> TestResult {
    println!("wal_decode seed {SEED:#x}");
    let segment = real_segment()?;
    let intact = check_log_decode(&segment)?;
    assert_eq!(intact, 60, "30 claims and 30 commits");
    let used = segment.iter().rposition(|&b| b != 0).unwrap_or(0) + 1;
    let mut rng = Rng::new(SEED);
    for round in 0..3000 {
        let mut bytes = segment[..used + 64].to_vec();
        match rng.below(5) {
            0 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
            1 => {
                for _ in 0..=rng.below(4) {
                    let at = rng.below(bytes.len() as u64) as usize;
                    bytes[at] ^= 1 << rng.below(8);
                }
            }
            2 => {
                let at = (rng.below(bytes.len() as u64 / 512) * 512) as usize;
                let end = (at + 512).min(bytes.len());
                bytes[at..end].fill(0);
            }
            3 => {
                // Splice a copy of one region over another (frames out of place).
                let len = 1 + rng.below(200) as usize;
                let from = rng.below((bytes.len() - len) as u64) as usize;
                let to = rng.below((bytes.len() - len) as u64) as usize;
                let piece = bytes[from..from + len].to_vec();
                bytes[to..to + len].copy_from_slice(&piece);
            }
            _ => {
                let len = rng.below(2048) as usize;
                bytes = (0..len).map(|_| rng.next_u64() as u8).collect();
            }
        }
        let frames = check_log_decode(&bytes).map_err(|v| format!("round {round}: {v}"))?;
        assert!(
            frames <= intact,
            "round {round}: {frames} frames from a damaged segment"
        );
    }
    Ok(())
}

/// Found by the `wal_decode` fuzzer: a valid header with the largest segment number made
/// recovery overflow computing the next one.
#[test]
fn extreme_numbers_in_a_valid_header_do_not_overflow() -> TestResult {
    use idemstore::testing::build_segment;
    for (number, first_seq) in [
        (u64::MAX, u64::MAX),
        (u64::MAX, 0),
        (0, u64::MAX),
        (7, u64::MAX - 1),
    ] {
        check_log_decode(&build_segment(
            number,
            first_seq,
            &[vec![1], vec![2], vec![3]],
        ))?;
    }
    Ok(())
}

/// The `record_decode` fuzz body on stable, seeded: damaged records of both versions never
/// panic, and every one that still decodes re-encodes to itself.
#[test]
fn damaged_records_never_panic_and_what_decodes_round_trips() -> TestResult {
    use idemstore::testing::{check_record_decode, sample_records};
    println!("record_decode seed {SEED:#x}");
    let samples = sample_records();
    for sample in &samples {
        assert!(check_record_decode(sample)?, "an intact sample decodes");
    }
    let mut rng = Rng::new(SEED);
    let (mut decoded, mut refused) = (0, 0);
    for round in 0..20_000 {
        let mut bytes = samples[rng.below(samples.len() as u64) as usize].clone();
        match rng.below(3) {
            0 => bytes.truncate(rng.below(bytes.len() as u64) as usize),
            1 => {
                for _ in 0..=rng.below(3) {
                    let at = rng.below(bytes.len() as u64) as usize;
                    bytes[at] ^= 1 << rng.below(8);
                }
            }
            _ => bytes = (0..rng.below(400)).map(|_| rng.next_u64() as u8).collect(),
        }
        match check_record_decode(&bytes).map_err(|v| format!("round {round}: {v}"))? {
            true => decoded += 1,
            false => refused += 1,
        }
    }
    // Both outcomes happen: flips in a fingerprint or a time still decode; truncations never.
    assert!(
        decoded > 1_000 && refused > 5_000,
        "{decoded} decoded, {refused} refused"
    );
    Ok(())
}
