//! The gateway's HTTP surface: `/mcp/{namespace}` (both MCP eras, each
//! namespace its own service and session store), `/healthz`, `/readyz`
//! and `/metrics`. Authentication is a layer the caller puts on the MCP
//! routes ([`router`] takes it), so this module only routes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use tower::ServiceExt;

use crate::core::limits::{bytes_text, JOB_UPLOAD_CHUNK, MCP_BODY_LIMIT};
use crate::serve::http::{opens_session, sessions_full};

use super::namespaces::{NamespaceError, Namespaces};

/// The route parameter every namespaced route names (the auth layer reads it).
pub const NAMESPACE_PARAM: &str = "namespace";

/// Whether the gateway can serve: its watches have synced once.
#[derive(Default, Clone)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What the routes share.
#[derive(Clone)]
struct Shared {
    namespaces: Arc<Namespaces>,
    ready: Readiness,
    metrics: Arc<dyn Fn() -> String + Send + Sync>,
}

fn json_error(status: StatusCode, code: &str, message: String) -> Response {
    (status, axum::Json(serde_json::json!({ "error": { "code": code, "message": message } }))).into_response()
}

async fn mcp(State(shared): State<Shared>, Path(namespace): Path<String>, request: Request) -> Response {
    if !shared.ready.is_ready() {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not-ready",
            "the gateway is still reading the cluster's bindings; retry in a moment".into(),
        );
    }
    let ns = match shared.namespaces.get(&namespace).await {
        Ok(ns) => ns,
        Err(err @ NamespaceError::BadName(_)) => return json_error(StatusCode::NOT_FOUND, "bad-namespace", err.to_string()),
        Err(err @ NamespaceError::Full { .. }) => {
            let mut response = json_error(StatusCode::SERVICE_UNAVAILABLE, "namespaces-full", err.to_string());
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            return response;
        }
    };
    if opens_session(&request) && ns.sessions.is_full() {
        return sessions_full(ns.sessions.max());
    }
    // rmcp reads the body itself, so axum's extractor limit would not hold:
    // a declared length is refused up front, an undeclared one is cut off.
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MCP_BODY_LIMIT) {
        return json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            format!(
                "an MCP request body may be at most {}: upload files in chunks of {} (skill_job_upload with an offset)",
                bytes_text(MCP_BODY_LIMIT),
                bytes_text(JOB_UPLOAD_CHUNK)
            ),
        );
    }
    let (parts, body) = request.into_parts();
    let request = Request::from_parts(parts, axum::body::Body::new(http_body_util::Limited::new(body, MCP_BODY_LIMIT as usize)));
    match ns.service.clone().oneshot(request).await {
        Ok(response) => response.into_response(),
        Err(never) => match never {},
    }
}

/// The routes. `gate` wraps the namespaced MCP routes only (the health
/// routes stay open): the auth middleware, or the identity in tests.
pub fn router<L>(namespaces: Arc<Namespaces>, ready: Readiness, metrics: Arc<dyn Fn() -> String + Send + Sync>, gate: L) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request, Error = std::convert::Infallible> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<Request>>::Response: IntoResponse + 'static,
    <L::Service as tower::Service<Request>>::Future: Send + 'static,
{
    let shared = Shared { namespaces, ready: ready.clone(), metrics };
    let path = format!("/mcp/{{{NAMESPACE_PARAM}}}");
    let mcp_routes = Router::new().route(&path, any(mcp)).route(&format!("{path}/"), any(mcp)).route_layer(gate).with_state(shared.clone());
    let open = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<Shared>| async move {
                if s.ready.is_ready() {
                    (StatusCode::OK, "ready").into_response()
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "the bindings and packages are not synced yet").into_response()
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(s): State<Shared>| async move {
                ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], (s.metrics)()).into_response()
            }),
        )
        .with_state(shared);
    Router::new().merge(mcp_routes).merge(open)
}
