//! The restore a rebuilt store came from, in its metadata: the pending mark a rebuild writes
//! into the file before its first open, and the stamp that open turns it into (layouts in
//! `layout.rs` and `docs/design.md`, "Meta").
//!
//! The window itself is a pure rule (`model::restore`): here it is read, merged and written.
//! A rebuilt file may carry the mark of the store it was copied from (that store was itself
//! restored, and its window may still be open): the first open merges the two, so a second
//! restore inside the first one's window keeps that window.

use std::time::Duration;

use redb::{Database, ReadableTable, Table};

use super::layout::{META_RESTORE_PENDING, META_RESTORED};
use super::meta::{META_TABLE, setup};
use crate::error::OpenError;
use crate::model::clock::Timestamp;
use crate::model::replica::Guarantee;
use crate::model::restore::{PendingRestore, RestoreMark};

/// The version byte this build writes at the start of both marks.
const VERSION: u8 = 2;
/// Both marks' length in version 2.
const LEN: usize = 26;

/// Marks, inside `txn` (one that builds a restored store's file, before its first open), that
/// the store is rebuilt from a copy of another (see `model::restore`). A mark already pending
/// is replaced: the last rebuild counts (the stamped mark of the copy's own store is kept and
/// merged at the first open).
pub(crate) fn set_pending(
    txn: &redb::WriteTransaction,
    pending: PendingRestore,
) -> Result<(), redb::Error> {
    let value = encode(
        pending.guarantee,
        pending.last_frame,
        pending.window_end,
        pending.not_before,
    );
    txn.open_table(META_TABLE)?
        .insert(META_RESTORE_PENDING, value.as_slice())?;
    Ok(())
}

/// At open, before the store serves anything: a pending restore mark becomes the store's
/// restore, stamped `now` (or the newest time the restored data holds, if the clock reads
/// before it) and merged with the restore the file already carried, in one durable commit (a
/// crash before it leaves the mark pending for the next open). `length` is the window's
/// length by this open's settings. Returns the store's restore, stamped now or by an earlier
/// open; `None` for a store never restored.
pub(crate) fn start_window(
    db: &Database,
    now: Timestamp,
    length: Duration,
) -> Result<Option<RestoreMark>, OpenError> {
    let mut txn = db.begin_write().map_err(setup)?;
    txn.set_quick_repair(true);
    let (pending, before) = {
        let meta = txn.open_table(META_TABLE).map_err(setup)?;
        (read_pending(&meta)?, read_stamped(&meta)?)
    };
    let Some(pending) = pending else {
        txn.abort().map_err(setup)?;
        return Ok(before);
    };
    let mark = RestoreMark::stamp(pending, before, now, length);
    assert!(
        mark.at >= now && mark.at >= pending.not_before,
        "a window starts no earlier than the clock or the restored data"
    );
    if now < pending.not_before {
        tracing::warn!(
            clock_ms = now.as_millis(),
            newest_data_ms = pending.not_before.as_millis(),
            "this box's clock reads before the newest time in the restored data (a clock not yet set?); the restore window starts at the data's time instead"
        );
    }
    {
        let mut meta = txn.open_table(META_TABLE).map_err(setup)?;
        let value = encode(mark.guarantee, mark.last_frame, mark.inherited_end, mark.at);
        meta.insert(META_RESTORED, value.as_slice())
            .map_err(setup)?;
        meta.remove(META_RESTORE_PENDING).map_err(setup)?;
    }
    txn.commit().map_err(setup)?;
    tracing::warn!(
        guarantee = mark.guarantee.as_str(),
        last_frame = mark.last_frame,
        restored_at_ms = mark.at.as_millis(),
        inherited_end_ms = mark.inherited_end.map(Timestamp::as_millis),
        "first open of a restored store: the restore window starts now"
    );
    Ok(Some(mark))
}

/// Version 2 of either mark: the time is the pending mark's not-before, or the stamp's start.
fn encode(
    guarantee: Guarantee,
    last_frame: u64,
    window_end: Option<Timestamp>,
    time: Timestamp,
) -> Vec<u8> {
    let mut value = Vec::with_capacity(LEN);
    value.push(VERSION);
    value.push(match guarantee {
        Guarantee::Complete => 1,
        Guarantee::MayLag => 2,
    });
    value.extend_from_slice(&last_frame.to_le_bytes());
    value.extend_from_slice(&window_end.map_or(0, Timestamp::as_millis).to_le_bytes());
    value.extend_from_slice(&time.as_millis().to_le_bytes());
    debug_assert_eq!(value.len(), LEN);
    value
}

/// One mark's fields: guarantee, last frame, window end, and its time (absent in a version
/// 1 pending mark).
type Fields = (Guarantee, u64, Option<Timestamp>, Option<Timestamp>);

fn read_pending(meta: &Table<'_, &[u8], &[u8]>) -> Result<Option<PendingRestore>, OpenError> {
    Ok(
        read(meta, META_RESTORE_PENDING, "restore_pending")?.map(|(g, last, end, time)| {
            PendingRestore {
                guarantee: g,
                last_frame: last,
                window_end: end,
                not_before: time.unwrap_or(Timestamp::from_millis(0)),
            }
        }),
    )
}

fn read_stamped(meta: &Table<'_, &[u8], &[u8]>) -> Result<Option<RestoreMark>, OpenError> {
    let Some((guarantee, last_frame, inherited_end, at)) = read(meta, META_RESTORED, "restored")?
    else {
        return Ok(None);
    };
    let at = at.ok_or(OpenError::CorruptMeta {
        key: "restored",
        detail: "no time".into(),
    })?;
    Ok(Some(RestoreMark {
        guarantee,
        last_frame,
        at,
        inherited_end,
    }))
}

fn read(
    meta: &Table<'_, &[u8], &[u8]>,
    key: &[u8],
    name: &'static str,
) -> Result<Option<Fields>, OpenError> {
    let Some(value) = meta.get(key).map_err(setup)? else {
        return Ok(None);
    };
    let bytes = value.value();
    let corrupt = |detail: String| OpenError::CorruptMeta { key: name, detail };
    let stamped = key == META_RESTORED;
    let expected = match bytes.first() {
        Some(1) if stamped => 18,
        Some(1) => 10,
        Some(&VERSION) => LEN,
        Some(other) => return Err(corrupt(format!("version {other} is unknown"))),
        None => return Err(corrupt("empty".into())),
    };
    if bytes.len() != expected {
        return Err(corrupt(format!(
            "{} bytes where {expected} are expected",
            bytes.len()
        )));
    }
    let guarantee = match bytes[1] {
        1 => Guarantee::Complete,
        2 => Guarantee::MayLag,
        other => return Err(corrupt(format!("guarantee {other} is unknown"))),
    };
    let u64_at = |at: usize| {
        let mut le = [0u8; 8];
        le.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(le)
    };
    let time = |at: usize| Some(Timestamp::from_millis(u64_at(at)));
    Ok(Some(match bytes[0] {
        1 => (
            guarantee,
            u64_at(2),
            None,
            if stamped { time(10) } else { None },
        ),
        _ => {
            let end = Some(u64_at(10))
                .filter(|ms| *ms > 0)
                .map(Timestamp::from_millis);
            (guarantee, u64_at(2), end, time(18))
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn database() -> Result<Database, redb::Error> {
        let db = Database::builder().create_with_backend(redb::backends::InMemoryBackend::new())?;
        let txn = db.begin_write()?;
        txn.open_table(META_TABLE)?;
        txn.commit()?;
        Ok(db)
    }

    fn put(db: &Database, key: &[u8], value: &[u8]) -> Result<(), redb::Error> {
        let txn = db.begin_write()?;
        txn.open_table(META_TABLE)?.insert(key, value)?;
        txn.commit()?;
        Ok(())
    }

    fn entry(db: &Database, key: &[u8]) -> Result<Option<Vec<u8>>, redb::Error> {
        let txn = db.begin_write()?;
        let value = txn
            .open_table(META_TABLE)?
            .get(key)?
            .map(|v| v.value().to_vec());
        txn.abort()?;
        Ok(value)
    }

    fn pend(db: &Database, pending: PendingRestore) -> Result<(), OpenError> {
        let txn = db.begin_write().map_err(setup)?;
        set_pending(&txn, pending).map_err(setup)?;
        txn.commit().map_err(setup)
    }

    #[test]
    fn the_first_open_stamps_a_pending_restore_and_later_ones_read_it() -> Result<(), OpenError> {
        let db = database().map_err(setup)?;
        assert_eq!(start_window(&db, t(5), HOUR)?, None);
        pend(
            &db,
            PendingRestore {
                guarantee: Guarantee::MayLag,
                last_frame: 0x0102,
                window_end: None,
                not_before: t(0x0203),
            },
        )?;
        let mut layout = vec![2, 2, 2, 1, 0, 0, 0, 0, 0, 0];
        layout.extend_from_slice(&[0; 8]);
        layout.extend_from_slice(&[3, 2, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            entry(&db, META_RESTORE_PENDING).map_err(setup)?,
            Some(layout),
            "the layout in docs/design.md"
        );
        let stamped = RestoreMark {
            guarantee: Guarantee::MayLag,
            last_frame: 0x0102,
            at: t(0x0304),
            inherited_end: None,
        };
        assert_eq!(start_window(&db, t(0x0304), HOUR)?, Some(stamped));
        assert_eq!(entry(&db, META_RESTORE_PENDING).map_err(setup)?, None);
        assert_eq!(
            start_window(&db, t(99_999), HOUR)?,
            Some(stamped),
            "a reopen does not move the window"
        );
        Ok(())
    }

    #[test]
    fn a_restore_of_a_restored_store_merges_the_windows() -> Result<(), Box<dyn std::error::Error>>
    {
        let db = database().map_err(setup)?;
        // The copied store's own mark, version 1 (a store of the build before): restored at
        // 1 s from a lagging stream.
        let mut v1 = vec![1, 2, 7, 0, 0, 0, 0, 0, 0, 0];
        v1.extend_from_slice(&1_000u64.to_le_bytes());
        put(&db, META_RESTORED, &v1).map_err(setup)?;
        pend(
            &db,
            PendingRestore {
                guarantee: Guarantee::Complete,
                last_frame: 20,
                window_end: None,
                not_before: t(0),
            },
        )?;
        let mark = start_window(&db, t(10_000), HOUR)?.ok_or("no mark")?;
        assert_eq!(mark.inherited_end, Some(t(1_000 + 3_600_000)));
        let window = mark.window(HOUR);
        assert!(window.may_have_run_elsewhere(t(3_600_000)));
        assert!(!window.may_have_run_elsewhere(t(1_000 + 3_600_000)));
        Ok(())
    }

    #[test]
    fn a_clock_before_the_data_starts_the_window_at_the_data()
    -> Result<(), Box<dyn std::error::Error>> {
        let db = database().map_err(setup)?;
        pend(
            &db,
            PendingRestore {
                guarantee: Guarantee::MayLag,
                last_frame: 3,
                window_end: None,
                not_before: t(1_800_000_000_000),
            },
        )?;
        let mark = start_window(&db, t(0), HOUR)?.ok_or("no mark")?;
        assert_eq!(mark.at, t(1_800_000_000_000));
        assert!(
            mark.window(HOUR)
                .may_have_run_elsewhere(t(1_800_000_000_000 + 60_000)),
            "the window is open once the clock is corrected"
        );
        Ok(())
    }

    #[test]
    fn a_damaged_restore_mark_is_corrupt_metadata() -> Result<(), redb::Error> {
        for (key, value) in [
            (META_RESTORE_PENDING, vec![1, 2, 0]),
            (META_RESTORE_PENDING, vec![3, 2, 0, 0, 0, 0, 0, 0, 0, 0]),
            (META_RESTORE_PENDING, vec![]),
            (
                META_RESTORED,
                vec![1, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (META_RESTORED, vec![2; 18]),
        ] {
            let db = database()?;
            put(&db, key, &value)?;
            assert!(
                matches!(
                    start_window(&db, t(1), HOUR),
                    Err(OpenError::CorruptMeta { .. })
                ),
                "{value:?}"
            );
        }
        Ok(())
    }
}
