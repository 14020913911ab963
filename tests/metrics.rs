//! The store's metrics, read through a `metrics` recorder after a known workload, against the
//! workload's real side effects: rows written, the store's own stats.
//!
//! One test in this binary: the recorder is process-global. It runs the local store's whole
//! workload, then (features `testing` and `tokio`) one workload through the protocol trait on
//! every backend, which must count the same.

#[path = "suite/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{LEASE, ORDERS, TTL, TestResult, clock, fp, orders, scope};
use idemstore::{Begin, Response, Store, Sweep};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// Every metric as `name{label=value,...}` with its value (counters and gauges as numbers,
/// histograms as their number of samples).
fn snapshot(snapshotter: &metrics_util::debugging::Snapshotter) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = if labels.is_empty() {
            key.name().to_owned()
        } else {
            format!("{}{{{}}}", key.name(), labels.join(","))
        };
        let value = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(samples) => samples.len() as f64,
        };
        out.insert(name, value);
    }
    out
}

#[test]
fn metrics_count_what_the_workload_did() -> TestResult {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install()?;

    let tmp = tempfile::tempdir()?;
    let clock = clock();
    let store = Store::builder()
        .lease(LEASE)
        .ttl(TTL)
        .tombstone_ttl(Duration::from_secs(3600))
        .table(ORDERS)
        .clock(clock.clone())
        .sweep(Sweep::Off)
        .open(tmp.path().join("idem"))?;
    let commit = |claim: idemstore::Claim, key: &str| {
        let row = key.to_owned();
        claim.commit(move |tx| {
            tx.insert(&ORDERS, row.as_str(), "paid")?;
            Ok(Response::new(201, "ok"))
        })
    };
    for key in ["k1", "k2", "k3"] {
        let Begin::Claimed(claim) = store.begin(&scope(key), fp(key))? else {
            return Err("claimed".into());
        };
        commit(claim, key)?;
    }
    assert!(matches!(
        store.begin(&scope("k1"), fp("k1"))?,
        Begin::Replay(_)
    ));
    let Begin::Claimed(k4) = store.begin(&scope("k4"), fp("k4"))? else {
        return Err("claimed".into());
    };
    assert!(matches!(
        store.begin(&scope("k4"), fp("k4"))?,
        Begin::InProgress { .. }
    ));
    assert!(matches!(
        store.begin(&scope("k4"), fp("other"))?,
        Begin::Mismatch
    ));
    k4.release()?;
    let Begin::Claimed(first) = store.begin(&scope("k5"), fp("k5"))? else {
        return Err("claimed".into());
    };
    clock.advance(LEASE + Duration::from_secs(1));
    let Begin::Recovered(second) = store.begin(&scope("k5"), fp("k5"))? else {
        return Err("recovered".into());
    };
    assert!(commit(first, "k5").is_err(), "the first attempt is stale");
    commit(second, "k5")?;
    clock.advance(TTL + Duration::from_secs(1));
    let evicted = store.evict_expired(100)?;
    assert!(matches!(
        store.begin(&scope("k1"), fp("k1"))?,
        Begin::Expired { .. }
    ));
    let stats = store.exact_stats()?; // records by state exact: the gauges too

    let m = snapshot(&snapshotter);
    let get = |name: &str| m.get(name).copied().unwrap_or(-1.0);
    let begin = |outcome: &str| get(&format!("idemstore_begin_total{{outcome={outcome}}}"));
    // Side effects: four orders written, one per commit.
    assert_eq!(orders(&store)?.len(), 4);
    assert_eq!(get("idemstore_commits_total"), 4.0, "{m:#?}");
    assert_eq!(begin("claimed"), 5.0);
    assert_eq!(begin("claimed"), stats.claims as f64);
    assert_eq!(begin("replay"), 1.0);
    assert_eq!(begin("in_progress"), 1.0);
    assert_eq!(begin("mismatch"), 1.0);
    assert_eq!(begin("recovered"), 1.0);
    assert_eq!(begin("expired"), 1.0);
    assert_eq!(get("idemstore_releases_total"), 1.0);
    assert_eq!(get("idemstore_stale_claim_refusals_total"), 1.0);
    assert_eq!(
        get("idemstore_stale_claim_refusals_total"),
        stats.stale_rejections as f64
    );
    assert_eq!(
        get("idemstore_evicted_records_total"),
        evicted.removed as f64
    );
    assert_eq!(evicted.removed, 4);
    assert_eq!(get("idemstore_poison_events_total"), -1.0, "never poisoned");
    // Histograms: one sample per begin, per commit, per log sync.
    assert_eq!(
        get("idemstore_begin_duration_seconds{outcome=claimed}"),
        5.0
    );
    assert_eq!(get("idemstore_commit_duration_seconds"), 4.0);
    assert!(get("idemstore_log_sync_duration_seconds") >= 1.0);
    assert!(get("idemstore_group_size") >= 1.0);
    // Gauges, as of the stats call.
    assert_eq!(get("idemstore_records{state=tombstone}"), 4.0);
    assert_eq!(get("idemstore_records{state=in_progress}"), 0.0);
    assert_eq!(get("idemstore_records{state=completed}"), 0.0);
    assert_eq!(get("idemstore_oldest_in_progress_seconds"), 0.0);
    assert!(get("idemstore_file_bytes") > 0.0);
    assert!(
        m.keys().all(|k| !k.contains("tenant")),
        "no tenant label unless asked for: {m:#?}"
    );

    // Opted in: the tenant labels `idemstore_begin_total`, and nothing else.
    let labelled = Store::builder()
        .metric_labels(idemstore::MetricLabels::WithTenant)
        .sweep(Sweep::Off)
        .open(tmp.path().join("labelled"))?;
    let tenant_scope = idemstore::Scope::new("acct_9", "op", "key")?;
    assert!(matches!(
        labelled.begin(&tenant_scope, fp("x"))?,
        Begin::Claimed(_)
    ));
    let m = snapshot(&snapshotter);
    assert_eq!(
        m.get("idemstore_begin_total{outcome=claimed,tenant=acct_9}"),
        Some(&1.0),
        "{m:#?}"
    );
    // (A snapshot drains counters: the unlabelled series saw no new claim.)
    assert_eq!(m.get("idemstore_begin_total{outcome=claimed}"), Some(&0.0));

    #[cfg(all(feature = "testing", feature = "tokio"))]
    every_backend::counts_the_same(&snapshotter)?;
    Ok(())
}

/// The events both backends count through one rule: the same workload, through the protocol
/// trait, gives the same metrics on the local store and on PostgreSQL.
#[cfg(all(feature = "testing", feature = "tokio"))]
mod every_backend {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use idemstore::testing::conformance::{Harness, Settings};
    use idemstore::{Begin, BoxError, ManualClock, Protocol, ProtocolClaim, Response, Scope};
    use metrics_util::debugging::Snapshotter;

    use super::{TestResult, fp, snapshot};

    pub(super) fn counts_the_same(snapshotter: &Snapshotter) -> TestResult {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let counted: Result<(), BoxError> = runtime.block_on(async {
            let local = idemstore::testing::conformance::Local::new(idemstore::Durability::Wal);
            let on_local = workload(&local, snapshotter).await?;
            let begins = [
                ("claimed", 4.0),
                ("recovered", 1.0),
                ("replay", 1.0),
                ("in_progress", 1.0),
                ("mismatch", 1.0),
            ];
            let expected: BTreeMap<String, f64> = begins
                .iter()
                .flat_map(|(outcome, n)| {
                    [
                        (format!("idemstore_begin_total{{outcome={outcome}}}"), *n),
                        (
                            format!("idemstore_begin_duration_seconds{{outcome={outcome}}}"),
                            *n,
                        ),
                    ]
                })
                .chain(
                    [
                        ("idemstore_commits_total", 3.0),
                        ("idemstore_commit_duration_seconds", 3.0),
                        ("idemstore_releases_total", 1.0),
                        ("idemstore_stale_claim_refusals_total", 1.0),
                        ("idemstore_records{state=completed}", 3.0),
                        ("idemstore_records{state=in_progress}", 0.0),
                    ]
                    .map(|(k, v)| (k.to_owned(), v)),
                )
                .collect();
            assert_eq!(on_local, expected, "local");
            #[cfg(feature = "postgres")]
            {
                let pg = idemstore::testing::postgres::Postgres::new();
                assert_eq!(workload(&pg, snapshotter).await?, expected, "postgres");
            }
            Ok(())
        });
        counted.map_err(|e| -> Box<dyn std::error::Error> { e })
    }

    /// Three claims completed (one of them after a take-over, whose first holder is then
    /// refused), a replay, an answer "in progress", a mismatch and a release; then the stats,
    /// which set the gauges. Returns the metrics every backend emits.
    async fn workload<H: Harness>(
        harness: &H,
        snapshotter: &Snapshotter,
    ) -> Result<BTreeMap<String, f64>, BoxError> {
        let clock = ManualClock::new(idemstore::Timestamp::from_millis(1_000_000));
        let mut settings = Settings::default();
        settings.lease = Duration::from_secs(30);
        let store = harness.open(settings, clock.clone()).await?;
        let _ = snapshot(snapshotter); // from here on, this workload's counts only
        let scope = |key: &str| Scope::new("acct", "pay", key);
        let claimed = |answer: Begin<_>| match answer {
            Begin::Claimed(claim) | Begin::Recovered(claim) => Ok(claim),
            _ => Err::<<H::Backend as Protocol>::Claim, BoxError>("not claimed".into()),
        };
        for key in ["a", "b"] {
            let claim = claimed(store.begin(&scope(key)?, fp(key)).await?)?;
            claim.complete(Response::new(201, key)).await?;
        }
        assert!(matches!(
            store.begin(&scope("a")?, fp("a")).await?,
            Begin::Replay(_)
        ));
        let held = claimed(store.begin(&scope("c")?, fp("c")).await?)?;
        assert!(matches!(
            store.begin(&scope("c")?, fp("c")).await?,
            Begin::InProgress { .. }
        ));
        assert!(matches!(
            store.begin(&scope("c")?, fp("other")).await?,
            Begin::Mismatch
        ));
        clock.advance(Duration::from_secs(31));
        let taken = claimed(store.begin(&scope("c")?, fp("c")).await?)?;
        assert!(held.release().await.is_err(), "the first holder is stale");
        taken.complete(Response::new(201, "c")).await?;
        let released = claimed(store.begin(&scope("d")?, fp("d")).await?)?;
        released.release().await?;
        store.stats().await?;
        let m = snapshot(snapshotter);
        let shared = |name: &String| {
            name.starts_with("idemstore_begin_")
                || name.starts_with("idemstore_commit")
                || name.starts_with("idemstore_releases")
                || name.starts_with("idemstore_stale")
                || name.starts_with("idemstore_records{state=completed")
                || name.starts_with("idemstore_records{state=in_progress")
        };
        // A snapshot drains: a series this workload did not touch reads 0 and is left out,
        // except the gauges, which hold their value.
        Ok(m.into_iter()
            .filter(|(name, value)| {
                shared(name) && (*value != 0.0 || name.starts_with("idemstore_records"))
            })
            .collect())
    }
}
