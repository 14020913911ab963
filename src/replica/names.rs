//! What a store's name becomes on the server: its log stream and subject, its writer bucket,
//! its snapshot bucket. The name is checked here, once, so that every name built from it is
//! valid for NATS (stream and bucket names, and a subject token).

use crate::error::ReplicaError;

/// The longest store name (the bucket names built from it stay far below the server's limits).
pub(super) const MAX_NAME: usize = 64;

/// The key of the writer entry in the writer bucket.
pub(super) const WRITER_KEY: &str = "writer";

/// The server-side names of one store's replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Names {
    /// The store's name, as given.
    pub(super) store: String,
    /// The log stream: `IDEMSTORE_LOG_<name>`.
    pub(super) stream: String,
    /// The log stream's one subject: `idemstore.log.<name>`.
    pub(super) subject: String,
    /// The key-value bucket of the writer entry: `IDEMSTORE_WRITER_<name>`.
    pub(super) writers: String,
    /// The object store bucket of the snapshots: `IDEMSTORE_SNAP_<name>`.
    pub(super) snapshots: String,
}

impl Names {
    /// The names for the store `name`: 1 to 64 of `A-Z a-z 0-9 _ -`.
    pub(super) fn new(name: &str) -> Result<Names, ReplicaError> {
        let valid = (1..=MAX_NAME).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(ReplicaError::Refused {
                detail: format!(
                    "{name:?} is not a valid replica stream name: use 1 to {MAX_NAME} of A-Z, a-z, 0-9, _ and -"
                ),
            });
        }
        Ok(Names {
            store: name.to_owned(),
            stream: format!("IDEMSTORE_LOG_{name}"),
            subject: format!("idemstore.log.{name}"),
            writers: format!("IDEMSTORE_WRITER_{name}"),
            snapshots: format!("IDEMSTORE_SNAP_{name}"),
        })
    }

    /// The stream behind the writer bucket (the key-value store's own naming).
    pub(super) fn writers_stream(&self) -> String {
        format!("KV_{}", self.writers)
    }

    /// The stream behind the snapshot bucket (the object store's own naming).
    pub(super) fn snapshots_stream(&self) -> String {
        format!("OBJ_{}", self.snapshots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_name_gives_every_server_name() -> Result<(), ReplicaError> {
        let names = Names::new("orders-eu_1")?;
        assert_eq!(names.stream, "IDEMSTORE_LOG_orders-eu_1");
        assert_eq!(names.subject, "idemstore.log.orders-eu_1");
        assert_eq!(names.writers, "IDEMSTORE_WRITER_orders-eu_1");
        assert_eq!(names.snapshots, "IDEMSTORE_SNAP_orders-eu_1");
        assert_eq!(names.writers_stream(), "KV_IDEMSTORE_WRITER_orders-eu_1");
        Ok(())
    }

    #[test]
    fn names_nats_would_misread_are_refused() {
        for bad in ["", "a.b", "a b", "a*", "a>", "é", &"x".repeat(MAX_NAME + 1)] {
            assert!(
                matches!(Names::new(bad), Err(ReplicaError::Refused { .. })),
                "{bad:?} was accepted"
            );
        }
        assert!(Names::new(&"x".repeat(MAX_NAME)).is_ok());
    }
}
