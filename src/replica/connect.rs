//! The [`JetStream`] replica: its connection, its settings, and how each call crosses to the
//! replica's runtime (`bridge.rs`) and back within the time limit.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::Context;
use async_nats::{Client, ConnectOptions};
use parking_lot::Mutex;

use super::bridge::{Bridge, Progress, Silence};
use super::errors;
use super::names::Names;
use crate::error::ReplicaError;
use crate::model::replica::WriterIdentity;

/// The default time limit of each call.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The shortest time limit [`JetStream::timeout`] takes.
const MIN_TIMEOUT: Duration = Duration::from_millis(10);
/// How often a call that finds the client not yet connected looks again.
const CONNECTED_POLL: Duration = Duration::from_millis(10);

/// A store's write-ahead log replicated to NATS JetStream (feature `nats`): both a
/// [`Replica`](crate::Replica) (what a store shipping its log calls) and a
/// [`ReplicaSource`](crate::ReplicaSource) (what a restore reads).
///
/// For a store named `N` the server holds:
///
/// - the stream `IDEMSTORE_LOG_N` (file storage), whose one subject `idemstore.log.N` carries
///   the frames, one message each (a frame larger than the server's `max_payload` in
///   consecutive chunk messages), and take-over markers;
/// - the key-value bucket `IDEMSTORE_WRITER_N`, whose key `writer` (JSON) names the store
///   that writes the stream and the latest snapshot;
/// - the object store bucket `IDEMSTORE_SNAP_N`, the snapshots.
///
/// A [`claim`](crate::Replica::claim) or a [`take_over`](crate::ReplicaSource::take_over)
/// creates them; the rest need them. They work with NATS 2.9 and later.
///
/// **Every call is bounded.** The traits are blocking and may be called from any thread,
/// including one inside a tokio runtime: each call runs on the replica's own runtime thread
/// and the caller waits at most the [time limit](JetStream::timeout) for it (a call moving
/// many bytes, such as a snapshot, at most a time limit *without progress*). A server that is
/// down, unknown, or accepts the connection and then says nothing gives
/// [`ReplicaError::Unreachable`] within about that limit, never a hang.
///
/// **It connects lazily.** [`connect`](JetStream::connect) fails only on a bad name or URL; it
/// does not wait for the server, so a store opens while NATS is down. The connection is made
/// (and remade after a loss) in the background; a call made while there is none waits for it
/// up to its time limit, then reports the server unreachable.
pub struct JetStream {
    pub(super) link: Arc<Link>,
    bridge: Bridge,
    limit: Duration,
    /// Serializes the writer's own calls (claim, publish, release, take-over): each reads and
    /// advances what the writer knows of the stream.
    pub(super) writing: Mutex<()>,
    /// Serializes snapshots, without holding up the frames published meanwhile.
    pub(super) snapshotting: Mutex<()>,
}

/// What every call of one replica shares; its futures hold it.
pub(super) struct Link {
    pub(super) url: String,
    pub(super) client: Client,
    /// The JetStream context; each call takes a copy with its own time limit.
    js: Context,
    pub(super) names: Names,
    /// How many servers of a cluster keep each stream and bucket this replica creates.
    pub(super) replicas: usize,
    /// This replica's claim on the stream, once [`Replica::claim`](crate::Replica::claim)
    /// succeeded.
    pub(super) writer: Mutex<Option<Claimed>>,
}

/// What a writer knows of the stream it claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claimed {
    pub(super) me: WriterIdentity,
    /// The writer epoch it claimed at (`model::writer_epoch`).
    pub(super) epoch: u64,
    /// Unique to this claim: in every frame it publishes (`Idemstore-Writer`, and the message
    /// ids), so that its own messages are told from anyone else's.
    pub(super) token: String,
    /// The stream sequence of the last message this writer knows the stream holds: the
    /// fence of its next publish.
    pub(super) last_seq: u64,
    /// The last frame the stream holds, in messages or in a snapshot.
    pub(super) last_frame: u64,
}

impl JetStream {
    /// A replica on the NATS server at `url` (`nats://host:4222`, or several separated by
    /// commas) for the store whose stream name is `name`: 1 to 64 of `A-Z a-z 0-9 _ -`,
    /// unique per store on that server.
    ///
    /// Fails ([`ReplicaError::Refused`]) only on an invalid name or URL: the connection is
    /// made in the background, and a call made before it is up waits for it (see the type's
    /// doc).
    pub fn connect(url: &str, name: &str) -> Result<JetStream, ReplicaError> {
        let names = Names::new(name)?;
        let bridge = Bridge::start()?;
        let target = url.to_owned();
        let connected = bridge.call(DEFAULT_TIMEOUT, None, async move {
            let client = ConnectOptions::new()
                .name("idemstore replica")
                .retry_on_initial_connect()
                .connect(target.as_str())
                .await?;
            let js = async_nats::jetstream::new(client.clone());
            Ok::<_, async_nats::ConnectError>((client, js))
        });
        let (client, js) = match connected {
            Ok(Ok(connected)) => connected,
            Ok(Err(e)) => {
                return Err(ReplicaError::Refused {
                    detail: format!("cannot use the NATS URL {url:?}: {e}"),
                });
            }
            Err(_) => return Err(errors::stopped("connecting")),
        };
        Ok(JetStream {
            link: Arc::new(Link {
                url: url.to_owned(),
                client,
                js,
                names,
                replicas: 1,
                writer: Mutex::new(None),
            }),
            bridge,
            limit: DEFAULT_TIMEOUT,
            writing: Mutex::new(()),
            snapshotting: Mutex::new(()),
        })
    }

    /// How many servers of a JetStream cluster keep the stream, the writer entry and the
    /// snapshots this replica creates (default 1; a cluster of three takes 3, and then loses
    /// nothing acknowledged when one server goes). Streams that already exist keep theirs.
    ///
    /// # Panics
    /// If called after the replica was shared (it is set right after [`JetStream::connect`]).
    #[must_use]
    pub fn replicas(mut self, servers: usize) -> JetStream {
        Arc::get_mut(&mut self.link)
            .expect("replicas is set before the replica is used")
            .replicas = servers.clamp(1, 5);
        self
    }

    /// The time limit of each call (default 5 s; at least 10 ms). A call that moves many
    /// bytes (a snapshot, a long read, a large batch) fails after this long *without
    /// progress* instead. A call past its limit fails with [`ReplicaError::Unreachable`].
    pub fn timeout(mut self, limit: Duration) -> JetStream {
        self.limit = limit.max(MIN_TIMEOUT);
        self
    }

    /// Runs `future` on the replica's runtime within the time limit (of silence, with
    /// `progress`).
    pub(super) fn run<T, F>(
        &self,
        what: &str,
        progress: Option<&Progress>,
        future: F,
    ) -> Result<T, ReplicaError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, ReplicaError>> + Send + 'static,
    {
        match self.bridge.call(self.limit, progress, future) {
            Ok(answer) => answer,
            Err(Silence::TimedOut) => Err(self.silent(what)),
            Err(Silence::Stopped) => Err(errors::stopped(what)),
        }
    }

    /// The error of a call that got no answer within the limit.
    pub(super) fn silent(&self, what: &str) -> ReplicaError {
        errors::timed_out(&self.link.client, &self.link.url, what, self.limit)
    }

    /// The time limit.
    pub(super) fn limit(&self) -> Duration {
        self.limit
    }

    /// The runtime thread.
    pub(super) fn bridge(&self) -> &Bridge {
        &self.bridge
    }

    /// A JetStream context whose requests time out with this replica's limit.
    pub(super) fn context(&self) -> Context {
        let mut js = self.link.js.clone();
        js.set_timeout(self.limit);
        js
    }
}

impl Link {
    /// Returns once the client is connected (a call's own limit bounds the wait).
    pub(super) async fn connected(&self) {
        while self.client.connection_state() != State::Connected {
            tokio::time::sleep(CONNECTED_POLL).await;
        }
    }
}

impl fmt::Debug for JetStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStream")
            .field("url", &self.link.url)
            .field("stream", &self.link.names.stream)
            .field("timeout", &self.limit)
            .field(
                "connection",
                &self.link.client.connection_state().to_string(),
            )
            .finish_non_exhaustive()
    }
}
