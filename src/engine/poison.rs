//! The poison flag: after a failure whose outcome is unknown, nothing more is written until the
//! store has recovered from its log.
//!
//! A failed sync may have left some of a group on disk and some not; the only safe answer is to
//! refuse writes until the store has rebuilt a known state from what the disk holds. Unlike a
//! process restart, that recovery happens in place (the writer does it), after which the flag
//! is cleared. Reads never look at the flag.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::error::StoreError;

#[derive(Debug, Default)]
pub(crate) struct Poison {
    /// Set with `cause`; read without the lock on every write.
    set: AtomicBool,
    cause: Mutex<Option<(Arc<str>, Option<io::ErrorKind>)>>,
}

impl Poison {
    /// `Err(Poisoned)` while the store is poisoned.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        if !self.set.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.cause.lock().as_ref() {
            None => Ok(()),
            Some((cause, kind)) => Err(StoreError::Poisoned {
                kind: *kind,
                cause: cause.clone(),
            }),
        }
    }

    /// Poisons the store with `error` as the cause; the first cause is kept until cleared.
    pub(crate) fn set(&self, error: &StoreError) {
        let mut cause = self.cause.lock();
        if cause.is_none() {
            let text: Arc<str> = match error {
                StoreError::OutcomeUnknown { cause, .. } | StoreError::Poisoned { cause, .. } => {
                    cause.clone()
                }
                other => other.to_string().into(),
            };
            tracing::error!(
                cause = &*text,
                "idemstore is poisoned: writes are refused until it recovers from its log"
            );
            *cause = Some((text, error.io_kind()));
            crate::metrics::count(crate::metrics::POISONED, 1);
            self.set.store(true, Ordering::Release);
        }
    }

    /// Clears the flag once the store has recovered a known state.
    pub(crate) fn clear(&self) {
        let mut cause = self.cause.lock();
        if cause.take().is_some() {
            tracing::info!("idemstore recovered from its log; writes are accepted again");
        }
        self.set.store(false, Ordering::Release);
    }
}

/// Poisons the store if the thread holding it unwinds (the writer must never die silently).
#[derive(Debug)]
pub(crate) struct PanicGuard<'a>(pub(crate) &'a Poison);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.set(&StoreError::Internal {
                message: "the writer thread panicked".into(),
            });
        }
    }
}
