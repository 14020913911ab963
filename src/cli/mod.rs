//! The `idemstore` command-line tool (feature `cli`): look at an idempotency store's
//! directory, check it, and run its maintenance.
//!
//! This module is the tool's whole source. A binary that ships the tool calls [`run`] from its
//! `main` and returns what it answers, as this package's own `idemstore` binary
//! (`src/bin/idemstore.rs`) does:
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     idemstore::cli::run()
//! }
//! ```
//!
//! The read commands (`stats`, `get`, `list`, `verify`, `dump-log`) open the store read-only
//! through [`crate::inspect`] and never change it; `evict`, `compact` and `backup` open it as a
//! service would. Exit codes: 0 done (for `verify`: sound), 1 `verify` found problems or `get`
//! found no record, 2 bad input or a store that cannot be read (one line on stderr).

mod backup;
mod compact;
mod dump_log;
mod evict;
mod fail;
mod get;
mod list;
#[cfg(feature = "nats")]
mod restore;
mod show;
mod stats;
mod verify;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::inspect::InspectError;
use crate::{Builder, Holder, OpenError, RecoveryError, Store};
use clap::{Args, Parser, Subcommand};

use fail::{Fail, Outcome};

/// Inspect and maintain an idemstore store directory.
///
/// Read commands open the store read-only and never change it; a store held open by a running
/// process cannot be read (ask the service's /stats instead).
#[derive(Debug, Parser)]
#[command(name = "idemstore", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Options every read command takes.
#[derive(Debug, Args)]
struct Read {
    /// The store's directory (the one given to `Store::open`).
    dir: PathBuf,
    /// Print JSON instead of text, for scripts.
    #[arg(long)]
    json: bool,
}

/// Options the maintenance commands take.
#[derive(Debug, Args)]
struct Maintain {
    /// The store's directory. The service using it must be stopped: these open it for writing.
    dir: PathBuf,
    /// Print JSON instead of text, for scripts.
    #[arg(long)]
    json: bool,
}

/// Opens an existing store for writing, refusing (as the read commands do) a directory that
/// is missing, not a store, or in use; `Store::open` alone would create a new store.
fn open_for_writing(dir: &Path, settings: impl FnOnce(Builder) -> Builder) -> Result<Store, Fail> {
    open_existing(dir, settings, |holder| {
        InspectError::InUse {
            path: dir.to_path_buf(),
            holder,
        }
        .into()
    })
}

/// [`open_for_writing`], with the refusal of a directory in use (naming its holder) left to
/// the command, which knows what to advise.
fn open_existing(
    dir: &Path,
    settings: impl FnOnce(Builder) -> Builder,
    in_use: impl FnOnce(Holder) -> Fail,
) -> Result<Store, Fail> {
    if !dir.is_dir() {
        return Err(InspectError::NoSuchDirectory {
            path: dir.to_path_buf(),
        }
        .into());
    }
    if !crate::storage::db_file(dir).is_file() {
        return Err(InspectError::no_database(dir.to_path_buf()).into());
    }
    settings(Store::builder()).open(dir).map_err(|e| match e {
        OpenError::AlreadyOpen { holder, .. } => in_use(holder),
        // The tool knows no business table's types, so it cannot replay a log that writes
        // one; the service can.
        OpenError::Recovery(RecoveryError::UnknownTable { table, .. }) => Fail::Input(format!(
            "the log past the last checkpoint writes table {table:?}, which only the service can open (it knows its types): start the service once and stop it cleanly (its close checkpoints the log), then run this again"
        )),
        other => Fail::Input(other.to_string()),
    })
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Records by state, file and log sizes, the oldest work in progress, the checkpoint, and
    /// what the next open would replay.
    Stats(stats::StatsArgs),
    /// One record: state, fingerprint, fence, attempt, lease, expiry, checkpoint and response.
    Get(get::GetArgs),
    /// Records of one state, oldest first (`--state in-progress --older-than 5m`: abandoned
    /// work).
    List(list::ListArgs),
    /// Check the log's frames, the database, the indexes against the records, and the tables
    /// the log writes; exits 1 naming each problem.
    Verify(verify::VerifyArgs),
    /// One line per log frame: segment, offset, sequence number, size and operations.
    DumpLog(dump_log::DumpLogArgs),
    /// Evict completed records past their TTL (opens the store for writing).
    Evict(evict::EvictArgs),
    /// Rewrite the database file to give back free space (opens the store for writing).
    Compact(compact::CompactArgs),
    /// Copy a stopped store into a new directory that opens as a store (opens the store for
    /// writing; a running service calls `Store::backup` instead).
    Backup(backup::BackupArgs),
    /// Rebuild a store from the JetStream stream its log was shipped to: the latest snapshot
    /// and the frames after it (feature `nats`).
    #[cfg(feature = "nats")]
    Restore(restore::RestoreArgs),
}

/// Runs the tool: parses the process's arguments ([`std::env::args`]), runs the command they
/// name, and answers the exit code the process should end with.
///
/// It installs a panic hook first, so that a bug ends in one line on stderr rather than a
/// backtrace. Usage errors, `--help` and `--version` are clap's: it prints them and exits the
/// process itself (with 2 for a usage error, 0 for help).
#[must_use]
pub fn run() -> ExitCode {
    // A bug must still end in one line, never a backtrace.
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        eprintln!("idemstore: internal error: {message} (please report it)");
    }));
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Stats(args) => stats::run(&args),
        Command::Get(args) => get::run(&args),
        Command::List(args) => list::run(&args),
        Command::Verify(args) => verify::run(&args),
        Command::DumpLog(args) => dump_log::run(&args),
        Command::Evict(args) => evict::run(&args),
        Command::Compact(args) => compact::run(&args),
        Command::Backup(args) => backup::run(&args),
        #[cfg(feature = "nats")]
        Command::Restore(args) => restore::run(&args),
    };
    match result {
        Ok(Outcome::Done) => ExitCode::SUCCESS,
        Ok(Outcome::Problems) => ExitCode::from(1),
        Err(Fail::Closed) => ExitCode::SUCCESS,
        Err(Fail::Input(message)) => {
            eprintln!("idemstore: {message}");
            ExitCode::from(2)
        }
    }
}
