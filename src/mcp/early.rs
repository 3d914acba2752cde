//! A `tools/call` over its caller's `calls` limit, answered over HTTP
//! before rmcp sees it. A refusal through rmcp costs the session's channels,
//! a task hop each way and an SSE stream; here it costs a scan of the body
//! and a bucket check, so a caller flooding refused calls takes much less of
//! the server from everyone else (docs/benchmarks.md#rate-limits). The call
//! that passes takes its token here and carries [`CallCounted`], so the
//! tool handler does not take a second one.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use rmcp::ErrorData as McpError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::executor::Caller;
use super::state::ServerState;
use crate::core::limits::{bytes_text, MCP_BODY_LIMIT};

/// On a request whose `calls` token was taken by [`limit_calls`]. An HTTP
/// extension, which a client cannot set.
#[derive(Debug, Clone, Copy)]
pub struct CallCounted;

/// Only what decides: serde skips every other field without building it.
#[derive(Deserialize)]
struct Peek {
    method: Option<String>,
    #[serde(default)]
    id: Value,
}

/// The request back (its body read once and put back, a `tools/call` that
/// passed marked [`CallCounted`]), or the answer to a refused call. Requests
/// without an authenticated caller, other methods and other HTTP verbs pass
/// untouched, as does everything on a server that limits no calls.
pub async fn limit_calls(state: &ServerState, request: Request) -> Result<Request, Response> {
    if request.method() != Method::POST || !state.rate_limits.current().limits_calls() {
        return Ok(request);
    }
    let Some(caller) = request.extensions().get::<Caller>().cloned() else { return Ok(request) };
    let (mut parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, MCP_BODY_LIMIT as usize).await {
        Ok(bytes) => bytes,
        Err(_) => {
            let message = format!("an MCP request body may be at most {}", bytes_text(MCP_BODY_LIMIT));
            return Err((StatusCode::PAYLOAD_TOO_LARGE, axum::Json(json!({"error": "body-too-large", "message": message}))).into_response());
        }
    };
    // Not JSON, or not a request: rmcp answers it as it always does.
    if let Ok(peek) = serde_json::from_slice::<Peek>(&bytes) {
        if peek.method.as_deref() == Some("tools/call") {
            match state.rate_limits.check_call(&caller.principal) {
                Ok(()) => {
                    parts.extensions.insert(CallCounted);
                }
                Err(limited) => {
                    let error = McpError::from(limited);
                    if state.audit.enabled() {
                        let request: Value = serde_json::from_slice(&bytes).unwrap_or_default();
                        let params = &request["params"];
                        let facts = super::audit::CallFacts::of(params["name"].as_str().unwrap_or(""), params["arguments"].as_object());
                        super::audit::tool_call(state, &caller, facts, &Err(error.clone()));
                    }
                    let body = json!({"jsonrpc": "2.0", "id": peek.id, "error": error});
                    let mut response = (StatusCode::OK, axum::Json(body)).into_response();
                    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
                    return Err(response);
                }
            }
        }
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// Whether [`limit_calls`] already took this call's token.
pub fn counted(parts: Option<&http::request::Parts>) -> bool {
    parts.is_some_and(|p| p.extensions.get::<CallCounted>().is_some())
}
