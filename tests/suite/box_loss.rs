//! The loss of the box, with real processes and a real NATS JetStream (issue 31): the edge
//! service ships its store's log to JetStream while three clients charge; it is SIGKILLed, its
//! directory deleted, and a new one restored from the stream (`EDGE_RESTORE=1`) in a new
//! directory serves the clients' retries. And NATS stopped, silent and back under load, then
//! the box lost. `shipping.rs` plays the same against a replica in memory.
//!
//! What the tests check is what a paying client cares about: every charge answered 201 is on
//! the new box, and a retry of it is a replay (or, after asynchronous shipping, a recovery that
//! finds the charge at the processor), never a second charge; a request the kill left without
//! an answer gets one when retried; and the simulated processor's ledger, kept outside the
//! lost directory as a real processor's is, holds exactly one charge per key.
//!
//! NATS itself is never stopped (other tests share it): the service reaches it through a proxy
//! (`common::proxy`) that refuses connections (NATS stopped), holds them open and silent, or
//! passes them. Leases end on the service's manual clock (`EDGE_MANUAL_CLOCK=1`); nothing
//! sleeps for one. Each test ships to a stream of its own and deletes the stream and its
//! buckets at the end, failed or not. NATS must be up (`common::nats`): an unreachable server
//! fails the tests, never skips them.

use crate::common;

use crate::edge_service;

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;

use common::TestResult;
use common::nats::{unique, url};
use common::proxy::{Arrivals, Cut, Proxy};
use common::service::{Answer, PATIENCE, Service};

pub(super) type Fallible<T> = Result<T, Box<dyn Error>>;

const ALICE: &str = "Bearer sk_test_alice";
const OPERATOR_TOKEN: &str = "sk_test_operator";
const OPERATOR: &str = "Bearer sk_test_operator";
/// The service's lease (its default, `EDGE_LEASE_SECS`): a retry past it recovers the claim.
const LEASE_SECS: u64 = 30;
/// Bytes only the log frame that commits a charge holds: the charge's JSON, in its response
/// and its `charges.created` event.
const COMMIT_OF_A_CHARGE: &[u8] = br#""processor_charge":"#;
/// Clients charging at once.
const CLIENTS: usize = 3;
/// Charges acknowledged before a box is lost or NATS goes away.
const WARM_UP: usize = 60;
/// How soon after NATS returns the service must take charges again and the replica hold
/// every frame: a synchronous store's longest self-heal backoff (30 s, `SelfHeal::default`),
/// NATS's reconnect backoff (4 s) and the shipper's (5 s), each of which may be at its longest
/// after an outage.
const RESUME_WITHIN: Duration = Duration::from_secs(45);
/// The problem types a charge refused while the replica is away may carry: the store refused
/// the claim or the commit, or did not answer within the layer's limit.
const REFUSALS: [&str; 2] = [
    "urn:idemstore:problem:idempotency-store-unavailable",
    "urn:idemstore:problem:idempotency-store-timeout",
];

/// Not a test: the edge service process the tests start.
#[test]
#[ignore = "the service process started by the other tests"]
fn service_process() {
    if std::env::var_os("EDGE_SERVICE_CHILD").is_some() {
        edge_service::main().expect("the service runs");
    }
}

/// `EDGE_SHIP_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// `sync`: a charge is answered only once JetStream holds it; refused while it is away.
    Sync,
    /// `async`: answered after the local sync; the stream follows behind.
    Async,
}

impl Mode {
    fn env(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Async => "async",
        }
    }

    /// What a store restored from a stream shipped in this mode knows it may lack.
    fn guarantee(self) -> &'static str {
        match self {
            Mode::Sync => "complete",
            Mode::Async => "may-lag",
        }
    }
}

/// A stream name of the test's own; its stream and buckets are deleted when it drops, also
/// after a failure.
pub(super) struct Scratch {
    pub(super) name: String,
}

impl Scratch {
    /// Fails, saying how to start NATS, if it is unreachable.
    pub(super) fn new() -> Scratch {
        common::nats::require();
        Scratch {
            name: unique("box"),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        common::nats::drop_replica(&self.name);
    }
}

/// The proxy between the service and NATS, on a runtime of its own.
pub(super) struct Net {
    proxy: Proxy,
    _runtime: tokio::runtime::Runtime,
}

impl Net {
    pub(super) fn start() -> Fallible<Net> {
        let nats = url();
        let first = nats
            .trim_start_matches("nats://")
            .split(',')
            .next()
            .unwrap_or_default()
            .to_owned();
        let upstream: SocketAddr = first
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| format!("{nats} resolves to no address"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let proxy = runtime.block_on(Proxy::start(upstream))?;
        Ok(Net {
            proxy,
            _runtime: runtime,
        })
    }

    /// The NATS URL through the proxy.
    pub(super) fn url(&self) -> String {
        self.proxy.url(&url())
    }

    /// NATS stops: its connections close and new ones are refused.
    pub(super) fn stop(&self) {
        self.proxy.arrivals(Arrivals::Refuse);
        self.proxy.drop_all();
    }

    /// NATS goes silent: connections stay open (new ones too) and nothing is answered.
    fn silence(&self) {
        self.proxy.arrivals(Arrivals::Hold);
        self.proxy.hold_all();
    }

    /// NATS goes silent the moment the service sends `bytes` on its connection: they never
    /// arrive, nor anything after them, and new connections are held too.
    fn silence_at(&self, bytes: &[u8]) -> TestResult {
        let ports = self.proxy.ports();
        let [port] = ports[..] else {
            return Err(format!(
                "the service has {} connections to NATS, not one",
                ports.len()
            )
            .into());
        };
        self.proxy.arrivals(Arrivals::Hold);
        if !self.proxy.hold_on(port, bytes, Cut::Before) {
            return Err("the service's connection to NATS closed".into());
        }
        until("the bytes to be sent", PATIENCE, || {
            Ok(self.proxy.is_held(port))
        })?;
        Ok(())
    }

    /// NATS is back. Connections held silent are closed (what they lost in between would
    /// garble the protocol; a client reconnects, as it would after a long partition).
    pub(super) fn heal(&self) {
        self.proxy.arrivals(Arrivals::Pass);
        self.proxy.drop_all();
    }
}

/// What every box of one test shares: the stream, the mode, the processor's ledger.
pub(super) struct Setup {
    pub(super) stream: String,
    pub(super) mode: Mode,
    pub(super) ledger: PathBuf,
}

impl Setup {
    /// Starts a box with its store in `data`, shipping to `ship` (a NATS URL); restored from
    /// the stream first if `restore`.
    pub(super) fn start(&self, data: &Path, ship: &str, restore: bool) -> Fallible<Service> {
        let ledger = self
            .ledger
            .to_str()
            .ok_or("a ledger path that is not UTF-8")?;
        let mut env = vec![
            ("EDGE_LATENCY_MS", "20"),
            ("EDGE_ADMIN_TOKEN", OPERATOR_TOKEN),
            ("EDGE_MANUAL_CLOCK", "1"),
            ("EDGE_SHIP", ship),
            ("EDGE_SHIP_STREAM", self.stream.as_str()),
            ("EDGE_SHIP_MODE", self.mode.env()),
            ("EDGE_PROCESSOR_LEDGER", ledger),
        ];
        if restore {
            env.push(("EDGE_RESTORE", "1"));
        }
        Service::start(&crate::child_test!("service_process"), data, &env)
    }
}

impl Answer {
    /// The charge's id and the processor's charge id, from a 201's body.
    pub(super) fn charge(&self) -> Fallible<(String, String)> {
        let json = self.json()?;
        let field = |name: &str| {
            json[name]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("no {name} in {}", self.body))
        };
        Ok((field("id")?, field("processor_charge")?))
    }
}

/// A client of one service: charges, reads, and the test clock.
pub(super) struct Client {
    agent: ureq::Agent,
    base: String,
}

impl Client {
    pub(super) fn new(base: &str) -> Client {
        Client {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(30)))
                .build()
                .into(),
            base: base.to_owned(),
        }
    }

    /// `POST /charges` as tenant alice.
    pub(super) fn charge(&self, key: &str, body: &str) -> Result<Answer, ureq::Error> {
        Answer::read(
            self.agent
                .post(format!("{}/charges", self.base))
                .header("authorization", ALICE)
                .header("idempotency-key", key)
                .content_type("application/json")
                .send(body)?,
        )
    }

    fn get(&self, path: &str, auth: &str) -> Result<Answer, ureq::Error> {
        Answer::read(
            self.agent
                .get(format!("{}{path}", self.base))
                .header("authorization", auth)
                .call()?,
        )
    }

    /// The operator's view of `/stats`.
    pub(super) fn stats(&self) -> Fallible<Value> {
        let answer = self.get("/stats", OPERATOR)?;
        if answer.status != 200 {
            return Err(format!("/stats: {} {}", answer.status, answer.body).into());
        }
        answer.json()
    }

    /// The store's log shipping, from `/stats`.
    pub(super) fn shipping(&self) -> Fallible<Value> {
        let shipping = self.stats()?["store"]["shipping"].clone();
        if shipping.is_null() {
            return Err("/stats shows no shipping: the service does not ship".into());
        }
        Ok(shipping)
    }

    /// Moves the service's manual clock past a lease.
    fn past_lease(&self) -> Fallible<()> {
        let mut answer = self
            .agent
            .post(format!(
                "{}/_test/clock?advance_secs={}",
                self.base,
                LEASE_SECS + 1
            ))
            .send_empty()?;
        if answer.status().as_u16() != 200 {
            return Err(format!(
                "advancing the clock: {}",
                answer.body_mut().read_to_string()?
            )
            .into());
        }
        Ok(())
    }
}

pub(super) fn charge_body(client: usize, i: usize) -> String {
    format!(
        r#"{{"amount": {}, "currency": "eur", "customer": "cus_{client}"}}"#,
        100 + i
    )
}

/// One request a client sent, and what came of it.
#[derive(Debug, Clone)]
struct Sent {
    key: String,
    body: String,
    at: Instant,
    answered_at: Instant,
    /// `None`: no answer (the connection failed: the box died).
    answer: Option<Answer>,
}

/// What a client does after an answer other than 201.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Nothing: on to the next key. A client stops when the service stops answering.
    Never,
    /// The same key again (past the lease first after a 409) until it is charged, however
    /// long NATS is away; on stop, the key in hand is finished first.
    UntilCharged,
}

/// [`CLIENTS`] clients charging at once, each one request at a time with keys of its own,
/// every request recorded.
struct Load {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Sent>>>,
    clients: Vec<JoinHandle<Result<(), String>>>,
}

impl Load {
    fn start(base: &str, retry: Retry) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let clients = (0..CLIENTS)
            .map(|c| {
                let (stop, log, client) = (stop.clone(), log.clone(), Client::new(base));
                std::thread::spawn(move || charge_on(c, &client, retry, &stop, &log))
            })
            .collect();
        Load { stop, log, clients }
    }

    /// Keys answered 201 so far.
    fn charged(&self) -> usize {
        self.log
            .lock()
            .iter()
            .filter(|s| s.answer.as_ref().is_some_and(|a| a.status == 201))
            .count()
    }

    /// Every request sent so far.
    fn log(&self) -> Vec<Sent> {
        self.log.lock().clone()
    }

    /// Requests sent after `since`.
    fn sent_since(&self, since: Instant) -> Vec<Sent> {
        self.log
            .lock()
            .iter()
            .filter(|s| s.at > since)
            .cloned()
            .collect()
    }

    /// Stops the clients (each finishes its key first with [`Retry::UntilCharged`]); every
    /// request they sent.
    fn stop(self) -> Fallible<Vec<Sent>> {
        self.stop.store(true, Ordering::SeqCst);
        for client in self.clients {
            client.join().map_err(|_| "a client panicked")??;
        }
        let log = self.log.lock().clone();
        Ok(log)
    }
}

/// Client `c`'s loop: key `charge-c{c}-{i:05}` for i = 0, 1, ...
fn charge_on(
    c: usize,
    client: &Client,
    retry: Retry,
    stop: &AtomicBool,
    log: &Mutex<Vec<Sent>>,
) -> Result<(), String> {
    for i in 0.. {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (key, body) = (format!("charge-c{c}-{i:05}"), charge_body(c, i));
        let mut stopped_at: Option<Instant> = None;
        loop {
            let at = Instant::now();
            let answer = client.charge(&key, &body).ok();
            log.lock().push(Sent {
                key: key.clone(),
                body: body.clone(),
                at,
                answered_at: Instant::now(),
                answer: answer.clone(),
            });
            let Some(answer) = answer else {
                return match retry {
                    Retry::Never => Ok(()), // the box is gone
                    Retry::UntilCharged => Err(format!("{key}: the service stopped answering")),
                };
            };
            if answer.status == 201 || retry == Retry::Never {
                break;
            }
            if stop.load(Ordering::SeqCst) {
                let since = *stopped_at.get_or_insert_with(Instant::now);
                if since.elapsed() > PATIENCE {
                    return Err(format!(
                        "{key}: not charged {PATIENCE:?} after the load stopped; last answer {answer:?}"
                    ));
                }
            }
            if answer.status == 409 {
                client.past_lease().map_err(|e| e.to_string())?;
            } else {
                // A client's pace between retries; no lease is waited for here.
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(())
}

/// Every key the clients sent, with its body and the first 201 it got (none if the box died
/// first).
#[derive(Debug, Clone)]
struct Key {
    body: String,
    first_sent: Instant,
    charged: Option<Answer>,
}

fn keys(log: &[Sent]) -> BTreeMap<String, Key> {
    let mut keys: BTreeMap<String, Key> = BTreeMap::new();
    for sent in log {
        let key = keys.entry(sent.key.clone()).or_insert_with(|| Key {
            body: sent.body.clone(),
            first_sent: sent.at,
            charged: None,
        });
        if let Some(answer) = sent.answer.as_ref().filter(|a| a.status == 201)
            && key.charged.is_none()
        {
            key.charged = Some(answer.clone());
        }
    }
    keys
}

/// How a key came through the new box.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Came {
    /// The old box's answer, replayed byte for byte.
    Replay,
    /// The charge found at the processor (the stream lacked it): 201 with the same processor
    /// charge, not a replay.
    Recovery,
    /// The old box never answered it, and the new box did not know it: answered at once.
    InFlight,
    /// The old box never answered it, and its claim was in the stream: in progress on the
    /// new box until its lease ended, then recovered.
    InFlightClaimed,
}

/// Polls `check` until it holds, for at most `within`; how long it took.
pub(super) fn until(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Fallible<bool>,
) -> Fallible<Duration> {
    let started = Instant::now();
    loop {
        if check()? {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            return Err(format!("waited {within:?} for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The box restored from a stream shipped in `mode` says so in `/stats`.
fn check_restore_window(new: &Client, mode: Mode) -> TestResult {
    let stats = new.stats()?;
    let window = &stats["store"]["restore_window"];
    assert_eq!(
        window["guarantee"],
        mode.guarantee(),
        "the restored box's window: {stats}"
    );
    Ok(())
}

/// Retries every key on the restored box `new` until it is answered: a key the old box
/// answered 201 must be replayed, or, where `recoveries_allowed`, recovered (201 with the same
/// processor charge); a key it never answered must be answered 201. Every key is tried once
/// with the clock untouched (so that a claim restored in progress answers 409), then the ones
/// in progress again past their lease. Checks that the new box shows a charge before the retry
/// exactly when it replays it, and after, that every key replays its final answer and shows
/// its charge. The final answers, and how each key came.
fn retry_on_new_box(
    new: &Client,
    keys: &BTreeMap<String, Key>,
    recoveries_allowed: bool,
) -> Fallible<(BTreeMap<String, Answer>, BTreeMap<String, Came>)> {
    let mut first = BTreeMap::new();
    let mut shown = BTreeMap::new();
    for (key, sent) in keys {
        if let Some(original) = &sent.charged {
            let (id, _) = original.charge()?;
            shown.insert(key, new.get(&format!("/charges/{id}"), ALICE)?);
        }
        first.insert(key, new.charge(key, &sent.body)?);
    }
    let mut finals = BTreeMap::new();
    let mut came = BTreeMap::new();
    let mut past_lease = false;
    for (key, sent) in keys {
        let answer = &first[key];
        let mut last = answer.clone();
        let in_progress = answer.status == 409;
        for _ in 0..4 {
            if last.status != 409 {
                break;
            }
            if !past_lease {
                new.past_lease()?;
                past_lease = true;
            }
            last = new.charge(key, &sent.body)?;
            if last.status == 409 {
                new.past_lease()?;
            }
        }
        let how = match &sent.charged {
            None if last.status == 201 && in_progress => Came::InFlightClaimed,
            None if last.status == 201 => Came::InFlight,
            Some(original)
                if !in_progress
                    && last.status == 201
                    && last.replayed
                    && last.body == original.body =>
            {
                Came::Replay
            }
            Some(original)
                if recoveries_allowed
                    && last.status == 201
                    && !last.replayed
                    && last.charge()? == original.charge()? =>
            {
                Came::Recovery
            }
            _ => {
                return Err(format!(
                    "{key}: the old box answered {:?}; the new box {answer:?}, then {last:?}",
                    sent.charged
                )
                .into());
            }
        };
        if let (Some(original), Some(shown)) = (&sent.charged, shown.get(key)) {
            match (how, shown.status) {
                (Came::Replay, 200) => assert_eq!(shown.body, original.body, "{key}: the charge"),
                (Came::Recovery, 404) => {}
                (how, status) => {
                    return Err(format!(
                        "{key}: its charge answered {status} before a retry that came as {how:?}"
                    )
                    .into());
                }
            }
        }
        // A recovery stores its own answer (its attempt may differ), which retries replay.
        finals.insert(key.clone(), last);
        came.insert(key.clone(), how);
    }
    // Every key now replays, and its charge is there.
    for (key, answer) in &finals {
        let again = new.charge(key, &keys[key].body)?;
        assert!(
            again.status == 201 && again.replayed && again.body == answer.body,
            "{key}: a second retry on the new box is not the replay of {answer:?}: {again:?}"
        );
        let (id, _) = answer.charge()?;
        let shown = new.get(&format!("/charges/{id}"), ALICE)?;
        assert_eq!((shown.status, &shown.body), (200, &answer.body), "{key}");
    }
    Ok((finals, came))
}

/// The processor's ledger: one line per charge it made (it never makes two for one key).
fn ledger(path: &Path) -> Fallible<Vec<Value>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .map(|line| serde_json::from_str(line).map_err(Into::into))
        .collect()
}

/// One side effect per key: the processor made as many charges as the clients sent keys,
/// each key's answer names a charge of its own, and they are the ledger's charges.
fn check_side_effects(
    new: &Client,
    ledger_path: &Path,
    finals: &BTreeMap<String, Answer>,
) -> TestResult {
    let charges = ledger(ledger_path)?;
    let made: BTreeSet<String> = charges
        .iter()
        .filter_map(|c| c["id"].as_str().map(str::to_owned))
        .collect();
    let answered: BTreeSet<String> = finals
        .values()
        .map(|a| a.charge().map(|(_, processor)| processor))
        .collect::<Fallible<_>>()?;
    assert_eq!(
        charges.len(),
        finals.len(),
        "the processor's charges against the keys sent"
    );
    assert_eq!(
        made, answered,
        "the charges the answers name are the ledger's"
    );
    let stats = new.stats()?;
    assert_eq!(
        stats["processor"]["side_effects"],
        finals.len(),
        "side effects in /stats: {stats}"
    );
    Ok(())
}

/// Charges answered while NATS was up, replayed and read (`GET /charges/{id}`, a read of the
/// store's tables) while it is away. The reads that failed, for the caller to report last.
fn replays_while_away(service: &Client, charged: &[(String, Key)]) -> Fallible<Vec<String>> {
    let mut unread = Vec::new();
    for (key, sent) in charged.iter().take(5) {
        let original = sent.charged.as_ref().ok_or("a charged key")?;
        let again = service.charge(key, &sent.body)?;
        assert!(
            again.status == 201 && again.replayed && again.body == original.body,
            "{key}: a replay while NATS is away: {again:?}"
        );
        let (id, _) = original.charge()?;
        let shown = service.get(&format!("/charges/{id}"), ALICE)?;
        if (shown.status, &shown.body) != (200, &original.body) {
            unread.push(format!(
                "GET /charges/{id}: {} {}",
                shown.status, shown.body
            ));
        }
    }
    Ok(unread)
}

/// A stream of the test's own, the proxy to NATS, and a directory for the boxes and the
/// processor's ledger (outside every box: the processor survives the box).
fn prepare(mode: Mode) -> Fallible<(Scratch, Net, tempfile::TempDir, Setup)> {
    let scratch = Scratch::new();
    let net = Net::start()?;
    let dir = tempfile::tempdir()?;
    let setup = Setup {
        stream: scratch.name.clone(),
        mode,
        ledger: dir.path().join("processor-ledger.jsonl"),
    };
    Ok((scratch, net, dir, setup))
}

#[test]
fn box_lost_under_load_with_synchronous_shipping_keeps_every_charge_and_charges_each_key_once()
-> TestResult {
    box_lost(Mode::Sync)
}

#[test]
fn box_lost_under_load_with_asynchronous_shipping_recovers_what_the_stream_lacks_from_the_processor()
-> TestResult {
    box_lost(Mode::Async)
}

/// Three clients charge until [`WARM_UP`] charges are answered; then the stream goes silent
/// for the last stretch before the kill. Synchronously, nothing can be answered from then on:
/// the stream goes silent as the commit of a charge the processor made is on its way (the
/// request most at risk of a second charge), and the box is killed. Asynchronously, the box
/// goes on answering: it is killed once it answered charges the stream lacks. Its directory is deleted, and a
/// new box restored from the stream answers every retry.
fn box_lost(mode: Mode) -> TestResult {
    let started = Instant::now();
    // The stream is deleted when `_scratch` goes, at the end of the test.
    let (_scratch, net, dir, setup) = prepare(mode)?;
    let old_dir = dir.path().join("old-box");
    let old = setup.start(&old_dir, &net.url(), false)?;
    let load = Load::start(&old.base, Retry::Never);
    until("the first charges", PATIENCE, || {
        Ok(load.charged() >= WARM_UP)
    })?;

    let held = match mode {
        Mode::Sync => {
            // The first commit of a charge sent after this never reaches NATS: the processor
            // has made the charge, and the box cannot answer it.
            net.silence_at(COMMIT_OF_A_CHARGE)?;
            Instant::now()
        }
        Mode::Async => {
            net.silence();
            let held = Instant::now();
            let before = load.charged();
            let watch = Client::new(&old.base);
            until("charges acknowledged past the stream", PATIENCE, || {
                let lag = watch.shipping()?["lag_frames"].as_u64().unwrap_or(0);
                Ok(load.charged() >= before + 20 && lag > 0)
            })?;
            held
        }
    };
    old.kill()?; // SIGKILL, with the clients' requests in flight
    let log = load.stop()?;
    std::fs::remove_dir_all(&old_dir)?;

    let sent = keys(&log);
    let answered = sent.values().filter(|k| k.charged.is_some()).count();
    // Charges the processor made for requests the old box never answered.
    let charged_unanswered = ledger_lines(&setup.ledger)? - answered;
    for request in &log {
        let Some(answer) = &request.answer else {
            continue;
        };
        match (mode, answer.status) {
            // Synchronously, only what was sent before the stream went silent.
            (Mode::Sync, 201) => assert!(
                request.at < held,
                "{}: answered 201 while the stream was silent",
                request.key
            ),
            (Mode::Async, 201) => {}
            // A commit that waited past its time limit for the silent stream: unknown.
            (Mode::Sync, 503) if request.answered_at > held => {}
            _ => panic!("{}: the old box answered {answer:?}", request.key),
        }
    }
    let new_box = setup.start(&dir.path().join("new-box"), &url(), true)?;
    let new = Client::new(&new_box.base);
    check_restore_window(&new, mode)?;
    let (finals, came) = retry_on_new_box(&new, &sent, mode == Mode::Async)?;

    let count = |how: Came| came.values().filter(|c| **c == how).count();
    let (replays, recoveries, claimed) = (
        count(Came::Replay),
        count(Came::Recovery),
        count(Came::InFlightClaimed),
    );
    let in_flight = count(Came::InFlight) + claimed;
    println!(
        "box loss ({}): {} keys, {replays} replayed, {recoveries} recovered from the processor, {in_flight} in flight at the kill ({claimed} in progress on the new box, {charged_unanswered} charged by the processor); {:?}",
        mode.env(),
        sent.len(),
        started.elapsed()
    );
    assert!(in_flight >= 1, "no request was in flight at the kill");
    match mode {
        Mode::Sync => {
            assert!(
                charged_unanswered >= 1,
                "the kill found no charge made and not answered"
            );
            // A charge is made only once its claim is in the stream.
            assert!(
                claimed >= charged_unanswered,
                "{charged_unanswered} charged and not answered, {claimed} claims restored"
            );
        }
        Mode::Async => {
            // Sent after the stream went silent: only the processor knows of these charges.
            for (key, s) in &sent {
                if s.first_sent > held && s.charged.is_some() {
                    assert_eq!(
                        came[key],
                        Came::Recovery,
                        "{key}: sent after the stream was held"
                    );
                }
            }
            assert!(
                recoveries >= 1,
                "no retry was answered by a recovery: the stream did not lag"
            );
        }
    }
    check_side_effects(&new, &setup.ledger, &finals)
}

/// The charges in the processor's ledger so far (its complete lines: it may be appending).
fn ledger_lines(path: &Path) -> Fallible<usize> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(bytes.iter().filter(|b| **b == b'\n').count()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// How NATS goes away.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Connections closed, new ones refused.
    Stopped,
    /// Connections open, nothing answered.
    Silent,
}

#[test]
fn nats_stopped_and_silent_under_load_with_synchronous_shipping_refuses_charges_then_resumes()
-> TestResult {
    nats_away(Mode::Sync)
}

#[test]
fn nats_stopped_and_silent_under_load_with_asynchronous_shipping_charges_on_and_catches_up()
-> TestResult {
    nats_away(Mode::Async)
}

/// Three clients charge (each retrying a key until it is charged) while NATS stops, returns,
/// goes silent and returns; then, shipping caught up, the box is lost and a new one restored
/// replays every charge.
fn nats_away(mode: Mode) -> TestResult {
    let started = Instant::now();
    // The stream is deleted when `_scratch` goes, at the end of the test.
    let (_scratch, net, dir, setup) = prepare(mode)?;
    let box_dir = dir.path().join("box");
    let service = setup.start(&box_dir, &net.url(), false)?;
    let client = Client::new(&service.base);
    let load = Load::start(&service.base, Retry::UntilCharged);
    until("the first charges", PATIENCE, || {
        Ok(load.charged() >= WARM_UP)
    })?;

    let (mut refusals, mut unread) = (Vec::new(), Vec::new());
    for fault in [Fault::Stopped, Fault::Silent] {
        let outage = away(mode, fault, &net, &client, &load)?;
        refusals.extend(outage.refusals);
        unread.extend(outage.unread);
    }
    let log = load.stop()?;
    let caught_up = until("shipping to catch up", PATIENCE, || {
        let shipping = client.shipping()?;
        Ok(shipping["state"] == "shipping" && shipping["lag_frames"] == 0)
    })?;
    println!("caught up {caught_up:?} after the load stopped");
    for request in &log {
        let Some(answer) = &request.answer else {
            return Err(format!("{}: no answer: {request:?}", request.key).into());
        };
        let allowed: &[u16] = match mode {
            Mode::Sync => &[201, 409, 503],
            Mode::Async => &[201],
        };
        assert!(
            allowed.contains(&answer.status),
            "{}: {answer:?} ({} mode)",
            request.key,
            mode.env()
        );
    }

    service.kill()?;
    std::fs::remove_dir_all(&box_dir)
        .map_err(|e| format!("deleting the killed box's {}: {e}", box_dir.display()))?;
    let sent = keys(&log);
    let new_box = setup
        .start(&dir.path().join("new-box"), &url(), true)
        .map_err(|e| format!("starting the restored box: {e}"))?;
    let new = Client::new(&new_box.base);
    check_restore_window(&new, mode)?;
    // Shipping had caught up: every charge replays, whatever the mode.
    let (finals, came) = retry_on_new_box(&new, &sent, false)?;
    assert!(
        came.values().all(|c| *c == Came::Replay),
        "a key the old box did not answer: {came:?}"
    );
    check_side_effects(&new, &setup.ledger, &finals)?;
    println!(
        "NATS away ({}): {} keys, {} requests, every charge replayed on the restored box; {:?}",
        mode.env(),
        sent.len(),
        log.len(),
        started.elapsed()
    );
    // Last, so that everything above is checked whatever these find: reads go on while NATS
    // is away, and a charge refused because the replica is away says so.
    assert!(
        unread.is_empty(),
        "charges could not be read while NATS was away: {unread:#?}"
    );
    let silent: BTreeSet<&str> = refusals
        .iter()
        .filter(|a| !a.body.contains("replica"))
        .map(|a| a.body.as_str())
        .collect();
    assert!(
        silent.is_empty(),
        "{} of {} charges refused while the replica was away do not name it: {silent:#?}",
        refusals
            .iter()
            .filter(|a| !a.body.contains("replica"))
            .count(),
        refusals.len()
    );
    Ok(())
}

/// One outage of NATS under load, and its end. Synchronously: no charge sent during it is
/// answered 201, each is refused 503 (or 409 for a claim whose commit it cut off); replays
/// go on; charges are taken again within [`RESUME_WITHIN`] of its end. Asynchronously: charges
/// go on, the replica's lag grows, and falls back to nothing after.
fn away(mode: Mode, fault: Fault, net: &Net, service: &Client, load: &Load) -> Fallible<Outage> {
    let before: Vec<(String, Key)> = keys(&load.log())
        .into_iter()
        .filter(|(_, k)| k.charged.is_some())
        .collect();
    match fault {
        Fault::Stopped => net.stop(),
        Fault::Silent => net.silence(),
    }
    let began = Instant::now();
    match mode {
        Mode::Sync => {
            until("charges refused while NATS is away", PATIENCE, || {
                let refused = load
                    .sent_since(began)
                    .iter()
                    .filter(|s| s.answer.as_ref().is_some_and(|a| a.status == 503))
                    .count();
                Ok(refused >= 10)
            })?;
        }
        Mode::Async => {
            let mut first_lag = None;
            until("the replica's lag to grow", PATIENCE, || {
                let shipping = service.shipping()?;
                let lag = shipping["lag_frames"].as_u64().unwrap_or(0);
                let unreachable = shipping["state"] == "unreachable";
                let first = *first_lag.get_or_insert(lag);
                let charged = load
                    .sent_since(began)
                    .iter()
                    .filter(|s| s.answer.as_ref().is_some_and(|a| a.status == 201))
                    .count();
                Ok(unreachable && lag > first && charged >= 20)
            })?;
            println!("{fault:?} (async): while away {}", service.shipping()?);
        }
    }
    if mode == Mode::Sync {
        until(
            "the stats to show the replica unreachable",
            PATIENCE,
            || Ok(service.shipping()?["state"] == "unreachable"),
        )?;
        let stats = service.stats()?;
        println!(
            "{fault:?} (sync): while away, health {} and shipping {}",
            stats["health"], stats["store"]["shipping"]
        );
    }
    let unread = replays_while_away(service, &before)?;
    net.heal();
    let ended = Instant::now();

    let during: Vec<Sent> = load
        .sent_since(began)
        .into_iter()
        .filter(|s| s.answered_at < ended)
        .collect();
    until("charges taken again", RESUME_WITHIN, || {
        Ok(load
            .sent_since(ended)
            .iter()
            .any(|s| s.answer.as_ref().is_some_and(|a| a.status == 201)))
    })?;
    // From NATS's return to the first charge sent since and answered 201.
    let resumed = load
        .sent_since(ended)
        .iter()
        .filter(|s| s.answer.as_ref().is_some_and(|a| a.status == 201))
        .map(|s| s.answered_at - ended)
        .min()
        .ok_or("no charge since NATS returned")?;
    let caught_up = |what: &str| -> Fallible<Duration> {
        until(what, RESUME_WITHIN, || {
            let shipping = service.shipping()?;
            Ok(shipping["state"] == "shipping" && shipping["lag_frames"] == 0)
        })?;
        Ok(ended.elapsed())
    };
    let mut refusals = Vec::new();
    match mode {
        Mode::Sync => {
            // Refused, or (a key whose claim was taken before NATS went away and whose
            // commit was not) still in progress; never charged.
            let mut in_progress = 0;
            for sent in &during {
                let answer = sent.answer.as_ref().ok_or("no answer")?;
                let problem = answer.problem().unwrap_or_default();
                let problem = problem.as_str();
                match answer.status {
                    503 => {
                        assert!(REFUSALS.contains(&problem), "{}: {answer:?}", sent.key);
                        refusals.push(answer.clone());
                    }
                    409 => {
                        assert_eq!(problem, "urn:idemstore:problem:request-in-progress");
                        in_progress += 1;
                    }
                    _ => panic!("{} while NATS is away: {answer:?}", sent.key),
                }
            }
            let caught_up = caught_up("the replica to catch up")?;
            println!(
                "{fault:?} ({}): {} charges refused and {in_progress} in progress while away ({:?}); after NATS returned, charges taken again within {resumed:?}, the replica caught up within {caught_up:?}",
                mode.env(),
                refusals.len(),
                refusals
                    .iter()
                    .map(|a| a.problem().unwrap_or_default())
                    .collect::<BTreeSet<_>>(),
            );
        }
        Mode::Async => {
            let charged = during
                .iter()
                .filter(|s| s.answer.as_ref().is_some_and(|a| a.status == 201))
                .count();
            assert!(
                charged >= 20,
                "{fault:?}: {charged} charges while NATS was away"
            );
            let caught_up = caught_up("the lag to fall back to nothing")?;
            println!(
                "{fault:?} (async): {charged} charges answered while away; after NATS returned, the first charge within {resumed:?}, no lag within {caught_up:?}"
            );
        }
    }
    Ok(Outage { refusals, unread })
}

/// What an outage leaves for the end of its test: the charges refused while NATS was away,
/// and the reads of charges that failed meanwhile.
struct Outage {
    refusals: Vec<Answer>,
    unread: Vec<String>,
}
