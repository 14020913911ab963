//! `idemstore list DIR --state S [--tenant T] [--older-than 5m] [--limit N]`.

use std::io::Write;

use crate::inspect::{Entry, Filter, Inspector, LogDamage, StateFilter};
use crate::{RecordState, Scope};
use clap::{Args, ValueEnum};
use serde_json::json;

use super::fail::{Fail, Outcome};
use super::show::{self, Format, Length};

/// A record state, as typed on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum State {
    /// Claims held, or abandoned by a crashed or stuck attempt (oldest lease first).
    InProgress,
    /// Completed records with their stored response (soonest expiry first).
    Completed,
    /// Markers left after a response was evicted (soonest to go first).
    Tombstone,
}

/// Arguments of `list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    read: super::Read,
    /// Which records.
    #[arg(long, value_enum)]
    state: State,
    /// Only this tenant's records.
    #[arg(long)]
    tenant: Option<String>,
    /// Only records first claimed at least this long ago: 500ms, 30s, 5m, 2h, 1d.
    #[arg(long, value_parser = show::parse_duration)]
    older_than: Option<std::time::Duration>,
    /// At most this many records.
    #[arg(long, default_value_t = 100)]
    limit: usize,
}

pub(crate) fn run(args: &ListArgs) -> Result<Outcome, Fail> {
    if let Some(tenant) = &args.tenant {
        // The tenant is checked as the store checks it: a bad one is named, not just unmatched.
        Scope::new(tenant, "x", "x")?;
    }
    let inspector = Inspector::open(&args.read.dir, LogDamage::Refuse)?;
    let entries = inspector.records(&Filter {
        state: match args.state {
            State::InProgress => StateFilter::InProgress,
            State::Completed => StateFilter::Completed,
            State::Tombstone => StateFilter::Tombstone,
        },
        tenant: args.tenant.clone(),
        older_than: args.older_than,
        limit: args.limit,
    })?;
    let mut out = std::io::stdout().lock();
    match Format::of(args.read.json) {
        Format::Json => {
            let list: Vec<_> = entries
                .iter()
                .map(|e| {
                    let mut v = super::get::to_json(&inspector, &e.record, Length::Truncated);
                    v["scope"] = show::scope_json(&e.scope);
                    v
                })
                .collect();
            show::json_line(&mut out, &json!(list))?;
        }
        Format::Text => {
            for entry in &entries {
                line(&mut out, &inspector, entry)?;
            }
            if entries.is_empty() {
                writeln!(out, "no records")?;
            }
        }
    }
    Ok(Outcome::Done)
}

fn line(out: &mut impl Write, inspector: &Inspector, e: &Entry) -> std::io::Result<()> {
    let r = &e.record;
    let now = inspector.now();
    let when = match r.state() {
        RecordState::InProgress { lease_until, .. } if *lease_until <= now => {
            format!("lease ended {}", show::time(*lease_until))
        }
        RecordState::InProgress { lease_until, .. } => {
            format!("lease until {}", show::time(*lease_until))
        }
        RecordState::Completed {
            expires_at,
            response,
            ..
        } => format!(
            "status {}, expires {}",
            response.status(),
            show::time(*expires_at)
        ),
        RecordState::Tombstone { until, .. } => format!("until {}", show::time(*until)),
    };
    writeln!(
        out,
        "{}  age {}  attempt {}  fence {}  {when}",
        show::scope(&e.scope),
        show::duration(now.saturating_since(r.created_at())),
        r.attempt(),
        r.fence()
    )
}
