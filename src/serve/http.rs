//! The standalone server's streamable HTTP endpoint: `/mcp` (both protocol
//! eras) and `/healthz`, with the DNS-rebinding guards (Host and Origin
//! allowlists, loopback names always allowed), a bearer token on `/mcp`,
//! and a cap on sessions ([`super::sessions`]); `/metrics` has the
//! listener's counters ([`crate::listener`]: timeouts and connection caps).
//!
//! # Who is calling
//!
//! `/mcp` is not anonymous: every request carries `Authorization: Bearer
//! <token>` with a token from the token file (`--http-token-file`, or one
//! generated at start into `<data dir>/http-token`, mode `0600`, and
//! printed once). The token names a principal, which goes into the
//! request's extensions as a [`Caller`]; the MCP handler reads it from
//! there, and every job belongs to the principal that created it (another
//! principal cannot list, read, run or delete it). A request without a
//! valid token is answered 401 with a `WWW-Authenticate: Bearer` header
//! naming the protected-resource metadata (RFC 9728), served at
//! `/.well-known/oauth-protected-resource`. `--http-no-auth` drops the
//! check, on a loopback bind only (every request is then the one
//! principal `anonymous`). `/healthz` is open.
//!
//! The token file holds one token per line, `TOKEN` or `PRINCIPAL TOKEN`
//! (blank lines and `#` comments ignored). A token without a name is the
//! principal `token-<first 12 hex digits of its SHA-256>`. Tokens are
//! compared by digest in constant time.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};

use crate::core::limits::HTTP_TOKEN_BYTES;
use crate::mcp::executor::Caller;
use crate::mcp::state::ServerState;
use crate::mcp::SkillServer;
use crate::shutdown::Shutdown;

use super::sessions::BoundedSessions;

/// The principal of every request when authentication is off.
pub const ANONYMOUS: &str = "anonymous";
/// Where the protected-resource metadata is served.
pub const RESOURCE_METADATA_PATH: &str = "/.well-known/oauth-protected-resource";

/// How the HTTP endpoint is set up.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub addr: SocketAddr,
    /// `Host` values accepted besides the loopback names.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted besides loopback origins.
    pub allowed_origins: Vec<String>,
    /// Who may call `/mcp`.
    pub auth: Auth,
    /// Sessions held at once.
    pub max_sessions: usize,
    /// The listener's timeouts and caps.
    pub bounds: crate::listener::Bounds,
    /// Its counters, served at `/metrics`.
    pub listener_metrics: crate::listener::ListenerMetrics,
}

/// Who may call `/mcp`.
#[derive(Debug, Clone)]
pub enum Auth {
    /// A bearer token from this set.
    Tokens(Arc<Tokens>),
    /// Anyone (`--http-no-auth`, loopback binds only).
    None,
}

/// The accepted tokens, by digest.
#[derive(Clone)]
pub struct Tokens {
    entries: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").field("principals", &self.entries.iter().map(|(p, _)| p).collect::<Vec<_>>()).finish()
    }
}

/// Why the HTTP endpoint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HttpSetupError {
    #[error("cannot read the token file {path}: {source}")]
    ReadTokens { path: PathBuf, source: std::io::Error },
    #[error("the token file {path} holds no token (one per line: `TOKEN` or `PRINCIPAL TOKEN`)")]
    NoTokens { path: PathBuf },
    #[error("the token file {path}, line {line}: {why}")]
    BadToken { path: PathBuf, line: usize, why: &'static str },
    #[error("cannot write the generated token to {path}: {source} (give a token with --http-token-file, or another --data-dir)")]
    WriteToken { path: PathBuf, source: std::io::Error },
    #[error("--http-no-auth is allowed on a loopback address only, not {0}: anyone who can reach it could run scripts; use a token")]
    NoAuthOffLoopback(SocketAddr),
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Equal in time independent of where two digests differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// One token for one principal.
    pub fn single(principal: &str, token: &str) -> Tokens {
        Tokens { entries: vec![(principal.to_string(), digest(token))] }
    }

    /// Parse a token file's text (see the module docs).
    pub fn parse(text: &str, path: &Path) -> Result<Tokens, HttpSetupError> {
        let mut entries = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why| HttpSetupError::BadToken { path: path.to_path_buf(), line: i + 1, why };
            let mut words = line.split_whitespace();
            let (principal, token) = match (words.next(), words.next(), words.next()) {
                (Some(token), None, _) => (None, token),
                (Some(principal), Some(token), None) => (Some(principal), token),
                _ => return Err(bad("expected `TOKEN` or `PRINCIPAL TOKEN`")),
            };
            if token.len() < 16 {
                return Err(bad("a token must be at least 16 characters"));
            }
            let d = digest(token);
            let principal = principal.map(str::to_string).unwrap_or_else(|| format!("token-{}", &hex::encode(d)[..12]));
            entries.push((principal, d));
        }
        if entries.is_empty() {
            return Err(HttpSetupError::NoTokens { path: path.to_path_buf() });
        }
        Ok(Tokens { entries })
    }

    /// Read a token file (a warning when others may read it).
    pub fn load(path: &Path) -> Result<Tokens, HttpSetupError> {
        use std::os::unix::fs::PermissionsExt;
        let text = std::fs::read_to_string(path).map_err(|source| HttpSetupError::ReadTokens { path: path.to_path_buf(), source })?;
        if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
            tracing::warn!(path = %path.display(), "the token file is readable by others: chmod 600 it");
        }
        Tokens::parse(&text, path)
    }

    /// A fresh random token, written to `path` (mode 0600, replacing any
    /// earlier one): the token and its parsed set.
    pub fn generate(path: &Path) -> Result<(String, Tokens), HttpSetupError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let fail = |source| HttpSetupError::WriteToken { path: path.to_path_buf(), source };
        let bytes = crate::runner::egress::random_bytes::<HTTP_TOKEN_BYTES>().map_err(fail)?;
        let token = hex::encode(bytes);
        let tmp = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
        let written = (|| {
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            writeln!(file, "{token}")?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(fail(e));
        }
        let tokens = Tokens::parse(&token, path)?;
        Ok((token, tokens))
    }

    /// The principal a presented token names.
    pub fn principal(&self, token: &str) -> Option<&str> {
        let d = digest(token);
        // Check every entry, so the time does not depend on which one matched.
        let mut found = None;
        for (principal, known) in &self.entries {
            if same(known, &d) && found.is_none() {
                found = Some(principal.as_str());
            }
        }
        found
    }
}

/// What the auth layer needs.
#[derive(Clone)]
struct AuthState {
    auth: Auth,
    /// The protected-resource metadata URL, for `WWW-Authenticate`.
    metadata_url: String,
    /// Where refused requests are recorded (`auth.refused`).
    audit: crate::audit::Audit,
}

fn unauthorized(state: &AuthState, error: Option<&str>) -> Response {
    if state.audit.enabled() {
        let reason = if error.is_some() { "the bearer token is not one of this server's" } else { "no bearer token" };
        let record = crate::audit::Record::new(crate::audit::Event::AuthRefused, crate::audit::Outcome::Refused)
            .code(crate::mcp::error::codes::UNAUTHORIZED)
            .reason(reason);
        state.audit.record(record);
    }
    let mut challenge = format!("Bearer realm=\"skill-operator\", resource_metadata=\"{}\"", state.metadata_url);
    if let Some(error) = error {
        challenge.push_str(&format!(", error=\"{error}\""));
    }
    let body = serde_json::json!({
        "error": "unauthorized",
        "message": "this endpoint needs `Authorization: Bearer <token>`: the token the server printed at start (also in its token file), or one from --http-token-file",
    });
    let mut response = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    if let Ok(value) = HeaderValue::from_str(&challenge) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
    }
    response.extensions_mut().insert(crate::audit::http::Recorded);
    response
}

/// The bearer check: the caller's principal into the request, or 401.
async fn authenticate(State(state): State<AuthState>, mut request: Request, next: Next) -> Response {
    let principal = match &state.auth {
        Auth::None => ANONYMOUS.to_string(),
        Auth::Tokens(tokens) => {
            let presented = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
                .map(str::trim);
            match presented {
                None => return unauthorized(&state, None),
                Some(token) => match tokens.principal(token) {
                    Some(p) => p.to_string(),
                    None => return unauthorized(&state, Some("invalid_token")),
                },
            }
        }
    };
    let caller = Caller::named(principal);
    request.extensions_mut().insert(caller.clone());
    let mut response = next.run(request).await;
    // Whoever refuses it further in, the trail names the caller.
    response.extensions_mut().insert(caller);
    response
}

/// Whether a request would open a session: only a 2025-11-25 (or older)
/// `initialize` does, a POST without a session id and without a 2026-07-28
/// protocol header (that era is stateless and sends its version on every
/// request).
pub(crate) fn opens_session(request: &Request) -> bool {
    let modern = request
        .headers()
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v >= rmcp::model::ProtocolVersion::V_2026_07_28.as_str());
    request.method() == axum::http::Method::POST && !request.headers().contains_key("mcp-session-id") && !modern
}

/// The answer to a session-opening request when the store is full.
pub(crate) fn sessions_full(max: usize) -> Response {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32000, "message": crate::serve::sessions::SessionsError::Full { max }.to_string()},
    });
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The session rules, around the MCP service: a new session past the cap
/// is refused; a request naming a session must come from the principal
/// whose `initialize` opened it (whatever the method: POST, the GET event
/// stream, DELETE), or it is answered as rmcp answers an unknown session;
/// and a session opened now is bound to its caller. Without an
/// authenticated caller (a loopback server with no token) there is no one
/// to bind to.
pub(crate) async fn with_sessions<F, Fut>(sessions: &BoundedSessions, request: Request, service: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let opening = opens_session(&request);
    if opening && sessions.is_full() {
        return sessions_full(sessions.max());
    }
    let principal = request.extensions().get::<crate::mcp::executor::Caller>().map(|c| c.principal.clone());
    let named = request.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok());
    if let (Some(principal), Some(id)) = (&principal, named) {
        if !sessions.is_owner(id, principal) {
            return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
        }
    }
    let response = service(request).await;
    if let (true, Some(principal)) = (opening, principal) {
        if let Some(id) = response.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()) {
            sessions.bind_owner(id, &principal);
        }
    }
    response
}

/// The header naming a legacy session.
const SESSION_HEADER: &str = "mcp-session-id";

async fn sessions_guard(State(sessions): State<Arc<BoundedSessions>>, request: Request, next: Next) -> Response {
    with_sessions(&sessions, request, |request| next.run(request)).await
}

/// A `tools/call` over its caller's limit, answered before rmcp (after the bearer check).
async fn limit_calls(State(state): State<Arc<ServerState>>, request: Request, next: Next) -> Response {
    match crate::mcp::early::limit_calls(&state, request).await {
        Ok(request) => next.run(request).await,
        Err(refused) => refused,
    }
}

/// The HTTP router: `/mcp` (both protocol eras, behind the bearer check),
/// `/healthz`, and the protected-resource metadata.
pub fn router(state: Arc<ServerState>, options: &HttpOptions, shutdown: &Shutdown) -> Router {
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into(), "[::1]".into()];
    hosts.extend(options.allowed_hosts.iter().cloned());
    let mut origins: Vec<String> = vec!["http://localhost:*".into(), "http://127.0.0.1:*".into(), "http://[::1]:*".into()];
    origins.extend(options.allowed_origins.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_cancellation_token(shutdown.token());
    let audit = state.audit.clone();
    let refusals_audit = audit.clone();
    let limits_state = state.clone();
    let server = SkillServer::new(state);
    let sessions = Arc::new(BoundedSessions::new(options.max_sessions));
    let service = StreamableHttpService::new(move || Ok(server.clone()), sessions.clone(), config);
    let base = format!("http://{}", options.addr);
    let auth = AuthState { auth: options.auth.clone(), metadata_url: format!("{base}{RESOURCE_METADATA_PATH}"), audit };
    let metadata = serde_json::json!({
        "resource": format!("{base}/mcp"),
        "resource_name": "skill-operator",
        "bearer_methods_supported": ["header"],
    });
    let listener_metrics = options.listener_metrics.clone();
    // /metrics behind the same bearer check as /mcp: what the server counts
    // (principals' refusals, listener counters) is for its token holders.
    let metrics = Router::new()
        .route("/metrics", get(move || std::future::ready(listener_metrics.render_after(&rate_limit_metrics()))))
        .layer(axum::middleware::from_fn_with_state(auth.clone(), authenticate));
    let mcp = Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn_with_state(limits_state, limit_calls))
        .layer(axum::middleware::from_fn_with_state(sessions, sessions_guard))
        .layer(axum::middleware::from_fn_with_state(auth, authenticate));
    let metadata_route = get(move || {
        let metadata = metadata.clone();
        async move { axum::Json(metadata) }
    });
    Router::new()
        .merge(mcp)
        .merge(metrics)
        .route("/healthz", get(|| async { "ok" }))
        .route(RESOURCE_METADATA_PATH, metadata_route.clone())
        .route(&format!("{RESOURCE_METADATA_PATH}/mcp"), metadata_route)
        .layer(axum::middleware::from_fn_with_state(refusals_audit, crate::audit::http::record_refusals))
}

/// Check the options before binding (a no-auth bind must be loopback).
pub fn check(options: &HttpOptions) -> Result<(), HttpSetupError> {
    if matches!(options.auth, Auth::None) && !options.addr.ip().is_loopback() {
        return Err(HttpSetupError::NoAuthOffLoopback(options.addr));
    }
    Ok(())
}

/// Serve streamable HTTP until shutdown.
pub async fn serve(state: Arc<ServerState>, options: HttpOptions, shutdown: Shutdown) -> anyhow::Result<()> {
    check(&options)?;
    if !options.addr.ip().is_loopback() && options.allowed_hosts.is_empty() {
        tracing::warn!(addr = %options.addr, "binding a non-loopback address: only loopback Host headers are accepted unless --allowed-host is given");
    }
    let listener = crate::listener::bind(options.addr).with_context(|| format!("cannot listen on {}", options.addr))?;
    serve_on(listener, state, options, shutdown).await
}

/// Serve streamable HTTP on a bound listener until shutdown.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    state: Arc<ServerState>,
    mut options: HttpOptions,
    shutdown: Shutdown,
) -> anyhow::Result<()> {
    check(&options)?;
    let local = listener.local_addr()?;
    options.addr = local;
    if matches!(options.auth, Auth::None) {
        eprintln!(
            "skill-operator: WARNING: --http-no-auth: http://{local}/mcp accepts every request without a token; any process on this machine can list, read, run and delete jobs"
        );
        tracing::warn!(%local, "HTTP endpoint without authentication (--http-no-auth)");
    }
    let app = router(state, &options, &shutdown);
    eprintln!("skill-operator: listening on http://{local}/mcp");
    let metrics = options.listener_metrics.clone();
    crate::listener::serve(listener, app, options.bounds, metrics, shutdown.wait_owned()).await.context("HTTP server failed")?;
    Ok(())
}

/// The rate-limit refusals, under this server's metric prefix.
fn rate_limit_metrics() -> String {
    crate::mcp::ratelimit::render_metrics("skill_operator_serve")
}
