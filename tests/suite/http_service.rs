//! The edge service example over real HTTP on loopback, as a child process: duplicates,
//! conflicting reuse, bad requests, tenants, and a SIGKILL between the processor call and the
//! commit, recovered by the next process without a second charge.
//!
//! The child is this test binary re-executed to run only [`service_process`], which runs the
//! example's `main`: the example's code, in a process the test can kill, without a cargo build
//! from inside a test. Lease expiry is driven by the service's manual clock (a test hook);
//! nothing sleeps.

use crate::common;

use crate::edge_service;

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::service::{Answer, PATIENCE, Service};

use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const ALICE: &str = "Bearer sk_test_alice";
/// The operator's token, for the view of `/stats` across tenants.
const OPERATOR_TOKEN: &str = "sk_test_operator";
const OPERATOR: &str = "Bearer sk_test_operator";
const BOB: &str = "Bearer sk_test_bob";

/// Not a test: the service process the tests start (see the module docs).
#[test]
#[ignore = "the service process started by the other tests"]
fn service_process() {
    if std::env::var_os("EDGE_SERVICE_CHILD").is_some() {
        edge_service::main().expect("the service runs");
    }
}

/// What these tests ask of the service, beside starting and killing it.
trait Api {
    fn charge(&self, auth: &str, key: Option<&str>, body: &str) -> Result<Answer, ureq::Error>;
    fn get(&self, path: &str, auth: &str) -> Result<Answer, ureq::Error>;
    /// The operator's view of `/stats`: every tenant's side effects and the store's counters.
    fn stats(&self) -> Result<Value, Box<dyn std::error::Error>>;
}

impl Api for Service {
    fn charge(&self, auth: &str, key: Option<&str>, body: &str) -> Result<Answer, ureq::Error> {
        charge_at(&self.agent, &self.base, auth, key, body)
    }

    fn get(&self, path: &str, auth: &str) -> Result<Answer, ureq::Error> {
        Answer::read(
            self.agent
                .get(format!("{}{path}", self.base))
                .header("authorization", auth)
                .call()?,
        )
    }

    fn stats(&self) -> Result<Value, Box<dyn std::error::Error>> {
        Ok(serde_json::from_str(&self.get("/stats", OPERATOR)?.body)?)
    }
}

/// Starts the service with these tests' settings (a 20 ms processor, an operator token).
fn start(data: &Path, env: &[(&str, &str)]) -> Result<Service, Box<dyn std::error::Error>> {
    let mut all = vec![
        ("EDGE_LATENCY_MS", "20"),
        ("EDGE_ADMIN_TOKEN", OPERATOR_TOKEN),
    ];
    all.extend_from_slice(env);
    Service::start(&crate::child_test!("service_process"), data, &all)
}

/// `POST /charges` on the service at `base`.
fn charge_at(
    agent: &ureq::Agent,
    base: &str,
    auth: &str,
    key: Option<&str>,
    body: &str,
) -> Result<Answer, ureq::Error> {
    let mut request = agent
        .post(format!("{base}/charges"))
        .header("authorization", auth)
        .content_type("application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    Answer::read(request.send(body)?)
}

fn charge_body(amount: u64) -> String {
    json!({"amount": amount, "currency": "eur", "customer": "cus_42"}).to_string()
}

#[test]
fn fifty_concurrent_identical_posts_charge_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let service = Arc::new(start(dir.path(), &[("EDGE_LATENCY_MS", "100")])?);
    let barrier = Arc::new(Barrier::new(50));
    let threads: Vec<_> = (0..50)
        .map(|_| {
            let (service, barrier) = (service.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                service.charge(ALICE, Some("order-7-attempt"), &charge_body(1900))
            })
        })
        .collect();
    let (mut created, mut replayed, mut in_progress) = (Vec::new(), 0, 0);
    for thread in threads {
        let answer = thread.join().map_err(|_| "a client thread panicked")??;
        match (answer.status, answer.replayed) {
            (201, false) => created.push(answer.json()?),
            (201, true) => replayed += 1,
            (409, false) => {
                assert!(
                    answer.retry_after.is_some_and(|s| s >= 1),
                    "409 carries Retry-After"
                );
                in_progress += 1;
            }
            (status, _) => panic!("unexpected {status}: {}", answer.body),
        }
    }
    assert_eq!(created.len(), 1, "exactly one request ran");
    assert_eq!(replayed + in_progress, 49);
    let stats = service.stats()?;
    assert_eq!(stats["processor"]["side_effects"], 1, "{stats}");
    assert_eq!(stats["store"]["claims"], 1, "{stats}");

    // A retry after all of them is a replay of the one charge.
    let retry = service.charge(ALICE, Some("order-7-attempt"), &charge_body(1900))?;
    assert!(retry.replayed);
    assert_eq!(retry.json()?, created[0]);
    Ok(())
}

#[test]
fn conflicting_reuse_bad_requests_and_tenants_are_answered_as_the_draft_says() -> TestResult {
    let dir = tempfile::tempdir()?;
    let service = start(dir.path(), &[])?;

    let first = service.charge(ALICE, Some("request-k-1"), &charge_body(1900))?;
    assert_eq!(first.status, 201, "{}", first.body);
    let id = first.json()?["id"].as_str().ok_or("an id")?.to_owned();

    // A body that fails validation is refused and its key released: fixed, it can run.
    let invalid = service.charge(
        ALICE,
        Some("request-k-fix"),
        r#"{"amount": 0, "currency": "eur"}"#,
    )?;
    assert_eq!(
        (invalid.status, invalid.content_type.as_str()),
        (400, "application/problem+json")
    );
    let fixed = service.charge(ALICE, Some("request-k-fix"), &charge_body(300))?;
    assert_eq!(
        (fixed.status, fixed.replayed),
        (201, false),
        "{}",
        fixed.body
    );

    let changed = service.charge(ALICE, Some("request-k-1"), &charge_body(2500))?;
    assert_eq!(
        (changed.status, changed.content_type.as_str()),
        (422, "application/problem+json")
    );

    let missing = service.charge(ALICE, None, &charge_body(1900))?;
    assert_eq!(
        (missing.status, missing.content_type.as_str()),
        (400, "application/problem+json")
    );

    let huge = json!({"amount": 1, "currency": "eur", "customer": "x".repeat(20_000)}).to_string();
    let oversized = service.charge(ALICE, Some("request-k-big"), &huge)?;
    assert_eq!(
        (oversized.status, oversized.content_type.as_str()),
        (413, "application/problem+json")
    );

    let twice = service
        .agent
        .post(format!("{}/charges", service.base))
        .header("authorization", ALICE)
        .header("idempotency-key", "a")
        .header("idempotency-key", "b")
        .content_type("application/json")
        .send(charge_body(1900))?;
    let twice = Answer::read(twice)?;
    assert_eq!(
        (twice.status, twice.content_type.as_str()),
        (400, "application/problem+json")
    );
    assert_eq!(
        twice.json()?["type"],
        "urn:idemstore:problem:invalid-idempotency-key"
    );

    // Bob's "k-1" is his own: a second charge, invisible to Alice.
    let bobs = service.charge(BOB, Some("request-k-1"), &charge_body(1900))?;
    assert_eq!((bobs.status, bobs.replayed), (201, false));
    let bobs_id = bobs.json()?["id"].as_str().ok_or("an id")?.to_owned();
    assert_ne!(bobs_id, id);
    assert_eq!(
        service.get(&format!("/charges/{id}"), ALICE)?.json()?,
        first.json()?
    );
    assert_eq!(
        service.get(&format!("/charges/{bobs_id}"), ALICE)?.status,
        404
    );

    // Refused by authentication: never reaches the store.
    let claims_before = service.stats()?["store"]["claims"].clone();
    let stranger = service.charge("Bearer nobody", Some("request-k-2"), &charge_body(1900))?;
    assert_eq!(stranger.status, 401);
    assert_eq!(
        stranger.json()?["type"],
        "urn:edge-service:problem:unauthenticated",
        "refused by the service's authentication, outside the idempotency layer"
    );
    let stats = service.stats()?;
    assert_eq!(stats["store"]["claims"], claims_before);
    assert_eq!(stats["processor"]["side_effects"], 3, "{stats}");

    // The 401 carries a challenge; the scheme is matched in any case.
    let challenge = service
        .agent
        .get(format!("{}/stats", service.base))
        .call()?;
    assert_eq!(challenge.status(), 401);
    assert!(challenge.headers().contains_key("www-authenticate"));
    let lower = service.get("/stats", "bearer sk_test_alice")?;
    assert_eq!(lower.status, 200);

    // A tenant's view of /stats is its own: its charges and side effects, the store's health,
    // and none of the store's counters across tenants.
    let alices = lower.json()?;
    assert_eq!(alices["tenant"], "acct_alice");
    assert_eq!(alices["charges"], 2, "{alices}");
    assert_eq!(alices["processor"]["side_effects"], 2, "{alices}");
    assert_eq!(alices["health"]["writable"], true, "{alices}");
    assert!(alices.get("store").is_none(), "{alices}");
    let bobs_view = service.get("/stats", BOB)?.json()?;
    assert_eq!(bobs_view["processor"]["side_effects"], 1, "{bobs_view}");
    Ok(())
}

/// SIGKILL after the processor charged and before the commit; a new process on the same
/// directory answers 409 within the lease, then recovers (attempt 2) without charging again.
#[test]
fn a_service_killed_between_charge_and_commit_is_recovered_without_a_second_charge() -> TestResult {
    let dir = tempfile::tempdir()?;
    let hooks = [("EDGE_MANUAL_CLOCK", "1"), ("EDGE_LEASE_SECS", "30")];
    let doomed = start(
        dir.path(),
        &[hooks[0], hooks[1], ("EDGE_PAUSE_AFTER_CHARGE", "1")],
    )?;
    let client = std::thread::spawn({
        let (agent, base) = (doomed.agent.clone(), doomed.base.clone());
        move || {
            charge_at(
                &agent,
                &base,
                ALICE,
                Some("request-k-crash"),
                &charge_body(1900),
            )
            .is_ok()
        }
    });
    doomed.line_starting("PAUSED request-k-crash")?;
    doomed.kill()?;
    assert!(
        !client.join().map_err(|_| "the client panicked")?,
        "the request died with the process"
    );

    let service = start(dir.path(), &hooks)?;
    assert_eq!(
        service.stats()?["processor"]["side_effects"],
        1,
        "the charge happened"
    );
    let early = service.charge(ALICE, Some("request-k-crash"), &charge_body(1900))?;
    assert_eq!(early.status, 409, "{}", early.body);
    assert!(early.retry_after.is_some_and(|s| (1..=30).contains(&s)));

    service.advance_clock(31)?;
    let recovered = service.charge(ALICE, Some("request-k-crash"), &charge_body(1900))?;
    assert_eq!(
        (recovered.status, recovered.replayed),
        (201, false),
        "{}",
        recovered.body
    );
    assert_eq!(
        recovered.json()?["attempt"],
        2,
        "the handler saw the recovery"
    );
    assert_eq!(
        recovered.json()?["processor_charge"],
        "py_000001",
        "the first attempt's charge"
    );
    let stats = service.stats()?;
    assert_eq!(
        stats["processor"]["side_effects"], 1,
        "not charged twice: {stats}"
    );
    assert_eq!(stats["store"]["recoveries"], 1, "{stats}");
    assert!(
        service
            .charge(ALICE, Some("request-k-crash"), &charge_body(1900))?
            .replayed
    );
    Ok(())
}

/// A processor timeout leaves the claim in progress (the outcome is unknown): 504, then 409
/// within the lease, then a recovery that finds the charge the timed-out call made.
#[test]
fn a_processor_timeout_is_recovered_after_the_lease_without_a_second_charge() -> TestResult {
    let dir = tempfile::tempdir()?;
    let service = start(
        dir.path(),
        &[
            ("EDGE_MANUAL_CLOCK", "1"),
            ("EDGE_LEASE_SECS", "30"),
            ("EDGE_TIMEOUT_RATE", "1"),
        ],
    )?;
    let timed_out = service.charge(ALICE, Some("request-k-slow"), &charge_body(700))?;
    assert_eq!(
        (timed_out.status, timed_out.retry_after),
        (504, Some(30)),
        "{}",
        timed_out.body
    );
    assert_eq!(
        service
            .charge(ALICE, Some("request-k-slow"), &charge_body(700))?
            .status,
        409
    );
    service.advance_clock(31)?;
    let recovered = service.charge(ALICE, Some("request-k-slow"), &charge_body(700))?;
    assert_eq!(recovered.status, 201, "{}", recovered.body);
    assert_eq!(recovered.json()?["attempt"], 2);
    assert_eq!(service.stats()?["processor"]["side_effects"], 1);
    Ok(())
}

/// A charge whose processor call timed out (504) and that the client never retries is finished
/// by the service's completer once the lease ends: it asks the processor by the request's
/// downstream key (a lookup, never a second charge) and commits the charge row. A late retry
/// then gets the replay.
#[test]
fn an_abandoned_charge_is_completed_by_the_completer_without_a_second_charge() -> TestResult {
    let dir = tempfile::tempdir()?;
    let service = start(
        dir.path(),
        &[
            ("EDGE_MANUAL_CLOCK", "1"),
            ("EDGE_LEASE_SECS", "30"),
            ("EDGE_TIMEOUT_RATE", "1"),
            ("EDGE_COMPLETE_EVERY_MS", "20"),
        ],
    )?;
    let timed_out = service.charge(ALICE, Some("abandoned-1"), &charge_body(700))?;
    assert_eq!(timed_out.status, 504, "{}", timed_out.body);
    service.advance_clock(31)?;
    // The completer runs on its own schedule: wait (bounded) for its effect.
    let deadline = Instant::now() + PATIENCE;
    let stats = loop {
        let stats = service.stats()?;
        if stats["store"]["completed"] == 1 {
            break stats;
        }
        assert!(Instant::now() < deadline, "never completed: {stats}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(stats["store"]["in_progress"], 0, "{stats}");
    assert_eq!(stats["processor"]["side_effects"], 1, "{stats}");
    assert_eq!(
        stats["processor"]["charge_calls"], 1,
        "never asked to charge again: {stats}"
    );
    assert!(stats["processor"]["lookups"].as_u64() >= Some(1), "{stats}");
    let alices = service.get("/stats", ALICE)?.json()?;
    assert_eq!(alices["charges"], 1, "one charge row: {alices}");

    let late = service.charge(ALICE, Some("abandoned-1"), &charge_body(700))?;
    assert_eq!((late.status, late.replayed), (201, true), "{}", late.body);
    assert_eq!(late.json()?["attempt"], 2, "completed by the recovery");
    assert_eq!(service.stats()?["processor"]["side_effects"], 1);
    Ok(())
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    path: std::path::PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `mib` MiB on a new directory under `parent`; `Err` says why it
    /// cannot (not root, or no mount in this sandbox).
    fn mount(parent: &Path, mib: u32) -> Result<Tmpfs, String> {
        let path = parent.join("small-disk");
        std::fs::create_dir_all(&path).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("mount could not run: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(Tmpfs { path })
    }

    /// Writes a file of zeros until the file system is full; returns its path.
    fn fill(&self) -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
        use std::io::Write;
        let filler = self.path.join("filler");
        let mut file = std::fs::File::create(&filler)?;
        let chunk = vec![0u8; 64 * 1024];
        loop {
            match file.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => return Err(e.into()),
            }
        }
        // Whatever fit in the last chunk: fill to the last byte.
        for _ in 0..chunk.len() {
            if file.write_all(&[0]).is_err() {
                break;
            }
        }
        Ok(filler)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// The review's reproduction on a real file system: the service's data on a small tmpfs,
/// filled up. Replays and reads of stored charges go on; new charges that need space get 503
/// with a `Retry-After`; once space is freed, new charges are taken again, all without a
/// restart, and the processor charged each key at most once. Skipped, with the reason printed,
/// where this process may not mount a tmpfs (the simulated disk's tests cover the same paths
/// everywhere).
#[test]
fn a_full_disk_under_the_real_service_keeps_replays_and_recovers_without_a_restart() -> TestResult {
    let dir = tempfile::tempdir()?;
    let tmpfs = match Tmpfs::mount(dir.path(), 24) {
        Ok(tmpfs) => tmpfs,
        Err(why) => {
            println!("skipped: cannot mount a tmpfs here ({why})");
            return Ok(());
        }
    };
    let ledger = dir.path().join("processor-ledger.jsonl");
    let service = start(
        &tmpfs.path,
        &[
            ("EDGE_LOG_SEGMENT_KB", "64"),
            (
                "EDGE_PROCESSOR_LEDGER",
                ledger.to_str().ok_or("a UTF-8 path")?,
            ),
        ],
    )?;
    let first = service.charge(ALICE, Some("before-full"), &charge_body(100))?;
    assert_eq!(first.status, 201, "{}", first.body);
    let id = first.json()?["id"].as_str().ok_or("an id")?.to_owned();

    let filler = tmpfs.fill()?;
    let mut refused = 0;
    for i in 0..3_000 {
        let answer =
            service.charge(ALICE, Some(&format!("request-full-{i}")), &charge_body(100))?;
        match answer.status {
            201 => {}
            503 => {
                refused += 1;
                assert!(
                    answer.retry_after.is_some_and(|s| s >= 1),
                    "{}",
                    answer.body
                );
                assert!(!answer.body.contains("os error"), "{}", answer.body);
                // While new charges are refused, stored ones are still answered.
                let replay = service.charge(ALICE, Some("before-full"), &charge_body(100))?;
                assert_eq!(
                    (replay.status, replay.replayed),
                    (201, true),
                    "{}",
                    replay.body
                );
                assert_eq!(service.get(&format!("/charges/{id}"), ALICE)?.status, 200);
                if refused >= 3 {
                    break;
                }
            }
            other => return Err(format!("{other}: {}", answer.body).into()),
        }
    }
    assert!(refused > 0, "the full disk never refused a charge");

    std::fs::remove_file(filler)?;
    let mut resumed = false;
    for i in 0..50 {
        let answer = service.charge(
            ALICE,
            Some(&format!("request-after-{i}")),
            &charge_body(100),
        )?;
        if answer.status == 201 {
            resumed = true;
            break;
        }
        assert_eq!(answer.status, 503, "{}", answer.body);
    }
    assert!(
        resumed,
        "new charges were not taken again after space was freed"
    );
    let stats = service.stats()?;
    assert_eq!(stats["health"]["writable"], true, "{stats}");
    Ok(())
}

/// `GET /metrics` after a known workload (two charges, a retry replayed, a key reused for
/// another request): the store's counters and gauges in Prometheus text, matching what
/// happened.
#[cfg(feature = "metrics")]
#[test]
fn metrics_are_scraped_in_prometheus_text_after_a_known_workload() -> TestResult {
    let dir = tempfile::tempdir()?;
    let service = start(dir.path(), &[])?;
    for key in ["metrics-1", "metrics-2"] {
        let created = service.charge(ALICE, Some(key), &charge_body(100))?;
        assert_eq!(created.status, 201, "{}", created.body);
    }
    let retry = service.charge(ALICE, Some("metrics-1"), &charge_body(100))?;
    assert!(retry.replayed, "{}", retry.body);
    let reused = service.charge(ALICE, Some("metrics-1"), &charge_body(999))?;
    assert_eq!(reused.status, 422);

    // The records-by-state gauges are as of the writer's last publish to redb (Store::stats
    // never waits for the writer), a few milliseconds behind an acknowledged commit: scrape
    // until they have caught up, with a bound.
    let deadline = Instant::now() + PATIENCE;
    let page = loop {
        let page = service.get("/metrics", "")?;
        assert_eq!(page.status, 200, "{}", page.body);
        if page
            .body
            .lines()
            .any(|l| l == r#"idemstore_records{state="completed"} 2"#)
            || Instant::now() > deadline
        {
            break page;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        page.content_type.starts_with("text/plain"),
        "{}",
        page.content_type
    );
    let value = |series: &str| -> Option<f64> {
        page.body
            .lines()
            .find(|line| line.starts_with(series) && line[series.len()..].starts_with(' '))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
    };
    assert_eq!(
        value(r#"idemstore_begin_total{outcome="claimed"}"#),
        Some(2.0),
        "{}",
        page.body
    );
    assert_eq!(
        value(r#"idemstore_begin_total{outcome="replay"}"#),
        Some(1.0)
    );
    assert_eq!(
        value(r#"idemstore_begin_total{outcome="mismatch"}"#),
        Some(1.0)
    );
    assert_eq!(value("idemstore_commits_total"), Some(2.0));
    assert_eq!(value(r#"idemstore_records{state="completed"}"#), Some(2.0));
    assert_eq!(
        value(r#"idemstore_records{state="in_progress"}"#),
        Some(0.0)
    );
    assert!(value("idemstore_file_bytes").is_some_and(|b| b > 0.0));
    assert!(
        !page.body.contains("acct_alice") && !page.body.contains("metrics-1"),
        "no tenant or key in a label"
    );
    // The processor's side effects agree: two charges.
    assert_eq!(service.stats()?["processor"]["side_effects"], 2);
    Ok(())
}
