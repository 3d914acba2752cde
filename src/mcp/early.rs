//! A `tools/call` over its caller's `calls` limit, answered over HTTP
//! before rmcp sees it. A refusal through rmcp costs the session's channels,
//! a task hop each way and an SSE stream; here it costs a scan of the body
//! and a bucket check, and the answer is held for [`RATE_REFUSAL_HOLD`], so
//! a caller flooding refused calls takes little of the server from everyone
//! else (docs/benchmarks.md#rate-limits). The call that passes takes its
//! token here and carries [`CallCounted`], so the tool handler does not
//! take a second one.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use rmcp::ErrorData as McpError;
use serde::Deserialize;
use serde_json::{json, Value};

use super::executor::Caller;
use super::state::ServerState;
use crate::core::limits::{bytes_text, MCP_BODY_LIMIT, RATE_REFUSAL_HOLD};

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
                    // A timer, not work: the caller's next call waits for this answer.
                    let hold = RATE_REFUSAL_HOLD.min(std::time::Duration::from_secs(limited.retry_after_secs()));
                    let error = McpError::from(limited);
                    if state.audit.enabled() {
                        let request: Value = serde_json::from_slice(&bytes).unwrap_or_default();
                        let params = &request["params"];
                        let facts = super::audit::CallFacts::of(params["name"].as_str().unwrap_or(""), params["arguments"].as_object());
                        super::audit::tool_call(state, &caller, facts, &Err(error.clone()));
                    }
                    tokio::time::sleep(hold).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::ratelimit::RateLimits;
    use crate::mcp::snapshot::Snapshot;

    fn call(principal: &str, id: u32) -> Request {
        let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"skill_list","arguments":{}}});
        let mut request = Request::post("/mcp").body(Body::from(body.to_string())).unwrap();
        request.extensions_mut().insert(Caller::named(principal.to_string()));
        request
    }

    fn state(limits: RateLimits) -> ServerState {
        ServerState::new(Snapshot::scan(&[], crate::core::grants::Grants::resolve(&|_| None, None), Default::default()))
            .with_rate_limits(limits)
    }

    /// The edge: the burst passes marked counted, the next call is refused and
    /// its answer held exactly RATE_REFUSAL_HOLD (paused time), and another
    /// principal's call is neither held nor refused.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_is_held_and_a_pass_is_marked_counted() {
        let state = state(RateLimits { calls_per_minute: 60, burst_calls: 2, ..RateLimits::default() });
        for id in 0..2 {
            let passed = limit_calls(&state, call("a", id)).await.unwrap_or_else(|_| panic!("call {id} is within the burst"));
            assert!(passed.extensions().get::<CallCounted>().is_some());
        }
        let started = tokio::time::Instant::now();
        let refused = limit_calls(&state, call("a", 7)).await.expect_err("over the burst");
        assert_eq!(started.elapsed(), RATE_REFUSAL_HOLD);
        let body: Value = serde_json::from_slice(&axum::body::to_bytes(refused.into_body(), 1 << 20).await.unwrap()).unwrap();
        assert_eq!((body["id"].clone(), body["error"]["code"].clone()), (json!(7), json!(-32029)), "{body}");

        let started = tokio::time::Instant::now();
        assert!(limit_calls(&state, call("b", 1)).await.is_ok());
        assert_eq!(started.elapsed(), std::time::Duration::ZERO, "another principal waits for nothing");
    }

    /// Unlimited servers, other methods and unauthenticated requests are not
    /// read at all; a closed server refuses calls with its 503 shape.
    #[tokio::test(start_paused = true)]
    async fn only_calls_of_a_known_caller_on_a_limited_server_are_looked_at() {
        let unlimited = state(RateLimits::default());
        let passed = limit_calls(&unlimited, call("a", 1)).await.unwrap();
        assert!(passed.extensions().get::<CallCounted>().is_none(), "no token taken where there is no bucket");

        let limited = state(RateLimits { calls_per_minute: 1, burst_calls: 1, ..RateLimits::default() });
        let list = json!({"jsonrpc":"2.0","id":1,"method":"tools/list"}).to_string();
        for _ in 0..3 {
            let mut request = Request::post("/mcp").body(Body::from(list.clone())).unwrap();
            request.extensions_mut().insert(Caller::named("a".to_string()));
            assert!(limit_calls(&limited, request).await.is_ok(), "a listing is never refused here");
        }
        let mut anonymous = call("a", 2);
        anonymous.extensions_mut().remove::<Caller>();
        assert!(limit_calls(&limited, anonymous).await.is_ok());

        let closed = ServerState::new(Snapshot::scan(&[], crate::core::grants::Grants::resolve(&|_| None, None), Default::default()))
            .with_rate_limits(crate::mcp::ratelimit::Policy::Closed("unknown here".into()));
        let refused = limit_calls(&closed, call("a", 3)).await.expect_err("closed");
        let body: Value = serde_json::from_slice(&axum::body::to_bytes(refused.into_body(), 1 << 20).await.unwrap()).unwrap();
        assert_eq!(body["error"]["data"]["status"], 503, "{body}");
    }
}
