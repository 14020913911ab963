//! The writer entry's format, and its reads and compare-and-set writes: the key `writer` of
//! the bucket `IDEMSTORE_WRITER_<name>` (the format is in `writer.rs`'s doc; what may change
//! it, there and in `model::writer_epoch`).

use async_nats::jetstream::Context;
use async_nats::jetstream::kv::{self, CreateErrorKind, Operation, UpdateErrorKind};
use async_nats::jetstream::stream::{self as js_stream, DiscardPolicy, StorageType};
use serde::{Deserialize, Serialize};

use super::connect::Link;
use super::errors::{corrupt, failed};
use super::names::WRITER_KEY;
use super::stream::{self, Missing};
use crate::error::ReplicaError;
use crate::model::clock::Timestamp;
use crate::model::replica::{Guarantee, WriterIdentity};
use crate::model::restore::Lineage;
use crate::model::writer_epoch::Slot;

/// The entry's format.
pub(super) const VERSION: u32 = 2;

/// The writer entry (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Entry {
    pub(super) version: u32,
    #[serde(default)]
    pub(super) epoch: u64,
    pub(super) writer: Option<WriterIdentity>,
    #[serde(default)]
    pub(super) last_writer: Option<WriterIdentity>,
    pub(super) snapshot: Option<SnapshotRef>,
}

impl Entry {
    /// The entry as the rules see it.
    pub(super) fn slot(&self) -> Slot<WriterIdentity> {
        Slot {
            epoch: self.epoch,
            writer: self.writer.clone(),
            last_writer: self.last_writer.clone(),
        }
    }

    /// The entry the rules made, with `snapshot`.
    pub(super) fn of(slot: Slot<WriterIdentity>, snapshot: Option<SnapshotRef>) -> Entry {
        Entry {
            version: VERSION,
            epoch: slot.epoch,
            writer: slot.writer,
            last_writer: slot.last_writer,
            snapshot,
        }
    }
}

/// The latest snapshot: an object of the snapshot bucket, and the lineage it was sent with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SnapshotRef {
    pub(super) object: String,
    pub(super) seq: u64,
    pub(super) guarantee: String,
    pub(super) bytes: u64,
    #[serde(default)]
    pub(super) epoch: u64,
    #[serde(default)]
    pub(super) window_end_ms: Option<u64>,
    #[serde(default)]
    pub(super) newest_ms: u64,
}

impl SnapshotRef {
    /// The reference to `object`, a snapshot of every frame up to `seq` sent with `lineage`.
    pub(super) fn new(object: String, seq: u64, bytes: u64, lineage: &Lineage) -> SnapshotRef {
        SnapshotRef {
            object,
            seq,
            guarantee: lineage.guarantee.as_str().to_owned(),
            bytes,
            epoch: lineage.epoch,
            window_end_ms: lineage.window_end.map(Timestamp::as_millis),
            newest_ms: lineage.newest.as_millis(),
        }
    }

    /// The lineage it was sent with.
    pub(super) fn lineage(&self) -> Result<Lineage, ReplicaError> {
        let guarantee = Guarantee::parse(&self.guarantee).ok_or_else(|| {
            corrupt(format!(
                "the snapshot {} has an unknown guarantee {:?}",
                self.object, self.guarantee
            ))
        })?;
        Ok(Lineage {
            epoch: self.epoch,
            guarantee,
            window_end: self.window_end_ms.map(Timestamp::from_millis),
            newest: Timestamp::from_millis(self.newest_ms),
        })
    }
}

/// How a compare-and-set ended.
pub(super) enum Written {
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
    if missing != Missing::Create {
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
        num_replicas: link.replicas,
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
pub(super) async fn read(
    link: &Link,
    store: &kv::Store,
) -> Result<Option<(Entry, u64)>, ReplicaError> {
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
pub(super) async fn write(
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
