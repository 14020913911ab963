//! The background sweeper: evicts expired records every so often, in bounded batches.
//!
//! It holds only a weak reference to the engine between passes, so it never keeps a store
//! alive, and it stops as soon as the store is dropped: the store's last handle stops it and
//! waits for a pass in progress, before the engine (and its file) is closed.

use std::sync::Weak;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use super::Engine;
use crate::model::maintenance::Backlog;

/// Batches one tick may evict before it yields the writer to other work until the next tick.
const MAX_BATCHES_PER_TICK: usize = 100;

#[derive(Debug)]
pub(crate) struct Sweeper {
    /// Dropping it stops the thread.
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    thread_id: ThreadId,
}

impl Sweeper {
    pub(crate) fn start(
        engine: Weak<Engine>,
        interval: Duration,
        batch: usize,
    ) -> std::io::Result<Sweeper> {
        let (stop, stopped) = channel();
        let thread = std::thread::Builder::new()
            .name("idemstore-sweeper".into())
            .spawn(move || run(&engine, &stopped, interval, batch))?;
        Ok(Sweeper {
            stop: Some(stop),
            thread_id: thread.thread().id(),
            thread: Some(thread),
        })
    }
}

impl Sweeper {
    /// Stops the thread without waiting for it.
    pub(crate) fn detach(mut self) {
        self.stop = None;
        self.thread = None;
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.stop = None;
        // The last handle to a store can be dropped on the sweeper itself (it held the engine
        // for a tick); it must not wait for itself, and exits on its own right after.
        if std::thread::current().id() != self.thread_id
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
    }
}

fn run(engine: &Weak<Engine>, stopped: &Receiver<()>, interval: Duration, batch: usize) {
    loop {
        match stopped.recv_timeout(interval) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
        let Some(engine) = engine.upgrade() else {
            return;
        };
        for _ in 0..MAX_BATCHES_PER_TICK {
            match engine.evict(batch) {
                Ok(evicted) if evicted.backlog == Backlog::More => {}
                // Done, or failing: a failure is the store's to report (it is poisoned or
                // closed), and the next tick tries again.
                _ => break,
            }
        }
    }
}
