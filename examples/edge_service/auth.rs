//! The service's authentication: `Authorization: Bearer <token>` names the tenant.
//!
//! It runs *outside* the idempotency layer: a request it refuses never touches the store, and
//! the tenant the layer scopes keys by comes from here, never from the client's body.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use idemstore::http::Tenant;

use super::problem;

/// Token → tenant.
pub(crate) type Tokens = Arc<HashMap<String, String>>;

/// Parses `token=tenant,token=tenant`.
pub(crate) fn parse_tokens(spec: &str) -> Result<Tokens, String> {
    let mut tokens = HashMap::new();
    for pair in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (token, tenant) = pair
            .split_once('=')
            .ok_or_else(|| format!("`{pair}` is not token=tenant"))?;
        tokens.insert(token.trim().to_owned(), tenant.trim().to_owned());
    }
    Ok(Arc::new(tokens))
}

/// Records the caller as a [`Tenant`] extension, or answers 401.
pub(crate) async fn authenticate(
    State(tokens): State<Tokens>,
    mut request: Request,
    next: Next,
) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token.and_then(|t| tokens.get(t.trim())) {
        Some(tenant) => {
            let tenant = Tenant(tenant.clone());
            request.extensions_mut().insert(tenant);
            next.run(request).await
        }
        None => problem(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "send Authorization: Bearer <token> with a known token (try sk_test_alice)",
        )
        .into_response(),
    }
}
