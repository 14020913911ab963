//! PgBouncer in front of the machine's PostgreSQL (`.ci/pgbouncer`, started by the tests if it
//! is not up). In session mode the conformance suites and the two-instance service run through
//! it (`conformance::pgbouncer`, `pg_two_instances::*_behind_pgbouncer`). In transaction mode
//! (its database `test_tx`) a server connection goes to another client after each
//! transaction, which breaks the store's prepared statements and session settings: the open
//! refuses it, says which setting to change, and creates nothing.

use idemstore::sqlx;
use idemstore::testing::postgres::{
    database_url, drop_prefixes, pgbouncer_url, start_pgbouncer, unique_prefix, unreachable,
};
use idemstore::{BoxError, PgOpenError, PgStore};

type TestResult = Result<(), BoxError>;

#[tokio::test]
async fn a_transaction_pooler_is_refused_at_open_naming_the_setting_and_nothing_is_created()
-> TestResult {
    start_pgbouncer();
    // The same PgBouncer's database pooled in transaction mode.
    let url = format!("{}_tx", pgbouncer_url());
    let prefix = unique_prefix("pgbtx");
    let opened = PgStore::builder(&url).prefix(&prefix).open().await;
    drop_prefixes(&database_url(), vec![prefix.clone()]);
    let message = match opened {
        Err(e @ PgOpenError::Pooler { .. }) => e.to_string(),
        Err(PgOpenError::Connect { message }) => return Err(unreachable(&url, &message)),
        Err(other) => return Err(format!("refused for another reason: {other}").into()),
        Ok(_) => return Err("a store opened through a transaction pooler".into()),
    };
    assert!(
        message.contains("transaction mode") && message.contains("pool_mode = session"),
        "{message}"
    );

    // Refused before the schema: no table of the prefix exists.
    let direct = sqlx::PgPool::connect(&database_url())
        .await
        .map_err(|e| unreachable(&database_url(), &e))?;
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class WHERE relname LIKE $1 || '%' AND relkind IN ('r', 'S')",
    )
    .bind(&prefix)
    .fetch_one(&direct)
    .await?;
    assert_eq!(tables, 0, "the refused open created tables");
    Ok(())
}

#[tokio::test]
async fn a_session_pooler_and_a_direct_connection_open() -> TestResult {
    start_pgbouncer();
    for url in [database_url(), pgbouncer_url()] {
        let prefix = unique_prefix("pgbs");
        let opened = PgStore::builder(&url).prefix(&prefix).open().await;
        drop_prefixes(&database_url(), vec![prefix]);
        opened.map_err(|e| unreachable(&url, &e))?;
    }
    Ok(())
}
