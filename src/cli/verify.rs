//! `idemstore verify DIR`: every check, a summary, and each problem named (exit 1).

use std::io::Write;

use crate::inspect::{Closed, Inspector, LogDamage};
use clap::Args;
use serde_json::json;

use super::fail::{Fail, Outcome};
use super::show::{self, Format};

/// Arguments of `verify`.
#[derive(Debug, Args)]
pub(crate) struct VerifyArgs {
    #[command(flatten)]
    read: super::Read,
}

pub(crate) fn run(args: &VerifyArgs) -> Result<Outcome, Fail> {
    let inspector = Inspector::open(&args.read.dir, LogDamage::Report)?;
    let v = inspector.verify()?;
    let mut out = std::io::stdout().lock();
    match Format::of(args.read.json) {
        Format::Json => show::json_line(
            &mut out,
            &json!({
                "sound": v.is_sound(),
                "closed_cleanly": inspector.closed() == Closed::Cleanly,
                "segments": v.segments,
                "frames": v.frames,
                "pending_frames": v.pending_frames,
                "torn_tail": v.torn_tail.as_ref().map(|(s, o)| json!({"segment": s, "offset": o})),
                "records": v.records,
                "partitions": v.partitions,
                "tables_in_log": v.tables_in_log,
                "problems": v.problems.iter().map(ToString::to_string).collect::<Vec<_>>(),
            }),
        )?,
        Format::Text => {
            let torn = match &v.torn_tail {
                Some((segment, offset)) => format!(
                    "; a torn last frame in {segment} at offset {offset} (never acknowledged; the next open drops it)"
                ),
                None => String::new(),
            };
            writeln!(
                out,
                "log       {} segments, {} valid frames, {} past the checkpoint{torn}",
                v.segments, v.frames, v.pending_frames
            )?;
            writeln!(
                out,
                "database  opens ({}); {} records, {} partitions checked",
                closed(&inspector),
                v.records,
                v.partitions
            )?;
            writeln!(
                out,
                "tables    {} business tables written by the log past the checkpoint",
                v.tables_in_log
            )?;
            for problem in &v.problems {
                writeln!(out, "problem: {problem}")?;
            }
            match v.problems.len() {
                0 => writeln!(out, "ok: no problems found")?,
                n => writeln!(out, "FAILED: {n} problems")?,
            }
        }
    }
    Ok(if v.is_sound() {
        Outcome::Done
    } else {
        Outcome::Problems
    })
}

/// How the database file was found, for people.
pub(crate) fn closed(inspector: &Inspector) -> &'static str {
    match inspector.closed() {
        Closed::Cleanly => "closed cleanly",
        _ => "not closed cleanly: repaired in memory, the file untouched",
    }
}
