use std::sync::Arc;
use std::time::Duration;

use super::hash::KeyHasher;
use super::*;
use crate::model::fingerprint::Fingerprint;
use crate::model::record::{Record, RecordState};
use crate::model::response::Response;

const WINDOW: Duration = Duration::from_secs(60);

fn at(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn partitions(capacity: u64) -> Partitions {
    Partitions::new(KeyHasher::new([7; 16]), capacity)
}

/// A completed record that expires at `expires`.
fn completed(expires: u64) -> Record {
    Record {
        fingerprint: Fingerprint::of_bytes(b"r"),
        fence: 1,
        origin_fence: 1,
        attempt: 1,
        created_at: at(0),
        state: RecordState::Completed {
            completed_at: at(0),
            expires_at: at(expires),
            response: Response::new(200, b"ok".to_vec()),
        },
    }
}

fn numbers(p: &Partitions) -> Vec<PartitionNo> {
    p.all().partitions().iter().map(|p| p.number()).collect()
}

#[test]
fn the_open_partition_is_sealed_when_full_or_a_window_old() {
    let p = partitions(3);
    let first = p.choose(at(1_000), WINDOW);
    assert_eq!((first.number, first.sealed.is_none()), (0, true));
    for i in 0..3 {
        let chosen = p.choose(at(1_000 + i), WINDOW);
        assert_eq!(chosen.number, 0, "room for three");
        p.note(0, i, &completed(5_000));
    }
    let next = p.choose(at(2_000), WINDOW);
    assert_eq!(next.number, 1, "full after three");
    let sealed = next.sealed.expect("the full one is sealed by this choice");
    assert_eq!(sealed.number(), 0);
    assert!(!sealed.is_open());
    let (info, _) = sealed.info();
    assert_eq!(info.records, 3);
    assert_eq!(info.max_expires, at(5_000));

    p.note(1, 10, &completed(6_000));
    assert_eq!(p.choose(at(61_999), WINDOW).number, 1);
    let late = p.choose(at(62_000), WINDOW);
    assert_eq!(late.number, 2, "a window after its first record");
    assert_eq!(late.sealed.map(|s| s.number()), Some(1));
    assert_eq!(numbers(&p), [0, 1, 2]);
}

#[test]
fn lookups_go_newest_first_and_skip_partitions_that_are_all_gone() {
    let p = partitions(100);
    let tombstone_ttl = Duration::from_secs(10);
    for (number, now, expires) in [(0, 0, 1_000), (1, 61_000, 70_000), (2, 122_000, 200_000)] {
        assert_eq!(p.choose(at(now), WINDOW).number, number);
        p.note(number, 42, &completed(expires));
    }
    let mut probed = Vec::new();
    let found = p
        .find(42, at(0), tombstone_ttl, |n| {
            probed.push(n);
            Ok::<_, ()>((n == 1).then_some("record"))
        })
        .expect("no error");
    assert_eq!(found, Some((1, "record")));
    assert_eq!(
        probed,
        [2, 1],
        "newest first, stopping at the first record found"
    );

    // Partition 0 is all gone once its last expiry and the tombstone time have passed.
    assert_eq!(p.candidates(42, at(10_999), tombstone_ttl), [2, 1, 0]);
    assert_eq!(p.candidates(42, at(11_000), tombstone_ttl), [2, 1]);
    assert_eq!(
        p.oldest_gone(at(10_999), tombstone_ttl).map(|p| p.number()),
        None
    );
    assert_eq!(
        p.oldest_gone(at(11_000), tombstone_ttl).map(|p| p.number()),
        Some(0)
    );
    // A key no partition was told of is, as far as the filters go, in none of them (bar a
    // rare false positive: these three filters hold one key each).
    assert!(p.candidates(43, at(0), tombstone_ttl).len() < 3);
    p.remove(0);
    assert_eq!(numbers(&p), [1, 2]);
}

#[test]
fn expired_partitions_are_tombstoned_only_when_tombstones_are_kept() {
    let p = partitions(100);
    assert_eq!(p.choose(at(0), WINDOW).number, 0);
    p.note(0, 1, &completed(1_000));
    let keep = Duration::from_secs(60);
    assert_eq!(
        p.oldest_expired(at(5_000), keep).map(|p| p.number()),
        Some(0),
        "the open one too, once every TTL in it has passed"
    );
    assert_eq!(p.choose(at(61_000), WINDOW).number, 1);
    assert_eq!(p.oldest_expired(at(999), keep).map(|p| p.number()), None);
    assert_eq!(
        p.oldest_expired(at(1_000), keep).map(|p| p.number()),
        Some(0)
    );
    assert!(
        p.oldest_expired(at(1_000), Duration::ZERO).is_none(),
        "no tombstones kept"
    );
    assert!(
        p.oldest_expired(at(61_000), keep).is_none(),
        "gone: dropped, not tombstoned"
    );
    let zero = p.get(0).expect("partition 0");
    zero.mark_tombstoned();
    assert!(p.oldest_expired(at(1_000), keep).is_none(), "done once");
}

#[test]
fn done_keys_sort_by_partition_then_scope() {
    let a = done_key(1, b"\x01zz");
    let b = done_key(2, b"\x01aa");
    assert!(a < b);
    assert_eq!(split_done_key(&b), Some((2, &b"\x01aa"[..])));
    let (start, end) = partition_bounds(2);
    assert!(start.as_slice() <= b.as_slice());
    assert!(end.as_deref().is_some_and(|end| b.as_slice() < end));
    assert_eq!(partition_bounds(PartitionNo::MAX).1, None);
}

#[test]
fn a_sealed_partition_rebuilt_from_its_row_answers_as_before() {
    let p = partitions(1_000);
    assert_eq!(p.choose(at(0), WINDOW).number, 0);
    for hash in 0..500u64 {
        p.note(
            0,
            hash.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            &completed(9_000),
        );
    }
    let sealed = p
        .choose(at(61_000), WINDOW)
        .sealed
        .expect("sealed by the window");
    let bytes = Partitions::sealed_row(&sealed);
    let (info, filter, hashes) = info::Info::decode(&bytes).expect("a row round-trips");
    let written: Vec<u64> = (0..500u64)
        .map(|h| h.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    assert_eq!(hashes, written, "the row keeps every key's hash, in order");
    assert!(sealed.take_hashes().is_empty(), "and memory does not");
    let back = Arc::new(Partition::sealed(0, &info, filter));
    assert!(written.iter().all(|&h| back.may_hold(h)));
    // A changed row keeps the hashes of the row it replaces; without one, there is none.
    let changed = Partitions::changed_row(&back, Some(&bytes)).expect("a row to change");
    assert_eq!(info::Info::decode(&changed).expect("decodes").2, written);
    assert!(Partitions::changed_row(&back, None).is_none());
    assert_eq!(back.gone_from(Duration::ZERO), at(9_000));
    assert!(!back.is_open());
}

#[test]
fn sixteen_partitions_share_a_generation_that_goes_with_the_last() {
    // One record a partition: every choice after a record seals the open one.
    let p = partitions(1);
    for i in 0..20u64 {
        let chosen = p.choose(at(i), WINDOW);
        assert_eq!(u64::from(chosen.number), i);
        p.note(chosen.number, i, &completed(1_000 + i));
    }
    let generations: Vec<u32> = p.all().generations().iter().map(|g| g.number()).collect();
    assert_eq!(generations, [0, 1]);
    for i in 0..20u64 {
        let found = p.candidates(i, at(0), Duration::ZERO);
        assert!(
            found.contains(&(i as u32)),
            "key {i} in partition {i}: {found:?}"
        );
    }
    for n in 0..15 {
        p.remove(n);
        assert_eq!(p.all().generations().len(), 2, "generation 0 holds others");
    }
    p.remove(15);
    assert_eq!(
        p.all().generations().len(),
        1,
        "gone with the last of generation 0"
    );
}
