//! The store's metrics, read through a `metrics` recorder after a known workload, against the
//! workload's real side effects: rows written, the store's own stats.
//!
//! One test in this binary: the recorder is process-global.

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
    Ok(())
}
