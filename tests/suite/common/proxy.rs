//! A TCP proxy between a store and its database (or its NATS server) that can make the
//! network fail the way networks do: pass traffic, drop a connection (both sockets closed, as
//! after a reset), or hold it (both sockets stay open and nothing is forwarded either way, as
//! in a partition or a frozen peer: neither side hears anything, and a close on one side never
//! reaches the other). Per connection or for all of them. New connections pass unless
//! [`Proxy::arrivals`] says otherwise: refused (closed at once, as by a server that is down)
//! or held (accepted and never answered, as by a silent one).
//!
//! A connection is named by the port of its upstream socket, which is what PostgreSQL shows
//! as `client_port` in `pg_stat_activity`: a test finds the session it wants to silence (the
//! one holding a lock, the one listening) and holds exactly that one.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What a connection does with its traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pass,
    Hold,
    Drop,
}

/// What the proxy does with the connections it accepts from now on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrivals {
    /// Connected to the upstream, their traffic passed (the default).
    Pass,
    /// Closed at once, before a byte goes either way: the server is down.
    Refuse,
    /// Kept open and never answered, until arrivals change: the server is silent.
    Hold,
}

/// Where an armed trigger holds the connection relative to the bytes it matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The matched bytes never reach the server (a request lost on its way).
    Before,
    /// They reach it, and nothing after, answers included (an answer lost on its way back).
    After,
}

/// One proxied connection.
struct Link {
    /// The upstream socket's local port: the session's `client_port` on the server.
    port: u16,
    state: watch::Sender<State>,
    /// Bytes from the client that, once seen, hold the connection.
    trigger: Mutex<Option<(Vec<u8>, Cut)>>,
}

/// The proxy; dropping it closes every connection it carries.
pub struct Proxy {
    addr: SocketAddr,
    links: Arc<Mutex<Vec<Arc<Link>>>>,
    tasks: Arc<Mutex<JoinSet<()>>>,
    arrivals: watch::Sender<Arrivals>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let links: Arc<Mutex<Vec<Arc<Link>>>> = Arc::default();
        let tasks: Arc<Mutex<JoinSet<()>>> = Arc::default();
        let arrivals = watch::Sender::new(Arrivals::Pass);
        let (accepted, spawn, policy) = (links.clone(), tasks.clone(), arrivals.subscribe());
        tasks.lock().spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let now = *policy.borrow();
                match now {
                    Arrivals::Pass => {}
                    Arrivals::Refuse => continue, // dropped: the client sees it closed
                    Arrivals::Hold => {
                        let mut until = policy.clone();
                        spawn.lock().spawn(async move {
                            let _open = client;
                            let _ = until.wait_for(|a| *a != Arrivals::Hold).await;
                        });
                        continue;
                    }
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue; // the client sees its connection closed
                };
                let Ok(local) = server.local_addr() else {
                    continue;
                };
                let link = Arc::new(Link {
                    port: local.port(),
                    state: watch::Sender::new(State::Pass),
                    trigger: Mutex::new(None),
                });
                accepted.lock().push(link.clone());
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let mut tasks = spawn.lock();
                // Subscribed here, so that the link counts as open from the start.
                let (up, down) = (link.state.subscribe(), link.state.subscribe());
                tasks.spawn(pump(client_read, server_write, up, link.clone(), true));
                tasks.spawn(pump(server_read, client_write, down, link, false));
            }
        });
        Ok(Proxy {
            addr,
            links,
            tasks,
            arrivals,
        })
    }

    /// What happens to the connections accepted from now on (those open now are unchanged;
    /// connections held as they arrived are closed when arrivals stop being held).
    pub fn arrivals(&self, arrivals: Arrivals) {
        self.arrivals.send_replace(arrivals);
    }

    /// `url` (a `postgres://` or `nats://` URL) with its host and port replaced by the
    /// proxy's.
    pub fn url(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let user = authority
            .rsplit_once('@')
            .map(|(user, _)| format!("{user}@"));
        format!("{scheme}://{}{}{path}", user.unwrap_or_default(), self.addr)
    }

    /// The upstream ports of the connections open now, oldest first.
    pub fn ports(&self) -> Vec<u16> {
        self.live().iter().map(|l| l.port).collect()
    }

    /// Holds the connection whose upstream port is `port`; false if there is none.
    pub fn hold(&self, port: u16) -> bool {
        self.set(|l| l.port == port, State::Hold) > 0
    }

    /// Holds every connection open now; returns how many.
    pub fn hold_all(&self) -> usize {
        self.set(|_| true, State::Hold)
    }

    /// Closes every connection open now, both sockets; returns how many.
    pub fn drop_all(&self) -> usize {
        self.set(|_| true, State::Drop)
    }

    /// Holds the connection on `port` as soon as its client sends `bytes` (matched within
    /// what one read returns, or across two), cutting as `cut` says; false if there is no
    /// such connection.
    pub fn hold_on(&self, port: u16, bytes: &[u8], cut: Cut) -> bool {
        let links = self.live();
        let Some(link) = links.iter().find(|l| l.port == port) else {
            return false;
        };
        *link.trigger.lock() = Some((bytes.to_vec(), cut));
        true
    }

    /// Whether the connection on `port` is held (its trigger fired, or it was held).
    pub fn is_held(&self, port: u16) -> bool {
        self.live()
            .iter()
            .any(|l| l.port == port && *l.state.borrow() == State::Hold)
    }

    fn live(&self) -> Vec<Arc<Link>> {
        let mut links = self.links.lock();
        links.retain(|l| *l.state.borrow() != State::Drop && l.state.receiver_count() > 0);
        links.clone()
    }

    fn set(&self, which: impl Fn(&Link) -> bool, state: State) -> usize {
        let chosen: Vec<Arc<Link>> = self.live().into_iter().filter(|l| which(l)).collect();
        for link in &chosen {
            link.state.send_replace(state);
        }
        chosen.len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.tasks.lock().abort_all();
    }
}

/// Forwards one direction of `link` while it passes; holding, it reads nothing (and what it
/// had read is lost, as in a partition); dropped or at the end of the stream, it stops, and
/// its socket halves close with it.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    link: Arc<Link>,
    upstream: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    // The tail of the previous read, so that a trigger split across two reads still matches.
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let now = *state.borrow_and_update();
        match now {
            State::Drop => return,
            State::Hold => {
                // Hold for good: wait for a drop (or the proxy's end), read nothing.
                if state.wait_for(|s| *s == State::Drop).await.is_err() {
                    std::future::pending::<()>().await;
                }
                return;
            }
            State::Pass => {}
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        if *state.borrow() != State::Pass {
            continue; // held or dropped while reading: these bytes are lost
        }
        let mut end = n;
        if upstream {
            let trigger = link.trigger.lock().clone();
            if let Some((bytes, cut)) = trigger {
                let mut seen = std::mem::take(&mut tail);
                let carried = seen.len();
                seen.extend_from_slice(&buf[..n]);
                if let Some(at) = seen
                    .windows(bytes.len())
                    .position(|w| w == bytes.as_slice())
                {
                    let stop = if cut == Cut::Before {
                        at
                    } else {
                        at + bytes.len()
                    };
                    // Hold first, so that the answer to what goes through is never forwarded.
                    link.state.send_replace(State::Hold);
                    *link.trigger.lock() = None;
                    end = stop.saturating_sub(carried).min(n);
                    if end > 0 {
                        let _ = to.write_all(&buf[..end]).await;
                    }
                    continue;
                }
                let keep = bytes.len().saturating_sub(1).min(seen.len());
                tail = seen[seen.len() - keep..].to_vec();
            }
        }
        if to.write_all(&buf[..end]).await.is_err() {
            return;
        }
    }
}
