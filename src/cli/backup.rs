//! `idemstore backup DIR DEST`: copy a stopped store into a new directory that opens as a
//! store, through `Store::backup`, with the store opened for writing.
//!
//! A store that a running process holds cannot be copied from another process: its newest
//! acknowledged writes may be in that process's log and memory only, and the database file
//! changes underneath a reader. So this takes the store's lock as an opening store does, and
//! when a process holds it, says to call `Store::backup` from the service, or to stop it first.
//! The tool knows no business table's types either (a table is copied through them), so a
//! store with business tables is backed up by its service.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::inspect::InspectError;
use crate::{BackupError, Holder, Sweep};
use clap::Args;
use serde_json::json;

use super::fail::{Fail, Outcome};
use super::show::{self, Format};

/// Arguments of `backup`.
#[derive(Debug, Args)]
pub(crate) struct BackupArgs {
    #[command(flatten)]
    maintain: super::Maintain,
    /// Where the copy goes: a path that does not exist yet, or an empty directory.
    dest: PathBuf,
}

pub(crate) fn run(args: &BackupArgs) -> Result<Outcome, Fail> {
    let dir = &args.maintain.dir;
    // Before the store is opened (which writes to it): a refused destination changes nothing.
    crate::storage::check_backup_destination(&args.dest).map_err(|e| Fail::Input(e.to_string()))?;
    let store = super::open_existing(dir, |b| b.sweep(Sweep::Off), |holder| held(dir, holder))?;
    let backed_up = store.backup(&args.dest).map_err(|e| match e {
        BackupError::UnregisteredTable { name } => Fail::Input(format!(
            "the store has business table {name:?}, whose key and value types only the service knows: call Store::backup from the service (it registers its tables) to back this store up"
        )),
        other => Fail::Input(format!("backup failed: {other}")),
    })?;
    super::evict::close(store)?;
    let mut out = std::io::stdout().lock();
    match Format::of(args.maintain.json) {
        Format::Json => show::json_line(
            &mut out,
            &json!({
                "dest": args.dest.display().to_string(),
                "records": backed_up.records,
                "messages": backed_up.messages,
                "business_rows": backed_up.business_rows,
                "bytes": backed_up.bytes,
                "next_fence": backed_up.next_fence,
                "duration_ms": u64::try_from(backed_up.duration.as_millis()).unwrap_or(u64::MAX),
            }),
        )?,
        Format::Text => writeln!(
            out,
            "backed up {} records and {} outbox messages to {}: {} in {}",
            backed_up.records,
            backed_up.messages,
            args.dest.display(),
            show::bytes(backed_up.bytes),
            show::duration(backed_up.duration)
        )?,
    }
    Ok(Outcome::Done)
}

/// The refusal of a store that something else holds, with what to do instead.
fn held(dir: &Path, holder: Holder) -> Fail {
    if holder == Holder::Readers {
        return InspectError::InUse {
            path: dir.to_path_buf(),
            holder,
        }
        .into();
    }
    Fail::Input(format!(
        "{} is in use by {holder}: a store that a running process holds cannot be copied from another process (its newest writes may be in that process's log and memory only); call Store::backup from the service, or stop it and run this again",
        dir.display()
    ))
}
