//! Issue 9, class 1: the HTTP endpoint is not anonymous. The router is
//! driven with `tower::ServiceExt::oneshot` (no socket): `/mcp` without a
//! token is 401 with a `WWW-Authenticate: Bearer` challenge naming the
//! protected-resource metadata; a wrong token is 401 too; the right one
//! passes and its principal reaches the MCP handler; the Host and Origin
//! guards still hold behind it; `/healthz` and the metadata are open.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use skill_operator::core::grants::Grants;
use skill_operator::mcp::snapshot::Snapshot;
use skill_operator::mcp::state::ServerState;
use skill_operator::serve::http::{router, Auth, HttpOptions, Tokens};
use skill_operator::shutdown::Shutdown;
use tower::ServiceExt;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn app(auth: Auth) -> axum::Router {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Snapshot::scan(&[dir.path().to_path_buf()], Grants::resolve(&|_| None, None), BTreeSet::new());
    let options = HttpOptions {
        addr: "127.0.0.1:8080".parse().unwrap(),
        allowed_hosts: vec![],
        allowed_origins: vec![],
        auth,
        max_sessions: 4,
        bounds: Default::default(),
        listener_metrics: Default::default(),
    };
    router(Arc::new(ServerState::new(snapshot)), &options, &Shutdown::new())
}

fn tokens() -> Auth {
    Auth::Tokens(Arc::new(Tokens::single("alice", TOKEN)))
}

fn initialize(host: &str, token: Option<&str>, origin: Option<&str>) -> Request<Body> {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let mut r = Request::post("/mcp")
        .header("host", host)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(t) = token {
        r = r.header("authorization", format!("Bearer {t}"));
    }
    if let Some(o) = origin {
        r = r.header("origin", o);
    }
    r.body(Body::from(body)).unwrap()
}

async fn text(response: axum::response::Response) -> String {
    String::from_utf8_lossy(&response.into_body().collect().await.unwrap().to_bytes()).into_owned()
}

#[tokio::test]
async fn no_token_is_401_with_a_bearer_challenge() {
    let r = app(tokens()).oneshot(initialize("127.0.0.1:8080", None, None)).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let challenge = r.headers().get("www-authenticate").expect("WWW-Authenticate").to_str().unwrap().to_string();
    assert!(challenge.starts_with("Bearer "), "{challenge}");
    assert!(challenge.contains("resource_metadata=\"http://127.0.0.1:8080/.well-known/oauth-protected-resource\""), "{challenge}");
    assert!(text(r).await.contains("Authorization: Bearer"), "the body says what to send");
}

#[tokio::test]
async fn a_wrong_token_is_401() {
    let r = app(tokens()).oneshot(initialize("127.0.0.1:8080", Some("not-the-token-at-all-0000"), None)).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.headers()["www-authenticate"].to_str().unwrap().contains("error=\"invalid_token\""));
    // The scheme is required: a bare token is no bearer token.
    let mut bare = initialize("127.0.0.1:8080", None, None);
    bare.headers_mut().insert("authorization", TOKEN.parse().unwrap());
    assert_eq!(app(tokens()).oneshot(bare).await.unwrap().status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_right_token_passes() {
    let r = app(tokens()).oneshot(initialize("127.0.0.1:8080", Some(TOKEN), None)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().contains_key("mcp-session-id"));
    assert!(text(r).await.contains("serverInfo"));
}

#[tokio::test]
async fn host_and_origin_guards_still_hold_behind_the_token() {
    let r = app(tokens()).oneshot(initialize("evil.example:8080", Some(TOKEN), None)).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "a foreign Host (DNS rebinding)");
    let r = app(tokens()).oneshot(initialize("127.0.0.1:8080", Some(TOKEN), Some("http://evil.example"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN, "a foreign Origin");
    let r = app(tokens()).oneshot(initialize("localhost:8080", Some(TOKEN), Some("http://localhost:3000"))).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn healthz_and_the_metadata_are_open() {
    let r = app(tokens()).oneshot(Request::get("/healthz").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!((r.status(), text(r).await), (StatusCode::OK, "ok".to_string()));
    let r = app(tokens()).oneshot(Request::get("/.well-known/oauth-protected-resource").body(Body::empty()).unwrap()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let meta: serde_json::Value = serde_json::from_str(&text(r).await).unwrap();
    assert_eq!(meta["resource"], "http://127.0.0.1:8080/mcp");
    assert_eq!(meta["bearer_methods_supported"], serde_json::json!(["header"]));
}

#[tokio::test]
async fn no_auth_is_loopback_only() {
    let r = app(Auth::None).oneshot(initialize("127.0.0.1:8080", None, None)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let options = HttpOptions {
        addr: "0.0.0.0:8080".parse().unwrap(),
        allowed_hosts: vec![],
        allowed_origins: vec![],
        auth: Auth::None,
        max_sessions: 4,
        bounds: Default::default(),
        listener_metrics: Default::default(),
    };
    let err = skill_operator::serve::http::check(&options).unwrap_err().to_string();
    assert!(err.contains("loopback"), "{err}");
}

#[test]
fn token_files() {
    let path = std::path::Path::new("tokens");
    let t = Tokens::parse("# team\nalice 0123456789abcdef0123\n\nfedcba9876543210fedc\n", path).unwrap();
    assert_eq!(t.principal("0123456789abcdef0123"), Some("alice"));
    assert!(t.principal("fedcba9876543210fedc").unwrap().starts_with("token-"));
    assert_eq!(t.principal("0123456789abcdef012"), None);
    assert!(Tokens::parse("short\n", path).is_err(), "a short token is refused");
    assert!(Tokens::parse("a b c\n", path).is_err());
    assert!(Tokens::parse("# nothing\n", path).is_err());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("http-token");
    let (token, tokens) = Tokens::generate(&file).unwrap();
    assert!(tokens.principal(&token).is_some());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
}
