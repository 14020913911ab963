//! Checkpoints: when one is due, taking one, and what a failed one leaves.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;
use std::time::Instant;

use super::{Appends, Job, JobKind, LogFailure, Reopen, StoreError, Writer, catch_up};

impl Writer {
    /// Frames replayed at open (or by a restore) are in redb without a sync, and their segments
    /// cannot be reused until a checkpoint: take one at the first chance.
    pub(in crate::engine) fn checkpoint_soon_if_replayed(&mut self) {
        if self.mode.since_checkpoint() > 0 {
            // A deadline of now, not a last checkpoint an interval ago: `Instant` cannot go
            // back further than the machine's uptime, so an interval longer than that (an
            // hour, on a box booted minutes ago) left this checkpoint an interval away.
            self.timed_checkpoint = Instant::now();
        }
    }

    /// How long until a checkpoint is due, if the log holds frames not yet in durable redb.
    pub(super) fn checkpoint_due_in(&self) -> Option<Duration> {
        let log = self.mode.log()?;
        (log.since_checkpoint() > 0).then(|| {
            self.shared
                .config
                .checkpoint_interval
                .min(
                    self.timed_checkpoint
                        .saturating_duration_since(Instant::now()),
                )
                .max(self.checkpoint_retry.wait().unwrap_or_default())
        })
    }

    pub(super) fn checkpoint_if_due(&mut self) {
        let Some(log) = self.mode.log() else {
            return;
        };
        let due = log.since_checkpoint() >= self.shared.config.checkpoint_bytes
            || (log.since_checkpoint() > 0 && Instant::now() >= self.timed_checkpoint);
        if due
            && self.checkpoint_retry.due()
            && let Err(e) = self.checkpoint()
        {
            self.checkpoint_failed(e);
        }
    }

    /// A failed checkpoint changed nothing the log does not hold, but redb latches the error:
    /// restore it in place and try the checkpoint again after a while.
    pub(super) fn checkpoint_failed(&mut self, e: StoreError) -> StoreError {
        tracing::warn!(error = %e, "checkpoint failed; the log keeps every write, and the checkpoint is tried again later");
        self.checkpoint_retry.failed();
        self.heal(Reopen::IfNeeded);
        match e.io_kind() {
            Some(kind) => StoreError::NotWritten {
                kind,
                cause: format!("checkpoint failed: {e}").into(),
            },
            None => e,
        }
    }

    /// After an open that replayed frames, the checkpoint that must come before the first new
    /// frame (see [`Appends`]). A failure refuses the group as "not written" (nothing of it
    /// ran) without poisoning the store: the checkpoint is tried again with backoff.
    pub(super) fn checkpoint_before_appending(
        &mut self,
        group: &VecDeque<Box<dyn Job>>,
    ) -> Result<(), StoreError> {
        if self.appends == Appends::Open {
            return Ok(());
        }
        let asked = group.iter().any(|job| job.kind() == JobKind::Checkpoint);
        if !asked && !self.checkpoint_retry.due() {
            return Err(StoreError::NotWritten {
                kind: std::io::ErrorKind::Other,
                cause: "the log replayed at open is not checkpointed yet (the last try failed; it is tried again shortly)".into(),
            });
        }
        self.checkpoint().map_err(|e| self.checkpoint_failed(e))
    }

    /// Makes redb durable (with quick-repair, so a crash never forces a full scan), records the
    /// last logged frame as checkpointed, and lets the log reuse the segments before it. Runs
    /// between epochs, so everything logged is published.
    pub(super) fn checkpoint(&mut self) -> Result<(), StoreError> {
        let Some(log) = self.mode.log() else {
            return Ok(());
        };
        let seq = log
            .wait_durable()
            .map_err(|failure: LogFailure| failure.error)?;
        let segment = log.next_frame_segment();
        {
            let slot = self.shared.db.read(&self.shared.poison)?;
            catch_up::checkpoint_now(&slot, seq, segment)?;
        }
        // Enough spare segments to log one checkpoint interval without creating files.
        let keep_free = usize::try_from(
            self.shared
                .config
                .checkpoint_bytes
                .div_ceil(self.shared.config.segment_bytes)
                + 1,
        )
        .unwrap_or(usize::MAX);
        log.checkpointed(seq, keep_free);
        self.appends = Appends::Open;
        tracing::debug!(seq, segment, "checkpoint");
        self.checkpoint_retry.reset();
        let now = Instant::now();
        self.timed_checkpoint = now + self.shared.config.checkpoint_interval;
        self.shared.counters.checkpointed();
        let since_open = now.duration_since(self.shared.counters.opened);
        self.shared.counters.last_checkpoint_ms.store(
            u64::try_from(since_open.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            Ordering::Relaxed,
        );
        Ok(())
    }
}
