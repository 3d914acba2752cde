//! The gateway's HTTP surface: `/mcp/{namespace}` (both MCP eras, each
//! namespace its own service and session store), the file route
//! `/files/{namespace}/{job}/{*path}` ([`super::files`]), `/healthz`,
//! `/readyz` and `/metrics`. Authentication is a layer the caller puts on
//! the namespaced routes ([`router`] takes it), so this module only routes.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use tower::ServiceExt;

use crate::core::limits::{bytes_text, FILE_ROUTE_BYTES, JOB_UPLOAD_CHUNK, MCP_BODY_LIMIT};
use crate::serve::http::with_sessions;

use super::files::{files, FILES_PREFIX};
use super::namespaces::Namespaces;
pub use super::shared::Readiness;
use super::shared::{json_error, namespace_or_refusal, Shared};

/// The route parameter every namespaced route names (the auth layer reads it).
pub const NAMESPACE_PARAM: &str = "namespace";

async fn mcp(State(shared): State<Shared>, Path(namespace): Path<String>, request: Request) -> Response {
    let ns = match namespace_or_refusal(&shared, &namespace).await {
        Ok(ns) => ns,
        Err(response) => return response,
    };
    let sessions = ns.sessions.clone();
    with_sessions(&sessions, request, |request| serve_mcp(ns, namespace, request)).await
}

/// A request on a namespace's MCP endpoint, past the session rules.
async fn serve_mcp(ns: std::sync::Arc<super::namespaces::Namespace>, namespace: String, request: Request) -> Response {
    // rmcp reads the body itself, so axum's extractor limit would not hold:
    // a declared length is refused up front, an undeclared one is cut off.
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MCP_BODY_LIMIT) {
        return json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            format!(
                "an MCP request body may be at most {}: upload files in chunks of {} (skill_job_upload with an offset), or PUT a file of up to {} whole to {FILES_PREFIX}/{namespace}/<job>/<path> with your bearer token",
                bytes_text(MCP_BODY_LIMIT),
                bytes_text(JOB_UPLOAD_CHUNK),
                bytes_text(FILE_ROUTE_BYTES)
            ),
        );
    }
    let (parts, body) = request.into_parts();
    let request = Request::from_parts(parts, axum::body::Body::new(http_body_util::Limited::new(body, MCP_BODY_LIMIT as usize)));
    // A call over its caller's limit is answered here, before rmcp.
    let request = match crate::mcp::early::limit_calls(&ns.state, request).await {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    match ns.service.clone().oneshot(request).await {
        Ok(response) => response.into_response(),
        Err(never) => match never {},
    }
}

/// The routes. `gate` wraps the namespaced routes only (`/mcp/…` and
/// `/files/…`; the health routes stay open): the auth middleware, or the
/// identity in tests. `/metrics` answers the scrapers `metrics_access` lets in.
pub fn router<L>(
    namespaces: Arc<Namespaces>,
    ready: Readiness,
    metrics: Arc<dyn Fn() -> String + Send + Sync>,
    metrics_access: crate::metrics_access::MetricsAccess,
    gate: L,
) -> Router
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<Request, Error = std::convert::Infallible> + Clone + Send + Sync + 'static,
    <L::Service as tower::Service<Request>>::Response: IntoResponse + 'static,
    <L::Service as tower::Service<Request>>::Future: Send + 'static,
{
    let shared = Shared { namespaces, ready: ready.clone(), metrics };
    let path = format!("/mcp/{{{NAMESPACE_PARAM}}}");
    let files_path = format!("{FILES_PREFIX}/{{{NAMESPACE_PARAM}}}/{{job}}/{{*path}}");
    let mcp_routes = Router::new()
        .route(&path, any(mcp))
        .route(&format!("{path}/"), any(mcp))
        .route(&files_path, get(files).put(files))
        .route_layer(gate)
        .with_state(shared.clone());
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
            })
            .route_layer(axum::middleware::from_fn_with_state(metrics_access, crate::metrics_access::guard)),
        )
        .with_state(shared);
    Router::new().merge(mcp_routes).merge(open)
}

#[cfg(test)]
mod tests {
    use super::super::namespaces::testing::registry;
    use super::*;
    use axum::body::Body;

    fn app(ready: bool) -> Router {
        let (trees, reg) = registry(4);
        trees.put("team-a", &["one"]);
        let readiness = Readiness::default();
        if ready {
            readiness.set_ready();
        }
        router(
            Arc::new(reg),
            readiness,
            Arc::new(|| "# metrics\n".to_string()),
            crate::metrics_access::MetricsAccess::open(),
            tower::layer::util::Identity::new(),
        )
    }

    async fn send(app: Router, request: axum::http::Request<Body>) -> (StatusCode, String) {
        let response = app.oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn initialize(ns: &str, body: Body, length: Option<u64>) -> axum::http::Request<Body> {
        let mut request = axum::http::Request::post(format!("/mcp/{ns}"))
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream");
        if let Some(n) = length {
            request = request.header(header::CONTENT_LENGTH, n);
        }
        request.body(body).unwrap()
    }

    const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#;

    #[tokio::test]
    async fn health_is_open_and_readiness_follows_the_sync() {
        assert_eq!(send(app(false), axum::http::Request::get("/healthz").body(Body::empty()).unwrap()).await.0, StatusCode::OK);
        assert_eq!(
            send(app(false), axum::http::Request::get("/readyz").body(Body::empty()).unwrap()).await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(send(app(true), axum::http::Request::get("/readyz").body(Body::empty()).unwrap()).await.0, StatusCode::OK);
        let (status, body) = send(app(false), initialize("team-a", Body::from(INIT), None)).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("not-ready"));
    }

    #[tokio::test]
    async fn a_namespace_must_be_a_dns_label_and_bodies_are_bounded() {
        let (status, body) = send(app(true), initialize("Team_A", Body::from(INIT), None)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert!(body.contains("bad-namespace"));
        // Declared over the limit: refused before anything reads it.
        let (status, body) = send(app(true), initialize("team-a", Body::empty(), Some(MCP_BODY_LIMIT + 1))).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
        assert!(body.contains("skill_job_upload") && body.contains("/files/team-a/<job>/<path>"), "{body}");
        // At the limit it is read (and answered by the MCP service).
        let mut padded = INIT.to_string();
        padded.push_str(&" ".repeat(MCP_BODY_LIMIT as usize - INIT.len()));
        let (status, _) = send(app(true), initialize("team-a", Body::from(padded), Some(MCP_BODY_LIMIT))).await;
        assert_eq!(status, StatusCode::OK);
        // Undeclared and over the limit: cut off, never served.
        let chunks = futures::stream::iter(vec![Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b' '; MCP_BODY_LIMIT as usize + 1]))]);
        let (status, _) = send(app(true), initialize("team-a", Body::from_stream(chunks), None)).await;
        assert_ne!(status, StatusCode::OK);
    }

    #[tokio::test]
    async fn the_file_route_is_namespaced_and_waits_for_the_sync() {
        let get = |uri: &str| axum::http::Request::get(uri).body(Body::empty()).unwrap();
        let (status, body) = send(app(false), get("/files/team-a/skj-1/out.txt")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let (status, body) = send(app(true), get("/files/Team_A/skj-1/out.txt")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("bad-namespace"), "{body}");
        // A namespace whose backend runs no jobs has no files to serve.
        let (status, body) = send(app(true), get("/files/team-a/skj-1/out.txt")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("no-execution"), "{body}");
        // Only GET and PUT.
        let delete = axum::http::Request::delete("/files/team-a/skj-1/out.txt").body(Body::empty()).unwrap();
        assert_eq!(send(app(true), delete).await.0, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn a_legacy_session_belongs_to_its_namespace() {
        let app = app(true);
        let response = app.clone().oneshot(initialize("team-a", Body::from(INIT), None)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let session = response.headers().get("mcp-session-id").unwrap().to_str().unwrap().to_string();
        let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;
        let on = |ns: &str| {
            axum::http::Request::post(format!("/mcp/{ns}"))
                .header(header::HOST, "localhost")
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "application/json, text/event-stream")
                .header("mcp-session-id", session.as_str())
                .header("mcp-protocol-version", "2025-11-25")
                .body(Body::from(list))
                .unwrap()
        };
        let (status, body) = send(app.clone(), on("team-b")).await;
        assert!(status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST, "team-a's session on team-b: {status} {body}");
    }

    /// The gate's stand-in: the caller named by a test header.
    async fn as_principal(mut request: Request, next: axum::middleware::Next) -> Response {
        let who = request.headers().get("x-test-principal").and_then(|v| v.to_str().ok()).unwrap_or("nobody").to_string();
        request.extensions_mut().insert(crate::mcp::executor::Caller::named(&who));
        next.run(request).await
    }

    /// A session id leaked to another principal opens nothing: every method
    /// on it (a call, the event stream, the DELETE that would end it) is
    /// answered as an unknown session, and the session goes on for its owner.
    #[tokio::test]
    async fn a_session_belongs_to_the_principal_who_opened_it() {
        let (trees, reg) = registry(4);
        trees.put("team-a", &["one"]);
        let readiness = Readiness::default();
        readiness.set_ready();
        let app = router(
            Arc::new(reg),
            readiness,
            Arc::new(String::new),
            crate::metrics_access::MetricsAccess::open(),
            axum::middleware::from_fn(as_principal),
        );
        let mut open = initialize("team-a", Body::from(INIT), None);
        open.headers_mut().insert("x-test-principal", "alice".parse().unwrap());
        let response = app.clone().oneshot(open).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let session = response.headers().get("mcp-session-id").unwrap().to_str().unwrap().to_string();
        let on = |method: &str, who: &str, body: &'static str| {
            axum::http::Request::builder()
                .method(method)
                .uri("/mcp/team-a")
                .header(header::HOST, "localhost")
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "application/json, text/event-stream")
                .header("mcp-session-id", session.as_str())
                .header("mcp-protocol-version", "2025-11-25")
                .header("x-test-principal", who)
                .body(Body::from(body))
                .unwrap()
        };
        const LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}"#;
        for method in ["POST", "GET", "DELETE"] {
            let body = if method == "POST" { LIST } else { "" };
            let (status, text) = send(app.clone(), on(method, "mallory", body)).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{method} by another principal: {text}");
            assert!(text.contains("Session not found"), "{text}");
        }
        // Still alice's, and alive.
        let (status, text) = send(app.clone(), on("POST", "alice", LIST)).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let (status, _) = send(app.clone(), on("DELETE", "alice", "")).await;
        assert!(status.is_success(), "the owner ends it: {status}");
        let (status, _) = send(app, on("POST", "alice", LIST)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "ended");
    }
}
