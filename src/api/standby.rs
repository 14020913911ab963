//! A standby: a store kept a short tail behind the stream another store ships to, ready to take
//! over when that store's box is lost.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::engine::{self, Followed, Position};
use crate::error::RestoreError;
use crate::model::maintenance::{Restored, Takeover};
use crate::storage::DirLock;
use crate::wal::ship::ReplicaSource;

/// Where a [`Standby`] stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StandbyStatus {
    /// The frame the standby's snapshot covers.
    pub snapshot: u64,
    /// The last frame it holds.
    pub last_frame: u64,
    /// Frames after the snapshot: what a take-over replays at its first open.
    pub tail_frames: u64,
    /// Times it was built again from a newer snapshot.
    pub rebases: u64,
    /// When it last reached the stream's end.
    pub caught_up_at: Instant,
    /// The last step's error, if it failed (it is tried again at the next poll).
    pub last_error: Option<String>,
}

struct State {
    position: Position,
    rebases: u64,
    caught_up_at: Instant,
    last_error: Option<String>,
    stopping: bool,
    /// The directory's lock, held while the standby follows (replaced at each rebase).
    _lock: DirLock,
}

/// Follows a stream into a store directory that nothing opens meanwhile: the snapshot, then
/// every `poll` the frames shipped since, appended to its log; when the stream's store sends a
/// newer snapshot, the standby is built again from it, so the log a take-over replays stays
/// about as short as the stream's own tail. [`Standby::take_over`] makes it the stream's
/// writer; open the directory with the application's [`Builder`](crate::Builder) then.
///
/// The standby holds the directory's lock while it follows, as an open store does: opening the
/// directory meanwhile is refused with [`OpenError::AlreadyOpen`](crate::OpenError), naming
/// the standby's process. The directory is a restorable store at every moment (each step
/// syncs before it counts), so a standby process that dies leaves a store that opens as a
/// restored one; to follow again, start a new standby in an empty directory.
pub struct Standby {
    dir: PathBuf,
    source: Arc<dyn ReplicaSource + Send + Sync>,
    state: Arc<(Mutex<State>, Condvar)>,
    poll: Duration,
    thread: Option<JoinHandle<()>>,
}

/// A take-over that did not happen: why, and the standby, following the stream again (its
/// directory as it was), so the take-over can be tried again.
#[derive(Debug)]
pub struct TakeOverError {
    /// Why the take-over failed.
    pub error: RestoreError,
    /// The standby, following again.
    pub standby: Standby,
}

impl std::fmt::Display for TakeOverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the standby did not take the stream over: {}; it follows the stream again, and take_over can be tried again",
            self.error
        )
    }
}

impl std::error::Error for TakeOverError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl std::fmt::Debug for Standby {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Standby")
            .field("dir", &self.dir)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl Standby {
    /// Restores `source` into `dir` (absent, or an empty directory) without taking the stream
    /// over, then follows it every `poll` on a thread of its own.
    ///
    /// # Errors
    /// [`RestoreError`] if the first restore fails; nothing is left at `dir`.
    pub fn follow(
        source: impl ReplicaSource + Send + Sync + 'static,
        dir: impl AsRef<Path>,
        poll: Duration,
    ) -> Result<Standby, RestoreError> {
        let dir = dir.as_ref().to_path_buf();
        let source: Arc<dyn ReplicaSource + Send + Sync> = Arc::new(source);
        let started = Instant::now();
        let (position, lock) = engine::build(source.as_ref(), &dir, Takeover::No, engine::lock)?;
        engine::finish(source.as_ref(), &dir, position, Takeover::No, started)?;
        let state = Arc::new((
            Mutex::new(State {
                position,
                rebases: 0,
                caught_up_at: Instant::now(),
                last_error: None,
                stopping: false,
                _lock: lock,
            }),
            Condvar::new(),
        ));
        let mut standby = Standby {
            dir: dir.clone(),
            source,
            state,
            poll,
            thread: None,
        };
        if let Err(e) = standby.start() {
            drop(standby);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        Ok(standby)
    }

    /// Where the standby stands now.
    pub fn status(&self) -> StandbyStatus {
        let state = self.state.0.lock();
        StandbyStatus {
            snapshot: state.position.snapshot,
            last_frame: state.position.last,
            tail_frames: state.position.frames,
            rebases: state.rebases,
            caught_up_at: state.caught_up_at,
            last_error: state.last_error.clone(),
        }
    }

    /// Stops following, takes in the frames shipped since the last poll, and makes the
    /// standby the stream's writer (the old one is fenced off from then on). Open the
    /// directory with the application's `Builder` (and `Builder::ship` to the same stream)
    /// next: its first open replays the tail. The directory stays locked until this returns.
    ///
    /// # Errors
    /// [`TakeOverError`], which gives the standby back, following again with its directory as
    /// it was: the stream could not be read, or it moved on while the take-over ran (the old
    /// store still ships: stop it, then take over again).
    pub fn take_over(mut self) -> Result<Restored, Box<TakeOverError>> {
        let started = Instant::now();
        self.stop();
        let taken = self.try_take_over(started);
        match taken {
            Ok(restored) => Ok(restored),
            Err(error) => {
                tracing::warn!(error = %error, "the standby did not take the stream over; it follows again");
                if let Err(e) = self.start() {
                    self.state.0.lock().last_error = Some(e.to_string());
                }
                Err(Box::new(TakeOverError {
                    error,
                    standby: self,
                }))
            }
        }
    }

    fn try_take_over(&mut self, started: Instant) -> Result<Restored, RestoreError> {
        let mut position = self.state.0.lock().position;
        let followed = engine::follow(self.source.as_ref(), &self.dir, &mut position);
        stepped(&mut self.state.0.lock(), position, followed)?;
        engine::finish(
            self.source.as_ref(),
            &self.dir,
            position,
            Takeover::Yes,
            started,
        )
    }

    /// Starts the thread that follows the stream.
    fn start(&mut self) -> Result<(), RestoreError> {
        self.state.0.lock().stopping = false;
        let (source, state, dir, poll) = (
            self.source.clone(),
            self.state.clone(),
            self.dir.clone(),
            self.poll,
        );
        let thread = std::thread::Builder::new()
            .name("idemstore-standby".into())
            .spawn(move || run(source.as_ref(), &dir, &state, poll))
            .map_err(|source| RestoreError::Io {
                path: PathBuf::new(),
                source,
            })?;
        self.thread = Some(thread);
        Ok(())
    }

    fn stop(&mut self) {
        self.state.0.lock().stopping = true;
        self.state.1.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Follows the stream every `poll` until stopped.
fn run(
    source: &(dyn ReplicaSource + Send + Sync),
    dir: &Path,
    state: &(Mutex<State>, Condvar),
    poll: Duration,
) {
    loop {
        let mut position = {
            let mut guard = state.0.lock();
            let deadline = Instant::now() + poll;
            while !guard.stopping && Instant::now() < deadline {
                state.1.wait_until(&mut guard, deadline);
            }
            if guard.stopping {
                return;
            }
            guard.position
        };
        let followed = engine::follow(source, dir, &mut position);
        if let Err(e) = stepped(&mut state.0.lock(), position, followed) {
            tracing::warn!(error = %e, "the standby could not follow the stream; trying again");
        }
    }
}

/// Records what a step did: its new position (and a rebase's lock) when it succeeded, its
/// error when it failed (the position stays: the next step goes on from it).
fn stepped(
    state: &mut State,
    position: Position,
    followed: Result<Followed, RestoreError>,
) -> Result<(), RestoreError> {
    match followed {
        Ok(followed) => {
            state.position = position;
            state.caught_up_at = Instant::now();
            state.last_error = None;
            if let Followed::Rebased(lock) = followed {
                state.rebases += 1;
                state._lock = lock;
            }
            Ok(())
        }
        Err(e) => {
            state.last_error = Some(e.to_string());
            Err(e)
        }
    }
}
