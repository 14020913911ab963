//! The store's tracing output names the tenant, operation and key, and never a response body.

#[path = "suite/common/mod.rs"]
mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{ORDERS, TestResult, clock, fp, open, scope};
use idemstore::{Begin, Response};

/// Collects everything the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::ErrorKind::Other)?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn operations_are_traced_with_their_key_and_never_their_body() -> TestResult {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, || -> TestResult {
        let dir = tempfile::tempdir()?;
        let store = open(dir.path(), &clock())?;
        let Begin::Claimed(claim) = store.begin(&scope("order-77"), fp("req"))? else {
            return Err("expected Claimed".into());
        };
        claim.commit(|tx| {
            tx.insert(&ORDERS, "o", "x")?;
            Ok(Response::new(201, b"SECRET-CARD-4242".to_vec()))
        })?;
        assert!(matches!(
            store.begin(&scope("order-77"), fp("req"))?,
            Begin::Replay(_)
        ));
        store.forget(&scope("order-77"), idemstore::Forget::Completed)?;
        Ok(())
    })?;
    let text = String::from_utf8(captured.0.lock().map_err(|_| "poisoned")?.clone())?;
    assert!(text.contains("idemstore.begin"), "{text}");
    assert!(text.contains("key=\"order-77\""), "{text}");
    assert!(text.contains("tenant=\"tenant-a\""), "{text}");
    assert!(text.contains("outcome=\"claimed\""), "{text}");
    assert!(text.contains("outcome=\"replay\""), "{text}");
    assert!(
        text.contains("idemstore.claim") && text.contains("op=\"commit\""),
        "{text}"
    );
    // Forgetting a record leaves an audit line naming it.
    let audit = text
        .lines()
        .find(|l| l.contains("idemstore::audit"))
        .ok_or(format!("no audit line:\n{text}"))?;
    assert!(
        audit.contains("forgot a record")
            && audit.contains("key=\"order-77\"")
            && audit.contains("state=\"completed\""),
        "{audit}"
    );
    assert!(
        !text.contains("SECRET-CARD"),
        "a response body reached the logs:\n{text}"
    );
    Ok(())
}
