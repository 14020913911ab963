//! The claim protocol's conformance suite (`idemstore::testing::conformance`) on both local
//! durability modes: every case, with real tasks racing the same keys.

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
