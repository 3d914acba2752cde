//! The standalone server's streamable HTTP endpoint: `/mcp` (both protocol
//! eras) and `/healthz`, with the DNS-rebinding guards (Host and Origin
//! allowlists, loopback names always allowed).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::routing::get;
use axum::Router;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::mcp::state::ServerState;
use crate::mcp::SkillServer;
use crate::shutdown::Shutdown;

/// How the HTTP endpoint guards against DNS rebinding.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub addr: SocketAddr,
    /// `Host` values accepted besides the loopback names.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted besides loopback origins.
    pub allowed_origins: Vec<String>,
}

/// The HTTP router: `/mcp` (both protocol eras) and `/healthz`.
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
    let server = SkillServer::new(state);
    let service = StreamableHttpService::new(move || Ok(server.clone()), LocalSessionManager::default().into(), config);
    Router::new().nest_service("/mcp", service).route("/healthz", get(|| async { "ok" }))
}

/// Serve streamable HTTP until shutdown.
pub async fn serve(state: Arc<ServerState>, options: HttpOptions, shutdown: Shutdown) -> anyhow::Result<()> {
    if !options.addr.ip().is_loopback() && options.allowed_hosts.is_empty() {
        tracing::warn!(addr = %options.addr, "binding a non-loopback address: only loopback Host headers are accepted unless --allowed-host is given");
    }
    let app = router(state, &options, &shutdown);
    let listener = tokio::net::TcpListener::bind(options.addr).await.with_context(|| format!("cannot listen on {}", options.addr))?;
    let local = listener.local_addr()?;
    eprintln!("skill-operator: listening on http://{local}/mcp");
    axum::serve(listener, app).with_graceful_shutdown(shutdown.wait_owned()).await.context("HTTP server failed")?;
    Ok(())
}
