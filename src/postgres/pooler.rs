//! What a pooler between the store and PostgreSQL (PgBouncer) must allow, checked at open
//! before any of the store's own connections is made.
//!
//! The store needs its connections to be sessions: sqlx prepares every statement under a name
//! on its connection, the time limits are session settings (`bounds`), `LISTEN` and the
//! relay's advisory lock live as long as the session. A pooler in *session* mode keeps all of
//! that (a server connection stays with its client until the client goes). One in
//! *transaction* mode hands the server connection to another client after each transaction:
//! the next client then finds the first one's prepared statements (PgBouncer before 1.21:
//! `prepared statement "sqlx_s_1" already exists`) and its settings. So the open refuses it,
//! saying which setting to change, instead of failing later at random, or leaking the store's
//! time limits into other clients' sessions.
//!
//! How: two fresh connections, without the store's settings. The first sets a custom setting
//! of its session to a token and ends its transaction; the second reads it. On PostgreSQL, or
//! through a session pooler, the second is another session and finds nothing. Through a
//! transaction pooler it is handed the first one's server connection (PgBouncer gives the
//! most recently used one, and nothing else of this store is connected yet) and finds the
//! token. A pooler that refuses a startup parameter of the driver's fails the first connect,
//! and that is said too.

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};

use super::bounds::Bounds;
use crate::error::PgOpenError;

/// The custom setting the check writes on one connection and reads on the other.
const PROBE: &str = "idemstore.pooler_probe";

/// What to change when the check finds a transaction pooler.
const SESSION_MODE: &str = "give idemstore's database `pool_mode = session` in pgbouncer.ini (per database: `dbname = host=... pool_mode=session`), or connect to PostgreSQL directly; idemstore's prepared statements, time limits, LISTEN and the relay's lock are per session";

/// What to change when the pooler refuses a startup parameter.
const STARTUP: &str = "add `ignore_startup_parameters = extra_float_digits` to pgbouncer.ini (the driver sends it; idemstore sets its own settings after connecting)";

/// Refuses a pooler that does not keep sessions (see the module doc).
pub(crate) async fn check(options: &PgConnectOptions, bounds: Bounds) -> Result<(), PgOpenError> {
    let mut first = connect(options, bounds).await?;
    let mut second = connect(options, bounds).await?;
    let token = format!("probe-{}", std::process::id());
    let shared = async {
        sqlx::query("SELECT set_config($1, $2, false)")
            .bind(PROBE)
            .bind(&token)
            .execute(&mut first)
            .await?;
        let seen: Option<String> = sqlx::query_scalar("SELECT current_setting($1, true)")
            .bind(PROBE)
            .fetch_one(&mut second)
            .await?;
        Ok::<_, sqlx::Error>(seen.as_deref() == Some(token.as_str()))
    };
    let shared = tokio::time::timeout(bounds.call, shared).await;
    // The probe's setting goes with its session; a transaction pooler's server connection
    // keeps it, so it is reset before the connections go.
    let _ = tokio::time::timeout(
        bounds.call,
        sqlx::query("SELECT set_config($1, '', false)")
            .bind(PROBE)
            .execute(&mut first),
    )
    .await;
    drop(tokio::time::timeout(bounds.call, first.close()).await);
    drop(tokio::time::timeout(bounds.call, second.close()).await);
    match shared {
        Ok(Ok(false)) => Ok(()),
        Ok(Ok(true)) => Err(PgOpenError::Pooler {
            problem: "the URL leads to a pooler in transaction mode: two connections of this store were handed the same server session".into(),
            fix: SESSION_MODE,
        }),
        // A transaction pooler before PgBouncer 1.21 fails here already: the second
        // connection's first prepared statement meets the first one's on the same server.
        Ok(Err(sqlx::Error::Database(db)))
            if matches!(db.code().as_deref(), Some("42P05" | "26000")) =>
        {
            Err(PgOpenError::Pooler {
                problem: format!(
                    "the URL leads to a pooler in transaction mode that does not keep prepared statements apart ({db})"
                ),
                fix: SESSION_MODE,
            })
        }
        Ok(Err(e)) => Err(PgOpenError::Connect {
            message: format!("checking the connection's sessions: {e}"),
        }),
        Err(_) => Err(PgOpenError::Connect {
            message: format!(
                "checking the connection's sessions: no answer within {:?}",
                bounds.call
            ),
        }),
    }
}

/// One connection for the check, within the call limit.
async fn connect(options: &PgConnectOptions, bounds: Bounds) -> Result<PgConnection, PgOpenError> {
    match tokio::time::timeout(bounds.call, PgConnection::connect_with(options)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) if e.to_string().contains("unsupported startup parameter") => {
            Err(PgOpenError::Pooler {
                problem: format!("the URL leads to a pooler that refused the connection ({e})"),
                fix: STARTUP,
            })
        }
        Ok(Err(e)) => Err(PgOpenError::Connect {
            message: e.to_string(),
        }),
        Err(_) => Err(PgOpenError::Connect {
            message: format!("no connection within {:?}", bounds.call),
        }),
    }
}
