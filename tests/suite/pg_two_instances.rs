//! Two edge service processes against one PostgreSQL database (`--backend postgres`), over
//! real HTTP on loopback: concurrent identical requests split across both charge once, a
//! retry on the other instance replays byte for byte, and an instance killed between the
//! processor call and the commit is recovered by the other (attempt 2) without a second
//! charge. Both instances share the simulated processor's ledger, whose lines are the side
//! effects counted here. With a relay in each (`--nats`), a kill of one leaves exactly one
//! JetStream event per charge committed in PostgreSQL. `/stats` and `/metrics` answer in the
//! same shape as on the local store.
//!
//! The children are this test binary re-executed to run only [`service_process`], as in
//! `http_service`. Lease expiry is driven by the surviving instance's manual clock
//! (a test hook); nothing sleeps to wait for a lease.

use crate::common;

use crate::edge_service;

use std::sync::{Arc, Barrier};

use common::service::Service;

use idemstore::testing::postgres::{
    database_url, drop_prefixes, pgbouncer_url, start_pgbouncer, unique_prefix, unreachable,
};
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const ALICE: &str = "Bearer sk_test_alice";
/// Not a test: the service process the tests start.
#[test]
#[ignore = "the service process started by the other tests"]
fn service_process() {
    if std::env::var_os("EDGE_SERVICE_CHILD").is_some() {
        edge_service::main().expect("the service runs");
    }
}

/// One database schema (a table prefix) and one processor ledger, shared by the instances
/// of a test; the tables are dropped at the end.
struct Shared {
    url: String,
    prefix: String,
    dir: tempfile::TempDir,
}

impl Shared {
    /// The instances' database at `url` (PostgreSQL, or PgBouncer in front of it).
    fn at(url: String) -> Result<Shared, Box<dyn std::error::Error>> {
        // Fails (never skips) when the database is not there, saying how to start it.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime
            .block_on(idemstore::sqlx::PgPool::connect(&url))
            .map_err(|e| unreachable(&url, &e).to_string())?;
        Ok(Shared {
            url,
            prefix: unique_prefix("edge"),
            dir: tempfile::tempdir()?,
        })
    }

    fn ledger(&self) -> std::path::PathBuf {
        self.dir.path().join("processor-ledger.jsonl")
    }

    /// The processor's side effects: the charges in its ledger, whoever made them.
    fn side_effects(&self) -> Result<usize, Box<dyn std::error::Error>> {
        Ok(std::fs::read_to_string(self.ledger())?
            .lines()
            .filter(|l| !l.is_empty())
            .count())
    }

    fn start(
        &self,
        name: &str,
        env: &[(&str, &str)],
    ) -> Result<Service, Box<dyn std::error::Error>> {
        let data = self.dir.path().join(name);
        std::fs::create_dir_all(&data)?;
        let mut all = vec![
            ("EDGE_BACKEND", "postgres"),
            ("EDGE_PG_URL", self.url.as_str()),
            ("EDGE_PG_PREFIX", self.prefix.as_str()),
        ];
        let ledger = self.ledger();
        let ledger = ledger.to_str().ok_or("a path in UTF-8")?;
        all.push(("EDGE_PROCESSOR_LEDGER", ledger));
        all.push(("EDGE_LATENCY_MS", "100"));
        all.extend_from_slice(env);
        Service::start(&crate::child_test!("service_process"), &data, &all)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The store's tables and the service's charges table, all under the prefix.
        drop_prefixes(&self.url, vec![self.prefix.clone()]);
    }
}

/// A charge on an instance.
fn charge(service: &Service, key: &str, body: &str) -> Result<Answer, ureq::Error> {
    charge_at(&service.agent, &service.base, key, body)
}

fn charge_at(
    agent: &ureq::Agent,
    base: &str,
    key: &str,
    body: &str,
) -> Result<Answer, ureq::Error> {
    let mut response = agent
        .post(format!("{base}/charges"))
        .header("authorization", ALICE)
        .header("idempotency-key", key)
        .content_type("application/json")
        .send(body)?;
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    Ok(Answer {
        status: response.status().as_u16(),
        replayed,
        body: response.body_mut().read_to_vec()?,
    })
}

struct Answer {
    status: u16,
    replayed: bool,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

fn charge_body(amount: u64) -> String {
    json!({"amount": amount, "currency": "eur", "customer": "cus_42"}).to_string()
}

#[test]
fn two_hundred_identical_requests_across_two_instances_charge_once() -> TestResult {
    two_hundred_identical_requests_across_two_instances_charge_once_at(database_url())
}

/// The same through PgBouncer in session mode: each instance's pool goes through it.
#[test]
fn two_hundred_identical_requests_across_two_instances_charge_once_behind_pgbouncer() -> TestResult
{
    start_pgbouncer();
    two_hundred_identical_requests_across_two_instances_charge_once_at(pgbouncer_url())
}

fn two_hundred_identical_requests_across_two_instances_charge_once_at(url: String) -> TestResult {
    let shared = Shared::at(url)?;
    let services = Arc::new([shared.start("a", &[])?, shared.start("b", &[])?]);
    let barrier = Arc::new(Barrier::new(200));
    let threads: Vec<_> = (0..200)
        .map(|i| {
            let (services, barrier) = (services.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                charge(&services[i % 2], "order-shared-1", &charge_body(1900))
            })
        })
        .collect();
    let (mut created, mut replayed, mut in_progress) = (Vec::new(), 0, 0);
    for thread in threads {
        let answer = thread.join().map_err(|_| "a client thread panicked")??;
        match (answer.status, answer.replayed) {
            (201, false) => created.push(answer.body),
            (201, true) => replayed += 1,
            (409, false) => in_progress += 1,
            (status, _) => panic!(
                "unexpected {status}: {}",
                String::from_utf8_lossy(&answer.body)
            ),
        }
    }
    assert_eq!(created.len(), 1, "exactly one request ran");
    assert_eq!(replayed + in_progress, 199);
    assert_eq!(shared.side_effects()?, 1, "one charge at the processor");

    // A retry on either instance replays the one response, byte for byte.
    for service in services.iter() {
        let retry = charge(service, "order-shared-1", &charge_body(1900))?;
        assert!(retry.replayed && retry.status == 201);
        assert_eq!(retry.body, created[0], "byte for byte");
    }
    // The same key for another request is refused on both.
    for service in services.iter() {
        assert_eq!(
            charge(service, "order-shared-1", &charge_body(2500))?.status,
            422
        );
    }
    assert_eq!(shared.side_effects()?, 1);
    // Each instance's /stats reads the shared ledger: one side effect, whichever made it.
    for service in services.iter() {
        let (status, stats) = get(service, "/stats", ALICE)?;
        assert_eq!(status, 200, "{stats}");
        let stats: Value = serde_json::from_str(&stats)?;
        assert_eq!(stats["processor"]["side_effects"], 1, "{stats}");
    }
    Ok(())
}

#[test]
fn an_instance_killed_between_charge_and_commit_is_recovered_by_the_other() -> TestResult {
    an_instance_killed_between_charge_and_commit_is_recovered_by_the_other_at(database_url())
}

/// The same through PgBouncer in session mode: each instance's pool goes through it.
#[test]
fn an_instance_killed_between_charge_and_commit_is_recovered_by_the_other_behind_pgbouncer()
-> TestResult {
    start_pgbouncer();
    an_instance_killed_between_charge_and_commit_is_recovered_by_the_other_at(pgbouncer_url())
}

fn an_instance_killed_between_charge_and_commit_is_recovered_by_the_other_at(
    url: String,
) -> TestResult {
    let shared = Shared::at(url)?;
    let hooks = [("EDGE_MANUAL_CLOCK", "1"), ("EDGE_LEASE_SECS", "30")];
    let doomed = shared.start("a", &[hooks[0], hooks[1], ("EDGE_PAUSE_AFTER_CHARGE", "1")])?;
    let survivor = shared.start("b", &hooks)?;
    let client = std::thread::spawn({
        let (agent, base) = (doomed.agent.clone(), doomed.base.clone());
        move || charge_at(&agent, &base, "order-crash-1", &charge_body(1900)).is_ok()
    });
    doomed.line_starting("PAUSED order-crash-1")?;
    doomed.kill()?;
    assert!(
        !client.join().map_err(|_| "the client panicked")?,
        "the request died with the process"
    );
    assert_eq!(shared.side_effects()?, 1, "the charge happened");

    // Within the lease the other instance answers 409: the claim lives in the database.
    let early = charge(&survivor, "order-crash-1", &charge_body(1900))?;
    assert_eq!(
        early.status,
        409,
        "{}",
        String::from_utf8_lossy(&early.body)
    );

    survivor.advance_clock(31)?;
    let recovered = charge(&survivor, "order-crash-1", &charge_body(1900))?;
    assert_eq!(
        (recovered.status, recovered.replayed),
        (201, false),
        "{}",
        String::from_utf8_lossy(&recovered.body)
    );
    assert_eq!(recovered.json()["attempt"], 2, "a recovery");
    assert_eq!(shared.side_effects()?, 1, "no second charge");

    let again = charge(&survivor, "order-crash-1", &charge_body(1900))?;
    assert!(again.replayed);
    assert_eq!(again.body, recovered.body);
    Ok(())
}

/// Both instances run a relay into one JetStream stream; only the holder of the outbox's lock
/// delivers. One instance is killed while both take charges: the other's relay takes the lock
/// over, and the stream ends up with exactly one event per charge committed in PostgreSQL.
#[test]
fn two_relays_and_a_kill_leave_one_event_per_charge_in_the_stream() -> TestResult {
    let shared = Shared::at(database_url())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let js = rt.block_on(common::nats::connect());
    let stream = common::nats::unique("IDEMSTORE_PG_RELAY");
    let subjects = format!("{}.", stream.to_lowercase());
    rt.block_on(js.create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("{subjects}charges.>")],
        duplicate_window: std::time::Duration::from_secs(600),
        ..Default::default()
    }))?;
    let url = common::nats::url();
    let env = [
        ("EDGE_NATS", url.as_str()),
        ("EDGE_NATS_STREAM", stream.as_str()),
        ("EDGE_NATS_SUBJECT_PREFIX", subjects.as_str()),
        ("EDGE_LATENCY_MS", "1"),
        ("EDGE_ADMIN_TOKEN", "admin-secret"),
    ];
    let doomed = shared.start("a", &env)?;
    let survivor = shared.start("b", &env)?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = [doomed.base.clone(), survivor.base.clone()]
        .into_iter()
        .enumerate()
        .map(|(n, base)| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .build()
                    .into();
                let mut created = 0;
                for i in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    match charge_at(
                        &agent,
                        &base,
                        &format!("relay-{n}-{i}"),
                        &charge_body(100 + i),
                    ) {
                        Ok(answer) if answer.status == 201 => created += 1,
                        Ok(_) => {}
                        Err(_) => break, // its instance was killed
                    }
                }
                created
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(400));
    doomed.kill()?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let created: Vec<u64> = clients
        .into_iter()
        .map(|c| c.join().map_err(|_| "a client panicked"))
        .collect::<Result<_, _>>()?;
    assert!(
        created.iter().all(|n| *n > 0),
        "both instances charged: {created:?}"
    );

    // The survivor's relay delivers what is left, the killed one's included.
    let deadline = std::time::Instant::now() + common::service::PATIENCE;
    loop {
        let mut answer = survivor
            .agent
            .get(format!("{}/stats", survivor.base))
            .header("authorization", "Bearer admin-secret")
            .call()?;
        let stats: Value = serde_json::from_str(&answer.body_mut().read_to_string()?)?;
        if stats["store"]["outbox_pending"].as_u64() == Some(0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not drained: {stats}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let committed: std::collections::HashSet<String> = rt.block_on(async {
        let pool = idemstore::sqlx::PgPool::connect(&shared.url).await?;
        let rows: Vec<(Vec<u8>,)> = idemstore::sqlx::query_as(idemstore::sqlx::AssertSqlSafe(
            format!("SELECT charge FROM {}charges", shared.prefix),
        ))
        .fetch_all(&pool)
        .await?;
        rows.iter()
            .map(|(json,)| {
                let charge: Value = serde_json::from_slice(json)?;
                Ok(charge["id"].as_str().ok_or("no id")?.to_owned())
            })
            .collect::<Result<_, Box<dyn std::error::Error>>>()
    })?;
    let events = rt.block_on(async {
        let mut s = js.get_stream(&stream).await?;
        let state = s.info().await?.state.clone();
        let mut events = Vec::new();
        for seq in state.first_sequence..=state.last_sequence {
            let m = s.get_raw_message(seq).await?;
            let charge: Value = serde_json::from_slice(&m.payload)?;
            events.push(charge["id"].as_str().ok_or("no id")?.to_owned());
        }
        Ok::<_, Box<dyn std::error::Error>>(events)
    })?;
    let distinct: std::collections::HashSet<String> = events.iter().cloned().collect();
    assert_eq!(
        distinct.len(),
        events.len(),
        "a charge with two events in the stream"
    );
    assert_eq!(distinct, committed, "one event per committed charge");
    println!(
        "{} charges, {created:?} answered 201 per instance",
        committed.len()
    );
    rt.block_on(js.delete_stream(&stream))?;
    Ok(())
}

/// The keys of a JSON value, recursively (`a`, `a.b`, ...): its shape, without the values.
fn shape(value: &Value, path: &str, out: &mut std::collections::BTreeSet<String>) {
    if let Value::Object(fields) = value {
        for (name, field) in fields {
            let path = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            shape(field, &path, out);
            out.insert(path);
        }
    }
}

/// `GET path` with `auth`, as JSON, or the body as text.
fn get(service: &Service, path: &str, auth: &str) -> Result<(u16, String), ureq::Error> {
    let mut response = service
        .agent
        .get(format!("{}{path}", service.base))
        .header("authorization", auth)
        .call()?;
    Ok((
        response.status().as_u16(),
        response.body_mut().read_to_string()?,
    ))
}

/// The same service on either backend answers `/stats` in one shape, for a tenant and for the
/// operator, and serves the store's metrics on `/metrics`, counted from the same events.
#[test]
fn stats_and_metrics_have_one_shape_on_both_backends() -> TestResult {
    let shared = Shared::at(database_url())?;
    let operator = [("EDGE_ADMIN_TOKEN", "sk_test_operator")];
    let on_pg = shared.start("pg", &operator)?;
    let local_data = shared.dir.path().join("local");
    let on_local = Service::start(
        &crate::child_test!("service_process"),
        &local_data,
        &[("EDGE_LATENCY_MS", "20"), operator[0]],
    )?;
    let mut shapes = Vec::new();
    for (service, backend) in [(&on_pg, "postgres"), (&on_local, "local")] {
        assert_eq!(
            charge(service, "order-shape-1", &charge_body(700))?.status,
            201
        );
        assert!(charge(service, "order-shape-1", &charge_body(700))?.replayed);
        let (status, tenant) = get(service, "/stats", ALICE)?;
        assert_eq!(status, 200, "{tenant}");
        let tenant: Value = serde_json::from_str(&tenant)?;
        assert_eq!(tenant["backend"], backend, "{tenant}");
        assert_eq!(tenant["charges"], 1, "{backend}: {tenant}");
        assert_eq!(tenant["health"]["writable"], true, "{backend}: {tenant}");
        let (status, all) = get(service, "/stats", "Bearer sk_test_operator")?;
        assert_eq!(status, 200, "{all}");
        let all: Value = serde_json::from_str(&all)?;
        assert_eq!(all["store"]["claims"], 1, "{backend}: {all}");
        assert_eq!(all["store"]["replays"], 1, "{backend}: {all}");
        let (mut of_tenant, mut of_all) = Default::default();
        shape(&tenant, "", &mut of_tenant);
        shape(&all, "", &mut of_all);
        shapes.push((backend, of_tenant, of_all));

        let (status, page) = get(service, "/metrics", "")?;
        assert_eq!(status, 200, "{backend}: {page}");
        for line in [
            "idemstore_begin_total{outcome=\"claimed\"} 1",
            "idemstore_begin_total{outcome=\"replay\"} 1",
            "idemstore_commits_total 1",
            "idemstore_records{state=\"completed\"} 1",
        ] {
            assert!(
                page.lines().any(|l| l == line),
                "{backend}: no `{line}` in\n{page}"
            );
        }
    }
    assert_eq!(shapes[0].1, shapes[1].1, "a tenant's view");
    assert_eq!(shapes[0].2, shapes[1].2, "the operator's view");
    Ok(())
}
