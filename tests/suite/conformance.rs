//! The claim protocol's conformance suite (`idemstore::testing::conformance`) on both local
//! durability modes and, with feature `postgres`, on PostgreSQL: every case, with real tasks
//! racing the same keys.

mod wal {
    idemstore::conformance_suite!(idemstore::testing::conformance::Local::new(
        idemstore::Durability::Wal
    ));
}

mod redb {
    idemstore::conformance_suite!(idemstore::testing::conformance::Local::new(
        idemstore::Durability::Redb
    ));
}

/// The PostgreSQL backend (feature `postgres`), in the database at `IDEMSTORE_PG_URL`: each
/// case under a table prefix of its own, dropped afterwards.
#[cfg(feature = "postgres")]
mod postgres {
    idemstore::conformance_suite!(idemstore::testing::conformance::Postgres::new());
}

/// The same database through PgBouncer in session mode (`IDEMSTORE_PGBOUNCER_URL`, the one
/// `.ci/run` starts): what users run in production, pooled, passes the same suite.
#[cfg(feature = "postgres")]
mod pgbouncer {
    idemstore::conformance_suite!(idemstore::testing::conformance::Postgres::behind_pgbouncer());
}

/// The outbox's conformance suite (`idemstore::testing::outbox_conformance`) on the same
/// backends: messages commit with the claim or not at all, stable ids, the relay's order and
/// at-least-once delivery through a faulty sink, dead letters, and a reopen.
mod outbox {
    mod wal {
        idemstore::outbox_conformance_suite!(idemstore::testing::conformance::Local::new(
            idemstore::Durability::Wal
        ));
    }

    mod redb {
        idemstore::outbox_conformance_suite!(idemstore::testing::conformance::Local::new(
            idemstore::Durability::Redb
        ));
    }

    #[cfg(feature = "postgres")]
    mod postgres {
        idemstore::outbox_conformance_suite!(idemstore::testing::conformance::Postgres::new());
    }

    #[cfg(feature = "postgres")]
    mod pgbouncer {
        idemstore::outbox_conformance_suite!(
            idemstore::testing::conformance::Postgres::behind_pgbouncer()
        );
    }
}
