//! Plans on a table that grows: every statement a store sends to its records table keeps an
//! index plan from an empty table to a million rows, in one session.
//!
//! A prepared statement (sqlx prepares each one once per connection) settles on a *generic*
//! plan after five runs when that plan costs no more than the custom ones, and keeps it until
//! the table's statistics change. A generic plan made while the table was empty, never
//! analyzed, is the one at risk: it cannot see the parameters, and the planner then guesses
//! the table's size. So the session here forces generic plans (`plan_cache_mode =
//! force_generic_plan`) for the statements the store prepares, prepares every statement on the
//! empty table, and reads each plan three times: empty; after a million rows went in, before
//! any `ANALYZE` (the cached plan the connection would still run); and after `ANALYZE`
//! (replanned). The statements the store plans at each run (`Planning::EachRun`: the
//! eviction passes, whose generic plan failed this test) are read as custom plans, with the
//! values a sweep sends. No plan may scan the records table whole.

use std::time::Instant;

use idemstore::sqlx::{self, AssertSqlSafe, Connection, Row};
use idemstore::testing::postgres::{Planning, Prefix, record_statements, unreachable};
use idemstore::{BoxError, PgStore, Sweep};

/// Rows the table grows to.
const ROWS: u64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_statement_keeps_an_index_plan_from_empty_to_a_million_rows()
-> Result<(), BoxError> {
    let prefix = Prefix::new("plans");
    let store = PgStore::builder(prefix.url())
        .prefix(prefix.name())
        .sweep(Sweep::Off)
        .open()
        .await
        .map_err(|e| unreachable(prefix.url(), &e))?;
    let records = prefix.table("records");
    let mut session = sqlx::PgConnection::connect(prefix.url()).await?;
    let statements = record_statements(prefix.name())?;
    for (name, text, _) in &statements {
        sqlx::query(AssertSqlSafe(format!("PREPARE {name} AS {text}")))
            .execute(&mut session)
            .await
            .map_err(|e| format!("PREPARE {name}: {e}"))?;
    }

    let mut seen = Vec::new();
    for moment in ["empty", "1M rows, not analyzed", "1M rows, analyzed"] {
        match moment {
            "1M rows, not analyzed" => grow(&mut session, &records).await?,
            "1M rows, analyzed" => {
                sqlx::query(AssertSqlSafe(format!("ANALYZE {records}")))
                    .execute(&mut session)
                    .await?;
            }
            _ => {}
        }
        for (name, text, planning) in &statements {
            let plan = plan(&mut session, name, parameters(text), *planning).await?;
            assert!(
                !plan.contains(&format!("Seq Scan on {records}")),
                "{name} ({moment}) scans the whole records table:\n{plan}"
            );
            assert!(
                plan.contains(&format!("Index Scan using {}", prefix.name()))
                    || plan.contains(&format!("Index Only Scan using {}", prefix.name()))
                    || plan.contains("Bitmap Index Scan on")
                    || plan.contains("Conflict Arbiter Indexes"),
                "{name} ({moment}) uses none of the records table's indexes:\n{plan}"
            );
            seen.push((name, moment));
        }
    }
    assert_eq!(seen.len(), statements.len() * 3);
    drop(store);
    Ok(())
}

/// A million records as a long-lived store holds them: nine in ten completed, with their
/// TTLs spread over a day, the rest tombstones and claims in progress.
async fn grow(session: &mut sqlx::PgConnection, records: &str) -> Result<(), BoxError> {
    let started = Instant::now();
    let now: i64 = 1_700_000_000_000;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {records} (tenant, operation, key, fingerprint, state, fence, origin_fence,
             attempt, created_ms, lease_until_ms, expires_ms, completed_ms, status, body)
         SELECT 't' || (i % 50), 'charge', md5(i::text), '\\x00'::bytea,
                CASE WHEN i % 20 = 0 THEN 1 WHEN i % 20 = 1 THEN 3 ELSE 2 END,
                i, 0, 1, {now} - i,
                CASE WHEN i % 20 = 0 THEN {now} + i % 60000 END,
                CASE WHEN i % 20 <> 0 THEN {now} + i % 86400000 END,
                CASE WHEN i % 20 > 1 THEN {now} - i END,
                CASE WHEN i % 20 > 1 THEN 200 END,
                CASE WHEN i % 20 > 1 THEN '\\x7b7d'::bytea END
         FROM generate_series(1, {ROWS}) AS i"
    )))
    .execute(&mut *session)
    .await?;
    let count: i64 = sqlx::query(AssertSqlSafe(format!("SELECT count(*) FROM {records}")))
        .fetch_one(&mut *session)
        .await?
        .get(0);
    assert_eq!(count, ROWS as i64);
    eprintln!("{ROWS} rows in {:?}", started.elapsed());
    Ok(())
}

/// The number of parameters a statement takes: its highest `$n`.
fn parameters(text: &str) -> usize {
    text.split('$')
        .skip(1)
        .filter_map(|after| {
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .max()
        .unwrap_or(0)
}

/// The values an eviction pass is planned with at each run: `$1` now (null: the database's
/// clock), `$2` the sweep's batch, `$3` the tombstone TTL (a day).
const EVICTION_VALUES: [&str; 3] = ["NULL", "1000", "86400000"];

/// The plan the session's prepared statement `name` runs now, as text: its generic plan if
/// the store prepares it (with nulls for its parameters; a generic plan does not see them),
/// else its plan for a sweep's values.
async fn plan(
    session: &mut sqlx::PgConnection,
    name: &str,
    parameters: usize,
    planning: Planning,
) -> Result<String, BoxError> {
    let (mode, values) = match planning {
        Planning::Cached => ("force_generic_plan", vec!["NULL"; parameters]),
        Planning::EachRun => {
            assert!(
                parameters <= EVICTION_VALUES.len(),
                "{name}: {parameters} parameters"
            );
            ("force_custom_plan", EVICTION_VALUES[..parameters].to_vec())
        }
    };
    sqlx::query(AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
        .execute(&mut *session)
        .await?;
    let values = values.join(", ");
    let rows = sqlx::query(AssertSqlSafe(format!("EXPLAIN EXECUTE {name}({values})")))
        .fetch_all(&mut *session)
        .await
        .map_err(|e| format!("EXPLAIN EXECUTE {name}: {e}"))?;
    Ok(rows
        .iter()
        .map(|row| row.get::<String, _>(0))
        .collect::<Vec<_>>()
        .join("\n"))
}

#[test]
fn parameters_are_counted_by_the_highest_placeholder() {
    assert_eq!(parameters("SELECT $1, $10, $2"), 10);
    assert_eq!(parameters("SELECT 1"), 0);
    assert_eq!(parameters("SELECT '$' || $3::text"), 3);
}
