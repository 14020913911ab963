//! Shipping the log to a replica: the shipper started with the engine, the snapshots it asks
//! for, and the checks a synchronous store makes before it writes.
//!
//! The shipper itself (`wal::ship`) knows frames, not tables: the engine gives it the frames
//! (through the log thread) and a way to make snapshots. A snapshot is a logical copy of a
//! redb read snapshot, exactly as [`Engine::backup`] makes one, tagged with the last frame it
//! holds (`meta::applied`); it needs nothing from the writer, so a snapshot can be made while
//! the writer waits for the replica, and nothing from the engine, so the snapshot a closing
//! store still owes its replica can be made while the engine closes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::Engine;
use super::backup::Copier;
use crate::error::{BackupError, OpenError};
use crate::model::backoff::Doubling;
use crate::model::config::Config;
use crate::model::replica::WriterIdentity;
use crate::storage::{DB_FILE, Storage};
use crate::wal::ship::{ShipOptions, ShipSettings, Shipper};

/// Where a store makes the snapshots it ships (removed after each).
const SNAPSHOT_DIR: &str = "ship-snapshot";
/// The wait after a failed call to the replica, doubling from the first up to the second.
const BACKOFF: (std::time::Duration, std::time::Duration) = (
    std::time::Duration::from_millis(100),
    std::time::Duration::from_secs(5),
);

/// Starts the shipper of a store whose log's last durable frame is `durable`; `None` without
/// shipping.
pub(super) fn start(
    options: Option<ShipOptions>,
    storage: &Storage,
    config: &Config,
    epoch: u64,
    durable: u64,
) -> Result<Option<Arc<Shipper>>, OpenError> {
    let Some(options) = options else {
        return Ok(None);
    };
    // A simulated disk has no directory: its snapshots are made in a temporary one (they
    // are real files, which the replica reads), and it is named as one store whatever the
    // disk (a crash image reopened is the same store).
    let (dir, snapshot_dir) = match storage.dir() {
        Some(dir) => (dir.to_path_buf(), dir.join(SNAPSHOT_DIR)),
        None => {
            let scratch = std::env::temp_dir().join(format!(
                "idemstore-simulated-{}-{:x}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos())
            ));
            (PathBuf::from("simulated-disk"), scratch.join(SNAPSHOT_DIR))
        }
    };
    let settings = ShipSettings {
        mode: options.mode,
        me: WriterIdentity::this_process(&dir),
        queue_bytes: config.memory().ship_queue,
        ack_timeout: options.ack_timeout,
        open_timeout: options.open_timeout,
        snapshot_bytes: options.snapshot_bytes,
        snapshot_dir,
        backoff: Doubling::new(BACKOFF.0, BACKOFF.1),
        epoch,
        window: config.restore.restored(),
        clock: config.clock.clone(),
    };
    let shipper = Shipper::start(options.replica, settings, durable).map_err(OpenError::Thread)?;
    Ok(Some(Arc::new(shipper)))
}

impl Engine {
    /// Hands the shipper its way to make snapshots, and, for a synchronous store that refuses
    /// while the replica is away, waits until the replica holds every frame: nothing this
    /// open replayed may be read before the replica has it.
    pub(super) fn start_shipping(self: &Arc<Self>) -> Result<(), OpenError> {
        let Some(shipper) = &self.shared.shipper else {
            return Ok(());
        };
        let copier = self.copier();
        shipper.set_snapshot_maker(Box::new(move |dir: &Path| {
            copier.ship_snapshot(dir).map_err(|e| e.to_string())
        }));
        if shipper.mode().refuses() {
            shipper
                .wait_caught_up(shipper.open_timeout())
                .map_err(|source| OpenError::Replica { source })?;
        }
        Ok(())
    }
}

impl Copier {
    /// A snapshot for the replica, made in the new directory `dir`: the database file and
    /// the last frame it holds.
    fn ship_snapshot(&self, dir: &Path) -> Result<(PathBuf, u64), BackupError> {
        let snapshot = self.published_snapshot()?;
        let (_, applied) = self.copy_snapshot(snapshot, dir, Instant::now())?;
        Ok((dir.join(DB_FILE), applied))
    }
}
