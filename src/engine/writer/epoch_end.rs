//! How an epoch ends, decided from what went wrong in it: a pure function, so that each row of
//! design.md's failure table ("When something fails") is a test here.

use crate::wal::FailedOutcome;

/// What the epoch's transaction holds beyond the durable groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Writes {
    /// Only the writes of groups that applied cleanly.
    Clean,
    /// A group's writes failed part way (a redb error, a panicking key type): the transaction
    /// holds writes that must not be published.
    Tainted,
}

/// How the epoch ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EpochEnd {
    /// Commit the transaction as it stands.
    Commit,
    /// Drop the transaction and re-apply, in a fresh one, the payloads of the durable groups
    /// whose frames are numbered below `keep_below`; the rest fail.
    Rebuild { keep_below: u64 },
    /// Drop the transaction and restore the store from its files: a sync failed, so what is
    /// durable is for the log's files to say, not for this process's memory.
    Restore,
}

/// The end of an epoch whose log failed with `log` (its outcome, and the first frame it
/// failed), and whose transaction holds `writes`.
pub(super) fn epoch_end(log: Option<(FailedOutcome, u64)>, writes: Writes) -> EpochEnd {
    match (log, writes) {
        (Some((FailedOutcome::Unknown, _)), Writes::Clean | Writes::Tainted) => EpochEnd::Restore,
        (Some((FailedOutcome::NotWritten, first)), Writes::Clean | Writes::Tainted) => {
            EpochEnd::Rebuild { keep_below: first }
        }
        (None, Writes::Tainted) => EpochEnd::Rebuild {
            keep_below: u64::MAX,
        },
        (None, Writes::Clean) => EpochEnd::Commit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "A request's own closure fails or panics", "the clock panics before a group": the
    /// request or group fails alone and the epoch is published as it stands.
    #[test]
    fn a_failure_inside_a_request_or_before_a_group_publishes_the_epoch() {
        assert_eq!(epoch_end(None, Writes::Clean), EpochEnd::Commit);
    }

    /// "A group's writes fail to apply": rebuilt from every durable group.
    #[test]
    fn writes_that_failed_to_apply_rebuild_from_every_durable_group() {
        assert_eq!(
            epoch_end(None, Writes::Tainted),
            EpochEnd::Rebuild {
                keep_below: u64::MAX
            }
        );
    }

    /// "The log refuses a frame before its sync": rebuilt without that frame's groups and
    /// every later one, tainted or not.
    #[test]
    fn a_refused_frame_rebuilds_without_it_and_what_followed() {
        for writes in [Writes::Clean, Writes::Tainted] {
            assert_eq!(
                epoch_end(Some((FailedOutcome::NotWritten, 7)), writes),
                EpochEnd::Rebuild { keep_below: 7 },
                "{writes:?}"
            );
        }
    }

    /// "A log fdatasync fails": restored in place, whatever else the epoch holds.
    #[test]
    fn a_failed_sync_restores_whatever_else_happened() {
        for writes in [Writes::Clean, Writes::Tainted] {
            assert_eq!(
                epoch_end(Some((FailedOutcome::Unknown, 7)), writes),
                EpochEnd::Restore,
                "{writes:?}"
            );
        }
    }
}
