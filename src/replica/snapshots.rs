//! Snapshots: a store's database file in the object store bucket `IDEMSTORE_SNAP_<name>`,
//! committed through the writer entry, and the frames it covers purged from the stream.
//!
//! A snapshot is uploaded as an object of its own, `snapshot-<seq>-<time>` (its metadata also
//! records `idemstore-seq` and `idemstore-guarantee`), streamed from the file in chunks of
//! the server's `max_payload`. It becomes the latest only when the writer entry names it, a
//! compare-and-set that succeeds only while the entry names this writer (`writer.rs`). Then
//! the objects stored before the upload (the previous snapshot, and the pieces of any upload
//! a crash interrupted) are purged, and the stream's messages at or before frame `seq`.
//!
//! So a restore always finds the newest *complete* snapshot: a crash before the commit leaves
//! the previous snapshot named, with every frame after it still in the stream; a crash after
//! it leaves frames the snapshot already covers, which a restore skips.

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context as TaskContext, Poll};

use async_nats::jetstream::Context;
use async_nats::jetstream::object_store::{
    self, GetErrorKind, ObjectMetadata, ObjectStore, PutErrorKind,
};
use async_nats::jetstream::stream::StorageType;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};

use super::bridge::Progress;
use super::connect::Link;
use super::errors::{corrupt, failed};
use super::messages;
use super::stream::{self, Missing};
use super::writer::{self, SnapshotRef};
use crate::error::ReplicaError;
use crate::model::replica::SnapshotInfo;
use crate::model::restore::Lineage;

/// The snapshot bucket; `None` if it does not exist and `missing` says not to create it.
pub(super) async fn bucket(
    link: &Link,
    js: &Context,
    missing: Missing,
) -> Result<Option<ObjectStore>, ReplicaError> {
    let name = &link.names.snapshots;
    let opened = match js.get_object_store(name).await {
        Ok(store) => return Ok(Some(store)),
        Err(e) => e,
    };
    stream::bucket_absent(link, js, &link.names.snapshots_stream(), name, &opened).await?;
    if missing != Missing::Create {
        return Ok(None);
    }
    let config = object_store::Config {
        bucket: name.clone(),
        description: Some(format!(
            "idemstore: snapshots of the stream {}",
            link.names.stream
        )),
        storage: StorageType::File,
        num_replicas: link.replicas,
        ..Default::default()
    };
    js.create_object_store(config)
        .await
        .map(Some)
        .map_err(|e| failed(&link.client, &format!("creating the bucket {name}"), &e))
}

/// [`Replica::snapshot`](crate::Replica::snapshot): see the module doc.
pub(super) async fn upload(
    link: Arc<Link>,
    js: Context,
    seq: u64,
    file: PathBuf,
    lineage: Lineage,
    progress: Progress,
) -> Result<(), ReplicaError> {
    link.connected().await;
    // Fenced before a byte moves: a writer another store took the stream from stops here.
    if let Some(latest) = writer::still_writer(&link, &js).await?
        && latest.seq > seq
    {
        return Err(ReplicaError::Refused {
            detail: format!(
                "the stream {} has a snapshot of frame {}, past frame {seq}",
                link.names.stream, latest.seq
            ),
        });
    }
    let store = bucket(&link, &js, Missing::Create)
        .await?
        .ok_or_else(writer::not_claimed)?;
    let objects = js
        .get_stream(link.names.snapshots_stream())
        .await
        .map_err(|e| failed(&link.client, "opening the snapshot bucket's stream", &e))?;
    let before = objects
        .get_info()
        .await
        .map_err(|e| failed(&link.client, "reading the snapshot bucket's state", &e))?
        .state
        .last_sequence;

    let source = tokio::fs::File::open(&file)
        .await
        .map_err(|e| ReplicaError::Refused {
            detail: format!("could not read the snapshot file {}: {e}", file.display()),
        })?;
    let nanos = super::unix_nanos();
    let name = format!("snapshot-{seq}-{nanos:x}");
    let metadata = ObjectMetadata {
        name: name.clone(),
        description: Some(format!(
            "idemstore snapshot of the stream {}: every frame up to {seq}",
            link.names.stream
        )),
        chunk_size: Some(messages::chunk_size(link.client.max_payload())),
        metadata: HashMap::from([
            ("idemstore-seq".to_owned(), seq.to_string()),
            (
                "idemstore-guarantee".to_owned(),
                lineage.guarantee.as_str().to_owned(),
            ),
            ("idemstore-epoch".to_owned(), lineage.epoch.to_string()),
        ]),
        headers: None,
    };
    let mut counted = Counted {
        inner: source,
        progress,
    };
    let info = store
        .put(metadata, &mut counted)
        .await
        .map_err(|e| match e.kind() {
            PutErrorKind::ReadChunks => ReplicaError::Refused {
                detail: format!("could not read the snapshot file {}: {e}", file.display()),
            },
            _ => failed(&link.client, &format!("uploading the snapshot {name}"), &e),
        })?;
    let reference = SnapshotRef::new(name.clone(), seq, info.size as u64, &lineage);
    if let Err(e) = writer::commit_snapshot(&link, &js, reference).await {
        let _ = store.delete(&name).await; // never named: nobody reads it
        return Err(e);
    }

    // Committed. What follows only frees space: a failure leaves it for the next snapshot.
    // (A purge up to sequence 1 would mean "no bound" to the server: skip an empty bucket.)
    if before > 0 {
        let purged = objects
            .purge()
            .filter(format!("$O.{}.>", link.names.snapshots))
            .sequence(before + 1)
            .await;
        if let Err(e) = purged {
            tracing::warn!(bucket = %link.names.snapshots, error = %e, "could not purge the snapshots older than the latest");
        }
    }
    if let Err(e) = trim(&link, &js, seq).await {
        tracing::warn!(stream = %link.names.stream, seq, error = %e, "could not purge the frames the latest snapshot covers");
    }
    Ok(())
}

/// Purges the stream's messages at or before frame `seq`.
async fn trim(link: &Link, js: &Context, seq: u64) -> Result<(), ReplicaError> {
    let log = stream::open(link, js, Missing::Refuse).await?;
    let tail = stream::tail(link, &log).await?;
    if tail.last.is_none() {
        return Ok(());
    }
    let keep = stream::first_after(link, &log, &tail, seq).await?;
    if keep > tail.first_seq {
        // Sequence 1 would mean "no bound" to the server, purging everything.
        assert!(
            keep > 1,
            "a purge keeps the messages from sequence {keep} on"
        );
        log.purge().sequence(keep).await.map_err(|e| {
            failed(
                &link.client,
                &format!("purging the stream {}", link.names.stream),
                &e,
            )
        })?;
    }
    Ok(())
}

/// [`ReplicaSource::latest_snapshot`](crate::ReplicaSource::latest_snapshot): the latest
/// snapshot's description, as the writer entry commits it.
pub(super) async fn latest(
    link: Arc<Link>,
    js: Context,
) -> Result<Option<SnapshotInfo>, ReplicaError> {
    link.connected().await;
    stream::open(&link, &js, Missing::Refuse).await?;
    let Some(latest) = writer::latest_snapshot(&link, &js).await? else {
        return Ok(None);
    };
    Ok(Some(SnapshotInfo {
        seq: latest.seq,
        lineage: latest.lineage()?,
        bytes: latest.bytes,
    }))
}

/// [`ReplicaSource::fetch_snapshot`](crate::ReplicaSource::fetch_snapshot): the latest
/// snapshot into `file`, created here (`created` says whether it was, for the caller to
/// remove it after a failure).
pub(super) async fn fetch(
    link: Arc<Link>,
    js: Context,
    file: PathBuf,
    created: Arc<AtomicBool>,
    progress: Progress,
) -> Result<Option<SnapshotInfo>, ReplicaError> {
    link.connected().await;
    stream::open(&link, &js, Missing::Refuse).await?;
    let Some(latest) = writer::latest_snapshot(&link, &js).await? else {
        return Ok(None);
    };
    let lineage = latest.lineage()?;
    let missing = || {
        corrupt(format!(
            "the writer entry names the snapshot {}, which the bucket {} does not hold",
            latest.object, link.names.snapshots
        ))
    };
    let store = bucket(&link, &js, Missing::Refuse)
        .await?
        .ok_or_else(missing)?;
    let mut object = match store.get(&latest.object).await {
        Ok(object) => object,
        Err(e) if e.kind() == GetErrorKind::NotFound => return Err(missing()),
        Err(e) => {
            return Err(failed(
                &link.client,
                &format!("downloading the snapshot {}", latest.object),
                &e,
            ));
        }
    };
    let local = |e: std::io::Error| ReplicaError::Refused {
        detail: format!("could not write the snapshot to {}: {e}", file.display()),
    };
    // Private from its first byte, whatever the umask, as the store's own file.
    let mut out = tokio::fs::File::from_std(crate::storage::create_private(&file).map_err(local)?);
    created.store(true, Ordering::Relaxed);
    let mut buffer = vec![0; 256 << 10];
    let mut bytes = 0u64;
    loop {
        let n = object.read(&mut buffer).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                corrupt(format!(
                    "the snapshot {} does not match its digest: {e}",
                    latest.object
                ))
            } else {
                failed(
                    &link.client,
                    &format!("downloading the snapshot {}", latest.object),
                    &e,
                )
            }
        })?;
        if n == 0 {
            break;
        }
        out.write_all(&buffer[..n]).await.map_err(local)?;
        bytes += n as u64;
        progress.tick();
    }
    out.sync_all().await.map_err(local)?;
    if bytes != latest.bytes {
        return Err(corrupt(format!(
            "the snapshot {} holds {bytes} bytes, not the {} it was committed with",
            latest.object, latest.bytes
        )));
    }
    Ok(Some(SnapshotInfo {
        seq: latest.seq,
        lineage,
        bytes,
    }))
}

/// A reader that reports progress with every read.
struct Counted<R> {
    inner: R,
    progress: Progress,
}

impl<R: AsyncRead + Unpin> AsyncRead for Counted<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if polled.is_ready() {
            self.progress.tick();
        }
        polled
    }
}
