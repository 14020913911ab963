//! `idemstore compact DIR`: rewrite the database file to give back free space, with the store
//! opened for writing (the service must be stopped).

use std::io::Write;

use crate::Sweep;
use clap::Args;
use serde_json::json;

use super::fail::{Fail, Outcome};
use super::show::{self, Format};

/// Arguments of `compact`.
#[derive(Debug, Args)]
pub(crate) struct CompactArgs {
    #[command(flatten)]
    maintain: super::Maintain,
}

pub(crate) fn run(args: &CompactArgs) -> Result<Outcome, Fail> {
    let store = super::open_for_writing(&args.maintain.dir, |b| b.sweep(Sweep::Off))?;
    let compacted = store
        .compact()
        .map_err(|e| Fail::Input(format!("compaction failed: {e}")))?;
    super::evict::close(store)?;
    let mut out = std::io::stdout().lock();
    match Format::of(args.maintain.json) {
        Format::Json => show::json_line(
            &mut out,
            &json!({
                "bytes_before": compacted.bytes_before,
                "bytes_after": compacted.bytes_after,
                "reclaimed": compacted.reclaimed(),
            }),
        )?,
        Format::Text => writeln!(
            out,
            "database {} -> {}: {} given back",
            show::bytes(compacted.bytes_before),
            show::bytes(compacted.bytes_after),
            show::bytes(compacted.reclaimed())
        )?,
    }
    Ok(Outcome::Done)
}
