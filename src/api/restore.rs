//! Rebuilding a store on a new box from the replica its log was shipped to.

use std::path::Path;

use crate::api::store::Store;
use crate::engine;
use crate::error::RestoreError;
use crate::model::maintenance::{Restored, Takeover};
use crate::wal::ship::ReplicaSource;

impl Store {
    /// Rebuilds a store in `dir` (absent, or an empty directory) from `source`: the latest
    /// snapshot, and every frame the stream holds after it. Nothing is opened: open `dir` with
    /// the application's [`Builder`](crate::Builder) (its tables, and [`Builder::ship`](crate::Builder::ship) to
    /// the same stream to go on shipping), and the first open replays the frames.
    ///
    /// A restored store knows how far it got. When the old store may have acknowledged more
    /// than the stream held (it shipped asynchronously, or fell back while the replica was
    /// away), a `begin` on an unknown key answers [`Begin::Recovered`](crate::Begin) for a
    /// while after the first open (`Builder::restore_window`): the request may have run on the
    /// old box, so the handler checks downstream with the claim's downstream key first, as
    /// after a crash.
    ///
    /// With [`Takeover::Yes`] the restored store becomes the stream's writer and the old one
    /// is fenced off; with [`Takeover::No`] the stream keeps its writer.
    ///
    /// # Errors
    /// [`RestoreError`]; nothing is left at `dir`.
    pub fn restore(
        source: &dyn ReplicaSource,
        dir: impl AsRef<Path>,
        takeover: Takeover,
    ) -> Result<Restored, RestoreError> {
        engine::rebuild(source, dir.as_ref(), takeover)
    }
}
