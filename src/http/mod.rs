//! The `Idempotency-Key` HTTP header as a tower/axum middleware (feature `http`).
//!
//! [`IdempotencyLayer`] follows the IETF httpapi draft "The Idempotency-Key HTTP Header Field"
//! and Stripe's documented behaviour. For each covered request (by default `POST`):
//!
//! | request | answer |
//! | --- | --- |
//! | repeated (two headers or a list), empty, over-long or malformed key; missing key where required | 400 problem |
//! | an operation name (method and path) too long to scope a key | 400 problem |
//! | no authenticated tenant | 401 problem, `WWW-Authenticate` |
//! | body over the buffering limit | 413 problem |
//! | new key | the handler runs on its own task (to the end, even if the client goes away); its response streams to the client and is stored with the key |
//! | new key, refused by an extractor before the handler began ([`NotStarted`]) | that answer; the key is released, so the corrected request runs |
//! | new key, and the handler fails with a [`HandlerError`], panics, or is cancelled | the claim is left in progress: its outcome is unknown |
//! | new key, and the handler's response is too large to store | the client gets it whole; a fixed 500 problem is stored in its place |
//! | key of a completed request, same request | the stored response, `Idempotent-Replayed: true` |
//! | key of a request in flight | 409 problem, `Retry-After` from the operation's recent completion times, within the holder's lease (see [`Begin::InProgress`](crate::Begin::InProgress)), or wait first: [`IdempotencyLayer::wait`] |
//! | key used for a different request | 422 problem |
//! | key whose response expired but whose tombstone is kept | 410 problem |
//! | the store cannot answer (a full disk, recovering) | 503 problem, `Retry-After` growing with the outage, with jitter |
//! | any, once the layer's stop has begun ([`Drain::start`]) and before the request is claimed, or claimed but not started | 503 problem, `Retry-After: 1`; nothing ran and the key is free |
//!
//! The request is identified by tenant (from authentication), operation (method and matched
//! route) and key; it is fingerprinted by method, path and query, and body (a JSON body in its
//! RFC 8785 canonical form, so key order and whitespace do not matter).
//!
//! A handler that takes an [`IdempotentRequest`] commits its business writes and its response
//! in one transaction; one that does not, has its response stored by the middleware. On a
//! route whose work is local ([`IdempotencyLayer::local_work`]) the layer claims nothing: the
//! handler's [`LocalRequest::execute`] claims and commits in one step. Problem
//! bodies are `application/problem+json` (RFC 9457). The mapping to HTTP status codes lives in
//! this module only: the core knows nothing of HTTP.

mod claimed;
mod convert;
mod drain;
mod extract;
mod jcs;
mod key;
mod layer;
mod local;
mod outage;
#[cfg(feature = "postgres")]
mod postgres;
mod problem;
mod rejection;
mod request;
mod service;
mod stream;

pub use convert::IDEMPOTENT_REPLAYED;
pub use drain::{Drain, Drained};
pub use extract::{Finish, HandlerError, IdempotentRequest, MissingClaim};
pub use key::IDEMPOTENCY_KEY;
pub use layer::{
    DEFAULT_DETACHED_STREAM_TIMEOUT, DEFAULT_MAX_BODY, DEFAULT_MIN_KEY_LEN, DEFAULT_STORE_TIMEOUT,
    Failures, IdempotencyLayer, KeyPolicy, Tenant,
};
pub use local::{LocalRequest, NotLocal};
pub use rejection::NotStarted;
pub use request::QueryPart;
pub use service::IdempotencyService;
