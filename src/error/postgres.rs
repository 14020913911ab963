//! Why a PostgreSQL store (feature `postgres`) could not be opened.

/// [`PgStore`](crate::PgStore) could not be opened. Nothing was changed in the database,
/// unless the migration itself failed part way, in which case its transaction was rolled back.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum PgOpenError {
    /// The table prefix is not a plain identifier: it goes into table names, so it may hold
    /// only lowercase ASCII letters, digits and `_`, must not start with a digit, and is at
    /// most 40 bytes (PostgreSQL cuts names at 63).
    #[error(
        "the table prefix `{prefix}` is not allowed: use 1 to 40 of a-z, 0-9 and _, not starting with a digit (e.g. `idemstore_`)"
    )]
    BadPrefix {
        /// The prefix given.
        prefix: String,
    },
    /// A setting is outside its range.
    #[error("the setting {setting} is invalid: {reason}")]
    InvalidSetting {
        /// The builder method.
        setting: &'static str,
        /// What is wrong, and the range accepted.
        reason: String,
    },
    /// The database could not be reached, or refused the connection.
    #[error(
        "could not connect to PostgreSQL ({message}); check that it is running and that the URL (host, port, user, database) is right"
    )]
    Connect {
        /// The driver's error.
        message: String,
    },
    /// The URL leads to a pooler (PgBouncer) that hands a server connection to another
    /// client between transactions, or refuses a startup parameter the driver sends.
    #[error("{problem}; {fix}")]
    Pooler {
        /// What the open found.
        problem: String,
        /// The setting to change.
        fix: &'static str,
    },
    /// Creating or upgrading the schema failed; its transaction was rolled back.
    #[error(
        "could not create or upgrade the schema ({message}); the user needs CREATE rights on the database's schema"
    )]
    Migrate {
        /// The driver's error.
        message: String,
    },
    /// Creating or upgrading the schema ran past its statement timeout (its own, at least a
    /// minute, not [`PgBuilder::timeout`](crate::PgBuilder::timeout)); its transaction was
    /// rolled back.
    #[error(
        "statement timeout during setup: creating or upgrading the schema took too long ({message}); another instance may hold the migration's lock for this prefix, or the database is overloaded. Retry the open"
    )]
    SetupTimedOut {
        /// The driver's error.
        message: String,
    },
    /// The schema was created by a newer idemstore.
    #[error(
        "the tables with this prefix are at schema version {found}, newer than this build knows ({known}); upgrade idemstore or use another prefix"
    )]
    SchemaTooNew {
        /// The version found in the database.
        found: i32,
        /// The newest version this build knows.
        known: i32,
    },
}
