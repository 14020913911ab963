//! `idemstore restore --from nats://HOST:PORT --store NAME DIR`: rebuild a store from the
//! JetStream stream its log was shipped to (feature `nats`), through `Store::restore`.
//!
//! The tool writes files only: the latest snapshot, and the frames after it as the new
//! store's log, which the service's first open replays through its own tables. So a store with
//! business tables is restored here too.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use crate::replica::JetStream;
use crate::{Store, Takeover};

use super::fail::{Fail, Outcome};
use super::show::{self, Format};

/// Arguments of `restore`.
#[derive(Debug, Args)]
pub(crate) struct RestoreArgs {
    /// The NATS server holding the stream, e.g. `nats://127.0.0.1:4222`.
    #[arg(long = "from", value_name = "URL")]
    from: String,
    /// The stream's name, as the store shipped with (`JetStream::connect(url, NAME)`).
    #[arg(long = "store", value_name = "NAME")]
    store: String,
    /// Make the restored store the stream's writer, fencing the old one off: for the box that
    /// replaces a lost one. Without it the stream keeps its writer (a copy to inspect).
    #[arg(long = "take-over")]
    take_over: bool,
    /// The longest one call to NATS may take, in seconds.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// One JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Where the restored store goes: a path that does not exist yet, or an empty directory.
    dir: PathBuf,
}

pub(crate) fn run(args: &RestoreArgs) -> Result<Outcome, Fail> {
    let source = JetStream::connect(&args.from, &args.store)
        .map_err(|e| Fail::Input(format!("cannot reach the stream: {e}")))?
        .timeout(Duration::from_secs(args.timeout.max(1)));
    let takeover = if args.take_over {
        Takeover::Yes
    } else {
        Takeover::No
    };
    let restored = Store::restore(&source, &args.dir, takeover)
        .map_err(|e| Fail::Input(format!("restore failed: {e}")))?;
    let mut out = std::io::stdout().lock();
    match Format::of(args.json) {
        Format::Json => show::json_line(
            &mut out,
            &json!({
                "dir": args.dir.display().to_string(),
                "snapshot": restored.snapshot,
                "frames": restored.frames,
                "last_frame": restored.last_frame,
                "guarantee": restored.guarantee.as_str(),
                "took_over": restored.took_over,
                "duration_ms": u64::try_from(restored.duration.as_millis()).unwrap_or(u64::MAX),
            }),
        )?,
        Format::Text => writeln!(
            out,
            "restored {} up to frame {} (snapshot at frame {}, {} frames after it) in {}; {}{}",
            args.dir.display(),
            restored.last_frame,
            restored.snapshot,
            restored.frames,
            show::duration(restored.duration),
            match restored.guarantee {
                crate::Guarantee::Complete =>
                    "the old store acknowledged nothing the stream lacked",
                crate::Guarantee::MayLag =>
                    "the old store may have acknowledged more: unknown keys answer as recoveries for a while after the first open",
            },
            if restored.took_over {
                "; the restored store now writes the stream"
            } else {
                "; the stream keeps its writer"
            },
        )?,
    }
    Ok(Outcome::Done)
}
