//! What a store creates is private to its user: directories `0700`, files `0600`, set after
//! creation so that the umask does not decide (the default umask of 022 would leave them
//! `0755` and `0644`). An existing store that others may read is reported, or refused.
//!
//! The checks read mode bits, not whether another user can open a file, so they hold when
//! the tests run as root.
#![cfg(unix)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{TestResult, clock, fp, scope};
use idemstore::{Begin, LoosePermissions, OpenError, Response, Store};

fn mode(path: &Path) -> std::io::Result<u32> {
    Ok(std::fs::metadata(path)?.permissions().mode() & 0o777)
}

/// Every directory and file under `root` (itself included), with its mode.
fn modes(root: &Path) -> std::io::Result<Vec<(String, u32)>> {
    let mut out = vec![(root.display().to_string(), mode(root)?)];
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            out.push((path.display().to_string(), mode(&path)?));
            if path.is_dir() {
                dirs.push(path);
            }
        }
    }
    Ok(out)
}

fn assert_private(root: &Path) -> TestResult {
    for (path, mode) in modes(root)? {
        let expected = if Path::new(&path).is_dir() {
            0o700
        } else {
            0o600
        };
        assert_eq!(mode, expected, "{path} is {mode:o}");
    }
    Ok(())
}

fn commit(store: &Store, key: &str, bytes: usize) -> TestResult {
    let Begin::Claimed(claim) = store.begin(&scope(key), fp("request"))? else {
        return Err("a new key is claimed".into());
    };
    claim.commit(move |_| Ok(Response::new(201, common::incompressible(bytes))))?;
    Ok(())
}

#[test]
fn a_new_store_and_every_level_open_creates_are_private() -> TestResult {
    let dir = tempfile::tempdir()?;
    // Two levels that do not exist yet: both are made by open.
    let root = dir.path().join("data").join("idem");
    let store = common::builder(&clock()).open(&root)?;
    commit(&store, "k", 100)?;
    assert_private(&dir.path().join("data"))?;
    assert!(store.stats()?.loose_permissions.is_empty());
    Ok(())
}

#[test]
fn log_segments_made_by_rotation_are_private() -> TestResult {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("idem");
    let store = common::builder(&clock())
        .log_segment_bytes(64 * 1024)
        .checkpoint_bytes(10 * 1024 * 1024)
        .open(&root)?;
    for i in 0..40 {
        commit(&store, &format!("k{i}"), 8 * 1024)?;
    }
    let segments = std::fs::read_dir(root.join("wal"))?.count();
    assert!(segments >= 3, "the log rotated: {segments} segments");
    assert_private(&root)?;
    Ok(())
}

#[test]
fn an_existing_store_others_may_read_is_reported_or_refused() -> TestResult {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("idem");
    drop(common::builder(&clock()).open(&root)?);
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))?;
    let db = root.join("idemstore.redb");
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644))?;

    let refused = common::builder(&clock())
        .loose_permissions(LoosePermissions::Refuse)
        .open(&root)
        .err()
        .ok_or("a loose store opened under LoosePermissions::Refuse")?;
    let OpenError::LoosePermissions { files } = &refused else {
        return Err(format!("expected LoosePermissions, got {refused}").into());
    };
    let named: Vec<_> = files.iter().map(|f| (f.path.clone(), f.mode)).collect();
    assert!(named.contains(&(root.clone(), 0o755)), "{named:?}");
    assert!(named.contains(&(db.clone(), 0o644)), "{named:?}");
    assert!(refused.to_string().contains("chmod"), "{refused}");
    // Refused means untouched: the modes are as they were.
    assert_eq!(mode(&db)?, 0o644);

    // The default warns, opens, and reports it.
    let store = common::builder(&clock()).open(&root)?;
    let loose = store.stats()?.loose_permissions;
    assert_eq!(loose.len(), 2, "{loose:?}");
    assert!(loose.iter().any(|f| f.path == db && f.mode == 0o644));
    Ok(())
}

#[test]
fn the_lock_file_is_private_and_reported_when_others_may_read_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("idem");
    drop(common::builder(&clock()).open(&root)?);
    let lock = root.join("idemstore.lock");
    assert_eq!(mode(&lock)?, 0o600);
    std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o644))?;
    let store = common::builder(&clock()).open(&root)?;
    let loose = store.stats()?.loose_permissions;
    assert!(
        loose.iter().any(|f| f.path == lock && f.mode == 0o644),
        "{loose:?}"
    );
    Ok(())
}
