//! Handovers between boxes with real processes and a real NATS JetStream, the states a single
//! box loss (`box_loss.rs`) does not reach: the old box back on its own directory after the
//! new one closed cleanly (it must stay fenced, and the stream keep the new box's charges), a
//! second restore inside the first one's window, and NATS coming back without its data.
//! `handover.rs` plays the same on the in-memory replica; `handover_model.rs` explores them.

use crate::box_loss::{Client, Fallible, Mode, Net, Scratch, Setup, charge_body, until};
use crate::common;

use std::path::Path;

use common::TestResult;
use common::nats::url;
use common::service::PATIENCE;

/// Charges `n` new keys `prefix-i` on `client`; the processor's charge id of each.
fn charge_all(client: &Client, prefix: &str, n: usize) -> Fallible<Vec<(String, String)>> {
    let mut charged = Vec::new();
    for i in 0..n {
        let key = format!("{prefix}-{i:08}");
        let answer = client.charge(&key, &charge_body(0, i))?;
        if answer.status != 201 {
            return Err(format!("{key}: {} {}", answer.status, answer.body).into());
        }
        charged.push((key, answer.charge()?.1));
    }
    Ok(charged)
}

/// Every charge in `charged` is answered on `client` with the processor charge it was made
/// with: a replay (or a recovery that found it at the processor), never a second charge.
fn all_there(client: &Client, charged: &[(String, String)], prefix: &str) -> TestResult {
    for (i, (key, processor)) in charged.iter().enumerate() {
        let answer = client.charge(key, &charge_body(0, i))?;
        assert!(
            matches!(answer.status, 200 | 201),
            "{prefix} {key}: {} {}",
            answer.status,
            answer.body
        );
        assert_eq!(
            &answer.charge()?.1,
            processor,
            "{prefix} {key} charged twice"
        );
    }
    Ok(())
}

fn caught_up(client: &Client) -> Fallible<bool> {
    let shipping = client.shipping()?;
    Ok(shipping["state"] == "shipping" && shipping["lag_frames"].as_u64() == Some(0))
}

fn setup(scratch: &Scratch, mode: Mode, ledger: &Path) -> Setup {
    Setup {
        stream: scratch.name.clone(),
        mode,
        ledger: ledger.to_path_buf(),
    }
}

/// Bug 1 with processes: A (async) is partitioned and charges alone; B restores, takes the
/// stream over, charges with `sync` and is stopped cleanly (a deploy); A's process is
/// restarted on its own directory. A must report itself fenced, and a restore from the stream
/// (box C) must hold B's charges.
#[test]
fn the_old_box_back_on_its_directory_after_a_clean_deploy_stays_fenced() -> TestResult {
    let scratch = Scratch::new();
    let net = Net::start()?;
    let dir = tempfile::tempdir()?;
    let ledger = dir.path().join("ledger.jsonl");
    let (a_setup, b_setup) = (
        setup(&scratch, Mode::Async, &ledger),
        setup(&scratch, Mode::Sync, &ledger),
    );
    let a_dir = dir.path().join("a");
    let a = a_setup.start(&a_dir, &net.url(), false)?;
    let a_client = Client::new(&a.base);
    charge_all(&a_client, "a", 5)?;
    until("A to ship", PATIENCE, || caught_up(&a_client))?;
    net.stop(); // A is partitioned from NATS
    charge_all(&a_client, "a-alone", 20)?;

    let b_dir = dir.path().join("b");
    let mut b = b_setup.start(&b_dir, &url(), true)?;
    let b_charges = charge_all(&Client::new(&b.base), "b", 3)?;
    let stopped = b.stop_with("TERM")?;
    assert!(stopped.success(), "B's clean stop: {stopped}");

    a.kill()?;
    net.heal();
    let a = a_setup.start(&a_dir, &net.url(), false)?;
    let a_client = Client::new(&a.base);
    until("A to find itself fenced", PATIENCE, || {
        Ok(a_client.shipping()?["state"] == "fenced")
    })?;
    let error = a_client.shipping()?["last_error"].to_string();
    assert!(error.contains("writer epoch 1"), "{error}");
    a.kill()?;

    let c = b_setup.start(&dir.path().join("c"), &url(), true)?;
    all_there(&Client::new(&c.base), &b_charges, "on C")?;
    drop(c);
    // B, restarted after its clean stop, claims its stream back... after C took it, it is
    // fenced too: one writer per epoch.
    Ok(())
}

/// Bug 2 with processes: A (async) is lost with charges the stream lacks; B restores and,
/// shipping `sync`, is moved to box C by a clean stop and a restore. C's retries of A's lost
/// charges are recoveries that find them at the processor, never second charges.
#[test]
fn a_second_restore_inside_the_first_ones_window_charges_nothing_twice() -> TestResult {
    let scratch = Scratch::new();
    let net = Net::start()?;
    let dir = tempfile::tempdir()?;
    let ledger = dir.path().join("ledger.jsonl");
    let (a_setup, b_setup) = (
        setup(&scratch, Mode::Async, &ledger),
        setup(&scratch, Mode::Sync, &ledger),
    );
    let a = a_setup.start(&dir.path().join("a"), &net.url(), false)?;
    let a_client = Client::new(&a.base);
    charge_all(&a_client, "a", 3)?;
    until("A to ship", PATIENCE, || caught_up(&a_client))?;
    net.stop();
    let lost = charge_all(&a_client, "lost", 5)?;
    a.kill()?;
    std::fs::remove_dir_all(dir.path().join("a"))?;

    let mut b = b_setup.start(&dir.path().join("b"), &url(), true)?;
    all_there(&Client::new(&b.base), &lost[..1], "on B")?;
    charge_all(&Client::new(&b.base), "b", 2)?;
    let stopped = b.stop_with("TERM")?;
    assert!(stopped.success(), "B's clean stop: {stopped}");

    let c = b_setup.start(&dir.path().join("c"), &url(), true)?;
    let c_client = Client::new(&c.base);
    let window = &c_client.stats()?["store"]["restore_window"];
    assert_eq!(window["guarantee"], "may-lag", "C's restore: {window}");
    all_there(&c_client, &lost, "on C")?;
    let lines = std::fs::read_to_string(&ledger)?.lines().count();
    assert_eq!(lines, 3 + 5 + 2, "the processor charged some key twice");
    Ok(())
}

/// Bug 4 with processes: NATS comes back without its data (here: the stream and its buckets
/// deleted under the running service, as a replaced server has none). A `sync` service
/// refuses while the stream is gone, then claims it again, sends a snapshot and charges on;
/// a box restored afterwards holds every charge answered 201, before and after.
#[test]
fn nats_back_without_its_data_is_caught_up_and_the_service_charges_on() -> TestResult {
    let scratch = Scratch::new();
    let dir = tempfile::tempdir()?;
    let ledger = dir.path().join("ledger.jsonl");
    let setup = setup(&scratch, Mode::Sync, &ledger);
    let a_dir = dir.path().join("a");
    let a = setup.start(&a_dir, &url(), false)?;
    let client = Client::new(&a.base);
    let mut charged = charge_all(&client, "before", 5)?;
    until("A to ship", PATIENCE, || caught_up(&client))?;
    common::nats::drop_replica(&scratch.name);
    let mut i = 0;
    until("the service to charge again", PATIENCE, || {
        i += 1;
        let key = format!("after-{i:08}");
        let answer = client.charge(&key, &charge_body(0, i))?;
        if answer.status == 201 {
            charged.push((key, answer.charge()?.1));
        }
        Ok(answer.status == 201 && caught_up(&client)?)
    })?;
    let snapshots = client.shipping()?["snapshots"].as_u64().unwrap_or(0);
    assert!(
        snapshots >= 2,
        "no catch-up snapshot after the loss: {snapshots}"
    );
    a.kill()?;
    std::fs::remove_dir_all(&a_dir)?;

    let b = setup.start(&dir.path().join("b"), &url(), true)?;
    let b_client = Client::new(&b.base);
    // Replays of the charges before the loss would be second charges if the snapshot lacked them.
    for (i, (key, processor)) in charged.iter().enumerate() {
        let body = match key.strip_prefix("after-") {
            Some(n) => charge_body(0, n.parse()?),
            None => charge_body(0, i),
        };
        let answer = b_client.charge(key, &body)?;
        assert!(
            answer.replayed,
            "{key} is not in the restored store: {answer:?}"
        );
        assert_eq!(&answer.charge()?.1, processor);
    }
    Ok(())
}
