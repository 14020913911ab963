//! The statements, written once per store from its table names. Every statement that needs
//! the time computes it once, as `now` (see [`now`]), so the whole statement judges leases and
//! TTLs by one reading of the database's clock.

use std::sync::Arc;

use super::schema::{COMPLETED, HELD, IN_PROGRESS, Names, TOMBSTONE};

/// The time, in milliseconds since the Unix epoch: the parameter `$n` when it is not null (a
/// test's manual clock), else the database's `statement_timestamp()` (the start of the
/// current statement: current inside a long transaction too, and one value for the whole
/// statement, unlike `clock_timestamp()`).
fn now(n: usize) -> String {
    format!(
        "coalesce(${n}::bigint, floor(extract(epoch from statement_timestamp()) * 1000)::bigint)"
    )
}

/// The statements of one store.
#[derive(Debug)]
pub(crate) struct Sql {
    /// The claim of one or several scopes at once: `$1..$3` their tenants, operations and
    /// keys, `$4` their fingerprints (four arrays of one length, no scope twice), `$5` lease
    /// ms, `$6` now, `$7` tombstone TTL ms. Returns a row, with its scope and the time it was
    /// granted at (`claimed_ms`), for each scope it claimed or took over, and one with `busy`
    /// true for each another session holds (see [`Hold::Shared`]). For a batch of `begin`s.
    pub(crate) claim: Arc<str>,
    /// The same for `execute`'s one scope, in its transaction ([`Hold::Exclusive`]).
    pub(crate) claim_held: Arc<str>,
    /// The record and the time, for a claim that wrote nothing: `$1..$3` scope, `$4` now.
    pub(crate) lookup: Arc<str>,
    /// The completion: `$1..$3` scope, `$4` fence, `$5` TTL ms, `$6` now, `$7` status,
    /// `$8` headers, `$9` body, `$10` the notification's payload.
    pub(crate) complete: Arc<str>,
    /// `$1..$3` scope, `$4` fence, `$5` payload.
    pub(crate) release: Arc<str>,
    /// Asks for a notification when the holder finishes: `$1..$3` scope. A row if the scope
    /// is still in progress.
    pub(crate) mark_waiting: Arc<str>,
    /// `$1..$3` scope, `$4` fence, `$5` lease ms, `$6` now, `$7` never shorten.
    pub(crate) extend: Arc<str>,
    /// `$1..$3` scope, `$4` fence, `$5` checkpoint.
    pub(crate) checkpoint: Arc<str>,
    /// Who holds the scope: `$1..$3`.
    pub(crate) holder: Arc<str>,
    /// One eviction pass over completed records: `$1` now, `$2` limit, `$3` tombstone TTL ms.
    pub(crate) evict_completed: Arc<str>,
    /// One pass over tombstones: `$1` now, `$2` limit.
    pub(crate) evict_tombstones: Arc<str>,
    /// `$1` now, `$2` limit.
    pub(crate) abandoned: Arc<str>,
    /// `$1` now.
    pub(crate) stats: Arc<str>,
    /// The completion of a commit that published messages: `complete`'s `$1..$10`, then the
    /// messages in publishing order, `$11` ids, `$12` subjects, `$13` payloads (three arrays
    /// of one length). One statement, so publishing costs no extra round trip.
    pub(crate) complete_publishing: Arc<str>,
    /// The first `$1` pending messages by seq, except those of the subjects in `$2` (a text
    /// array: the subjects waiting out a backoff).
    pub(crate) pending: Arc<str>,
    /// Delivered messages leave: `$1` their seqs.
    pub(crate) delivered: Arc<str>,
    /// Given-up messages move to the dead letters: `$1` seqs, `$2` attempts, `$3` last
    /// errors (three arrays of one length), `$4` now.
    pub(crate) bury: Arc<str>,
    /// The first `$1` dead letters by seq.
    pub(crate) dead_letters: Arc<str>,
    /// The dead letter `$1` back to the outbox, under a new seq.
    pub(crate) retry_dead: Arc<str>,
    /// Deletes the dead letter `$1`.
    pub(crate) drop_dead: Arc<str>,
}

/// The scope's columns matched against `$1..$3`.
const PK: &str = "r.tenant = $1 AND r.operation = $2 AND r.key = $3";
/// A message's columns, as `Message` is read from a row.
const MESSAGE: &str = "seq, id, subject, payload, committed_ms";

impl Sql {
    /// Every statement of the store named `names`: each is written by a function below, in
    /// families (claims, completion, sweep and stats, outbox).
    pub(crate) fn new(names: &Names) -> Self {
        Sql {
            claim: claim(names, Hold::Shared).into(),
            claim_held: claim(names, Hold::Exclusive).into(),
            lookup: lookup(names).into(),
            complete: complete(names).into(),
            complete_publishing: complete_publishing(names).into(),
            release: release(names).into(),
            mark_waiting: mark_waiting(names).into(),
            extend: extend(names).into(),
            checkpoint: checkpoint(names).into(),
            holder: holder(names).into(),
            evict_completed: evict_completed(names).into(),
            evict_tombstones: evict_tombstones(names).into(),
            abandoned: abandoned(names).into(),
            stats: stats(names).into(),
            pending: pending(names).into(),
            delivered: delivered(names).into(),
            bury: bury(names).into(),
            dead_letters: dead_letters(names).into(),
            retry_dead: retry_dead(names).into(),
            drop_dead: drop_dead(names).into(),
        }
    }
}

// Claims: the claim, what a claim that wrote nothing answers from, and what a holder does.

/// How long a batch's claim statement waits for a row another transaction has locked before
/// it gives up (`lock_timeout`, set for that statement alone): past it the batch is split and
/// each half claimed again, so that one locked row delays only the scopes it shares a
/// statement with, and a scope alone with it answers "in progress".
pub(crate) const LOCK_WAIT_MS: u32 = 100;

/// How a claim statement takes each scope's advisory lock (a transaction-level
/// `pg_try_advisory_xact_lock` on a hash of the table and the scope): what tells a claim that
/// another session holds the scope in an open transaction, without waiting on its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// A batch of `begin`s, each in a statement of its own transaction: shared, so batches
    /// never exclude each other; a scope whose lock is held exclusively is answered busy.
    Shared,
    /// `execute`'s claim, inside the transaction that then runs the work: exclusive and
    /// waited for, held until that transaction ends, so a batch's claim of the scope meanwhile
    /// is busy instead of waiting on its uncommitted row, and a racing `execute` of the scope
    /// waits for the first one's commit and replays it.
    Exclusive,
}

/// The advisory lock's key for the scope whose columns are the SQL expressions `tenant`,
/// `operation` and `key`: a 64-bit hash of them and of the table (so that two stores in one
/// database never exclude each other). A collision only makes a claim answer "in progress"
/// once, where it would have waited.
fn scope_lock(names: &Names, tenant: &str, operation: &str, key: &str) -> String {
    let r = &names.records;
    format!(
        "hashtextextended('{r}' || chr(31) || {tenant} || chr(31) || {operation} || chr(31) || {key}, 0)"
    )
}

/// One statement decides and writes, for every scope in it. A conflict updates only when the
/// scope may be claimed: an expired lease of the same request (a take-over: attempt + 1, the
/// checkpoint and first claim kept), or a completed record or tombstone past its time (gone: a
/// fresh claim). A fresh claim's origin is 0: its downstream key derives from the request
/// (`Scope::downstream_key`); a row an earlier build claimed keeps its first fence as origin.
/// Anything else updates nothing and returns no row for that scope; its caller then reads the
/// record to answer without writing.
///
/// The scopes come as arrays, so one statement (one round trip, one WAL flush) claims a whole
/// batch of concurrent `begin`s; a single `begin` is a batch of one. Each row draws its own
/// fence (`nextval` in the select list runs once a row), and the rows are inserted in key
/// order, so two batches lock the scopes they share in the same order.
///
/// A scope another session holds (its advisory lock, see [`Hold`]) is not written: it comes
/// back as a row with `busy` true and the claim's columns null. So a key that one `execute`
/// holds for seconds costs the other scopes of its batch nothing. The shared form also bounds
/// any other row-lock wait to [`LOCK_WAIT_MS`] (`set_config(..., true)`: this statement's own
/// transaction only, which works behind a transaction-pooling PgBouncer too).
fn claim(names: &Names, hold: Hold) -> String {
    let (r, fences) = (&names.records, &names.fences);
    let lock = scope_lock(names, "u.tenant", "u.operation", "u.key");
    let (free, wait) = match hold {
        Hold::Shared => (
            format!("pg_try_advisory_xact_lock_shared({lock})"),
            format!(", set_config('lock_timeout', '{LOCK_WAIT_MS}ms', true) AS wait"),
        ),
        // Waits for the lock; `void` cast to text is '', never null: always free once held.
        Hold::Exclusive => (
            format!("pg_advisory_xact_lock({lock})::text IS NOT NULL"),
            String::new(),
        ),
    };
    format!(
        "WITH t AS (SELECT {now6} AS now{wait}),
         q AS MATERIALIZED (
             SELECT u.tenant, u.operation, u.key, u.fingerprint, {free} AS free
             FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[])
                  AS u(tenant, operation, key, fingerprint)),
         c AS (
             INSERT INTO {r} AS r (tenant, operation, key, fingerprint, state, fence,
                 origin_fence, attempt, created_ms, lease_until_ms)
             SELECT f.tenant, f.operation, f.key, f.fingerprint, {IN_PROGRESS},
                    nextval('{fences}'), 0, 1, t.now, t.now + $5::bigint
             FROM t, (SELECT * FROM q WHERE q.free ORDER BY q.tenant, q.operation, q.key) AS f
             ON CONFLICT (tenant, operation, key) DO UPDATE SET
                 fence = EXCLUDED.fence,
                 origin_fence = CASE WHEN r.state = {IN_PROGRESS} THEN r.origin_fence
                                     ELSE EXCLUDED.origin_fence END,
                 attempt = CASE WHEN r.state = {IN_PROGRESS} THEN r.attempt + 1 ELSE 1 END,
                 created_ms = CASE WHEN r.state = {IN_PROGRESS} THEN r.created_ms
                                   ELSE EXCLUDED.created_ms END,
                 checkpoint = CASE WHEN r.state = {IN_PROGRESS} THEN r.checkpoint END,
                 fingerprint = EXCLUDED.fingerprint,
                 state = {IN_PROGRESS},
                 lease_until_ms = EXCLUDED.lease_until_ms,
                 waiters = false,
                 expires_ms = NULL, completed_ms = NULL,
                 status = NULL, headers = NULL, body = NULL
             WHERE (r.state = {IN_PROGRESS} AND r.fingerprint = EXCLUDED.fingerprint
                    AND r.lease_until_ms <= EXCLUDED.created_ms)
                OR (r.state = {COMPLETED} AND r.expires_ms + $7::bigint <= EXCLUDED.created_ms)
                OR (r.state = {TOMBSTONE} AND r.expires_ms <= EXCLUDED.created_ms)
             RETURNING r.tenant, r.operation, r.key, r.fence, r.origin_fence, r.attempt,
                       r.lease_until_ms, r.checkpoint)
         SELECT c.*, t.now AS claimed_ms, false AS busy FROM c, t
         UNION ALL
         SELECT q.tenant, q.operation, q.key, NULL::bigint, NULL::bigint, NULL::integer,
                NULL::bigint, NULL::bytea, NULL::bigint, true FROM q WHERE NOT q.free",
        now6 = now(6)
    )
}

fn lookup(names: &Names) -> String {
    let r = &names.records;
    format!(
        "SELECT r.fingerprint, r.state, r.fence, r.origin_fence, r.attempt, r.created_ms,
                r.lease_until_ms, r.expires_ms, r.completed_ms, r.checkpoint,
                r.status, r.headers, r.body, {now4} AS now
         FROM {r} AS r WHERE {PK}",
        now4 = now(4)
    )
}

fn mark_waiting(names: &Names) -> String {
    let r = &names.records;
    format!(
        "UPDATE {r} AS r SET waiters = true
         WHERE {PK} AND {HELD} RETURNING r.fence"
    )
}

fn extend(names: &Names) -> String {
    let r = &names.records;
    format!(
        "UPDATE {r} AS r SET lease_until_ms = CASE WHEN $7::boolean
             THEN greatest(r.lease_until_ms, t.now + $5::bigint) ELSE t.now + $5::bigint END
         FROM (SELECT {now6} AS now) AS t
         WHERE {PK} AND r.fence = $4 AND {HELD}
         RETURNING r.lease_until_ms",
        now6 = now(6)
    )
}

fn checkpoint(names: &Names) -> String {
    let r = &names.records;
    format!(
        "UPDATE {r} AS r SET checkpoint = $5
         WHERE {PK} AND r.fence = $4 AND {HELD} RETURNING r.fence"
    )
}

fn holder(names: &Names) -> String {
    let r = &names.records;
    format!("SELECT r.fence, r.state FROM {r} AS r WHERE {PK}")
}

// Completion: the holder stores its response (publishing messages with it, or not), or gives
// the scope back.

/// The completion's CTEs (`$1..$9`; `done` has a row only if the holder's fence still holds
/// the record), shared by the plain completion and the one that publishes.
///
/// The completion holds the scope's advisory lock (see [`Hold`]) from its statement to its
/// commit: a claim of the scope meanwhile is answered busy, not kept waiting on the row (the
/// wait was a whole statement timeout when the `COMMIT` was lost on its way).
fn completing(names: &Names) -> String {
    let r = &names.records;
    let lock = scope_lock(names, "$1", "$2", "$3");
    format!(
        "t AS (SELECT {now6} AS now, pg_advisory_xact_lock({lock})::text AS held),
         done AS (
             UPDATE {r} AS r SET state = {COMPLETED}, completed_ms = t.now,
                 expires_ms = t.now + $5::bigint, lease_until_ms = NULL,
                 checkpoint = NULL, status = $7, headers = $8, body = $9
             FROM t WHERE {PK} AND r.fence = $4 AND {HELD}
             RETURNING r.completed_ms, r.waiters)",
        now6 = now(6)
    )
}

/// The completion's answer (`$10` the notification's payload), shared like `completing`.
fn notify_done(names: &Names) -> String {
    let channel = &names.channel;
    format!(
        "SELECT done.completed_ms FROM done
         LEFT JOIN LATERAL (SELECT pg_notify('{channel}', $10) WHERE done.waiters) AS n ON true"
    )
}

/// The notification is sent only if the update happened and someone waits for it (`waiters`),
/// and only on commit. Not for every completion: PostgreSQL serializes the commits of
/// transactions that notify, which would undo its group commit.
fn complete(names: &Names) -> String {
    let (completing, notify_done) = (completing(names), notify_done(names));
    format!("WITH {completing} {notify_done}")
}

/// The messages go in only if the completion updated the record (a stale commit rolls back
/// anyway), stamped with its time; ordinality keeps the arrays' order, so seqs follow the
/// publishing order.
fn complete_publishing(names: &Names) -> String {
    let outbox = &names.outbox;
    let (completing, notify_done) = (completing(names), notify_done(names));
    format!(
        "WITH {completing},
         sent AS (
             INSERT INTO {outbox} (id, subject, payload, committed_ms)
             SELECT m.id, m.subject, m.payload, done.completed_ms
             FROM unnest($11::text[], $12::text[], $13::bytea[])
                      WITH ORDINALITY AS m(id, subject, payload, n),
                  done
             ORDER BY m.n)
         {notify_done}"
    )
}

fn release(names: &Names) -> String {
    let (r, channel) = (&names.records, &names.channel);
    format!(
        "WITH gone AS (
             DELETE FROM {r} AS r WHERE {PK} AND r.fence = $4 AND {HELD}
             RETURNING r.fence, r.waiters)
         SELECT gone.fence FROM gone
         LEFT JOIN LATERAL (SELECT pg_notify('{channel}', $5) WHERE gone.waiters) AS n ON true"
    )
}

// Sweep and stats: eviction past the TTL, abandoned claims, counts.

/// How the store sends a statement to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub))]
pub enum Planning {
    /// Prepared once per connection: its plan is cached, and after five runs it may be the
    /// generic one, made without the values.
    Cached,
    /// Sent unprepared, planned with its values at every run.
    EachRun,
}

/// How the eviction passes are planned: each run, with its limit. Their generic plan cannot
/// see the limit and guesses a tenth of the table; on a million analyzed rows it then joins
/// the due rows back with a hash over the whole table (`tests/suite/pg_plans.rs`). A pass
/// runs once a sweep interval, so planning it each time costs nothing that shows.
pub(crate) const EVICTION: Planning = Planning::EachRun;

/// Due rows are locked and skipped if locked, so sweepers of several instances share the work
/// instead of waiting for each other. `more` looks past the limit in the statement's snapshot
/// (which still holds the rows handled here). Planned as [`EVICTION`] says.
fn evict_completed(names: &Names) -> String {
    let r = &names.records;
    format!(
        "WITH t AS (SELECT {now1} AS now),
         due AS (
             SELECT r.tenant, r.operation, r.key FROM {r} AS r, t
             WHERE r.state = {COMPLETED} AND r.expires_ms <= t.now
             ORDER BY r.expires_ms LIMIT $2 FOR UPDATE OF r SKIP LOCKED),
         gone AS (
             DELETE FROM {r} AS r USING due
             WHERE $3::bigint = 0 AND r.tenant = due.tenant
               AND r.operation = due.operation AND r.key = due.key
             RETURNING 1),
         marked AS (
             UPDATE {r} AS r SET state = {TOMBSTONE}, expires_ms = r.expires_ms + $3::bigint,
                 status = NULL, headers = NULL, body = NULL
             FROM due
             WHERE $3::bigint > 0 AND r.tenant = due.tenant
               AND r.operation = due.operation AND r.key = due.key
             RETURNING 1)
         SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM marked) AS done,
                EXISTS (SELECT 1 FROM {r} AS r, t
                        WHERE r.state = {COMPLETED} AND r.expires_ms <= t.now
                        OFFSET $2) AS more",
        now1 = now(1)
    )
}

fn evict_tombstones(names: &Names) -> String {
    let r = &names.records;
    format!(
        "WITH t AS (SELECT {now1} AS now),
         due AS (
             SELECT r.tenant, r.operation, r.key FROM {r} AS r, t
             WHERE r.state = {TOMBSTONE} AND r.expires_ms <= t.now
             ORDER BY r.expires_ms LIMIT $2 FOR UPDATE OF r SKIP LOCKED),
         gone AS (
             DELETE FROM {r} AS r USING due
             WHERE r.tenant = due.tenant AND r.operation = due.operation
               AND r.key = due.key
             RETURNING 1)
         SELECT (SELECT count(*) FROM gone) AS done,
                EXISTS (SELECT 1 FROM {r} AS r, t
                        WHERE r.state = {TOMBSTONE} AND r.expires_ms <= t.now
                        OFFSET $2) AS more",
        now1 = now(1)
    )
}

fn abandoned(names: &Names) -> String {
    let r = &names.records;
    format!(
        "SELECT r.tenant, r.operation, r.key, r.fingerprint, r.fence, r.attempt,
                r.created_ms, r.lease_until_ms, r.checkpoint
         FROM {r} AS r, (SELECT {now1} AS now) AS t
         WHERE r.state = {IN_PROGRESS} AND r.lease_until_ms <= t.now
         ORDER BY r.lease_until_ms LIMIT $2",
        now1 = now(1)
    )
}

fn stats(names: &Names) -> String {
    let (r, outbox, dead) = (&names.records, &names.outbox, &names.dead_letters);
    format!(
        "SELECT count(*) AS records,
                count(*) FILTER (WHERE state = {IN_PROGRESS}) AS in_progress,
                count(*) FILTER (WHERE state = {COMPLETED}) AS completed,
                count(*) FILTER (WHERE state = {TOMBSTONE}) AS tombstones,
                (SELECT created_ms FROM {r} WHERE state = {IN_PROGRESS}
                 ORDER BY lease_until_ms LIMIT 1) AS first_in_progress,
                (SELECT count(*) FROM {outbox}) AS outbox_pending,
                (SELECT min(committed_ms) FROM {outbox}) AS first_pending,
                (SELECT count(*) FROM {dead}) AS dead_letters,
                {now1} AS now
         FROM {r}",
        now1 = now(1)
    )
}

// Outbox: delivery, dead letters.

fn pending(names: &Names) -> String {
    let outbox = &names.outbox;
    format!("SELECT {MESSAGE} FROM {outbox} WHERE subject <> ALL($2) ORDER BY seq LIMIT $1")
}

fn delivered(names: &Names) -> String {
    let outbox = &names.outbox;
    format!("DELETE FROM {outbox} WHERE seq = ANY($1::bigint[])")
}

/// A seq no longer in the outbox (settled before) moves nothing.
fn bury(names: &Names) -> String {
    let (outbox, dead) = (&names.outbox, &names.dead_letters);
    format!(
        "WITH d AS (SELECT * FROM unnest($1::bigint[], $2::integer[], $3::text[])
                        AS d(seq, attempts, last_error)),
         gone AS (DELETE FROM {outbox} AS o USING d WHERE o.seq = d.seq
                  RETURNING o.seq, o.id, o.subject, o.payload, o.committed_ms)
         INSERT INTO {dead} (seq, id, subject, payload, committed_ms, attempts,
                             last_error, dead_ms)
         SELECT g.seq, g.id, g.subject, g.payload, g.committed_ms, d.attempts,
                d.last_error, {now4}
         FROM gone AS g JOIN d ON d.seq = g.seq",
        now4 = now(4)
    )
}

fn dead_letters(names: &Names) -> String {
    let dead = &names.dead_letters;
    format!("SELECT {MESSAGE}, attempts, last_error, dead_ms FROM {dead} ORDER BY seq LIMIT $1")
}

fn retry_dead(names: &Names) -> String {
    let (outbox, dead) = (&names.outbox, &names.dead_letters);
    format!(
        "WITH gone AS (DELETE FROM {dead} WHERE seq = $1
                       RETURNING id, subject, payload, committed_ms)
         INSERT INTO {outbox} (id, subject, payload, committed_ms)
         SELECT id, subject, payload, committed_ms FROM gone
         RETURNING {MESSAGE}"
    )
}

fn drop_dead(names: &Names) -> String {
    let dead = &names.dead_letters;
    format!("DELETE FROM {dead} WHERE seq = $1 RETURNING seq")
}
