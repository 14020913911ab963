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

/// A restore as the store's metadata records it once the restored store first opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RestoreMark {
    /// What the restore may assume about what the old store acknowledged.
    pub(crate) guarantee: Guarantee,
    /// The last log frame of the old store the restore holds (0 if it names none).
    pub(crate) last_frame: u64,
    /// When the restored store first opened, by its clock: the window starts here.
    pub(crate) at: Timestamp,
}

/// A store's restore and its window, as [`Stats::restore_window`](crate::Stats) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RestoreWindow {
    /// When the restored store first opened (by its clock): the restore window starts here.
    /// A reopen does not move it.
    pub restored_at: Timestamp,
    /// What the restore assumes about what the old store acknowledged: with
    /// [`Guarantee::Complete`] nothing is missing and answers are normal; with
    /// [`Guarantee::MayLag`] unknown keys are recoveries until `ends_at`.
    pub guarantee: Guarantee,
    /// The last log frame of the old store that the restore holds (for a backup, the last
    /// frame its snapshot held; 0 if none).
    pub last_frame: u64,
    /// When the restore window ends: `restored_at` plus
    /// [`Builder::restore_window`](crate::Builder::restore_window) as this open set it (the
    /// TTL by default). From then on unknown keys are `Claimed` again.
    pub ends_at: Timestamp,
}

impl RestoreWindow {
    /// Whether a key this store has no live record of may have been run and acknowledged by
    /// the old store at `now`: the restore may lag, and its window is open.
    pub(crate) fn may_have_run_elsewhere(&self, now: Timestamp) -> bool {
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
            restored: mark.map(|mark| RestoreWindow {
                restored_at: mark.at,
                guarantee: mark.guarantee,
                last_frame: mark.last_frame,
                ends_at: mark.at.saturating_add(length),
            }),
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
        })
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
