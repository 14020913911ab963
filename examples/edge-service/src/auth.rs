//! The service's authentication: `Authorization: Bearer <token>` names the tenant.
//!
//! It runs *outside* the idempotency layer: a request it refuses never touches the store, and
//! the tenant the layer scopes keys by comes from here, never from the client's body. The auth
//! scheme is matched without regard to case (RFC 9110, section 11.1), and a refusal carries a
//! `WWW-Authenticate` challenge.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idemstore::http::Tenant;

use super::problem;

/// Who may call: token → tenant, and the operator's token, if one is set.
#[derive(Debug, Default)]
pub(crate) struct Tokens {
    tenants: HashMap<String, String>,
    operator: Option<String>,
}

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    /// A merchant account.
    Tenant(String),
    /// The service's operator (`--admin-token`): may read the stats of every tenant.
    Operator,
}

/// Parses `token=tenant,token=tenant`, and the operator's token.
pub(crate) fn parse_tokens(spec: &str, operator: Option<String>) -> Result<Arc<Tokens>, String> {
    let mut tenants = HashMap::new();
    for pair in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (token, tenant) = pair
            .split_once('=')
            .ok_or_else(|| format!("`{pair}` is not token=tenant"))?;
        tenants.insert(token.trim().to_owned(), tenant.trim().to_owned());
    }
    Ok(Arc::new(Tokens {
        tenants,
        operator: operator.filter(|t| !t.is_empty()),
    }))
}

/// The token of an `Authorization: Bearer <token>` header, the scheme in any case.
fn bearer(request: &Request) -> Option<&str> {
    let value = request
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Records the caller (and, for a tenant, its [`Tenant`] extension), or answers 401.
pub(crate) async fn authenticate(
    State(tokens): State<Arc<Tokens>>,
    mut request: Request,
    next: Next,
) -> Response {
    let caller = bearer(&request).and_then(|token| {
        if tokens.operator.as_deref() == Some(token) {
            return Some(Caller::Operator);
        }
        tokens.tenants.get(token).cloned().map(Caller::Tenant)
    });
    match caller {
        Some(caller) => {
            if let Caller::Tenant(tenant) = &caller {
                request.extensions_mut().insert(Tenant(tenant.clone()));
            }
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None => {
            let mut refused = problem(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "send Authorization: Bearer <token> with a known token (try sk_test_alice)",
            )
            .into_response();
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"edge-service\""),
            );
            // Refused before its body is read: the connection cannot serve another request.
            refused
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            refused
        }
    }
}
