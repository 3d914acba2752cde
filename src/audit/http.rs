//! The HTTP face of the trail: every request a server answers with an
//! error before any tool saw it is one record, whatever refused it (a
//! route of ours, rmcp's checks of host, origin, media type and message,
//! a body cap, a rate limit on a route that is no tool call).
//!
//! [`record_refusals`] wraps a whole router, outermost, and looks only at
//! the answer: a status of 400 or more that nothing recorded already is a
//! `request.refused` record ([`Event::RequestRefused`]). Whatever recorded
//! its own refusal (authentication's `auth.refused`) marks the answer with
//! [`Recorded`]. A refusal after authentication carries the caller in the
//! answer's extensions (the auth layer puts it there), so the record names
//! who was refused.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::Value;

use super::{Audit, Event, Outcome, Record};
use crate::mcp::executor::Caller;

/// On an answer whose refusal is in the trail already.
#[derive(Debug, Clone, Copy)]
pub struct Recorded;

/// Probes answer errors by design while a process starts; they are no refusals.
const UNRECORDED_PATHS: [&str; 2] = ["/healthz", "/readyz"];
/// An error body is read this far for its code and sentence (refusals are short).
const BODY_READ: usize = 64 * 1024;
/// The sentence kept from a body that is not one of our JSON errors.
const REASON_CHARS: usize = 300;

/// The middleware (`axum::middleware::from_fn_with_state(audit, record_refusals)`).
pub async fn record_refusals(State(audit): State<Audit>, request: Request, next: Next) -> Response {
    if !audit.enabled() || UNRECORDED_PATHS.contains(&request.uri().path()) {
        return next.run(request).await;
    }
    let line = format!("{} {}", request.method(), request.uri().path());
    let namespace = namespace_of(request.uri().path());
    let response = next.run(request).await;
    let status = response.status();
    if status.as_u16() < 400 || response.extensions().get::<Recorded>().is_some() {
        return response;
    }
    let caller = response.extensions().get::<Caller>().cloned();
    let retry_after = response.headers().get(header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, BODY_READ).await.unwrap_or_default();
    let (code, reason) = code_and_reason(status, &bytes);
    let outcome = match status {
        StatusCode::TOO_MANY_REQUESTS => Outcome::RateLimited,
        s if s.is_server_error() => Outcome::Failed,
        _ => Outcome::Refused,
    };
    let mut record = Record::new(Event::RequestRefused, outcome).code(code).reason(reason);
    record.request = Some(line);
    record.retry_after_seconds = retry_after;
    if let Some(ns) = namespace {
        record = record.namespace(ns);
    }
    if let Some(caller) = &caller {
        record = record.caller(caller);
    }
    audit.record(record);
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

/// The namespace a path names (`/mcp/NS`, `/files/NS/...`, `/ui/api/ns/NS/...`).
fn namespace_of(path: &str) -> Option<String> {
    let mut segments = path.trim_start_matches('/').split('/');
    let ns = match (segments.next(), segments.next(), segments.next(), segments.next()) {
        (Some("mcp" | "files"), Some(ns), _, _) => ns,
        (Some("ui"), Some("api"), Some("ns"), Some(ns)) => ns,
        _ => return None,
    };
    (!ns.is_empty()).then(|| ns.chars().take(63).collect())
}

/// Our JSON errors' code and message (`{"error":{"code","message"}}`, or
/// a JSON-RPC error), else `http:<status>` and the body's first line.
fn code_and_reason(status: StatusCode, body: &[u8]) -> (String, String) {
    let http = format!("http:{}", status.as_u16());
    if let Ok(json) = serde_json::from_slice::<Value>(body) {
        let error = &json["error"];
        let message = error["message"].as_str().or(json["message"].as_str()).unwrap_or_default();
        let code = match &error["code"] {
            Value::String(code) => code.clone(),
            Value::Number(n) => format!("jsonrpc:{n}"),
            _ => error.as_str().map(str::to_string).unwrap_or(http),
        };
        return (code, message.chars().take(REASON_CHARS).collect());
    }
    let text = String::from_utf8_lossy(body);
    (http, text.lines().next().unwrap_or_default().chars().take(REASON_CHARS).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespace_and_the_code_come_from_the_path_and_the_answer() {
        assert_eq!(namespace_of("/mcp/team-a"), Some("team-a".into()));
        assert_eq!(namespace_of("/files/team-a/skj-1/out.txt"), Some("team-a".into()));
        assert_eq!(namespace_of("/ui/api/ns/team-a/skills"), Some("team-a".into()));
        assert_eq!(namespace_of("/ui/api/namespaces"), None);
        assert_eq!(namespace_of("/mcp"), None);
        let (code, reason) = code_and_reason(StatusCode::NOT_FOUND, br#"{"error":{"code":"bad-namespace","message":"no such namespace"}}"#);
        assert_eq!((code.as_str(), reason.as_str()), ("bad-namespace", "no such namespace"));
        let (code, _) =
            code_and_reason(StatusCode::BAD_REQUEST, br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#);
        assert_eq!(code, "jsonrpc:-32700");
        let (code, reason) = code_and_reason(StatusCode::PAYLOAD_TOO_LARGE, br#"{"error":"body-too-large","message":"at most 4 MiB"}"#);
        assert_eq!((code.as_str(), reason.as_str()), ("body-too-large", "at most 4 MiB"));
        let (code, reason) = code_and_reason(StatusCode::FORBIDDEN, b"Forbidden: Host header is not allowed\nmore");
        assert_eq!((code.as_str(), reason.as_str()), ("http:403", "Forbidden: Host header is not allowed"));
    }
}
