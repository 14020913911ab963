//! The poison flag: once a group could not be made durable, nothing more is written.
//!
//! A failed sync may have left some of the group on disk and some not; the only safe answer is
//! to refuse further work until a reopen recovers a known state.

use std::sync::{Arc, OnceLock};

use crate::error::StoreError;

#[derive(Debug, Default)]
pub(crate) struct Poison {
    cause: OnceLock<Arc<str>>,
}

impl Poison {
    /// `Err(Poisoned)` once the store is poisoned.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        match self.cause.get() {
            None => Ok(()),
            Some(cause) => Err(StoreError::Poisoned {
                cause: cause.clone(),
            }),
        }
    }

    /// Poisons the store; the first cause is kept.
    pub(crate) fn set(&self, cause: &str) {
        if self.cause.set(Arc::from(cause)).is_ok() {
            tracing::error!(
                cause,
                "idemstore is poisoned: nothing more is written until it is reopened"
            );
        }
    }
}

/// Poisons the store if the thread holding it unwinds (the writer must never die silently).
#[derive(Debug)]
pub(crate) struct PanicGuard<'a>(pub(crate) &'a Poison);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.set("the writer thread panicked");
        }
    }
}
