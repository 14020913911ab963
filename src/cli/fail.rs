//! How a command ends: its outcome, or one line saying why it could not run.

use std::io;

use crate::inspect::InspectError;

/// A command that ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// It did what was asked (exit 0).
    Done,
    /// It ran and found something wrong, or nothing (exit 1).
    Problems,
}

/// A command that could not run.
#[derive(Debug)]
pub(crate) enum Fail {
    /// Bad input or an unreadable store: one line, exit 2.
    Input(String),
    /// Standard output was closed (`idemstore dump-log DIR | head`): stop quietly.
    Closed,
}

impl From<InspectError> for Fail {
    fn from(e: InspectError) -> Self {
        Fail::Input(e.to_string())
    }
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::BrokenPipe => Fail::Closed,
            _ => Fail::Input(format!("cannot write the output: {e}")),
        }
    }
}

impl From<crate::ScopeError> for Fail {
    fn from(e: crate::ScopeError) -> Self {
        Fail::Input(format!("bad scope part: {e}"))
    }
}
