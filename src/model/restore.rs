//! After a restore: what a store rebuilt from a copy (a backup, a replica's snapshot and
//! frames) knows about what it may lack, and the window during which it answers a key it does
//! not know as a recovery. No I/O: the engine reads and writes the marks in its metadata.
//!
//! A rebuilt store may lack writes the old store acknowledged: a backup is older than the store
//! it copied, and asynchronous shipping lags. A client retrying such a request finds no key
//! here; answered `Claimed`, its handler would run the operation a second time (a second
//! charge). So while the window is open and the restore may lag, a `begin` that finds no live
//! record claims as usual but answers `Recovered` ([`Recovery::Restored`]), and the handler
//! checks downstream with the claim's downstream key, which is the one the old store's attempt
//! passed on (`Scope::downstream_key`).
//!
//! [`Recovery::Restored`]: crate::model::claim::Recovery::Restored

use std::time::Duration;

use crate::model::clock::Timestamp;
use crate::model::invalid::InvalidSetting;
use crate::model::limits::MAX_TTL;
use crate::model::replica::Guarantee;

/// What a frame or a snapshot carries to a restore, besides its bytes: the writer's epoch,
/// and what the restore may assume about what the shipping store acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lineage {
    /// The epoch of the store that shipped it (`model::writer_epoch`).
    pub epoch: u64,
    /// Whether the stream may lack what the shipping store acknowledged: its own shipping
    /// mode, or [`Guarantee::MayLag`] while the store was itself inside a restore window.
    pub guarantee: Guarantee,
    /// The end of the restore window the shipping store was inside, if any: a store restored
    /// from this one inherits it (the later end wins).
    pub window_end: Option<Timestamp>,
    /// The shipping store's clock when it shipped this: the restored data holds nothing newer,
    /// so a restore window never starts before it (a new box's clock may read 1970).
    pub newest: Timestamp,
}

impl Lineage {
    /// A lineage from the mode alone, at epoch 0 and time 0 (a replica's own tests).
    pub fn of(guarantee: Guarantee) -> Lineage {
        Lineage {
            epoch: 0,
            guarantee,
            window_end: None,
            newest: Timestamp::from_millis(0),
        }
    }

    /// What a store shipping with `own` (its mode's guarantee) at epoch `epoch` ships at
    /// `now`, inside the restore window `window` if it has one: "may lag" with the window's
    /// end while the window is open, whatever the mode.
    pub fn shipping(
        own: Guarantee,
        epoch: u64,
        window: Option<RestoreWindow>,
        now: Timestamp,
    ) -> Lineage {
        let open = window
            .filter(|w| w.may_have_run_elsewhere(now))
            .map(|w| w.ends_at);
        Lineage {
            epoch,
            guarantee: if open.is_some() {
                Guarantee::MayLag
            } else {
                own
            },
            window_end: open,
            newest: now,
        }
    }

    /// What a restore holds after reading `next` behind `self` (the stream's order): the
    /// guarantee of the last writer (what it promised at the end), the latest window end and
    /// the newest time of the two.
    pub fn then(self, next: Lineage) -> Lineage {
        Lineage {
            epoch: self.epoch.max(next.epoch),
            guarantee: next.guarantee,
            window_end: later(self.window_end, next.window_end),
            newest: self.newest.max(next.newest),
        }
    }
}

/// The later of two optional times.
fn later(a: Option<Timestamp>, b: Option<Timestamp>) -> Option<Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// A restore written into a rebuilt store's file, before its first open stamps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PendingRestore {
    /// What the last writer promised.
    pub guarantee: Guarantee,
    /// The last log frame of the old store the restore holds (0 if it names none).
    pub last_frame: u64,
    /// The latest end of a window the restored history was inside.
    pub window_end: Option<Timestamp>,
    /// The newest time the restored data holds: the window starts no earlier.
    pub not_before: Timestamp,
}

/// A restore as the store's metadata records it once the restored store first opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RestoreMark {
    /// What the restore may assume about what the old store acknowledged.
    pub guarantee: Guarantee,
    /// The last log frame of the old store the restore holds (0 if it names none).
    pub last_frame: u64,
    /// When the window starts: the first open's clock, or the newest time in the restored
    /// data if the clock read earlier.
    pub at: Timestamp,
    /// The end of a window inherited from the history (an earlier restore's, still open).
    pub inherited_end: Option<Timestamp>,
}

impl RestoreMark {
    /// The mark the first open at `now` makes of `pending`, merged with `before` (the mark
    /// the restored file already carried: the old store was itself restored), whose window
    /// lasted `length` of its own: the union of the windows.
    pub fn stamp(
        pending: PendingRestore,
        before: Option<RestoreMark>,
        now: Timestamp,
        length: Duration,
    ) -> RestoreMark {
        let before_end = before
            .map(|b| b.window(length))
            .filter(|w| w.guarantee == Guarantee::MayLag)
            .map(|w| w.ends_at);
        RestoreMark {
            guarantee: pending.guarantee,
            last_frame: pending.last_frame,
            at: now.max(pending.not_before),
            inherited_end: later(pending.window_end, before_end),
        }
    }

    /// The window this mark opens when the store's own window lasts `length`.
    pub fn window(self, length: Duration) -> RestoreWindow {
        let own_end = self.at.saturating_add(length);
        let own_lags = self.guarantee == Guarantee::MayLag && !length.is_zero();
        // A zero length turns the window off, inherited ones included.
        let inherited = self
            .inherited_end
            .filter(|end| *end > self.at && !length.is_zero());
        let lags = own_lags || inherited.is_some();
        let ends_at = match (own_lags, inherited) {
            (true, Some(end)) => own_end.max(end),
            (false, Some(end)) => end,
            _ => own_end,
        };
        RestoreWindow {
            restored_at: self.at,
            guarantee: if lags {
                Guarantee::MayLag
            } else {
                Guarantee::Complete
            },
            last_frame: self.last_frame,
            ends_at,
        }
    }
}

/// A store's restore and its window, as [`Stats::restore_window`](crate::Stats) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct RestoreWindow {
    /// When the restore window starts: the restored store's first open, by its clock, or
    /// the newest time the restored data holds if the clock read earlier. A reopen does not
    /// move it.
    pub restored_at: Timestamp,
    /// What the restore assumes about what the old stores acknowledged: with
    /// [`Guarantee::Complete`] nothing is missing and answers are normal; with
    /// [`Guarantee::MayLag`] unknown keys are recoveries until `ends_at`. A restore of a
    /// store that was itself inside a window is "may lag" until that window's end, even
    /// when its last writer shipped synchronously.
    pub guarantee: Guarantee,
    /// The last log frame of the old store that the restore holds (for a backup, the last
    /// frame its snapshot held; 0 if none).
    pub last_frame: u64,
    /// When the restore window ends: the later of `restored_at` plus
    /// [`Builder::restore_window`](crate::Builder::restore_window) (the TTL by default), when
    /// the last writer may have lagged, and the end of any window inherited from the history.
    /// From then on unknown keys are `Claimed` again.
    pub ends_at: Timestamp,
}

impl RestoreWindow {
    /// Whether a key this store has no live record of may have been run and acknowledged by
    /// the old store at `now`: the restore may lag, and its window is open.
    pub fn may_have_run_elsewhere(&self, now: Timestamp) -> bool {
        self.guarantee == Guarantee::MayLag && now < self.ends_at
    }
}

/// The restore window: the setting, and the restore it applies to (read from the metadata
/// at open, so fixed for the life of the open store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct AfterRestore {
    /// [`Builder::restore_window`](crate::Builder::restore_window); `None`: the TTL.
    pub(crate) window: Option<Duration>,
    /// The store's restore, if its metadata records one.
    restored: Option<RestoreWindow>,
}

impl AfterRestore {
    /// The window's length for a store whose records answer for `ttl`.
    pub(crate) fn length(&self, ttl: Duration) -> Duration {
        self.window.unwrap_or(ttl)
    }

    /// The setting's range: 0 (off) ..= 3650 days, as the TTLs'.
    pub(crate) fn validate(&self) -> Result<(), InvalidSetting> {
        match self.window {
            Some(window) if window > MAX_TTL => Err(InvalidSetting {
                setting: "restore_window",
                reason: format!("{window:?} is over 3650 days"),
            }),
            _ => Ok(()),
        }
    }

    /// The window of an opened store whose metadata records `mark` (or no restore).
    pub(crate) fn opened(self, mark: Option<RestoreMark>, ttl: Duration) -> Self {
        let length = self.length(ttl);
        AfterRestore {
            restored: mark.map(|mark| mark.window(length)),
            ..self
        }
    }

    /// The restore, if the store was restored.
    pub(crate) fn restored(&self) -> Option<RestoreWindow> {
        self.restored
    }

    /// Whether a `begin` at `now` that finds no live record must answer it as a recovery.
    pub(crate) fn covers(&self, now: Timestamp) -> bool {
        self.restored
            .is_some_and(|restored| restored.may_have_run_elsewhere(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn mark(guarantee: Guarantee) -> Option<RestoreMark> {
        Some(RestoreMark {
            guarantee,
            last_frame: 7,
            at: t(1_000),
            inherited_end: None,
        })
    }

    fn pending(guarantee: Guarantee, window_end: Option<u64>, not_before: u64) -> PendingRestore {
        PendingRestore {
            guarantee,
            last_frame: 9,
            window_end: window_end.map(t),
            not_before: t(not_before),
        }
    }

    #[test]
    fn a_second_restore_inside_the_first_ones_window_keeps_it_open() {
        // B was restored from a lagging stream at 1 s; its window runs to 1 s + 1 h. B ships
        // synchronously, so C's last frame is complete; C restores at 10 s.
        let b = mark(Guarantee::MayLag);
        let c = RestoreMark::stamp(pending(Guarantee::Complete, None, 0), b, t(10_000), HOUR);
        let window = AfterRestore::default().opened(Some(c), HOUR);
        assert!(window.covers(t(10_000)));
        assert!(window.covers(t(1_000 + 3_599_999)), "B's window, inherited");
        assert!(!window.covers(t(1_000 + 3_600_000)));
        // The same through the frames' own stamps, without the file's mark.
        let c = RestoreMark::stamp(
            pending(Guarantee::MayLag, Some(1_000 + 3_600_000), 0),
            None,
            t(10_000),
            HOUR,
        );
        let window = AfterRestore::default().opened(Some(c), HOUR);
        assert!(
            window.covers(t(10_000 + 3_599_999)),
            "C's own window is longer"
        );
    }

    #[test]
    fn a_window_never_starts_before_the_newest_time_the_data_holds() {
        let day: u64 = 86_400_000;
        // The box reads 1970 at its first open; the data was shipped at day 20,000.
        let stamped = RestoreMark::stamp(
            pending(Guarantee::MayLag, None, 20_000 * day),
            None,
            t(5),
            HOUR,
        );
        assert_eq!(stamped.at, t(20_000 * day));
        let window = AfterRestore::default().opened(Some(stamped), HOUR);
        assert!(
            window.covers(t(20_000 * day + 1)),
            "open once the clock is right"
        );
        assert!(window.covers(t(5)), "and while it is wrong");
    }

    #[test]
    fn a_store_inside_its_window_ships_may_lag_with_the_windows_end() {
        let inside = AfterRestore::default().opened(mark(Guarantee::MayLag), HOUR);
        let shipped = Lineage::shipping(Guarantee::Complete, 2, inside.restored(), t(2_000));
        assert_eq!(shipped.guarantee, Guarantee::MayLag);
        assert_eq!(shipped.window_end, Some(t(1_000 + 3_600_000)));
        assert_eq!((shipped.epoch, shipped.newest), (2, t(2_000)));
        let after = Lineage::shipping(
            Guarantee::Complete,
            2,
            inside.restored(),
            t(1_000 + 3_600_000),
        );
        assert_eq!(
            (after.guarantee, after.window_end),
            (Guarantee::Complete, None)
        );
        // Read in the stream's order: the last writer's guarantee, the latest end.
        let read = shipped.then(after);
        assert_eq!(read.guarantee, Guarantee::Complete);
        assert_eq!(read.window_end, Some(t(1_000 + 3_600_000)));
    }

    #[test]
    fn a_lagging_restore_covers_its_window_and_no_more() {
        let window = AfterRestore::default().opened(mark(Guarantee::MayLag), HOUR);
        assert!(window.covers(t(1_000)));
        assert!(window.covers(t(1_000 + 3_599_999)));
        assert!(!window.covers(t(1_000 + 3_600_000)), "the end is outside");
        assert_eq!(
            window.restored().map(|r| r.ends_at),
            Some(t(1_000 + 3_600_000)),
            "the TTL by default"
        );
    }

    #[test]
    fn a_complete_restore_a_zero_window_and_no_restore_cover_nothing() {
        let complete = AfterRestore::default().opened(mark(Guarantee::Complete), HOUR);
        assert!(!complete.covers(t(1_000)));
        let off = AfterRestore {
            window: Some(Duration::ZERO),
            ..AfterRestore::default()
        }
        .opened(mark(Guarantee::MayLag), HOUR);
        assert!(!off.covers(t(1_000)));
        let never = AfterRestore::default().opened(None, HOUR);
        assert!(!never.covers(t(1_000)));
        assert_eq!(never.restored(), None);
    }

    #[test]
    fn the_window_is_at_most_ten_years() {
        let at_most = AfterRestore {
            window: Some(MAX_TTL),
            ..AfterRestore::default()
        };
        assert!(at_most.validate().is_ok());
        let over = AfterRestore {
            window: Some(MAX_TTL + Duration::from_millis(1)),
            ..AfterRestore::default()
        };
        assert!(over.validate().is_err());
    }
}
