//! `idemstore stats DIR`: records by state, sizes, the oldest work in progress, the checkpoint
//! and what the next open would replay.

use std::io::Write;

use crate::inspect::{Inspector, LogDamage, Summary};
use clap::Args;
use serde_json::json;

use super::fail::{Fail, Outcome};
use super::show::{self, Format};

/// Arguments of `stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    #[command(flatten)]
    read: super::Read,
}

pub(crate) fn run(args: &StatsArgs) -> Result<Outcome, Fail> {
    let inspector = Inspector::open(&args.read.dir, LogDamage::Refuse)?;
    let summary = inspector.summary()?;
    let mut out = std::io::stdout().lock();
    match Format::of(args.read.json) {
        Format::Json => show::json_line(&mut out, &to_json(&inspector, &summary))?,
        Format::Text => text(&mut out, &inspector, &summary)?,
    }
    Ok(Outcome::Done)
}

fn to_json(inspector: &Inspector, s: &Summary) -> serde_json::Value {
    json!({
        "dir": inspector.dir().display().to_string(),
        "records": s.records,
        "in_progress": s.in_progress,
        "completed": s.completed,
        "expired_awaiting_eviction": s.expired,
        "tombstones": s.tombstones,
        "partitions": s.partitions,
        "oldest_in_progress_ms": s.oldest_in_progress.map(|d| d.as_millis() as u64),
        "db_bytes": s.db_bytes,
        "closed_cleanly": inspector.closed() == crate::inspect::Closed::Cleanly,
        "db_modified": s.db_modified.map(show::time),
        "log_bytes": s.log_bytes,
        "log_segments": s.segments,
        "checkpoint_seq": s.checkpoint_seq,
        "next_fence": s.next_fence,
        "pending_replay": {
            "frames": s.pending.frames_replayed,
            "bytes": s.pending.bytes_replayed,
            "torn_tail": s.pending.torn_tail.as_ref().map(|(segment, offset)| json!({
                "segment": segment, "offset": offset, "bytes": s.pending.bytes_dropped,
            })),
        },
        "tables_in_log": s.tables_in_log.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>(),
    })
}

fn text(out: &mut impl Write, inspector: &Inspector, s: &Summary) -> std::io::Result<()> {
    writeln!(out, "store               {}", inspector.dir().display())?;
    writeln!(
        out,
        "records             {} (in progress {}, completed {}, of which tombstones {}) in {} partitions",
        s.records, s.in_progress, s.completed, s.tombstones, s.partitions
    )?;
    writeln!(
        out,
        "awaiting eviction   {} in partitions whose TTLs have all passed",
        s.expired
    )?;
    writeln!(
        out,
        "oldest in progress  {}",
        s.oldest_in_progress
            .map_or_else(|| "none".to_owned(), show::duration)
    )?;
    writeln!(
        out,
        "database            {}, {} (last written {})",
        show::bytes(s.db_bytes),
        super::verify::closed(inspector),
        s.db_modified
            .map_or_else(|| "unknown".to_owned(), show::time)
    )?;
    writeln!(
        out,
        "log                 {} in {} segments",
        show::bytes(s.log_bytes),
        s.segments
    )?;
    writeln!(
        out,
        "checkpoint          frame {} (next fence {})",
        s.checkpoint_seq, s.next_fence
    )?;
    let torn = match &s.pending.torn_tail {
        Some((segment, offset)) => format!(
            "a torn last frame in {segment} at offset {offset} ({} bytes, never acknowledged) to drop",
            s.pending.bytes_dropped
        ),
        None => "no torn frame".to_owned(),
    };
    writeln!(
        out,
        "next open replays   {} frames ({}) past the checkpoint; {torn}",
        s.pending.frames_replayed,
        show::bytes(s.pending.bytes_replayed)
    )?;
    Ok(())
}
