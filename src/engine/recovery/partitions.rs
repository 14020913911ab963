//! The partitions of completed records, read from the file when the store opens and again
//! after a recovery in place (`tables::partitions` holds them; `docs/design.md`, "Partitions").

use redb::Database;

use crate::error::OpenError;
use crate::model::config::Config;

use crate::engine::tables::meta;
use crate::engine::tables::partitions::hash::KeyHasher;
use crate::engine::tables::partitions::{Partitions, load};

/// The partitions of `db`, whose log is replayed and whose format is this build's.
pub(crate) fn open(db: &Database, config: &Config) -> Result<Partitions, OpenError> {
    let key = meta::load(db)?.filter_key.ok_or(OpenError::CorruptMeta {
        key: "filter_key",
        detail: "missing".into(),
    })?;
    let partitions = Partitions::new(KeyHasher::new(key), config.memory().partition_records);
    reload(db, &partitions).map_err(OpenError::Setup)?;
    Ok(partitions)
}

/// Replaces what `partitions` holds by what `db` says.
pub(crate) fn reload(db: &Database, partitions: &Partitions) -> Result<(), redb::Error> {
    let (found, generations) = load(db, partitions)?;
    tracing::debug!(
        partitions = found.len(),
        generations = generations.len(),
        "partitions read"
    );
    partitions.replace(found, generations);
    Ok(())
}
