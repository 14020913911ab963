//! The umbrella error over every operation's error, for callers that do not branch on the
//! operation (`?` into one type). It names the local store's claim (a commit error carries it),
//! so it lives above the engine, apart from the errors the engine returns.

use crate::api::claim::CommitError;
#[cfg(feature = "postgres")]
use crate::error::PgOpenError;
use crate::error::{
    BackupError, ClaimError, CompactError, ExecuteError, FingerprintError, ForgetError, OpenError,
    ReadError, ResponseError, ScopeError, StoreError, TxError, WriteError,
};
use crate::model::message::MessageError;

/// Any error this crate returns, for callers that do not branch on the operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// See [`OpenError`].
    #[error(transparent)]
    Open(#[from] OpenError),
    /// See [`ScopeError`].
    #[error(transparent)]
    Scope(#[from] ScopeError),
    /// See [`FingerprintError`].
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    /// See [`CommitError`].
    #[error(transparent)]
    Commit(#[from] CommitError),
    /// See [`ExecuteError`].
    #[error(transparent)]
    Execute(#[from] ExecuteError),
    /// See [`ClaimError`].
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// See [`WriteError`].
    #[error(transparent)]
    Write(#[from] WriteError),
    /// See [`CompactError`].
    #[error(transparent)]
    Compact(#[from] CompactError),
    /// See [`BackupError`].
    #[error(transparent)]
    Backup(#[from] BackupError),
    /// See [`ReadError`].
    #[error(transparent)]
    Read(#[from] ReadError),
    /// See [`TxError`].
    #[error(transparent)]
    Tx(#[from] TxError),
    /// See [`StoreError`].
    #[error(transparent)]
    Store(#[from] StoreError),
    /// See [`ForgetError`].
    #[error(transparent)]
    Forget(#[from] ForgetError),
    /// See [`ResponseError`].
    #[error(transparent)]
    Response(#[from] ResponseError),
    /// See [`MessageError`].
    #[error(transparent)]
    Message(#[from] MessageError),
    /// See [`PgOpenError`].
    #[cfg(feature = "postgres")]
    #[error(transparent)]
    PgOpen(#[from] PgOpenError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scope::Scope;

    /// `?` turns each operation's error into the umbrella one, keeping its message.
    fn through_question_mark<E: std::fmt::Display>(e: E) -> (Error, String)
    where
        Error: From<E>,
    {
        let message = e.to_string();
        let failing = || -> Result<(), Error> { Err(e)? };
        (failing().expect_err("it failed"), message)
    }

    #[test]
    fn every_operations_error_converts_with_its_message() {
        let scope = Scope::new("t", "op", "k").expect("a valid scope");
        let (e, message) = through_question_mark(ForgetError::Absent { scope });
        assert!(matches!(e, Error::Forget(_)));
        assert_eq!(e.to_string(), message);
        let (e, message) = through_question_mark(ResponseError::TooLarge { size: 9, max: 8 });
        assert!(matches!(e, Error::Response(_)));
        assert_eq!(e.to_string(), message);
        let (e, message) = through_question_mark(MessageError::BadSubject {
            subject: String::new(),
            reason: "empty",
        });
        assert!(matches!(e, Error::Message(_)));
        assert_eq!(e.to_string(), message);
        #[cfg(feature = "postgres")]
        {
            let (e, message) = through_question_mark(PgOpenError::BadPrefix { prefix: "9".into() });
            assert!(matches!(e, Error::PgOpen(_)));
            assert_eq!(e.to_string(), message);
        }
    }
}
