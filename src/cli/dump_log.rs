//! `idemstore dump-log DIR [--from SEQ]`: one line per frame of the log.

use std::io::Write;

use crate::inspect::{FrameStatus, InspectError, Inspector, LogDamage, LogFrame, OpKind};
use crate::{Scope, Timestamp};
use clap::Args;
use serde_json::json;

use super::fail::{Fail, Outcome};
use super::show::{self, Format};

/// Arguments of `dump-log`.
#[derive(Debug, Args)]
pub(crate) struct DumpLogArgs {
    #[command(flatten)]
    read: super::Read,
    /// Only frames with this sequence number or a later one.
    #[arg(long, default_value_t = 0)]
    from: u64,
}

/// Stops the walk: the output closed or failed, or a segment could not be read.
enum Stop {
    Inspect(InspectError),
    Output(std::io::Error),
}

impl From<InspectError> for Stop {
    fn from(e: InspectError) -> Self {
        Stop::Inspect(e)
    }
}

pub(crate) fn run(args: &DumpLogArgs) -> Result<Outcome, Fail> {
    // Damage does not stop the dump: the frames before it are what an operator needs to see.
    let inspector = Inspector::open(&args.read.dir, LogDamage::Report)?;
    let format = Format::of(args.read.json);
    let mut out = std::io::stdout().lock();
    let mut frames = 0u64;
    let damage = inspector
        .frames(args.from, |frame| {
            frames += 1;
            match format {
                Format::Json => show::json_line(&mut out, &to_json(frame)),
                Format::Text => writeln!(out, "{}", line(frame)),
            }
            .map_err(Stop::Output)
        })
        .map_err(|stop| match stop {
            Stop::Inspect(e) => Fail::from(e),
            Stop::Output(e) => Fail::from(e),
        })?;
    if format == Format::Text && frames == 0 {
        writeln!(out, "no frames")?;
    }
    out.flush()?;
    // One line for the damage, naming segment and offset: recovery's verdict when it has one
    // (it covers missing segments too), else the first damaged segment found.
    if let Some(e) = inspector.log_damage() {
        return Err(Fail::Input(e.to_string()));
    }
    if let Some(d) = damage.first() {
        return Err(Fail::Input(format!(
            "the log is damaged in {} at offset {}: {}",
            d.segment, d.offset, d.detail
        )));
    }
    Ok(Outcome::Done)
}

/// A key of one of the store's tables (or a business table's) for people.
fn key(table: &str, key: &[u8]) -> String {
    let scope =
        |bytes: &[u8]| Scope::decode(bytes).map_or_else(|_| show::hex(bytes), |s| show::scope(&s));
    match table {
        // Format 3's record tables, and format 2's (a log an older build left).
        "idemstore.claims" | "idemstore.records" => scope(key),
        "idemstore.done" => match key.split_first_chunk::<4>() {
            Some((partition, rest)) => {
                format!("p{} {}", u32::from_be_bytes(*partition), scope(rest))
            }
            None => show::hex(key),
        },
        "idemstore.partitions" => match <[u8; 4]>::try_from(key) {
            Ok(partition) => format!("p{}", u32::from_be_bytes(partition)),
            Err(_) => show::hex(key),
        },
        "idemstore.expiry" | "idemstore.leases" | "idemstore.tombstones" => {
            match key.split_first_chunk::<8>() {
                Some((at, rest)) => format!(
                    "@{} {}",
                    show::time(Timestamp::from_millis(u64::from_be_bytes(*at))),
                    scope(rest)
                ),
                None => show::hex(key),
            }
        }
        _ => show::text_or_hex(key),
    }
}

fn line(frame: &LogFrame) -> String {
    let status = match frame.status {
        FrameStatus::Checkpointed => "checkpointed",
        _ => "pending",
    };
    let ops = match &frame.ops {
        Err(detail) => format!("undecodable payload: {detail}"),
        Ok(ops) => ops
            .iter()
            .map(|op| match op.op {
                OpKind::Put { value_len } => {
                    format!(
                        "{} put {} ({value_len} B)",
                        op.table,
                        key(&op.table, &op.key)
                    )
                }
                _ => format!("{} delete {}", op.table, key(&op.table, &op.key)),
            })
            .collect::<Vec<_>>()
            .join("; "),
    };
    format!(
        "{} offset {} seq {} size {} {status}: {ops}",
        frame.segment, frame.offset, frame.seq, frame.size
    )
}

fn to_json(frame: &LogFrame) -> serde_json::Value {
    json!({
        "segment": frame.segment,
        "offset": frame.offset,
        "seq": frame.seq,
        "size": frame.size,
        "status": match frame.status { FrameStatus::Checkpointed => "checkpointed", _ => "pending" },
        "ops": match &frame.ops {
            Ok(ops) => json!(ops.iter().map(|op| json!({
                "table": op.table,
                "key": key(&op.table, &op.key),
                "op": match op.op { OpKind::Put { .. } => "put", _ => "delete" },
                "value_bytes": match op.op { OpKind::Put { value_len } => Some(value_len), _ => None },
            })).collect::<Vec<_>>()),
            Err(detail) => json!({ "error": detail }),
        },
    })
}
