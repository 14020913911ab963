//! The box and one NATS server lost at the same moment, against a real three-server
//! JetStream cluster: a store shipping synchronously (`Shipping::Sync(Unreachable::Refuse)`)
//! to an R3 replica (`JetStream::replicas(3)`) loses nothing it acknowledged.
//!
//! Why: a single NATS server is a second box that can be lost. With three replicas JetStream
//! acknowledges a message once a quorum (two of three) stored it, and a synchronous store
//! acknowledges a pair only after that, so any one server may go with the box and the other
//! two still hold every acknowledged pair. The server killed is the log stream's Raft leader,
//! the harder case: the stream must elect a new one from the follower that holds the tail.
//!
//! How: the test starts three `nats-server` processes on loopback as one cluster (ports
//! picked free, a config file and a store directory each, in a temporary directory; killed
//! when the test ends), waits for a JetStream meta leader, and runs this test binary as the
//! box (`cluster_box_process`): four threads write pairs and print `ack <key>` only once the
//! store acknowledged one. After 200 such lines the stream leader and the box are SIGKILLed
//! back to back, the box's directory is deleted, and once the survivors have elected new
//! leaders a restore from them must take the stream over and hold every acknowledged pair;
//! the restored store then ships on to the two survivors. The cluster really keeps three
//! copies: the log stream, the writer entry's bucket and the snapshot bucket are checked for
//! `num_replicas == 3` and three peers, so the test cannot pass on one node. A server that
//! does not start fails the test with its own log; nothing is ever skipped.
//!
//! Two things the test works around, each said where it does: the replica is given one
//! server's URL (a comma-separated list is refused by `JetStream::connect`; the client learns
//! the cluster's other servers from the one it reaches), and a restore whose snapshot fetch
//! is not answered is run again, a bounded number of times (`restore`).

use crate::common;

use std::collections::BTreeSet;
use std::error::Error;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use idemstore::replica::JetStream;
use idemstore::{
    Begin, Guarantee, ReplicaError, Response, RestoreError, Restored, Shipping, Store, Takeover,
    Unreachable,
};

use common::{ORDERS, TestResult, builder, clock, fp, order_count, scope};

type Fallible<T> = Result<T, Box<dyn Error>>;

/// The server binary (the distribution's package, v2.9.10).
const NATS_SERVER: &str = "/usr/sbin/nats-server";
/// The servers in the cluster.
const NODES: usize = 3;
/// The store's stream name on the cluster (the cluster is the test's own).
const NAME: &str = "cluster_box";
/// Pairs the box acknowledges before it is lost.
const ACKNOWLEDGED: usize = 200;
/// Threads writing pairs in the box.
const WRITERS: usize = 4;
/// How long the test waits for the cluster to form, the box to write, a leader to be elected.
const PATIENCE: Duration = Duration::from_secs(30);
/// The time limit of the replica's calls (its default is 5 s; a loaded test machine and a
/// Raft election after the kill get more room).
const REPLICA_TIMEOUT: Duration = Duration::from_secs(10);
/// The box's store directory, and the cluster's URLs: set only in the box process.
/// The time limit of the restore's calls, and how many restores the test runs at most (see
/// `restore`).
const RESTORE_TIMEOUT: Duration = Duration::from_secs(3);
const RESTORE_ATTEMPTS: usize = 8;
const BOX_DIR: &str = "IDEMSTORE_CLUSTER_BOX_DIR";
const BOX_URLS: &str = "IDEMSTORE_CLUSTER_BOX_URLS";

/// One `nats-server` process.
struct Node {
    name: String,
    port: u16,
    log: PathBuf,
    process: Option<Child>,
}

impl Node {
    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, and waits for the process to be gone.
    fn kill(&mut self) -> Fallible<()> {
        if let Some(mut process) = self.process.take() {
            process.kill()?;
            process.wait()?;
        }
        Ok(())
    }

    /// The server's log, for a failure message.
    fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("({e})"));
        format!("--- {} ({}) ---\n{text}", self.name, self.log.display())
    }
}

/// Three servers forming one JetStream cluster; each is killed when this drops.
struct Cluster {
    nodes: Vec<Node>,
}

impl Cluster {
    /// Starts the servers with their files under `dir` and returns once the cluster has a
    /// JetStream meta leader that can place a stream on all three.
    fn start(dir: &Path) -> Fallible<Cluster> {
        if !Path::new(NATS_SERVER).exists() {
            return Err(format!("{NATS_SERVER} is missing: install nats-server 2.9").into());
        }
        let ports = free_ports(2 * NODES)?;
        let (clients, routes) = ports.split_at(NODES);
        let mut cluster = Cluster { nodes: Vec::new() };
        for i in 0..NODES {
            let name = format!("n{}", i + 1);
            let store = dir.join(&name);
            std::fs::create_dir_all(&store)?;
            let others: Vec<String> = (0..NODES)
                .filter(|&j| j != i)
                .map(|j| format!("    \"nats-route://127.0.0.1:{}\"", routes[j]))
                .collect();
            let config = format!(
                "server_name: \"{name}\"\nlisten: \"127.0.0.1:{}\"\n\
                 jetstream {{\n  store_dir: \"{}\"\n}}\n\
                 cluster {{\n  name: \"idemstore\"\n  listen: \"127.0.0.1:{}\"\n  routes: [\n{}\n  ]\n}}\n",
                clients[i],
                store.display(),
                routes[i],
                others.join("\n"),
            );
            let conf = dir.join(format!("{name}.conf"));
            std::fs::write(&conf, config)?;
            let log = dir.join(format!("{name}.log"));
            let out = File::create(&log)?;
            let process = Command::new(NATS_SERVER)
                .arg("-c")
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()
                .map_err(|e| format!("cannot run {NATS_SERVER}: {e}"))?;
            cluster.nodes.push(Node {
                name,
                port: clients[i],
                log,
                process: Some(process),
            });
        }
        for i in 0..NODES {
            cluster.listening(i)?;
        }
        cluster.wait_for_meta_leader()?;
        Ok(cluster)
    }

    /// Waits until node `i` accepts client connections; fails with its log if it exited.
    fn listening(&mut self, i: usize) -> Fallible<()> {
        let started = Instant::now();
        loop {
            let node = &mut self.nodes[i];
            if let Some(status) = node.process.as_mut().and_then(|p| p.try_wait().transpose()) {
                let status = status?;
                return Err(format!("{} exited ({status}):\n{}", node.name, node.log()).into());
            }
            if TcpStream::connect(("127.0.0.1", node.port)).is_ok() {
                return Ok(());
            }
            if started.elapsed() > PATIENCE {
                return Err(self.failure(&format!("{} never listened", self.nodes[i].name)));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Polls `$JS.API.INFO` until JetStream answers (a meta leader exists), then creates a
    /// probe stream with three replicas until the leader places it (it knows all three
    /// peers), and deletes it.
    fn wait_for_meta_leader(&self) -> Fallible<()> {
        let urls = self.urls(None);
        let waited = common::nats::runtime().block_on(async {
            let started = Instant::now();
            let client = async_nats::connect(urls).await?;
            let mut js = jetstream::new(client.clone());
            js.set_timeout(Duration::from_secs(2));
            let mut last = String::from("no answer yet");
            let mut info = false;
            while started.elapsed() < PATIENCE {
                if !info {
                    match meta_leader(&client).await {
                        Ok(()) => info = true,
                        Err(e) => last = e,
                    }
                }
                if info {
                    let probe = stream::Config {
                        name: "PROBE".to_owned(),
                        subjects: vec!["probe".to_owned()],
                        num_replicas: NODES,
                        ..Default::default()
                    };
                    match js.create_stream(probe).await {
                        Ok(_) => {
                            js.delete_stream("PROBE").await?;
                            return Ok::<_, Box<dyn Error>>(None);
                        }
                        Err(e) => last = format!("creating an R{NODES} stream: {e}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Some(last))
        })?;
        match waited {
            None => Ok(()),
            Some(last) => Err(self.failure(&format!(
                "the cluster had no JetStream meta leader within {PATIENCE:?} ({last})"
            ))),
        }
    }

    /// The client URLs of every server but `except`.
    fn urls(&self, except: Option<usize>) -> Vec<String> {
        (0..NODES)
            .filter(|&i| Some(i) != except)
            .map(|i| self.nodes[i].url())
            .collect()
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// An error carrying `what` and every server's log.
    fn failure(&self, what: &str) -> Box<dyn Error> {
        let logs: Vec<String> = self.nodes.iter().map(Node::log).collect();
        format!("{what}\n{}", logs.join("\n")).into()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
        }
    }
}

/// Whether JetStream answers `$JS.API.INFO` within a second without an error: the cluster
/// has a meta leader (a request without one goes unanswered).
async fn meta_leader(client: &async_nats::Client) -> Result<(), String> {
    let asked = tokio::time::timeout(
        Duration::from_secs(1),
        client.request("$JS.API.INFO", "".into()),
    )
    .await
    .map_err(|_| "$JS.API.INFO: no answer within 1 s".to_owned())?
    .map_err(|e| format!("$JS.API.INFO: {e}"))?;
    let body: serde_json::Value =
        serde_json::from_slice(&asked.payload).map_err(|e| format!("$JS.API.INFO: {e}"))?;
    match body.get("error") {
        None => Ok(()),
        Some(error) => Err(format!("$JS.API.INFO: {error}")),
    }
}

/// `n` distinct ports free on loopback: bound all at once (so none repeats), then released.
fn free_ports(n: usize) -> Fallible<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()?)
}

/// Where a stream is kept: its replica count, its leader, and every peer (the leader and its
/// followers).
struct Placement {
    replicas: usize,
    leader: Option<String>,
    peers: BTreeSet<String>,
}

/// What the cluster at `urls` says of each of `streams` (a request unanswered within `limit`
/// fails: a stream without a leader does not answer).
fn placements(urls: &[String], streams: &[String], limit: Duration) -> Fallible<Vec<Placement>> {
    common::nats::runtime().block_on(async {
        let client = async_nats::connect(urls).await?;
        let mut js = jetstream::new(client);
        js.set_timeout(limit);
        let mut all = Vec::new();
        for name in streams {
            let mut stream = js.get_stream(name).await?;
            let info = stream.info().await?;
            let cluster = info.cluster.clone().unwrap_or_default();
            let mut peers: BTreeSet<String> =
                cluster.replicas.iter().map(|p| p.name.clone()).collect();
            peers.extend(cluster.leader.clone());
            all.push(Placement {
                replicas: info.config.num_replicas,
                leader: cluster.leader,
                peers,
            });
        }
        Ok(all)
    })
}

/// Waits until the cluster at `urls` has a meta leader and every one of `streams` a leader
/// other than `gone` (Raft elections after the kill); returns the streams' leaders.
fn until_led(urls: &[String], streams: &[String], gone: &str) -> Fallible<Vec<String>> {
    let started = Instant::now();
    loop {
        let meta = common::nats::runtime().block_on(async {
            let client = async_nats::connect(urls).await.map_err(|e| e.to_string())?;
            meta_leader(&client).await
        });
        let why = match meta.map(|()| placements(urls, streams, Duration::from_secs(1))) {
            Ok(Ok(all)) => {
                let leaders: Vec<String> = all.into_iter().filter_map(|p| p.leader).collect();
                if leaders.len() == streams.len() && leaders.iter().all(|l| l != gone) {
                    return Ok(leaders);
                }
                format!("leaders {leaders:?}")
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => e,
        };
        if started.elapsed() > PATIENCE {
            return Err(format!("no new leaders within {PATIENCE:?}: {why}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Restores from `source` into `new`, again after a failure to fetch the snapshot only, at
/// most [`RESTORE_ATTEMPTS`] times; returns what it restored and how many attempts failed.
///
/// Why again: the snapshot is an object, and async-nats reads an object's chunks through an
/// ephemeral ordered consumer. NATS 2.9 places that consumer on any of the bucket's three
/// peers, the killed one included, for as long as it is down: about one creation in three
/// is never answered, and the fetch fails at the replica's time limit. The frames are read
/// by direct get and are not affected. A restore leaves nothing at its destination and says
/// to run it again; every other error fails the test.
fn restore(source: &JetStream, new: &Path) -> Fallible<(Restored, usize)> {
    let mut failed = 0;
    loop {
        match Store::restore(source, new, Takeover::Yes) {
            Ok(restored) => return Ok((restored, failed)),
            Err(RestoreError::Replica(ReplicaError::Unreachable { detail }))
                if detail.contains("fetching the snapshot") && failed + 1 < RESTORE_ATTEMPTS =>
            {
                let left = std::fs::read_dir(new).map_or(0, |d| d.count());
                assert_eq!(left, 0, "a failed restore left {left} files at {new:?}");
                failed += 1;
                println!("restore attempt {failed} failed: {detail}");
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Not a test on its own: the box, run as a child process by the test below. Writes pairs
/// from several threads and prints `ack <key>` once the store acknowledged one, until killed.
#[test]
#[ignore = "the box process started by the cluster test"]
fn cluster_box_process() -> TestResult {
    let (Ok(dir), Ok(urls)) = (std::env::var(BOX_DIR), std::env::var(BOX_URLS)) else {
        return Ok(());
    };
    let replica = JetStream::connect(&urls, NAME)?
        .replicas(NODES)
        .timeout(REPLICA_TIMEOUT);
    let store = builder(&clock())
        .ship(replica, Shipping::Sync(Unreachable::Refuse))
        .open(&dir)?;
    let writers: Vec<_> = (0..WRITERS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0u64.. {
                    let key = format!("t{t}-{i}");
                    match pair(&store, &key) {
                        Ok(()) => println!("ack {key}"),
                        Err(e) => eprintln!("refused {key}: {e}"),
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().map_err(|_| "a writer panicked")?;
    }
    Ok(())
}

/// Claims `key` and commits it with one order row.
fn pair(store: &Store, key: &str) -> Fallible<()> {
    match store.begin(&scope(key), fp(key))? {
        Begin::Claimed(claim) => {
            let row = key.to_owned();
            claim.commit(move |tx| {
                tx.insert(&ORDERS, row.as_str(), "order")?;
                Ok(Response::new(201, row.clone().into_bytes()))
            })?;
            Ok(())
        }
        other => Err(format!("{key}: expected a claim, got {other:?}").into()),
    }
}

/// The box process and the acknowledgements it printed.
struct BoxProcess {
    process: Option<Child>,
    lines: mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
    stderr: PathBuf,
    acknowledged: BTreeSet<String>,
}

impl BoxProcess {
    fn start(dir: &Path, stderr: PathBuf, urls: &str) -> Fallible<BoxProcess> {
        let mut process = Command::new(std::env::current_exe()?)
            .args([
                crate::child_test!("cluster_box_process").as_str(),
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(BOX_DIR, dir)
            .env(BOX_URLS, urls)
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr)?)
            .spawn()?;
        let stdout = process.stdout.take().ok_or("no stdout")?;
        let (send, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(BoxProcess {
            process: Some(process),
            lines,
            reader: Some(reader),
            stderr,
            acknowledged: BTreeSet::new(),
        })
    }

    fn record(&mut self, line: &str) {
        if let Some(key) = line.strip_prefix("ack ") {
            self.acknowledged.insert(key.to_owned());
        }
    }

    /// Waits until the box acknowledged `n` pairs.
    fn until_acknowledged(&mut self, n: usize) -> Fallible<()> {
        let deadline = Instant::now() + PATIENCE;
        while self.acknowledged.len() < n {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => self.record(&line),
                Err(e) => {
                    let stderr = std::fs::read_to_string(&self.stderr).unwrap_or_default();
                    let tail: String = stderr.lines().rev().take(20).collect::<Vec<_>>().join("\n");
                    return Err(format!(
                        "the box acknowledged {} of {n} pairs ({e}); its stderr, last lines first:\n{tail}",
                        self.acknowledged.len()
                    )
                    .into());
                }
            }
        }
        Ok(())
    }

    /// SIGKILL, then every acknowledgement it printed before it died.
    fn kill(&mut self) -> Fallible<()> {
        if let Some(mut process) = self.process.take() {
            process.kill()?;
            process.wait()?;
        }
        if let Some(reader) = self.reader.take() {
            reader.join().map_err(|_| "the box's reader panicked")?;
        }
        while let Ok(line) = self.lines.try_recv() {
            self.record(&line);
        }
        Ok(())
    }
}

impl Drop for BoxProcess {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}

#[test]
fn losing_the_box_and_one_nats_node_at_once_loses_nothing_acknowledged_with_sync_refuse()
-> TestResult {
    let began = Instant::now();
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(&dir.path().join("nats"))?;
    let formed = began.elapsed();
    let all = cluster.urls(None);

    // One URL: `JetStream::connect` documents "several separated by commas" but hands the
    // string to async-nats as one URL, which refuses it ("invalid port number").
    let old = dir.path().join("old");
    let mut lost_box = BoxProcess::start(&old, dir.path().join("box.stderr"), &all[0])?;
    lost_box.until_acknowledged(ACKNOWLEDGED)?;

    // Three copies of everything the store made, on three different servers.
    let streams = [
        format!("IDEMSTORE_LOG_{NAME}"),
        format!("KV_IDEMSTORE_WRITER_{NAME}"),
        format!("OBJ_IDEMSTORE_SNAP_{NAME}"),
    ];
    let placed = placements(&all, &streams, Duration::from_secs(5))
        .map_err(|e| cluster.failure(&format!("the store's streams: {e}")))?;
    for (stream, placement) in streams.iter().zip(&placed) {
        assert_eq!(placement.replicas, NODES, "{stream}: num_replicas");
        assert_eq!(
            placement.peers.len(),
            NODES,
            "{stream}: peers {:?}",
            placement.peers
        );
    }
    let leader = placed[0]
        .leader
        .clone()
        .ok_or("the log stream has no leader")?;
    let victim = cluster
        .index(&leader)
        .ok_or_else(|| format!("the log stream's leader {leader:?} is not one of the servers"))?;

    // At once: the stream leader and the box, mid-write.
    let killed = Instant::now();
    cluster.nodes[victim].kill()?;
    lost_box.kill()?;
    let acknowledged = lost_box.acknowledged.clone();
    println!(
        "killed {leader} (the log stream's leader) and the box after {} acknowledged pairs",
        acknowledged.len()
    );
    assert!(acknowledged.len() >= ACKNOWLEDGED);
    std::fs::remove_dir_all(&old)?;

    // The streams the killed server led elect new leaders among the survivors (a few
    // seconds of Raft election); a JetStream request sent meanwhile goes unanswered, and a
    // restore does not retry one, so the new box is restored once the survivors lead.
    let survivors = cluster.urls(Some(victim));
    let leaders = until_led(&survivors, &streams, &leader)?;
    let elected = killed.elapsed();
    println!("new leaders {leaders:?} {elected:?} after the kill");
    let source = JetStream::connect(&survivors[0], NAME)?
        .replicas(NODES)
        .timeout(RESTORE_TIMEOUT);
    let new = dir.path().join("new");
    let (restored, failed) = restore(&source, &new).map_err(|e| cluster.failure(&e.to_string()))?;
    println!(
        "restored {restored:?} {:?} after the kill, {failed} failed attempts before",
        killed.elapsed()
    );
    assert!(restored.took_over, "{restored:?}");
    assert_eq!(restored.guarantee, Guarantee::Complete, "{restored:?}");
    drop(source);

    // Every acknowledged pair is there, and the new box ships on to the two survivors.
    let replica = JetStream::connect(&survivors[0], NAME)?
        .replicas(NODES)
        .timeout(REPLICA_TIMEOUT);
    let store = builder(&clock())
        .ship(replica, Shipping::Sync(Unreachable::Refuse))
        .open(&new)?;
    let mut lost = Vec::new();
    for key in &acknowledged {
        match store.begin(&scope(key), fp(key))? {
            Begin::Replay(response) => assert_eq!(response.status(), 201, "{key}"),
            other => lost.push(format!("{key}: {other:?}")),
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged pairs lost: {lost:?}",
        lost.len(),
        acknowledged.len()
    );
    assert!(order_count(&store)? >= acknowledged.len() as u64);
    pair(&store, "after-the-restore")?;
    drop(store);
    println!(
        "cluster formed in {formed:?}; {} acknowledged pairs, 0 lost; whole test {:?}",
        acknowledged.len(),
        began.elapsed()
    );
    Ok(())
}
