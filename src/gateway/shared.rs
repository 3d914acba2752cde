//! What the gateway's routes share: the namespaces, readiness, the
//! metrics text, and the JSON refusals every route answers with.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::namespaces::{Namespace, NamespaceError, Namespaces};
use crate::mcp::executor::Caller;
use crate::mcp::ratelimit::{Limited, LimiterSlot};

/// The code of a request refused for its caller's rate limit.
pub(crate) const RATE_LIMITED_CODE: &str = "rate-limited";

/// A request that is no MCP tool call (the console's routes, the file
/// route) takes one of its caller's `calls` tokens, from the same buckets
/// as their tool calls: one principal has one budget, whatever route it
/// uses. A refusal is answered with [`limited`].
pub(crate) fn charge_call(limiter: &LimiterSlot, caller: &Caller) -> Result<(), Limited> {
    limiter.check_call(&caller.principal)
}

/// The answer to a request over its caller's limit: 429 (503 when the
/// limits themselves are unknown: the server is the reason), when to come
/// back in `Retry-After` and the body.
pub(crate) fn limited(err: Limited) -> Response {
    let status = match err {
        Limited::Unknown { .. } => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::TOO_MANY_REQUESTS,
    };
    let retry = err.retry_after_secs();
    let body = serde_json::json!({ "error": { "code": RATE_LIMITED_CODE, "message": err.to_string(), "retryAfterSeconds": retry } });
    let mut response = (status, axum::Json(body)).into_response();
    if let Ok(value) = HeaderValue::from_str(&retry.to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

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
pub(super) struct Shared {
    pub(super) namespaces: Arc<Namespaces>,
    pub(super) ready: Readiness,
    pub(super) metrics: Arc<dyn Fn() -> String + Send + Sync>,
}

pub(super) fn json_error(status: StatusCode, code: &str, message: String) -> Response {
    (status, axum::Json(serde_json::json!({ "error": { "code": code, "message": message } }))).into_response()
}

/// The namespace a request names, or the answer when it cannot be served
/// (not synced yet, not a namespace name, too many namespaces).
pub(super) async fn namespace_or_refusal(shared: &Shared, namespace: &str) -> Result<Arc<Namespace>, Response> {
    served_or_refusal(&shared.namespaces, &shared.ready, namespace).await
}

/// [`namespace_or_refusal`] for routes that hold the namespaces and the
/// readiness themselves (the console).
pub(super) async fn served_or_refusal(namespaces: &Namespaces, ready: &Readiness, namespace: &str) -> Result<Arc<Namespace>, Response> {
    if !ready.is_ready() {
        return Err(json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not-ready",
            "the gateway is still reading the cluster's bindings; retry in a moment".into(),
        ));
    }
    match namespaces.get(namespace).await {
        Ok(ns) => Ok(ns),
        Err(err @ NamespaceError::BadName(_)) => Err(json_error(StatusCode::NOT_FOUND, "bad-namespace", err.to_string())),
        Err(err @ NamespaceError::Full { .. }) => {
            let mut response = json_error(StatusCode::SERVICE_UNAVAILABLE, "namespaces-full", err.to_string());
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            Err(response)
        }
    }
}
