//! What the driver's errors mean to a caller, and the time limit on every call.
//!
//! Two kinds of failure, told apart because the caller must act differently:
//! - nothing was acknowledged ([`StoreError::Backend`]): a refused or lost connection, a pool
//!   with no free connection in time, a statement cancelled by `statement_timeout`, an error
//!   the database answered with; the transaction was rolled back, so retrying is safe;
//! - a `COMMIT` was sent and its answer was lost ([`StoreError::OutcomeUnknown`]): the
//!   database may or may not have committed; `begin` for the key tells (a `Replay` means it
//!   did; otherwise the key is still in progress and its lease runs out).

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;

/// `statement_timeout`'s SQLSTATE (`query_canceled`).
pub(crate) const QUERY_CANCELED: &str = "57014";
/// `lock_timeout`'s SQLSTATE (`lock_not_available`).
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// What this backend does after a `COMMIT` whose answer was lost: the words
/// [`StoreError::OutcomeUnknown`] carries to the user.
const RECOVERY: &str = "PostgreSQL either committed it or rolls it back: a session whose COMMIT never arrived is ended by the server, and its locks with it, within about one lease";

/// A call whose answer was lost after it may have committed.
pub(crate) fn unknown(what: &str, cause: &dyn std::fmt::Display) -> StoreError {
    StoreError::unknown_in(what, cause, RECOVERY)
}

/// A failure that acknowledged nothing.
pub(crate) fn backend(what: &str, e: &sqlx::Error) -> StoreError {
    let message = match e {
        sqlx::Error::PoolTimedOut => {
            format!("{what}: no database connection came free in time (the pool's acquire timeout)")
        }
        sqlx::Error::Database(db) if db.code().as_deref() == Some(QUERY_CANCELED) => {
            format!("{what}: the statement ran past its timeout and was cancelled ({db})")
        }
        other => format!("{what}: {other}"),
    };
    StoreError::Backend {
        message: message.into(),
    }
}

/// A failure of `COMMIT`: an answer from the database means it did not commit; no answer
/// (the connection went, or the time ran out) means nobody knows.
pub(crate) fn commit_failed(e: &sqlx::Error) -> StoreError {
    match e {
        sqlx::Error::Database(_) => backend("commit refused", e),
        other => unknown("the commit's answer was lost", other),
    }
}

/// Runs one database call within `limit`. The server cancels a statement past
/// `statement_timeout` by itself; this catches what it cannot: a connection that hangs
/// without closing, or a pool that never answers.
pub(crate) async fn timed<T>(
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, StoreError> {
    within(limit, what, call)
        .await?
        .map_err(|e| backend(what, &e))
}

/// [`timed`], with the database's own error left for the caller to read (its SQLSTATE).
pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    call: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<Result<T, sqlx::Error>, StoreError> {
    tokio::time::timeout(limit, call)
        .await
        .map_err(|_| StoreError::Backend {
            message: format!("{what}: no answer from the database within {limit:?}").into(),
        })
}

/// Whether `e` is the database giving up on a lock wait (`lock_timeout`).
pub(crate) fn is_lock_wait(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(LOCK_NOT_AVAILABLE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_without_an_answer_is_unknown_and_one_refused_is_not() {
        let lost = sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "connection reset by peer",
        ));
        let unknown = commit_failed(&lost);
        assert!(matches!(unknown, StoreError::OutcomeUnknown { .. }));
        // It says what PostgreSQL does, not what the local store would.
        let said = unknown.to_string();
        assert!(
            said.contains("PostgreSQL") && !said.contains("log"),
            "{said}"
        );
        let refused = backend("claim", &sqlx::Error::PoolTimedOut);
        assert!(
            matches!(&refused, StoreError::Backend { message } if message.contains("acquire timeout"))
        );
        assert!(refused.is_transient());
    }

    #[tokio::test]
    async fn a_call_past_its_limit_fails_instead_of_hanging() {
        let hung = timed(
            Duration::from_millis(20),
            "claim",
            std::future::pending::<Result<(), sqlx::Error>>(),
        )
        .await;
        assert!(
            matches!(&hung, Err(StoreError::Backend { message }) if message.contains("no answer")),
            "{hung:?}"
        );
    }
}
