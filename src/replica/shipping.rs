//! [`JetStream`] as a [`Replica`] and a [`ReplicaSource`]: each method is one bounded call
//! onto the replica's runtime (`connect.rs`), into the module that does the work.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use tokio::sync::Semaphore;

use super::bridge::{self, Progress, Silence};
use super::connect::JetStream;
use super::errors;
use super::read::{self, Item};
use super::{publish, snapshots, writer};
use crate::error::ReplicaError;
use crate::model::replica::{SnapshotInfo, StreamPosition, WriterIdentity};
use crate::model::restore::Lineage;
use crate::wal::ship::{Replica, ReplicaSource, ShippedFrame};

impl Replica for JetStream {
    fn claim(&self, me: &WriterIdentity, epoch: u64) -> Result<StreamPosition, ReplicaError> {
        let _writing = self.writing.lock();
        let claim = writer::claim(self.link.clone(), self.context(), me.clone(), epoch);
        self.run("claiming the stream", None, claim)
    }

    fn publish(&self, frames: &[ShippedFrame], lineage: &Lineage) -> Result<(), ReplicaError> {
        let _writing = self.writing.lock();
        let progress = Progress::default();
        let publish = publish::publish(
            self.link.clone(),
            self.context(),
            frames.to_vec(),
            *lineage,
            progress.clone(),
        );
        self.run("publishing frames", Some(&progress), publish)
    }

    fn snapshot(&self, seq: u64, file: &Path, lineage: &Lineage) -> Result<(), ReplicaError> {
        let _snapshotting = self.snapshotting.lock();
        let progress = Progress::default();
        let upload = snapshots::upload(
            self.link.clone(),
            self.context(),
            seq,
            file.to_path_buf(),
            *lineage,
            progress.clone(),
        );
        self.run("sending a snapshot", Some(&progress), upload)
    }

    fn release(&self, me: &WriterIdentity) -> Result<(), ReplicaError> {
        let _writing = self.writing.lock();
        let release = writer::release(self.link.clone(), self.context(), me.clone());
        self.run("releasing the stream", None, release)
    }
}

impl ReplicaSource for JetStream {
    fn fetch_snapshot(&self, file: &Path) -> Result<Option<SnapshotInfo>, ReplicaError> {
        let progress = Progress::default();
        let created = Arc::new(AtomicBool::new(false));
        let fetch = snapshots::fetch(
            self.link.clone(),
            self.context(),
            file.to_path_buf(),
            created.clone(),
            progress.clone(),
        );
        let fetched = self.run("fetching the snapshot", Some(&progress), fetch);
        if fetched.is_err() && created.load(Ordering::Relaxed) {
            // A partial download must not pass for a snapshot, nor block the next attempt.
            let _ = std::fs::remove_file(file);
        }
        fetched
    }

    fn latest_snapshot(&self) -> Result<Option<SnapshotInfo>, ReplicaError> {
        let latest = snapshots::latest(self.link.clone(), self.context());
        self.run("reading the latest snapshot", None, latest)
    }

    fn frames_after(
        &self,
        after: u64,
        each: &mut dyn FnMut(ShippedFrame, Lineage) -> Result<(), ReplicaError>,
    ) -> Result<u64, ReplicaError> {
        let (tx, rx) = mpsc::channel();
        let permits = Arc::new(Semaphore::new(read::WAITING));
        let progress = Progress::default();
        let reader = read::read(
            self.link.clone(),
            self.context(),
            after,
            tx,
            permits,
            progress.clone(),
        );
        // Aborted when this returns, whatever the way.
        let _reader = self.bridge().spawn(reader);
        loop {
            match bridge::wait(&rx, self.limit(), Some(&progress)) {
                Ok(Item::Frame(frame, lineage, permit)) => {
                    each(frame, lineage)?;
                    drop(permit);
                }
                Ok(Item::Done(done)) => return done,
                Err(Silence::TimedOut) => return Err(self.silent("reading the stream")),
                Err(Silence::Stopped) => return Err(errors::stopped("reading the stream")),
            }
        }
    }

    fn take_over(&self, me: &WriterIdentity, last: u64, known: u64) -> Result<u64, ReplicaError> {
        let _writing = self.writing.lock();
        let take_over =
            writer::take_over(self.link.clone(), self.context(), me.clone(), last, known);
        self.run("taking the stream over", None, take_over)
    }
}
