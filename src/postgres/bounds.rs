//! Every time limit of the PostgreSQL backend, derived by one rule from the two a user sets
//! (the lease and the timeout), so that no layer waits longer than the layer above it
//! expects, and a silent peer costs a key about one lease, not the kernel's two hours. The
//! rule and why are told once, for users, on [`PgBuilder`](super::PgBuilder) ("Time
//! limits"); this is its one implementation.

use std::time::Duration;

use crate::model::clock::duration_millis;

/// The shortest silence after which the server ends a session: a loaded client (a busy
/// runtime, a pause) may go quiet for a few seconds without being gone, and TCP keepalives
/// count whole seconds.
pub(crate) const MIN_SILENCE: Duration = Duration::from_secs(4);

/// The shortest statement timeout of the schema's setup: it may wait for another instance's
/// migration of the same prefix, and creates tables and indexes, which a per-call timeout
/// of a few hundred milliseconds would cut short under load.
pub(crate) const MIN_SETUP: Duration = Duration::from_secs(60);

/// Keepalive probes the server sends before it gives a silent client up.
const KEEPALIVE_PROBES: u32 = 3;

/// The time limits of one store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    /// Each statement (the session's `statement_timeout`), and the wait for a pooled
    /// connection: `PgBuilder::timeout`.
    pub(crate) statement: Duration,
    /// One call on the client: a wait for a connection, then a statement.
    pub(crate) call: Duration,
    /// How long a session may go silent before the server ends it.
    pub(crate) silence: Duration,
    /// Each statement of the schema's setup (the migration), instead of `statement`.
    pub(crate) setup: Duration,
}

impl Bounds {
    /// The rule: everything from the lease and the timeout.
    pub(crate) fn new(lease: Duration, timeout: Duration) -> Self {
        let call = timeout.saturating_mul(2);
        Bounds {
            statement: timeout,
            call,
            silence: lease.max(call).max(MIN_SILENCE),
            setup: timeout.max(MIN_SETUP),
        }
    }

    /// The settings every connection of the store starts its session with (set when it
    /// connects, so that a replaced connection has them too).
    pub(crate) fn session(&self) -> [(&'static str, String); 6] {
        let silence = self.silence;
        [
            ("statement_timeout", millis(self.statement)),
            ("idle_in_transaction_session_timeout", millis(silence)),
            // Half the silence idle, then three probes a sixth of it apart.
            ("tcp_keepalives_idle", seconds(silence / 2)),
            ("tcp_keepalives_interval", seconds(silence / 6)),
            ("tcp_keepalives_count", KEEPALIVE_PROBES.to_string()),
            ("tcp_user_timeout", millis(silence)),
        ]
    }

    /// The statements that set [`session`](Self::session)'s settings, sent once a connection
    /// is up. Not startup parameters (`options`): a pooler such as PgBouncer refuses those
    /// (`unsupported startup parameter`) or, told to ignore them, drops them, and a session
    /// pooler keeps what a session sets.
    pub(crate) fn session_statements(&self) -> String {
        self.session()
            .iter()
            .map(|(setting, value)| format!("SET {setting} = {value}; "))
            .collect()
    }

    /// The statement that gives the migration's transaction its own statement timeout.
    pub(crate) fn setup_statement(&self) -> String {
        format!("SET LOCAL statement_timeout = {}", millis(self.setup))
    }

    /// The statement that bounds the relay lock's session even while it is idle outside a
    /// transaction: its lock outlives a silent relay by at most `silence`.
    pub(crate) fn idle_session(&self) -> String {
        format!("SET idle_session_timeout = {}", millis(self.silence))
    }

    /// How long a connection kept for its session (the relay's lock, `LISTEN`) may go
    /// unused before the store touches it: well inside `idle_session_timeout`, and soon
    /// enough to notice a silent one within about the silence bound.
    pub(crate) fn touch(&self) -> Duration {
        self.silence / 4
    }
}

fn millis(d: Duration) -> String {
    duration_millis(d).to_string()
}

/// Whole seconds, rounded up, at least one (zero would mean the system's default).
fn seconds(d: Duration) -> String {
    duration_millis(d).div_ceil(1000).max(1).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bound_follows_from_the_lease_and_the_timeout() {
        let defaults = Bounds::new(Duration::from_secs(30), Duration::from_secs(5));
        assert_eq!(defaults.call, Duration::from_secs(10));
        assert_eq!(defaults.silence, Duration::from_secs(30));
        assert_eq!(defaults.setup, MIN_SETUP);
        let session = defaults.session();
        let get = |name: &str| {
            session
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("statement_timeout"), Some("5000"));
        assert_eq!(get("idle_in_transaction_session_timeout"), Some("30000"));
        assert_eq!(get("tcp_keepalives_idle"), Some("15"));
        assert_eq!(get("tcp_keepalives_interval"), Some("5"));
        assert_eq!(get("tcp_user_timeout"), Some("30000"));
        // A short lease never ends a session sooner than one call may take, or MIN_SILENCE.
        let short = Bounds::new(Duration::from_millis(10), Duration::from_secs(3));
        assert_eq!(short.silence, Duration::from_secs(6));
        let tiny = Bounds::new(Duration::from_millis(1), Duration::from_millis(1));
        assert_eq!(tiny.silence, MIN_SILENCE);
        assert!(
            tiny.session().iter().all(|(_, v)| v != "0"),
            "zero means off"
        );
    }
}
