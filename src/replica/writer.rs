//! The writer entry: who writes the stream, and its latest snapshot, under the key `writer`
//! of the bucket `IDEMSTORE_WRITER_<name>`; and the claim, the release and the take-over that
//! change it.
//!
//! ```text
//! {"version":2,
//!  "epoch":3,                                                             (raised by take-overs)
//!  "writer":{"host":"db-1","pid":4242,"dir":"/var/lib/orders/idem"},    (null once released)
//!  "last_writer":{"host":"db-1","pid":4242,"dir":"/var/lib/orders/idem"},  (kept by a release)
//!  "snapshot":{"object":"snapshot-1200-…","seq":1200,"guarantee":"complete","bytes":8192,
//!              "epoch":3,"window_end_ms":null,"newest_ms":1765000000000}}
//! ```
//!
//! Who may change it is `model::writer_epoch` (the rules every replica applies): a claim at an
//! epoch below the entry's is refused as fenced whatever else it says, and a release lets the
//! writer go but keeps the epoch and the last writer. Entries of version 1 read as epoch 0
//! with no last writer.
//!
//! Every change is a compare-and-set on the entry's revision, so a snapshot is committed only
//! by the store the entry names at its epoch: a writer fenced off by a take-over cannot
//! replace the new writer's snapshot, nor purge its frames (see `snapshots.rs`).
//!
//! A take-over appends a marker carrying the new epoch to the stream, then writes the entry:
//! in between, the marker is the stream's last message, and a claim by any store at an older
//! epoch that finds it refuses. A take-over whose marker is no longer last when it comes to
//! write the entry gives up ([`ReplicaError::Moved`]): someone published after it.
//!
//! A writer entry or a stream that is gone while a store writes it, or a stream that ends
//! before what it acknowledged, is a broker that lost its data: [`ReplicaError::Lost`].

use std::sync::Arc;

use async_nats::jetstream::Context;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::kv;
use async_nats::jetstream::message::StreamMessage;

use super::connect::{Claimed, Link};
use super::entry::{Entry, Written, read, write};
pub(super) use super::entry::{SnapshotRef, bucket};
use super::errors::{corrupt, publish_failed};
use super::messages::{self, Kind};
use super::snapshots;
use super::stream::{self, Missing, Tail};
use crate::error::ReplicaError;
use crate::model::replica::{StreamPosition, WriterIdentity};
use crate::model::writer_epoch::{self, Claim, Refusal, Slot};

/// How many times a change is tried again when the entry changed under it.
const TRIES: usize = 3;

/// A token unique to one claim: the entry's revision it wrote, and the time.
fn token(revision: u64) -> String {
    let nanos = super::unix_nanos();
    format!("{revision}-{nanos:x}")
}

/// [`Replica::claim`](crate::Replica::claim).
pub(super) async fn claim(
    link: Arc<Link>,
    js: Context,
    me: WriterIdentity,
    epoch: u64,
) -> Result<StreamPosition, ReplicaError> {
    link.connected().await;
    let log = stream::open(&link, &js, Missing::Create).await?;
    let store = created(&link, &js).await?;
    snapshots::bucket(&link, &js, Missing::Create).await?;
    // A take-over by another store that has appended its marker and not yet written the
    // entry: that store has the stream. Looked for before the entry is touched, and again
    // after (the marker may land in between; the entry is then given back).
    tail_refuses(&stream::tail(&link, &log).await?, &me, epoch)?;
    let taken = take(&link, &store, &me, epoch).await?;
    let tail = stream::tail(&link, &log).await?;
    if let Err(e) = tail_refuses(&tail, &me, epoch) {
        if let Some(before) = &taken.before {
            let _ = write(&link, &store, before, Some(taken.revision)).await;
        }
        return Err(e);
    }
    let snapshot_seq = taken.snapshot.as_ref().map(|s| s.seq);
    let last_frame = tail.last_frame.max(snapshot_seq.unwrap_or(0));
    *link.writer.lock() = Some(Claimed {
        me,
        epoch,
        token: token(taken.revision),
        last_seq: tail.last_seq,
        last_frame,
    });
    Ok(StreamPosition {
        last_frame,
        snapshot: snapshot_seq,
    })
}

/// The writer bucket, created if absent.
async fn created(link: &Link, js: &Context) -> Result<kv::Store, ReplicaError> {
    bucket(link, js, Missing::Create)
        .await?
        .ok_or_else(|| ReplicaError::Refused {
            detail: format!("the bucket {} could not be created", link.names.writers),
        })
}

/// What [`take`] did: the entry's revision it wrote, the entry before (to give back; `None`
/// if there was none) and the snapshot it names.
struct Taken {
    revision: u64,
    before: Option<Entry>,
    snapshot: Option<SnapshotRef>,
}

/// Makes `me` the entry's writer at `epoch`, if the rules let it.
async fn take(
    link: &Link,
    store: &kv::Store,
    me: &WriterIdentity,
    epoch: u64,
) -> Result<Taken, ReplicaError> {
    for _ in 0..TRIES {
        let current = read(link, store).await?;
        let slot = current.as_ref().map(|(e, _)| e.slot());
        match writer_epoch::claim(slot.as_ref(), me, epoch) {
            Claim::Take => {}
            Claim::Fenced { by, epoch } => return Err(ReplicaError::Fenced { by, epoch }),
            Claim::OtherWriter(holder) => return Err(ReplicaError::OtherWriter { holder }),
        }
        let snapshot = current.as_ref().and_then(|(e, _)| e.snapshot.clone());
        let entry = Entry::of(writer_epoch::claimed(me, epoch), snapshot.clone());
        let over = current.as_ref().map(|(_, r)| *r);
        if let Written::Revision(revision) = write(link, store, &entry, over).await? {
            return Ok(Taken {
                revision,
                before: current.map(|(e, _)| e),
                snapshot,
            });
        }
    }
    Err(changing(link))
}

/// Refused if the stream ends with a message of a later epoch than `epoch` (a take-over's
/// marker whose entry is not written yet), or with a marker of another store at the same
/// epoch (a take-over written before epochs).
fn tail_refuses(tail: &Tail, me: &WriterIdentity, epoch: u64) -> Result<(), ReplicaError> {
    let Some((kind, message)) = &tail.last else {
        return Ok(());
    };
    let by = match kind {
        Kind::Marker { .. } => messages::marker_identity(message),
        Kind::Frame { .. } => None,
    };
    if kind.epoch() > epoch {
        return Err(ReplicaError::Fenced {
            by,
            epoch: kind.epoch(),
        });
    }
    if let Some(by) = by
        && kind.epoch() == epoch
        && !by.same_store(me)
    {
        return Err(ReplicaError::OtherWriter { holder: by });
    }
    Ok(())
}

/// The error a refusal of the rules is.
fn refused(link: &Link, refusal: Refusal<WriterIdentity>) -> ReplicaError {
    match refusal {
        Refusal::Fenced { by, epoch } => ReplicaError::Fenced { by, epoch },
        Refusal::OtherWriter(holder) => ReplicaError::OtherWriter { holder },
        Refusal::NotClaimed => ReplicaError::Refused {
            detail: format!(
                "the stream {} is no longer this writer's: its claim was released; claim it again",
                link.names.stream
            ),
        },
        Refusal::Lost => ReplicaError::Lost {
            detail: format!(
                "the writer entry of {} is gone, or older than this writer's epoch",
                link.names.writers
            ),
        },
    }
}

fn changing(link: &Link) -> ReplicaError {
    ReplicaError::Refused {
        detail: format!(
            "the writer entry of {} kept changing under this call; try again",
            link.names.writers
        ),
    }
}

/// [`Replica::release`](crate::Replica::release): the writer goes, the epoch stays.
pub(super) async fn release(
    link: Arc<Link>,
    js: Context,
    me: WriterIdentity,
) -> Result<(), ReplicaError> {
    let claimed = {
        let mut writer = link.writer.lock();
        match writer.as_ref() {
            Some(c) if c.me == me => writer.take(),
            _ => None,
        }
    };
    let Some(claimed) = claimed else {
        return Ok(()); // never claimed here, or taken over since
    };
    link.connected().await;
    let Some(store) = bucket(&link, &js, Missing::Refuse).await? else {
        return Ok(());
    };
    for _ in 0..TRIES {
        let Some((entry, revision)) = read(&link, &store).await? else {
            return Ok(());
        };
        let Some(slot) = writer_epoch::released(&entry.slot(), &me, claimed.epoch) else {
            return Ok(()); // not ours any more
        };
        let released = Entry::of(slot, entry.snapshot);
        if let Written::Revision(_) = write(&link, &store, &released, Some(revision)).await? {
            return Ok(());
        }
    }
    Err(changing(&link))
}

/// [`ReplicaSource::take_over`](crate::ReplicaSource::take_over): see the module doc.
pub(super) async fn take_over(
    link: Arc<Link>,
    js: Context,
    me: WriterIdentity,
    last: u64,
    known: u64,
) -> Result<u64, ReplicaError> {
    link.connected().await;
    let log = stream::open(&link, &js, Missing::Create).await?;
    let store = created(&link, &js).await?;
    snapshots::bucket(&link, &js, Missing::Create).await?;
    for _ in 0..TRIES {
        let current = read(&link, &store).await?;
        let snapshot = current.as_ref().and_then(|(e, _)| e.snapshot.clone());
        let tail = stream::tail(&link, &log).await?;
        let ours = match &tail.last {
            Some((Kind::Marker { after, epoch }, message))
                if *after == last && messages::marker_identity(message).as_ref() == Some(&me) =>
            {
                Some(*epoch)
            }
            _ => None,
        };
        let epoch = match ours {
            Some(epoch) => epoch,
            None => {
                let now = tail.last_frame.max(snapshot.as_ref().map_or(0, |s| s.seq));
                if now > last {
                    return Err(ReplicaError::Moved { read: last, now });
                }
                if now < last {
                    return Err(corrupt(format!(
                        "the stream {} ends at frame {now}, before frame {last} that the restore read",
                        link.names.stream
                    )));
                }
                let seen = known.max(tail.last.as_ref().map_or(0, |(k, _)| k.epoch()));
                let slot = current.as_ref().map(|(e, _)| e.slot());
                let epoch = writer_epoch::taken_over(slot.as_ref(), &me, seen).epoch;
                let marker =
                    messages::marker(last, epoch, &me)?.expected_last_sequence(tail.last_seq);
                let ack = js
                    .send_publish(link.names.subject.clone(), marker)
                    .await
                    .map_err(|e| {
                        publish_failed(&link.client, "appending a take-over marker", &e)
                    })?;
                match ack.await {
                    Ok(_) => {}
                    Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                        continue; // something landed meanwhile: look again
                    }
                    Err(e) => {
                        return Err(publish_failed(
                            &link.client,
                            "appending a take-over marker",
                            &e,
                        ));
                    }
                }
                epoch
            }
        };
        let entry = Entry::of(
            Slot {
                epoch,
                writer: Some(me.clone()),
                last_writer: Some(me.clone()),
            },
            snapshot,
        );
        if let Written::Revision(_) = write(&link, &store, &entry, current.map(|(_, r)| r)).await? {
            // Whatever this replica claimed before is over: the stream has a new writer.
            *link.writer.lock() = None;
            return Ok(epoch);
        }
    }
    Err(changing(&link))
}

/// The error for a fenced publish: what the rules say of the entry now, or, if they let this
/// writer write, what the stream's last message says (`last`).
pub(super) async fn other_writer(
    link: &Link,
    js: &Context,
    last: Option<&(Kind, StreamMessage)>,
) -> ReplicaError {
    if let Err(e) = still_writer(link, js).await {
        return e;
    }
    let claimed = link.writer.lock().clone();
    if let (Some((kind, message)), Some(claimed)) = (last, claimed)
        && let Err(e) = tail_refuses(
            &Tail {
                first_seq: 0,
                last_seq: 0,
                last_frame: 0,
                last: Some((kind.clone(), message.clone())),
            },
            &claimed.me,
            claimed.epoch,
        )
    {
        return e;
    }
    ReplicaError::Refused {
        detail: format!(
            "the stream {} is no longer this writer's: another writer appended to it; claim it again",
            link.names.stream
        ),
    }
}

/// The latest snapshot if the entry still lets this replica's writer write
/// (`writer_epoch::may_write`); else why not.
pub(super) async fn still_writer(
    link: &Link,
    js: &Context,
) -> Result<Option<SnapshotRef>, ReplicaError> {
    let claimed = link.writer.lock().clone().ok_or_else(not_claimed)?;
    let current = match bucket(link, js, Missing::Refuse).await? {
        Some(store) => read(link, &store).await?,
        None => None,
    };
    let slot = current.as_ref().map(|(e, _)| e.slot());
    writer_epoch::may_write(slot.as_ref(), &claimed.me, claimed.epoch)
        .map_err(|r| refused(link, r))?;
    Ok(current.and_then(|(e, _)| e.snapshot))
}

/// The error for a writer's call before its claim.
pub(super) fn not_claimed() -> ReplicaError {
    ReplicaError::Refused {
        detail: "this replica has not claimed the stream (call claim first)".to_owned(),
    }
}

/// The stream's last frame (in messages or in the snapshot), asked again; what this writer
/// knows is brought up to it. [`ReplicaError::Lost`] if it is below what the stream had
/// acknowledged to this writer.
pub(super) async fn refresh_last_frame(link: &Link, js: &Context) -> Result<u64, ReplicaError> {
    let snapshot = still_writer(link, js).await?;
    let log = stream::open(link, js, Missing::Lost).await?;
    let tail = stream::tail(link, &log).await?;
    let last = tail.last_frame.max(snapshot.map_or(0, |s| s.seq));
    let mut writer = link.writer.lock();
    let claimed = writer.as_mut().ok_or_else(not_claimed)?;
    lost_below(link, last, claimed.last_frame)?;
    claimed.last_frame = claimed.last_frame.max(last);
    Ok(claimed.last_frame)
}

/// [`ReplicaError::Lost`] if the stream's last frame `last` is below `acknowledged`.
pub(super) fn lost_below(link: &Link, last: u64, acknowledged: u64) -> Result<(), ReplicaError> {
    if last < acknowledged {
        return Err(ReplicaError::Lost {
            detail: format!(
                "the stream {} ends at frame {last}, before frame {acknowledged} it acknowledged",
                link.names.stream
            ),
        });
    }
    Ok(())
}

/// Commits `snapshot` as the latest, if the entry still lets this replica's writer write;
/// returns the snapshot it replaced.
pub(super) async fn commit_snapshot(
    link: &Link,
    js: &Context,
    snapshot: SnapshotRef,
) -> Result<Option<SnapshotRef>, ReplicaError> {
    let claimed = link.writer.lock().clone().ok_or_else(not_claimed)?;
    let store = bucket(link, js, Missing::Refuse)
        .await?
        .ok_or_else(|| refused(link, Refusal::Lost))?;
    for _ in 0..TRIES {
        let current = read(link, &store).await?;
        let slot = current.as_ref().map(|(e, _)| e.slot());
        writer_epoch::may_write(slot.as_ref(), &claimed.me, claimed.epoch)
            .map_err(|r| refused(link, r))?;
        let Some((entry, revision)) = current else {
            return Err(refused(link, Refusal::Lost));
        };
        let committed = Entry::of(entry.slot(), Some(snapshot.clone()));
        if let Written::Revision(_) = write(link, &store, &committed, Some(revision)).await? {
            if let Some(claimed) = link.writer.lock().as_mut() {
                claimed.last_frame = claimed.last_frame.max(snapshot.seq);
            }
            return Ok(entry.snapshot);
        }
    }
    Err(changing(link))
}

/// The latest snapshot, for a restore; `None` if there is none (or no bucket yet).
pub(super) async fn latest_snapshot(
    link: &Link,
    js: &Context,
) -> Result<Option<SnapshotRef>, ReplicaError> {
    let Some(store) = bucket(link, js, Missing::Refuse).await? else {
        return Ok(None);
    };
    Ok(read(link, &store)
        .await?
        .and_then(|(entry, _)| entry.snapshot))
}
