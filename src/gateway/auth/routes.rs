//! The HTTP face of authentication: the [`require_caller`] middleware in
//! front of a namespace's routes and the RFC 9728 protected-resource
//! metadata a 401 points to.
//!
//! Wiring (the gateway's router):
//!
//! ```ignore
//! let gate = axum::middleware::from_fn_with_state(authenticator.clone(), auth::require_caller);
//! Router::new()
//!     .route_service("/mcp/{namespace}", mcp_service)
//!     .route("/files/{namespace}/{*rest}", files)
//!     .route_layer(gate)
//!     .merge(auth::metadata_routes(authenticator))
//! ```
//!
//! The middleware reads the namespace from the route's `{namespace}`
//! parameter, so it works on any route that has one. Challenges from the
//! file route name the same metadata as the namespace's MCP endpoint: the
//! same tokens and the same namespace protect both.
//!
//! URLs are absolute, built from `--public-url` when given, else from
//! `http://` and the request's `Host` (forwarded headers are not trusted:
//! behind a TLS-terminating proxy, set `--public-url`).

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{Path, RawPathParams, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Value};

use super::{AuthConfig, AuthError, Authenticator};
use crate::controller::builders::is_dns1123_label;
use crate::mcp::state::Action;

/// Where RFC 9728 metadata lives; a resource's document is this plus the
/// resource's path (`/.well-known/oauth-protected-resource/mcp/{namespace}`).
pub const METADATA_PREFIX: &str = "/.well-known/oauth-protected-resource";
/// The path of a namespace's MCP endpoint, below the public base.
const MCP_PREFIX: &str = "/mcp";
/// The route parameter holding the namespace.
const NAMESPACE_PARAM: &str = "namespace";

/// The MCP endpoint of `namespace` under `base` (the protected resource).
pub fn resource_url(base: &str, namespace: &str) -> String {
    format!("{base}{MCP_PREFIX}/{namespace}")
}

/// The RFC 9728 metadata document of `namespace`'s endpoint under `base`.
pub fn metadata_url(base: &str, namespace: &str) -> String {
    format!("{base}{METADATA_PREFIX}{MCP_PREFIX}/{namespace}")
}

/// The metadata document itself (RFC 9728 §2).
pub fn protected_resource_metadata(config: &AuthConfig, base: &str, namespace: &str) -> Value {
    let mut doc = json!({
        "resource": resource_url(base, namespace),
        "resource_name": format!("skill-operator gateway, namespace {namespace}"),
        "bearer_methods_supported": ["header"],
    });
    if !config.authorization_servers.is_empty() {
        doc["authorization_servers"] = json!(config.authorization_servers);
    }
    doc
}

/// `GET /.well-known/oauth-protected-resource/mcp/{namespace}`; open to
/// everyone (it is what a client without a token reads first).
pub async fn protected_resource_handler(State(auth): State<Authenticator>, Path(namespace): Path<String>, headers: HeaderMap) -> Response {
    let Some(base) = request_base(auth.config(), &headers) else {
        let message =
            "the request has no valid Host header to build this resource's URL from; send one, or start the gateway with --public-url";
        return (StatusCode::BAD_REQUEST, axum::Json(json!({ "error": { "code": "invalid-request", "message": message } })))
            .into_response();
    };
    if !is_dns1123_label(&namespace) {
        return AuthError::NoSuchNamespace(namespace).into_response("");
    }
    axum::Json(protected_resource_metadata(auth.config(), &base, &namespace)).into_response()
}

/// The metadata route, with its state, for merging into any router.
pub fn metadata_routes<S: Clone + Send + Sync + 'static>(auth: Authenticator) -> Router<S> {
    Router::new().route(&format!("{METADATA_PREFIX}{MCP_PREFIX}/{{{NAMESPACE_PARAM}}}"), get(protected_resource_handler)).with_state(auth)
}

/// The gate of every route with a `{namespace}` parameter: a verified
/// caller allowed `get` on skillbindings in that namespace (the entry
/// gate, see the [module docs](super)), or the refusal. On success the
/// [`Caller`](crate::mcp::executor::Caller) goes into the request's
/// extensions, where the MCP handler (and any other handler) reads it, and
/// the `Authorization` header is removed so nothing downstream can log or
/// forward the credential.
pub async fn require_caller(
    State(auth): State<Authenticator>,
    params: Result<RawPathParams, RawPathParamsRejection>,
    mut request: Request,
    next: Next,
) -> Response {
    let namespace = params.ok().and_then(|params| params.iter().find(|(name, _)| *name == NAMESPACE_PARAM).map(|(_, v)| v.to_string()));
    let Some(namespace) = namespace else {
        // A wiring mistake, not the caller's: refuse rather than pass.
        tracing::error!(path = %request.uri().path(), "require_caller is mounted on a route without a {{namespace}} parameter");
        let body = json!({ "error": { "code": "internal", "message": "this route is not set up for authentication; the gateway's log says more" } });
        return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response();
    };
    // Without a usable Host the challenge still names the metadata, as a
    // path the client resolves against the URL it called.
    let base = request_base(auth.config(), request.headers()).unwrap_or_default();
    let metadata = metadata_url(&base, &namespace);
    if !is_dns1123_label(&namespace) {
        return AuthError::NoSuchNamespace(namespace).into_response(&metadata);
    }
    let caller = match auth.authenticate(request.headers().get(header::AUTHORIZATION)).await {
        Ok(caller) => caller,
        Err(err) => return refuse(&auth, err, None, &namespace, &metadata),
    };
    if let Err(err) = auth.authorize_action(&caller, &namespace, Action::ReadSkills).await {
        return refuse(&auth, err, Some(&caller), &namespace, &metadata);
    }
    request.headers_mut().remove(header::AUTHORIZATION);
    request.extensions_mut().insert(caller.clone());
    let mut response = next.run(request).await;
    // Whoever refuses it further in, the trail names the caller.
    response.extensions_mut().insert(caller);
    response
}

fn refuse(
    auth: &Authenticator,
    err: AuthError,
    caller: Option<&crate::mcp::executor::Caller>,
    namespace: &str,
    metadata: &str,
) -> Response {
    auth.audit_refusal(&err, namespace, caller);
    match &err {
        AuthError::Unavailable(detail) => tracing::warn!(namespace, %detail, "cannot check a request's credentials; answering 503"),
        other => tracing::debug!(namespace, error = %other, "request refused"),
    }
    let mut response = err.into_response(metadata);
    response.extensions_mut().insert(crate::audit::http::Recorded);
    response
}

/// `--public-url`, else `http://` and the request's `Host` when it is a
/// plain `host[:port]`.
fn request_base(config: &AuthConfig, headers: &HeaderMap) -> Option<String> {
    if let Some(base) = &config.public_base {
        return Some(base.clone());
    }
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let authority: axum::http::uri::Authority = host.parse().ok()?;
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return None;
    }
    Some(format!("http://{authority}"))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn host(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn the_base_is_the_public_url_else_the_host() {
        let config = AuthConfig::default();
        assert_eq!(request_base(&config, &host("gw.skills.svc:8090")).as_deref(), Some("http://gw.skills.svc:8090"));
        assert_eq!(request_base(&config, &host("[::1]:8090")).as_deref(), Some("http://[::1]:8090"));
        for bad in ["user@evil.example", "a b", "evil.example/path", ""] {
            assert_eq!(request_base(&config, &host(bad)), None, "{bad:?}");
        }
        assert_eq!(request_base(&config, &HeaderMap::new()), None);
        let public = AuthConfig { public_base: Some("https://skills.example.com/gw".into()), ..AuthConfig::default() };
        assert_eq!(request_base(&public, &host("evil.example")).as_deref(), Some("https://skills.example.com/gw"));
    }

    #[test]
    fn metadata_names_the_resource_and_the_issuers() {
        let config = AuthConfig { authorization_servers: vec!["https://oidc.example.com".into()], ..AuthConfig::default() };
        assert_eq!(
            protected_resource_metadata(&config, "https://skills.example.com", "team-a"),
            json!({
                "resource": "https://skills.example.com/mcp/team-a",
                "resource_name": "skill-operator gateway, namespace team-a",
                "authorization_servers": ["https://oidc.example.com"],
                "bearer_methods_supported": ["header"],
            })
        );
        // No issuer configured: the field is left out rather than empty.
        assert!(protected_resource_metadata(&AuthConfig::default(), "http://h", "a").get("authorization_servers").is_none());
        assert_eq!(metadata_url("http://h:1", "team-a"), "http://h:1/.well-known/oauth-protected-resource/mcp/team-a");
    }
}
