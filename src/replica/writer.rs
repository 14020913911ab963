//! The writer entry: who writes the stream, and its latest snapshot, under the key `writer`
//! of the bucket `IDEMSTORE_WRITER_<name>`; and the claim, the release and the take-over that
//! change it.
//!
//! ```text
//! {"version":1,
//!  "writer":{"host":"db-1","pid":4242,"dir":"/var/lib/orders/idem"},    (null once released)
//!  "snapshot":{"object":"snapshot-1200-…","seq":1200,"guarantee":"complete","bytes":8192}}
//! ```
//!
//! Every change is a compare-and-set on the entry's revision, so a snapshot is committed only
//! by the store the entry names: a writer fenced off by a take-over cannot replace the new
//! writer's snapshot, nor purge its frames (see `snapshots.rs`). A release keeps the snapshot
//! (the entry stays, naming no writer).
//!
//! A take-over appends a marker to the stream, then writes the entry: in between, the marker
//! is the stream's last message, and a claim by any other store that finds it refuses (the
//! take-over is under way; it also refuses after the take-over, until the new writer has
//! published: the stream goes on in that store's log). A take-over whose marker is no longer
//! last when it comes to write the entry gives up ([`ReplicaError::Moved`]): someone published
//! after it.

use std::sync::Arc;

use async_nats::jetstream::Context;
use async_nats::jetstream::kv::{self, CreateErrorKind, Operation, UpdateErrorKind};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{self as js_stream, DiscardPolicy, StorageType};
use serde::{Deserialize, Serialize};

use super::connect::{Claimed, Link};
use super::errors::{corrupt, failed};
use super::messages::{self, Kind};
use super::names::WRITER_KEY;
use super::snapshots;
use super::stream::{self, Missing, Tail};
use crate::error::ReplicaError;
use crate::model::replica::{StreamPosition, WriterIdentity};

/// The entry's format.
const VERSION: u32 = 1;
/// How many times a change is tried again when the entry changed under it.
const TRIES: usize = 3;

/// The writer entry (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Entry {
    pub(super) version: u32,
    pub(super) writer: Option<WriterIdentity>,
    pub(super) snapshot: Option<SnapshotRef>,
}

/// The latest snapshot: an object of the snapshot bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SnapshotRef {
    pub(super) object: String,
    pub(super) seq: u64,
    pub(super) guarantee: String,
    pub(super) bytes: u64,
}

/// How a compare-and-set ended.
enum Written {
    Revision(u64),
    Conflict,
}

/// The writer bucket; `None` if it does not exist and `missing` says not to create it.
pub(super) async fn bucket(
    link: &Link,
    js: &Context,
    missing: Missing,
) -> Result<Option<kv::Store>, ReplicaError> {
    let name = &link.names.writers;
    let opened = match js.get_key_value(name).await {
        Ok(store) => return Ok(Some(store)),
        Err(e) => e,
    };
    stream::bucket_absent(link, js, &link.names.writers_stream(), name, &opened).await?;
    if missing == Missing::Refuse {
        return Ok(None);
    }
    // The bucket's stream as async-nats's `create_key_value` makes it, made here: that call
    // first reads the account's info, which it cannot parse from a NATS 2.9 server.
    let config = js_stream::Config {
        name: link.names.writers_stream(),
        description: Some(format!(
            "idemstore: the store writing the stream {}",
            link.names.stream
        )),
        subjects: vec![format!("$KV.{name}.>")],
        max_messages_per_subject: 1,
        storage: StorageType::File,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: true,
        discard: DiscardPolicy::New,
        ..Default::default()
    };
    let what = || format!("creating the bucket {name}");
    js.create_stream(config)
        .await
        .map_err(|e| failed(&link.client, &what(), &e))?;
    js.get_key_value(name)
        .await
        .map(Some)
        .map_err(|e| failed(&link.client, &what(), &e))
}

/// The entry and its revision; `None` if there is none.
async fn read(link: &Link, store: &kv::Store) -> Result<Option<(Entry, u64)>, ReplicaError> {
    let entry = store.entry(WRITER_KEY).await.map_err(|e| {
        failed(
            &link.client,
            &format!("reading the writer entry of {}", link.names.writers),
            &e,
        )
    })?;
    let Some(entry) = entry.filter(|e| e.operation == Operation::Put) else {
        return Ok(None);
    };
    let parsed: Entry = serde_json::from_slice(&entry.value).map_err(|e| {
        corrupt(format!(
            "the writer entry of {} (revision {}) is not readable: {e}",
            link.names.writers, entry.revision
        ))
    })?;
    Ok(Some((parsed, entry.revision)))
}

/// Writes `entry` if the entry is still at revision `over` (or absent, for `None`).
async fn write(
    link: &Link,
    store: &kv::Store,
    entry: &Entry,
    over: Option<u64>,
) -> Result<Written, ReplicaError> {
    let value = serde_json::to_vec(entry).map_err(|e| ReplicaError::Refused {
        detail: format!("could not write the writer entry: {e}"),
    })?;
    let what = || format!("writing the writer entry of {}", link.names.writers);
    match over {
        None => match store.create(WRITER_KEY, value.into()).await {
            Ok(revision) => Ok(Written::Revision(revision)),
            Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(Written::Conflict),
            Err(e) => Err(failed(&link.client, &what(), &e)),
        },
        Some(revision) => match store.update(WRITER_KEY, value.into(), revision).await {
            Ok(revision) => Ok(Written::Revision(revision)),
            Err(e) if e.kind() == UpdateErrorKind::WrongLastRevision => Ok(Written::Conflict),
            Err(e) => Err(failed(&link.client, &what(), &e)),
        },
    }
}

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
) -> Result<StreamPosition, ReplicaError> {
    link.connected().await;
    let log = stream::open(&link, &js, Missing::Create).await?;
    let store = created(&link, &js).await?;
    snapshots::bucket(&link, &js, Missing::Create).await?;
    // A take-over by another store that has appended its marker and not yet written the
    // entry: that store has the stream. Looked for before the entry is touched, and again
    // after (the marker may land in between; the entry is then given back).
    foreign_marker(&stream::tail(&link, &log).await?, &me)?;
    let taken = take(&link, &store, &me).await?;
    let tail = stream::tail(&link, &log).await?;
    if let Err(e) = foreign_marker(&tail, &me) {
        let _ = write(&link, &store, &taken.before, Some(taken.revision)).await;
        return Err(e);
    }
    let (revision, snapshot) = (taken.revision, taken.before.snapshot);
    let snapshot_seq = snapshot.as_ref().map(|s| s.seq);
    let last_frame = tail.last_frame.max(snapshot_seq.unwrap_or(0));
    *link.writer.lock() = Some(Claimed {
        me,
        token: token(revision),
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

/// What [`take`] did: the entry's revision it wrote, and the entry before (as it is given
/// back; a released one if there was none).
struct Taken {
    revision: u64,
    before: Entry,
}

/// Makes `me` the entry's writer, if it names none, or this same store.
async fn take(link: &Link, store: &kv::Store, me: &WriterIdentity) -> Result<Taken, ReplicaError> {
    for _ in 0..TRIES {
        let current = read(link, store).await?;
        let (before, over) = match current {
            None => (
                Entry {
                    version: VERSION,
                    writer: None,
                    snapshot: None,
                },
                None,
            ),
            Some((entry, revision)) => match &entry.writer {
                Some(holder) if !holder.same_store(me) => {
                    return Err(ReplicaError::OtherWriter {
                        holder: holder.clone(),
                    });
                }
                _ => (entry, Some(revision)),
            },
        };
        let entry = Entry {
            version: VERSION,
            writer: Some(me.clone()),
            snapshot: before.snapshot.clone(),
        };
        if let Written::Revision(revision) = write(link, store, &entry, over).await? {
            return Ok(Taken { revision, before });
        }
    }
    Err(changing(link))
}

/// `OtherWriter` if the stream ends with another store's take-over marker.
fn foreign_marker(tail: &Tail, me: &WriterIdentity) -> Result<(), ReplicaError> {
    if let Some((Kind::Marker { .. }, message)) = &tail.last
        && let Some(by) = messages::marker_identity(message)
        && !by.same_store(me)
    {
        return Err(ReplicaError::OtherWriter { holder: by });
    }
    Ok(())
}

fn changing(link: &Link) -> ReplicaError {
    ReplicaError::Refused {
        detail: format!(
            "the writer entry of {} kept changing under this call; try again",
            link.names.writers
        ),
    }
}

/// [`Replica::release`](crate::Replica::release): the entry names no writer any more, if it
/// still named `me`.
pub(super) async fn release(
    link: Arc<Link>,
    js: Context,
    me: WriterIdentity,
) -> Result<(), ReplicaError> {
    {
        let mut writer = link.writer.lock();
        if writer.as_ref().is_some_and(|c| c.me == me) {
            *writer = None;
        }
    }
    link.connected().await;
    let Some(store) = bucket(&link, &js, Missing::Refuse).await? else {
        return Ok(());
    };
    for _ in 0..TRIES {
        let Some((entry, revision)) = read(&link, &store).await? else {
            return Ok(());
        };
        if entry.writer.as_ref() != Some(&me) {
            return Ok(()); // not ours any more
        }
        let released = Entry {
            writer: None,
            ..entry
        };
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
) -> Result<(), ReplicaError> {
    link.connected().await;
    let log = stream::open(&link, &js, Missing::Create).await?;
    let store = created(&link, &js).await?;
    snapshots::bucket(&link, &js, Missing::Create).await?;
    for _ in 0..TRIES {
        let current = read(&link, &store).await?;
        let snapshot = current.as_ref().and_then(|(e, _)| e.snapshot.clone());
        let tail = stream::tail(&link, &log).await?;
        let ours = matches!(&tail.last, Some((Kind::Marker { after }, message))
            if *after == last && messages::marker_identity(message).as_ref() == Some(&me));
        if !ours {
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
            let marker = messages::marker(last, &me)?.expected_last_sequence(tail.last_seq);
            let ack = js
                .send_publish(link.names.subject.clone(), marker)
                .await
                .map_err(|e| {
                    super::errors::publish_failed(&link.client, "appending a take-over marker", &e)
                })?;
            match ack.await {
                Ok(_) => {}
                Err(e)
                    if e.kind()
                        == async_nats::jetstream::context::PublishErrorKind::WrongLastSequence =>
                {
                    continue; // something landed meanwhile: look again
                }
                Err(e) => {
                    return Err(super::errors::publish_failed(
                        &link.client,
                        "appending a take-over marker",
                        &e,
                    ));
                }
            }
        }
        let entry = Entry {
            version: VERSION,
            writer: Some(me.clone()),
            snapshot,
        };
        if let Written::Revision(_) = write(&link, &store, &entry, current.map(|(_, r)| r)).await? {
            // Whatever this replica claimed before is over: the stream has a new writer.
            *link.writer.lock() = None;
            return Ok(());
        }
    }
    Err(changing(&link))
}

/// The error for a fenced publish: who writes the stream now, by the entry, or by the
/// stream's last message if it is a take-over marker.
pub(super) async fn other_writer(
    link: &Link,
    js: &Context,
    last: Option<&StreamMessage>,
) -> ReplicaError {
    let me = link.writer.lock().as_ref().map(|c| c.me.clone());
    if let Ok(Some(store)) = bucket(link, js, Missing::Refuse).await
        && let Ok(Some((entry, _))) = read(link, &store).await
        && let Some(holder) = entry.writer
        && Some(&holder) != me.as_ref()
    {
        return ReplicaError::OtherWriter { holder };
    }
    if let Some(holder) = last.and_then(messages::marker_identity) {
        return ReplicaError::OtherWriter { holder };
    }
    ReplicaError::Refused {
        detail: format!(
            "the stream {} is no longer this writer's: another writer appended to it, or its claim was released; claim it again",
            link.names.stream
        ),
    }
}

/// `Ok` if the entry still names this replica's writer; else who does.
pub(super) async fn still_writer(
    link: &Link,
    js: &Context,
) -> Result<Option<SnapshotRef>, ReplicaError> {
    let me = claimed_as(link)?;
    let store = bucket(link, js, Missing::Refuse).await?;
    let current = match &store {
        Some(store) => read(link, store).await?,
        None => None,
    };
    match current {
        Some((entry, _)) if entry.writer.as_ref() == Some(&me) => Ok(entry.snapshot),
        _ => Err(other_writer(link, js, None).await),
    }
}

/// The store this replica claimed the stream as.
fn claimed_as(link: &Link) -> Result<WriterIdentity, ReplicaError> {
    link.writer
        .lock()
        .as_ref()
        .map(|c| c.me.clone())
        .ok_or_else(not_claimed)
}

/// The error for a writer's call before its claim.
pub(super) fn not_claimed() -> ReplicaError {
    ReplicaError::Refused {
        detail: "this replica has not claimed the stream (call claim first)".to_owned(),
    }
}

/// The stream's last frame (in messages or in the snapshot), asked again; what this writer
/// knows is brought up to it.
pub(super) async fn refresh_last_frame(link: &Link, js: &Context) -> Result<u64, ReplicaError> {
    let snapshot = still_writer(link, js).await?;
    let log = stream::open(link, js, Missing::Refuse).await?;
    let tail = stream::tail(link, &log).await?;
    let last = tail.last_frame.max(snapshot.map_or(0, |s| s.seq));
    let mut writer = link.writer.lock();
    let claimed = writer.as_mut().ok_or_else(not_claimed)?;
    claimed.last_frame = claimed.last_frame.max(last);
    Ok(claimed.last_frame)
}

/// Commits `snapshot` as the latest, if the entry still names this replica's writer; returns
/// the snapshot it replaced.
pub(super) async fn commit_snapshot(
    link: &Link,
    js: &Context,
    snapshot: SnapshotRef,
) -> Result<Option<SnapshotRef>, ReplicaError> {
    let me = claimed_as(link)?;
    let store = bucket(link, js, Missing::Refuse)
        .await?
        .ok_or_else(not_claimed)?;
    for _ in 0..TRIES {
        let current = read(link, &store).await?;
        let Some((entry, revision)) = current.filter(|(e, _)| e.writer.as_ref() == Some(&me))
        else {
            return Err(other_writer(link, js, None).await);
        };
        let committed = Entry {
            version: VERSION,
            writer: Some(me.clone()),
            snapshot: Some(snapshot.clone()),
        };
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
