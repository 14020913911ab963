//! A prototype, not the product: `execute`'s own statements (the store's claim and
//! completion, from `idemstore::testing::postgres::record_statements`) sent through
//! tokio-postgres, which writes requests made together in one message instead of waiting
//! for each answer. `BEGIN` and the claim go together, then the business row, then the
//! completion and `COMMIT` together: 3 round trips instead of `execute`'s 5, the same
//! statements and the same one commit.
//!
//! What a product would need besides: a completion that updated nothing must fail the
//! transaction (`1 / count(*)`), because its `COMMIT` is already on its way; here the claim
//! was made in the same transaction and cannot be lost, and the bench checks the row after.

use std::sync::Arc;

use idemstore::testing::postgres::record_statements;
use idemstore::{Fingerprint, PgStore};
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

use super::{BODY, Made, Peer, ROW, Target, drop_all, key, prefix, runtime, store_with_orders};

/// One connection and its prepared statements.
struct Connection {
    client: Client,
    claim: Statement,
    insert: Statement,
    complete: Statement,
}

pub(crate) struct Pipelined {
    runtime: tokio::runtime::Runtime,
    /// The store, for its tables (and their removal).
    store: PgStore,
    prefix: String,
    idle: Mutex<Vec<Connection>>,
    free: Arc<Semaphore>,
}

impl Pipelined {
    pub(crate) fn open(pool_size: u32, target: Target) -> Made {
        let runtime = runtime();
        let prefix = prefix("pipe");
        let url = target.url();
        let (store, idle) = runtime
            .block_on(async {
                let (store, insert) = store_with_orders(&url, &prefix, 1).await?;
                let statements = record_statements(&prefix)?;
                let text = |name: &str| {
                    statements
                        .iter()
                        .find(|(n, _, _)| *n == name)
                        .map(|(_, text, _)| text.clone())
                        .expect("the store's statement")
                };
                let (claim, complete) = (text("claim_held"), text("complete"));
                let mut idle = Vec::new();
                for _ in 0..pool_size {
                    let (client, connection) = tokio_postgres::connect(&url, NoTls).await?;
                    tokio::spawn(connection);
                    let (claim, insert, complete) = tokio::try_join!(
                        client.prepare(&claim),
                        client.prepare(&insert),
                        client.prepare(&complete)
                    )?;
                    idle.push(Connection {
                        client,
                        claim,
                        insert,
                        complete,
                    });
                }
                Ok::<_, idemstore::BoxError>((store, idle))
            })
            .map_err(|e| target.unreachable(&e))?;
        Ok(Box::new(Pipelined {
            runtime,
            store,
            prefix,
            idle: Mutex::new(idle),
            free: Arc::new(Semaphore::new(pool_size as usize)),
        }))
    }
}

impl Peer for Pipelined {
    fn pair(&self, client: usize, i: u64) {
        let (tenant, key) = key(client, i);
        self.runtime.block_on(async {
            let _permit = self.free.acquire().await.expect("the pool is open");
            let conn = self.idle.lock().pop().expect("a permit means a connection");
            let fingerprint = Fingerprint::of_bytes(key.as_bytes());
            let tenants: &[&str] = &[tenant.as_str()];
            let operations: &[&str] = &["create_order"];
            let keys: &[&str] = &[key.as_str()];
            let fingerprints: &[&[u8]] = &[&fingerprint.as_bytes()[..]];
            let (lease_ms, now, tombstone_ttl_ms) = (30_000_i64, None::<i64>, 0_i64);
            let claim: [&(dyn ToSql + Sync); 7] = [
                &tenants,
                &operations,
                &keys,
                &fingerprints,
                &lease_ms,
                &now,
                &tombstone_ttl_ms,
            ];
            let (begun, claimed) = tokio::join!(
                conn.client.batch_execute("BEGIN"),
                conn.client.query(&conn.claim, &claim)
            );
            begun.expect("BEGIN");
            let rows = claimed.expect("claim");
            assert_eq!(rows.len(), 1, "{key} was not claimed");
            assert!(!rows[0].get::<_, bool>("busy"), "{key} was busy");
            let fence: i64 = rows[0].get("fence");
            let row: &[u8] = &ROW;
            conn.client
                .execute(&conn.insert, &[&key, &row])
                .await
                .expect("row");
            let (ttl_ms, status, headers, body) =
                (86_400_000_i64, 201_i32, Vec::<u8>::new(), &BODY[..]);
            let operation = "create_order";
            let complete: [&(dyn ToSql + Sync); 10] = [
                &tenant, &operation, &key, &fence, &ttl_ms, &now, &status, &headers, &body, &key,
            ];
            let (completed, committed) = tokio::join!(
                conn.client.query(&conn.complete, &complete),
                conn.client.batch_execute("COMMIT")
            );
            assert_eq!(
                completed.expect("complete").len(),
                1,
                "{key} was not completed"
            );
            committed.expect("COMMIT");
            self.idle.lock().push(conn);
        });
    }
}

impl Drop for Pipelined {
    fn drop(&mut self) {
        self.idle.lock().clear();
        let pool = self.store.pool().clone();
        self.runtime.block_on(drop_all(&pool, &self.prefix));
    }
}
