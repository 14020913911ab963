//! `idemstore evict DIR [--limit N]`: one bounded eviction pass, with the store opened for
//! writing (the service must be stopped).

use std::io::Write;
use std::time::Duration;

use crate::{Backlog, Store, Sweep};
use clap::Args;
use serde_json::json;

use super::fail::{Fail, Outcome};
use super::show::{self, Format};

/// Arguments of `evict`.
#[derive(Debug, Args)]
pub(crate) struct EvictArgs {
    #[command(flatten)]
    maintain: super::Maintain,
    /// At most this many records and tombstones removed.
    #[arg(long, default_value_t = 10_000)]
    limit: usize,
    /// The service's `Builder::tombstone_ttl` (0 if it keeps none): evicted responses leave a
    /// tombstone for this long. Give the service's value, or a late retry may run again.
    #[arg(long, value_parser = show::parse_duration, default_value = "0s")]
    tombstone_ttl: Duration,
}

pub(crate) fn run(args: &EvictArgs) -> Result<Outcome, Fail> {
    let store = super::open_for_writing(&args.maintain.dir, |b| {
        b.sweep(Sweep::Off).tombstone_ttl(args.tombstone_ttl)
    })?;
    let evicted = store
        .evict_expired(args.limit)
        .map_err(|e| Fail::Input(format!("eviction failed: {e}")))?;
    close(store)?;
    let more = evicted.backlog == Backlog::More;
    let mut out = std::io::stdout().lock();
    match Format::of(args.maintain.json) {
        Format::Json => show::json_line(
            &mut out,
            &json!({
                "evicted": evicted.removed,
                "tombstones_removed": evicted.tombstones_removed,
                "more_due": more,
            }),
        )?,
        Format::Text => writeln!(
            out,
            "evicted {} completed records and removed {} tombstones; {}",
            evicted.removed,
            evicted.tombstones_removed,
            if more {
                "more are due: run again"
            } else {
                "nothing more is due"
            }
        )?,
    }
    Ok(Outcome::Done)
}

/// Closes the store, checkpointing it, before the report says it is done.
pub(crate) fn close(store: Store) -> Result<(), Fail> {
    store
        .checkpoint()
        .map_err(|e| Fail::Input(format!("the final checkpoint failed: {e}")))?;
    drop(store);
    Ok(())
}
