//! `idemstore get DIR --tenant T --operation O --key K`: one record in full.

use std::io::Write;

use crate::inspect::{Inspector, LogDamage};
use crate::{Record, RecordState, Response, Scope, Timestamp};
use clap::Args;
use serde_json::json;

use super::fail::{Fail, Outcome};
use super::show::{self, Format, Length};

/// Arguments of `get`.
#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    #[command(flatten)]
    read: super::Read,
    /// The tenant (the authenticated caller the key belongs to).
    #[arg(long)]
    tenant: String,
    /// The operation (`create_charge`, `POST /orders`, ...).
    #[arg(long)]
    operation: String,
    /// The client's idempotency key.
    #[arg(long)]
    key: String,
    /// Show the whole response body and checkpoint (by default cut at 1,024 bytes).
    #[arg(long)]
    full: bool,
}

pub(crate) fn run(args: &GetArgs) -> Result<Outcome, Fail> {
    let scope = Scope::new(&args.tenant, &args.operation, &args.key)?;
    let inspector = Inspector::open(&args.read.dir, LogDamage::Refuse)?;
    let record = inspector.record(&scope)?;
    let length = if args.full {
        Length::Full
    } else {
        Length::Truncated
    };
    let mut out = std::io::stdout().lock();
    match (Format::of(args.read.json), &record) {
        (Format::Json, _) => show::json_line(
            &mut out,
            &json!({
                "scope": show::scope_json(&scope),
                "found": record.is_some(),
                "record": record.as_ref().map(|r| to_json(&inspector, r, length)),
            }),
        )?,
        (Format::Text, None) => writeln!(out, "no record for {}", show::scope(&scope))?,
        (Format::Text, Some(r)) => text(&mut out, &inspector, &scope, r, length)?,
    }
    Ok(if record.is_some() {
        Outcome::Done
    } else {
        Outcome::Problems
    })
}

/// Whether `t` has passed, for the reader.
fn passed(inspector: &Inspector, t: crate::Timestamp) -> &'static str {
    if t <= inspector.now() {
        " (passed)"
    } else {
        ""
    }
}

pub(crate) fn to_json(inspector: &Inspector, r: &Record, length: Length) -> serde_json::Value {
    let mut v = json!({
        "state": r.state().name(),
        "fingerprint": show::hex(r.fingerprint().as_bytes()),
        "fence": r.fence(),
        "attempt": r.attempt(),
        "created_at": show::time(r.created_at()),
        "age_ms": inspector.now().saturating_since(r.created_at()).as_millis() as u64,
    });
    match r.state() {
        RecordState::InProgress {
            lease_until,
            checkpoint,
        } => {
            v["lease_until"] = json!(show::time(*lease_until));
            v["lease_expired"] = json!(*lease_until <= inspector.now());
            v["checkpoint"] = match checkpoint {
                Some(bytes) => {
                    let (shown, cut) = show::body(bytes, length);
                    json!({ "bytes": bytes.len(), "value": shown, "truncated": cut })
                }
                None => serde_json::Value::Null,
            };
        }
        RecordState::Completed {
            completed_at,
            expires_at,
            response,
        } => {
            v["completed_at"] = json!(show::time(*completed_at));
            v["expires_at"] = json!(show::time(*expires_at));
            v["expired"] = json!(*expires_at <= inspector.now());
            let (body, cut) = show::body(response.body(), length);
            v["response"] = json!({
                "status": response.status(),
                "headers": response.headers().iter().map(|(name, value)| {
                    json!([name, show::text_or_hex(value)])
                }).collect::<Vec<_>>(),
                "body": body,
                "body_bytes": response.body().len(),
                "truncated": cut,
            });
        }
        RecordState::Tombstone {
            completed_at,
            until,
        } => {
            v["completed_at"] = json!(show::time(*completed_at));
            v["until"] = json!(show::time(*until));
        }
    }
    v
}

/// The record as `key   value` lines: what every record has, then what its state adds.
fn text(
    out: &mut impl Write,
    inspector: &Inspector,
    scope: &Scope,
    r: &Record,
    length: Length,
) -> std::io::Result<()> {
    let now = inspector.now();
    writeln!(out, "scope         {}", show::scope(scope))?;
    writeln!(out, "state         {}", r.state().name())?;
    writeln!(
        out,
        "fingerprint   {}",
        show::hex(r.fingerprint().as_bytes())
    )?;
    writeln!(out, "fence         {} (attempt {})", r.fence(), r.attempt())?;
    writeln!(
        out,
        "created       {} ({} ago)",
        show::time(r.created_at()),
        show::duration(now.saturating_since(r.created_at()))
    )?;
    match r.state() {
        RecordState::InProgress {
            lease_until,
            checkpoint,
        } => in_progress_text(out, inspector, *lease_until, checkpoint.as_deref(), length),
        RecordState::Completed {
            completed_at,
            expires_at,
            response,
        } => {
            writeln!(out, "completed     {}", show::time(*completed_at))?;
            writeln!(
                out,
                "expires       {}{}",
                show::time(*expires_at),
                passed(inspector, *expires_at)
            )?;
            response_text(out, response, length)
        }
        RecordState::Tombstone {
            completed_at,
            until,
        } => {
            writeln!(out, "completed     {}", show::time(*completed_at))?;
            writeln!(
                out,
                "until         {}{} (the response was evicted; retries are told it expired)",
                show::time(*until),
                passed(inspector, *until)
            )
        }
    }
}

/// A claim's lease and its last checkpoint.
fn in_progress_text(
    out: &mut impl Write,
    inspector: &Inspector,
    lease_until: Timestamp,
    checkpoint: Option<&[u8]>,
    length: Length,
) -> std::io::Result<()> {
    writeln!(
        out,
        "lease until   {}{}",
        show::time(lease_until),
        passed(inspector, lease_until)
    )?;
    match checkpoint {
        None => writeln!(out, "checkpoint    none"),
        Some(bytes) => {
            writeln!(out, "checkpoint    {} bytes", bytes.len())?;
            bytes_text(out, bytes, length)
        }
    }
}

/// A stored response: status, headers, body.
fn response_text(out: &mut impl Write, response: &Response, length: Length) -> std::io::Result<()> {
    writeln!(out, "status        {}", response.status())?;
    for (name, value) in response.headers() {
        writeln!(out, "header        {name}: {}", show::text_or_hex(value))?;
    }
    writeln!(out, "body          {} bytes", response.body().len())?;
    bytes_text(out, response.body(), length)
}

/// A body or checkpoint on a line of its own, and a note if `length` cut it.
fn bytes_text(out: &mut impl Write, bytes: &[u8], length: Length) -> std::io::Result<()> {
    let (shown, cut) = show::body(bytes, length);
    writeln!(out, "{shown}")?;
    if cut {
        writeln!(
            out,
            "(cut at {} bytes; --full shows all)",
            show::TRUNCATE_AT
        )?;
    }
    Ok(())
}
