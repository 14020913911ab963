//! The layer and its settings: which requests are covered, where the tenant and the operation
//! come from, and what is done with the handler's failures.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::MatchedPath;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use tower::Layer;

use super::drain::Drain;
use super::outage::Outage;
use super::request::{Fingerprinting, QueryPart};
use super::service::IdempotencyService;
use crate::api::store::Store;
use crate::protocol::Protocol;

/// The authenticated tenant of a request, as the application's authentication layer records it
/// in the request's extensions (`request.extensions_mut().insert(Tenant(account_id))`).
///
/// The default tenant extractor of [`IdempotencyLayer`] reads this. Keys are scoped per tenant
/// so that two callers sending the same key never see each other's responses; the tenant must
/// therefore come from authentication, never from a header or a body field the client writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant(pub String);

/// Whether a covered request must carry an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyPolicy {
    /// A covered request without a key is refused with 400 (the IETF draft's rule for an
    /// operation documented as requiring the header). The default.
    #[default]
    Required,
    /// A covered request without a key goes to the handler unprotected, as Stripe does.
    Optional,
}

/// What the middleware does with a claimed request whose handler answered an error status and
/// neither committed nor released the claim itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Failures {
    /// Store every response, 4xx and 5xx included, and replay it to retries: Stripe's rule.
    /// The handler ran and may have had side effects, so running it again is not safe unless
    /// the handler says so: a handler that refuses a request before doing anything (a body
    /// that fails validation) should [`release`](super::IdempotentRequest::release) the claim,
    /// so the client can fix the request and retry with the same key. The default.
    #[default]
    Store,
    /// Store 4xx responses; release the claim on 5xx so a retry runs the handler again. For
    /// handlers whose server errors happen before any side effect.
    ReleaseServerErrors,
    /// Release the claim on every 4xx and 5xx so a retry runs the handler again (the
    /// behaviour of libraries that delete the record when the handler raises).
    ReleaseAll,
}

impl Failures {
    /// Whether a response with this status is stored (otherwise the claim is released).
    pub(crate) fn handling(self, status: StatusCode) -> Handling {
        let release = match self {
            Failures::Store => false,
            Failures::ReleaseServerErrors => status.is_server_error(),
            Failures::ReleaseAll => status.is_client_error() || status.is_server_error(),
        };
        if release {
            Handling::Release
        } else {
            Handling::Store
        }
    }
}

/// What the middleware does with an unfinished claim after the handler answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handling {
    Store,
    Release,
}

/// Reads the tenant of a request; `None` means "not authenticated".
type TenantFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;
/// Names the operation of a request.
type OperationFn = Arc<dyn Fn(&Parts) -> String + Send + Sync>;

/// Default largest request body buffered for fingerprinting.
pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;
/// Default longest wait for the store's answer before a 503.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default shortest `Idempotency-Key`, in characters: a key shorter than this is likely to
/// collide with another of the same client's (a UUID has 36).
pub const DEFAULT_MIN_KEY_LEN: usize = 8;

/// Default time a response body is still drained after its client went away.
pub const DEFAULT_DETACHED_STREAM_TIMEOUT: Duration = Duration::from_secs(60);

/// The layer's settings, shared by every service it builds.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) methods: Vec<Method>,
    pub(crate) key: KeyPolicy,
    pub(crate) tenant: TenantFn,
    pub(crate) operation: OperationFn,
    pub(crate) max_body: usize,
    pub(crate) wait: Duration,
    pub(crate) replay_headers: Vec<HeaderName>,
    pub(crate) failures: Failures,
    /// `WWW-Authenticate` of a 401 for a request with no tenant.
    pub(crate) challenge: HeaderValue,
    /// How long a response body is still drained after its client went away.
    pub(crate) detached_stream_timeout: Duration,
    /// The store's outage, for `Retry-After` on 503s.
    pub(crate) outage: Arc<Outage>,
    /// What a request's fingerprint is made of.
    pub(crate) fingerprinting: Fingerprinting,
    /// The longest wait for the store's answer to `begin` before a 503.
    pub(crate) store_timeout: Duration,
    /// Covered requests in flight at most (`None`: no cap).
    pub(crate) in_flight: Option<Arc<tokio::sync::Semaphore>>,
    /// The shortest key accepted, in characters.
    pub(crate) min_key_len: usize,
    /// What the handlers of covered requests do: claimed first, or local work executed in one
    /// step (then this is the store they execute on).
    pub(crate) work: Work,
    /// The stop: shared by every clone of the layer.
    pub(crate) drain: Drain,
}

/// What the handlers behind a layer do, which decides whether the layer claims the key before
/// the handler runs.
#[derive(Clone, Debug, Default)]
pub(crate) enum Work {
    /// Anything, calls out of the process included: the layer claims the key first (the
    /// default).
    #[default]
    Claimed,
    /// Only writes to this store: the handler calls `LocalRequest::execute`.
    Local(LocalStore),
}

/// The store a local route's handler executes on.
#[derive(Clone, Debug)]
pub(crate) enum LocalStore {
    Embedded(Store),
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::PgStore),
}

impl Settings {
    pub(crate) fn covers(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }
}

/// `POST` plus the route the router matched (`POST /charges/{id}`), or the request path when
/// the layer runs outside routing.
fn default_operation(parts: &Parts) -> String {
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map_or(parts.uri.path(), MatchedPath::as_str);
    format!("{} {route}", parts.method)
}

fn default_tenant(parts: &Parts) -> Option<String> {
    parts.extensions.get::<Tenant>().map(|t| t.0.clone())
}

/// A tower [`Layer`] that makes the requests it covers idempotent under their
/// `Idempotency-Key`, backed by a [`Store`] (or any backend of the [`Protocol`]).
///
/// ```
/// use axum::{Router, routing::post};
/// use idemstore::http::{IdempotencyLayer, KeyPolicy};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let store = idemstore::Store::open(dir.path().join("idem"))?;
/// let app: Router = Router::new()
///     .route("/orders", post(|| async { "created" }))
///     // route_layer: after routing, so the operation is the matched route ("POST /orders").
///     .route_layer(IdempotencyLayer::new(store).key(KeyPolicy::Required));
/// # Ok(())
/// # }
/// ```
///
/// Put the application's authentication (and rate limiting) *outside* this layer: a request
/// they refuse never reaches the store. The authentication layer records the caller as a
/// [`Tenant`] extension, or [`IdempotencyLayer::tenant_from`] says where else to find it.
#[derive(Clone)]
pub struct IdempotencyLayer<P = Store> {
    store: P,
    settings: Arc<Settings>,
}

impl<P> fmt::Debug for IdempotencyLayer<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("IdempotencyLayer")
            .field("methods", &s.methods)
            .field("key", &s.key)
            .field("max_body", &s.max_body)
            .field("wait", &s.wait)
            .field("replay_headers", &s.replay_headers)
            .field("failures", &s.failures)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer<Store> {
    /// Declares the covered routes' work **local**: the handler only writes to this store, so
    /// the layer does not claim the key first. The handler takes a
    /// [`LocalRequest`](super::LocalRequest) and calls its `execute`, which claims, runs the
    /// work and stores the response in one writer step (one sync instead of two), or answers
    /// a duplicate (replay, 409, 422, 410) without running it.
    ///
    /// Only for handlers that call nothing outside the process before their response is
    /// stored: no payment processor, no email, no message. With no claim while the work runs,
    /// a crash would forget such a call and the retry would make it again. A handler that
    /// returns without calling `execute` is a bug: its response is replaced by a 500. The
    /// in-flight cap applies as before. The store timeout and waiting ([`wait`](Self::wait))
    /// do not: the handler awaits `execute` itself, and a duplicate of a request in flight is
    /// answered at once (replayed once the first is stored, else run or refused).
    #[must_use]
    pub fn local_work(mut self) -> Self {
        let store = LocalStore::Embedded(self.store.clone());
        self.settings().work = Work::Local(store);
        self
    }
}

#[cfg(feature = "postgres")]
impl IdempotencyLayer<crate::postgres::PgStore> {
    /// Declares the covered routes' work **local**, as on the local store
    /// ([`IdempotencyLayer::<Store>::local_work`](IdempotencyLayer::local_work)): the layer
    /// claims nothing, and the handler takes a `LocalRequest<PgStore>` whose `execute`
    /// claims, runs the work with a [`PgTx`](crate::PgTx) and stores the response in one
    /// PostgreSQL transaction (one commit instead of two), or answers a duplicate (replay,
    /// 409, 422, 410) without running it. A duplicate of a request in flight waits for its
    /// transaction (within the store's statement timeout), then gets its answer.
    ///
    /// The same rule as on the local store: only for handlers that call nothing outside the
    /// database before their response is stored.
    #[must_use]
    pub fn local_work(mut self) -> Self {
        let store = LocalStore::Postgres(self.store.clone());
        self.settings().work = Work::Local(store);
        self
    }
}

impl<P: Protocol> IdempotencyLayer<P> {
    /// Covers `POST` requests; key required; tenant from the [`Tenant`] extension; operation
    /// is the method and the matched route; bodies up to 1 MiB; no waiting on a request in
    /// flight; replays carry `content-type` and `location`; failures stored ([`Failures`]).
    pub fn new(store: P) -> Self {
        IdempotencyLayer {
            store,
            settings: Arc::new(Settings {
                methods: vec![Method::POST],
                key: KeyPolicy::Required,
                tenant: Arc::new(default_tenant),
                operation: Arc::new(default_operation),
                max_body: DEFAULT_MAX_BODY,
                wait: Duration::ZERO,
                replay_headers: vec![header::CONTENT_TYPE, header::LOCATION],
                failures: Failures::Store,
                challenge: HeaderValue::from_static("Bearer"),
                detached_stream_timeout: DEFAULT_DETACHED_STREAM_TIMEOUT,
                outage: Arc::new(Outage::default()),
                fingerprinting: Fingerprinting::default(),
                store_timeout: DEFAULT_STORE_TIMEOUT,
                in_flight: None,
                min_key_len: DEFAULT_MIN_KEY_LEN,
                work: Work::Claimed,
                drain: Drain::default(),
            }),
        }
    }

    fn settings(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.settings)
    }

    /// The layer's stop, for a clean shutdown (SIGTERM): see [`Drain`]. Shared by every clone
    /// of this layer.
    pub fn drain(&self) -> Drain {
        self.settings.drain.clone()
    }

    /// The methods covered; other requests pass through untouched. `GET`, `PUT` and `DELETE`
    /// are idempotent by definition and rarely need it; `POST` and `PATCH` do.
    #[must_use]
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.settings().methods = methods.into_iter().collect();
        self
    }

    /// Whether a covered request must carry a key.
    #[must_use]
    pub fn key(mut self, policy: KeyPolicy) -> Self {
        self.settings().key = policy;
        self
    }

    /// Where the tenant comes from. `None` answers 401: an unauthenticated request has no
    /// scope to claim. Read it from what authentication produced (an extension), never from
    /// something the client chose. A tenant that is not a valid scope part (empty, over 128
    /// bytes, a control character) answers 500 `invalid-tenant`: the service's fault.
    #[must_use]
    pub fn tenant_from(
        mut self,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.settings().tenant = Arc::new(tenant);
        self
    }

    /// How a request's operation is named (at most 128 bytes; a longer one answers 400
    /// `invalid-operation`). Two requests with the same key but different operations are
    /// different scopes.
    #[must_use]
    pub fn operation_from(
        mut self,
        operation: impl Fn(&Parts) -> String + Send + Sync + 'static,
    ) -> Self {
        self.settings().operation = Arc::new(operation);
        self
    }

    /// Largest request body buffered to fingerprint; a larger one is refused with 413.
    #[must_use]
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.settings().max_body = bytes;
        self
    }

    /// How long a duplicate of a request in flight *in this process* waits for its outcome
    /// before it is answered 409 (`Store::begin_or_wait`). Zero, the default, answers 409 at
    /// once.
    #[must_use]
    pub fn wait(mut self, max_wait: Duration) -> Self {
        self.settings().wait = max_wait;
        self
    }

    /// Adds response headers the middleware stores and replays, besides `content-type` and
    /// `location`. Headers not on the list are returned on the first response only: a replay
    /// must not repeat per-response headers such as `set-cookie` or `date`.
    #[must_use]
    pub fn replay_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let list = &mut self.settings().replay_headers;
        for name in names {
            if !list.contains(&name) {
                list.push(name);
            }
        }
        self
    }

    /// What is done with error responses the handler did not commit itself.
    #[must_use]
    pub fn failures(mut self, failures: Failures) -> Self {
        self.settings().failures = failures;
        self
    }

    /// The `WWW-Authenticate` challenge of the 401 for a request with no tenant (RFC 9110
    /// requires one). Default `Bearer`.
    #[must_use]
    pub fn challenge(mut self, challenge: HeaderValue) -> Self {
        self.settings().challenge = challenge;
        self
    }

    /// The longest wait for the store's answer before the request is refused with 503 and a
    /// `Retry-After`: a stalled disk or a writer held up by a slow commit closure must not hang
    /// every request. A claim the store makes after the wait ran out stays in progress (its
    /// request never ran), so a retry after the lease is a recovery: nothing is lost or run
    /// twice. Default 10 s; `Duration::MAX` waits as long as it takes (no timer at all, which
    /// also suits tests on a paused runtime clock).
    #[must_use]
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.settings().store_timeout = timeout;
        self
    }

    /// Caps the covered requests in flight through this layer (from admission until the
    /// response is stored): one over the cap is refused with 503 and a `Retry-After` before
    /// the store is touched. Default: no cap.
    #[must_use]
    pub fn max_in_flight(mut self, requests: usize) -> Self {
        self.settings().in_flight = Some(Arc::new(tokio::sync::Semaphore::new(requests)));
        self
    }

    /// The shortest key accepted, in characters; a shorter one is refused with 400. Default 8.
    #[must_use]
    pub fn min_key_len(mut self, chars: usize) -> Self {
        self.settings().min_key_len = chars;
        self
    }

    /// Whether the query string counts in a request's fingerprint (by default it does, its
    /// parameters in a canonical order).
    #[must_use]
    pub fn fingerprint_query(mut self, query: QueryPart) -> Self {
        self.settings().fingerprinting.query = query;
        self
    }

    /// Request headers that count in the fingerprint, besides method, path, query and body
    /// (none by default): a retry with another value of one of them is a different request.
    #[must_use]
    pub fn fingerprint_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.settings().fingerprinting.headers.extend(names);
        self
    }

    /// JSON pointers (RFC 6901, `/metadata/client_timestamp`) left out of a JSON body's
    /// fingerprint: volatile fields a client may change between retries.
    ///
    /// A field left out can differ between the first run and its replay: the replay is the
    /// first run's response, whatever the retry's value. Leave out only what does not change
    /// the operation's meaning. A pointer that does not start with `/` names nothing.
    #[must_use]
    pub fn fingerprint_ignore_json(
        mut self,
        pointers: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        for pointer in pointers {
            let pointer = pointer.into();
            if !pointer.starts_with('/') {
                tracing::error!(
                    pointer,
                    "a JSON pointer must start with '/'; this one names nothing and is ignored"
                );
                continue;
            }
            self.settings().fingerprinting.ignore.push(pointer);
        }
        self
    }

    /// Replaces the fingerprint with one of the bytes `identify` makes of the request's parts
    /// and body: what identifies a request is then the service's to say. Parts it leaves out
    /// can differ between the first run and its replay.
    #[must_use]
    pub fn fingerprint_with(
        mut self,
        identify: impl Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> Self {
        self.settings().fingerprinting.custom = Some(Arc::new(identify));
        self
    }

    /// How long a claimed request's response body is still read after its client went away,
    /// so that its outcome is stored for the retry. A body that has not ended by then (an
    /// endless event stream) gets the fixed 500 stored in its place. Default 60 s.
    #[must_use]
    pub fn detached_stream_timeout(mut self, timeout: Duration) -> Self {
        self.settings().detached_stream_timeout = timeout;
        self
    }
}

impl<S, P: Protocol> Layer<S> for IdempotencyLayer<P> {
    type Service = IdempotencyService<S, P>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.store.clone(), self.settings.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_policy_decides_by_status_class() {
        let cases = [
            (
                Failures::Store,
                StatusCode::INTERNAL_SERVER_ERROR,
                Handling::Store,
            ),
            (
                Failures::ReleaseServerErrors,
                StatusCode::BAD_GATEWAY,
                Handling::Release,
            ),
            (
                Failures::ReleaseServerErrors,
                StatusCode::PAYMENT_REQUIRED,
                Handling::Store,
            ),
            (
                Failures::ReleaseAll,
                StatusCode::PAYMENT_REQUIRED,
                Handling::Release,
            ),
            (Failures::ReleaseAll, StatusCode::CREATED, Handling::Store),
        ];
        for (policy, status, expected) in cases {
            assert_eq!(policy.handling(status), expected, "{policy:?} {status}");
        }
    }
}
