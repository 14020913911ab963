//! The memory budget reaches what it bounds: redb's page cache, and the writer's groups.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};

use common::{TestResult, builder, clock, fp, scope};
use idemstore::testing::redb_cache_used_bytes;
use idemstore::{Begin, OpenError, Response, Store};

const MIB: usize = 1024 * 1024;

/// Writes `count` completed records with `body`-byte responses from 16 threads, then reads
/// each back (`get`), so that redb's cache has had every page of the file offered to it.
fn fill_and_read(store: &Store, count: usize, body: usize) -> TestResult {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| -> Result<(), String> {
        let threads: Vec<_> = (0..16)
            .map(|_| {
                s.spawn(|| -> Result<(), String> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            return Ok(());
                        }
                        let key = format!("k{i}");
                        let begun = store.begin(&scope(&key), fp(&key));
                        let Ok(Begin::Claimed(claim)) = begun else {
                            return Err(format!("{key}: {begun:?}"));
                        };
                        claim
                            .commit(move |_| Ok(Response::new(201, common::incompressible(body))))
                            .map_err(|e| format!("{key}: {e}"))?;
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .try_for_each(|t| t.join().map_err(|_| "a writer panicked".to_owned())?)
    })?;
    store.checkpoint()?;
    for i in 0..count {
        assert!(store.get(&scope(&format!("k{i}")))?.is_some(), "k{i} lost");
    }
    Ok(())
}

#[test]
fn the_budget_bounds_redbs_page_cache() -> TestResult {
    let clock = clock();
    // About 25 MB of records: more than a 4 MiB cache holds, less than a 128 MiB one.
    let (count, body) = (12_000, 2_000);

    let dir = tempfile::tempdir()?;
    let small = builder(&clock).memory_budget(8 * MIB).open(dir.path())?;
    assert_eq!(small.stats()?.memory_budget, 8 * MIB);
    assert_eq!(small.stats()?.redb_cache_bytes, 4 * MIB);
    fill_and_read(&small, count, body)?;
    let used_small = redb_cache_used_bytes(&small)?;
    // redb holds its cache to the size it was given (a page or so of slack while it evicts).
    assert!(
        used_small <= 4 * MIB + 64 * 1024,
        "redb's cache holds {used_small} bytes with a 4 MiB share"
    );

    let dir = tempfile::tempdir()?;
    let large = builder(&clock).memory_budget(256 * MIB).open(dir.path())?;
    assert_eq!(large.stats()?.redb_cache_bytes, 128 * MIB);
    fill_and_read(&large, count, body)?;
    let used_large = redb_cache_used_bytes(&large)?;
    // The same reads keep far more with a larger share: the setting is what bounds it.
    assert!(
        used_large > 3 * used_small,
        "a 128 MiB share kept {used_large} bytes, a 4 MiB share {used_small}"
    );
    Ok(())
}

#[test]
fn the_budget_bounds_what_one_writer_group_holds() -> TestResult {
    let dir = tempfile::tempdir()?;
    // A 4 MiB budget: a group stops taking requests past 512 KiB of writes.
    let store = builder(&clock()).memory_budget(4 * MIB).open(dir.path())?;
    let body = 200 * 1024;
    // Claimed one at a time first, so that the groups counted below are the commits'.
    let claims = (0..64)
        .map(|t| {
            let key = format!("big-{t}");
            match store.begin(&scope(&key), fp(&key))? {
                Begin::Claimed(claim) => Ok(claim),
                other => Err(format!("{key}: {other:?}").into()),
            }
        })
        .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
    let before = store.stats()?.group_sizes;
    let barrier = std::sync::Barrier::new(64);
    std::thread::scope(|s| -> Result<(), String> {
        let threads: Vec<_> = claims
            .into_iter()
            .map(|claim| {
                let barrier = &barrier;
                s.spawn(move || -> Result<(), String> {
                    barrier.wait();
                    claim
                        .commit(move |_| Ok(Response::new(201, common::incompressible(body))))
                        .map_err(|e| format!("a commit: {e}"))?;
                    Ok(())
                })
            })
            .collect();
        threads
            .into_iter()
            .try_for_each(|t| t.join().map_err(|_| "a writer panicked".to_owned())?)
    })?;
    let stats = store.exact_stats()?;
    assert_eq!(stats.completed, 64);
    let commits: Vec<u64> = (0..stats.group_sizes.len())
        .map(|i| stats.group_sizes[i] - before[i])
        .collect();
    // Three 200 KiB commits pass 512 KiB: no group held four or more. (Without the bound,
    // 64 commits released together make groups of dozens.)
    assert_eq!(
        commits[2..].iter().sum::<u64>(),
        0,
        "commit groups by size: {commits:?}"
    );
    assert!(commits.iter().sum::<u64>() >= 64 / 3, "{commits:?}");
    Ok(())
}

#[test]
fn a_budget_under_the_minimum_is_refused_with_the_setting_named() {
    let dir = tempfile::tempdir().expect("dir");
    let err = Store::builder()
        .memory_budget(MIB)
        .open(dir.path())
        .expect_err("1 MiB is under the minimum");
    assert!(
        matches!(
            err,
            OpenError::InvalidConfig {
                setting: "memory_budget",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("4 MiB"), "{err}");
    assert!(
        std::fs::read_dir(dir.path()).expect("dir").next().is_none(),
        "a refused open wrote nothing"
    );
}

#[test]
fn the_default_budget_is_64_mib_with_half_for_redb() -> TestResult {
    let dir = tempfile::tempdir()?;
    let stats = Store::open(dir.path())?.stats()?;
    assert_eq!(
        (stats.memory_budget, stats.redb_cache_bytes),
        (64 * MIB, 32 * MIB)
    );
    Ok(())
}
