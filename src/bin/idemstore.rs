//! `idemstore`: look at an idempotency store's directory, check it, and run its maintenance.
//!
//! The tool's source is the library's [`idemstore::cli`] module (feature `cli`); this binary
//! only runs it, as any other package shipping the tool does.

fn main() -> std::process::ExitCode {
    idemstore::cli::run()
}
