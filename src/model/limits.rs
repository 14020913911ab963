//! Every bound the store enforces, in one place: on its settings (checked at `open`), on what
//! a request may carry (checked before anything is written), and the limits an open store was
//! given ([`Limits`], from `Store::limits`).

use std::time::Duration;

// Settings (`Builder`).
/// Longest lease a claim may hold or be extended to.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest TTL a completed record may be kept for (ten years).
pub const MAX_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);
/// The largest `Builder::max_response_bytes` accepted.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
/// The largest `Builder::max_checkpoint_bytes` accepted.
pub const MAX_CHECKPOINT_BYTES: usize = 16 * 1024 * 1024;
/// The largest `Builder::max_batch` accepted.
pub const MAX_BATCH: usize = 65_536;
/// Smallest accepted log segment size.
pub const MIN_SEGMENT_BYTES: u64 = 64 * 1024;
/// Largest accepted log segment size.
pub const MAX_SEGMENT_BYTES: u64 = 1 << 30;
/// Most bytes one request (one commit or write) may write, keys and values together.
pub const MAX_REQUEST_BYTES: u64 = 256 * 1024 * 1024;

// A scope (`Scope::new`).
/// Longest accepted idempotency key, in bytes (Stripe's and the IETF draft's ceiling).
pub const MAX_KEY_LEN: usize = 255;
/// Longest accepted tenant, in bytes.
pub const MAX_TENANT_LEN: usize = 128;
/// Longest accepted operation name, in bytes.
pub const MAX_OPERATION_LEN: usize = 128;

// A stored response (`Response`).
/// Most headers a stored response may carry.
pub const MAX_HEADERS: usize = 64;
/// Longest header name, in bytes.
pub const MAX_HEADER_NAME_LEN: usize = 256;
/// Longest header value, in bytes.
pub const MAX_HEADER_VALUE_LEN: usize = 8 * 1024;

// A fingerprint.
/// Length of a fingerprint in bytes (256 bits).
pub const FINGERPRINT_LEN: usize = 32;

/// The settings a store was opened with that callers size their work by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// How long a claim holds its key before another attempt may take it over.
    pub lease: Duration,
    /// How long a completed record answers retries.
    pub ttl: Duration,
    /// The largest encoded response a commit may store.
    pub max_response_bytes: usize,
    /// The largest checkpoint a claim may store.
    pub max_checkpoint_bytes: usize,
}

/// The memory budget: its default and its minimum (see `Builder::memory_budget`).
pub use super::memory::{DEFAULT_MEMORY_BUDGET, MIN_MEMORY_BUDGET};

/// Outbox messages: the longest subject, the largest payload, the most per commit.
pub use super::message::{MAX_MESSAGES_PER_COMMIT, MAX_PAYLOAD_BYTES, MAX_SUBJECT_LEN};
