//! The schema: table names from a validated prefix, and the embedded migration that creates
//! them, versioned and idempotent.
//!
//! Times are `bigint` milliseconds since the Unix epoch, the unit of
//! [`Timestamp`](crate::Timestamp), read from the database's clock: they round-trip exactly,
//! and no date library is needed. (An operator reads them with `to_timestamp(ms / 1000.0)`.)

use sqlx::{AssertSqlSafe, PgPool, Row};

use super::bounds::Bounds;
use super::driver::QUERY_CANCELED;
use crate::error::PgOpenError;

/// The longest prefix: the longest names built from it (`<prefix>schema_version`, and the
/// outbox's identity sequence `<prefix>outbox_seq_seq`, 14 bytes each) stay within
/// PostgreSQL's 63 bytes.
const MAX_PREFIX_LEN: usize = 40;

/// The record's `state` column.
pub(crate) const IN_PROGRESS: i16 = 1;
/// A completed record: `expires_ms` is the end of its TTL.
pub(crate) const COMPLETED: i16 = 2;
/// A tombstone: `expires_ms` is when the marker goes.
pub(crate) const TOMBSTONE: i16 = 3;

/// The condition a fenced statement puts on a record it looks up by its key (`r`): held in
/// progress. `state + 0`, not `state = 1`: the plain form matches the predicate of the
/// `leases` index, and a planner without statistics (a new table, autovacuum off) may then
/// scan that whole index, dead entries included, instead of looking the key up (seen with
/// `auto_explain` on a new table of 20 claims).
pub(crate) const HELD: &str = "r.state + 0 = 1";

/// The names of one store's objects.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    /// The records table.
    pub(crate) records: String,
    /// The sequence fences come from.
    pub(crate) fences: String,
    /// The table holding the schema versions applied.
    pub(crate) versions: String,
    /// The `NOTIFY` channel a completion or release is announced on.
    pub(crate) channel: String,
    /// Committed messages not yet delivered (schema version 2).
    pub(crate) outbox: String,
    /// Messages the relay gave up on (schema version 2).
    pub(crate) dead_letters: String,
    prefix: String,
}

impl Names {
    /// The prefix every name starts with.
    #[cfg(feature = "testing")]
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Names under `prefix`, after checking it is a plain identifier (it is spliced into SQL).
    pub(crate) fn new(prefix: &str) -> Result<Self, PgOpenError> {
        let plain = !prefix.is_empty()
            && prefix.len() <= MAX_PREFIX_LEN
            && prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !prefix.as_bytes()[0].is_ascii_digit();
        if !plain {
            return Err(PgOpenError::BadPrefix {
                prefix: prefix.chars().take(80).collect(),
            });
        }
        Ok(Names {
            records: format!("{prefix}records"),
            fences: format!("{prefix}fences"),
            versions: format!("{prefix}schema_version"),
            channel: format!("{prefix}done"),
            outbox: format!("{prefix}outbox"),
            dead_letters: format!("{prefix}dead_letters"),
            prefix: prefix.to_owned(),
        })
    }

    /// Every statement of each migration, oldest first; version `i + 1` is `[i]`. Never edit
    /// a released one: add the next.
    fn migrations(&self) -> Vec<Vec<String>> {
        let (r, p) = (&self.records, &self.prefix);
        let (outbox, dead) = (&self.outbox, &self.dead_letters);
        vec![
            vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {r} (
                    tenant text NOT NULL,
                    operation text NOT NULL,
                    key text NOT NULL,
                    fingerprint bytea NOT NULL,
                    state smallint NOT NULL CHECK (state IN (1, 2, 3)),
                    fence bigint NOT NULL,
                    origin_fence bigint NOT NULL,
                    attempt integer NOT NULL,
                    created_ms bigint NOT NULL,
                    lease_until_ms bigint,
                    expires_ms bigint,
                    checkpoint bytea,
                    waiters boolean NOT NULL DEFAULT false,
                    completed_ms bigint,
                    status integer,
                    headers bytea,
                    body bytea,
                    PRIMARY KEY (tenant, operation, key)
                )"
                ),
                format!("CREATE SEQUENCE IF NOT EXISTS {}", self.fences),
                // The indexes eviction and the abandoned-work listing walk, oldest first; each
                // holds only the records of its state.
                format!(
                    "CREATE INDEX IF NOT EXISTS {p}expiry ON {r} (expires_ms) WHERE state = {COMPLETED}"
                ),
                format!(
                    "CREATE INDEX IF NOT EXISTS {p}tombstones ON {r} (expires_ms) WHERE state = {TOMBSTONE}"
                ),
                format!(
                    "CREATE INDEX IF NOT EXISTS {p}leases ON {r} (lease_until_ms) WHERE state = {IN_PROGRESS}"
                ),
            ],
            // 2: the outbox. `seq` comes from the identity's sequence when the row is inserted,
            // not when it commits: see `PgStore`'s docs for what that means for order. Messages
            // keep their seq when they move to the dead letters, and get a new one when retried.
            vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {outbox} (
                    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                    id text NOT NULL,
                    subject text NOT NULL,
                    payload bytea NOT NULL,
                    committed_ms bigint NOT NULL
                )"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {dead} (
                    seq bigint PRIMARY KEY,
                    id text NOT NULL,
                    subject text NOT NULL,
                    payload bytea NOT NULL,
                    committed_ms bigint NOT NULL,
                    attempts integer NOT NULL,
                    last_error text NOT NULL,
                    dead_ms bigint NOT NULL
                )"
                ),
            ],
        ]
    }

    /// The objects `migrate` creates, for dropping them (tests).
    #[cfg(feature = "testing")]
    pub(crate) fn drop_statements(&self) -> Vec<String> {
        vec![
            format!("DROP TABLE IF EXISTS {}", self.outbox),
            format!("DROP TABLE IF EXISTS {}", self.dead_letters),
            format!("DROP TABLE IF EXISTS {}", self.records),
            format!("DROP SEQUENCE IF EXISTS {}", self.fences),
            format!("DROP TABLE IF EXISTS {}", self.versions),
        ]
    }
}

/// Why the migration failed: its own statement timeout, or anything else (most often
/// missing rights).
fn migrate_failed(e: sqlx::Error) -> PgOpenError {
    match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some(QUERY_CANCELED) => {
            PgOpenError::SetupTimedOut {
                message: e.to_string(),
            }
        }
        _ => PgOpenError::Migrate {
            message: e.to_string(),
        },
    }
}

/// Brings the schema under `names` to the newest version, in one transaction, holding an
/// advisory lock so that instances opening at once apply each migration once. Running it on
/// an up-to-date schema changes nothing. Its statements run under the setup's own timeout
/// (`bounds.setup`), not the store's per-call one.
pub(crate) async fn migrate(
    pool: &PgPool,
    names: &Names,
    bounds: Bounds,
) -> Result<(), PgOpenError> {
    let failed = migrate_failed;
    let migrations = names.migrations();
    let known = i32::try_from(migrations.len()).unwrap_or(i32::MAX);
    let mut tx = pool.begin().await.map_err(failed)?;
    sqlx::query(AssertSqlSafe(bounds.setup_statement()))
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(&names.versions)
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
        names.versions
    )))
    .execute(&mut *tx)
    .await
    .map_err(failed)?;
    let found: i32 = sqlx::query(AssertSqlSafe(format!(
        "SELECT coalesce(max(version), 0) FROM {}",
        names.versions
    )))
    .fetch_one(&mut *tx)
    .await
    .and_then(|row| row.try_get(0))
    .map_err(failed)?;
    if found > known {
        return Err(PgOpenError::SchemaTooNew { found, known });
    }
    for (version, statements) in (1..).zip(migrations) {
        if version <= found {
            continue;
        }
        for statement in statements {
            sqlx::query(AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await
                .map_err(failed)?;
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (version) VALUES ($1)",
            names.versions
        )))
        .bind(version)
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
    }
    tx.commit().await.map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database error with a SQLSTATE, as the driver would report it.
    #[derive(Debug)]
    struct Refused(&'static str);

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "refused with {}", self.0)
        }
    }

    impl std::error::Error for Refused {}

    impl sqlx::error::DatabaseError for Refused {
        fn message(&self) -> &str {
            "refused"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[test]
    fn a_setup_cut_by_its_timeout_says_so_not_that_rights_are_missing() {
        let timed_out = migrate_failed(sqlx::Error::Database(Box::new(Refused("57014"))));
        let said = timed_out.to_string();
        assert!(said.contains("statement timeout during setup"), "{said}");
        assert!(!said.contains("CREATE rights"), "{said}");
        let denied = migrate_failed(sqlx::Error::Database(Box::new(Refused("42501"))));
        assert!(denied.to_string().contains("CREATE rights"), "{denied}");
    }

    #[test]
    fn held_means_in_progress() {
        assert_eq!(HELD, format!("r.state + 0 = {IN_PROGRESS}"));
    }

    #[test]
    fn prefixes_are_plain_identifiers() {
        for good in ["idemstore_", "a", "t_42_", "x".repeat(40).as_str()] {
            assert!(Names::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "9lives_",
            "Upper_",
            "semi;colon",
            "quote\"",
            "space ",
            "dash-",
            "é_",
            "x".repeat(41).as_str(),
        ] {
            assert!(
                matches!(Names::new(bad), Err(PgOpenError::BadPrefix { .. })),
                "{bad}"
            );
        }
    }
}
