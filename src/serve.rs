//! The standalone server: one process serving a skills catalog over stdio
//! or streamable HTTP.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::routing::get;
use axum::Router;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use crate::mcp::state::ServerState;
use crate::mcp::SkillServer;

/// How the HTTP endpoint guards against DNS rebinding.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub addr: SocketAddr,
    /// `Host` values accepted besides the loopback names.
    pub allowed_hosts: Vec<String>,
    /// `Origin` values accepted besides loopback origins.
    pub allowed_origins: Vec<String>,
}

/// Serve over stdin/stdout until the client closes the stream.
pub async fn stdio(state: Arc<ServerState>) -> anyhow::Result<()> {
    let service = SkillServer::new(state).serve(rmcp::transport::stdio()).await.context("MCP handshake over stdio failed")?;
    service.waiting().await.context("stdio session ended with an error")?;
    Ok(())
}

/// The HTTP router: `/mcp` (both protocol eras) and `/healthz`.
pub fn router(state: Arc<ServerState>, options: &HttpOptions, shutdown: CancellationToken) -> Router {
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into(), "[::1]".into()];
    hosts.extend(options.allowed_hosts.iter().cloned());
    let mut origins: Vec<String> = vec!["http://localhost:*".into(), "http://127.0.0.1:*".into(), "http://[::1]:*".into()];
    origins.extend(options.allowed_origins.iter().cloned());
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts)
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_cancellation_token(shutdown);
    let server = SkillServer::new(state);
    let service = StreamableHttpService::new(move || Ok(server.clone()), LocalSessionManager::default().into(), config);
    Router::new().nest_service("/mcp", service).route("/healthz", get(|| async { "ok" }))
}

/// Serve streamable HTTP until SIGTERM or Ctrl-C.
pub async fn http(state: Arc<ServerState>, options: HttpOptions) -> anyhow::Result<()> {
    if !options.addr.ip().is_loopback() && options.allowed_hosts.is_empty() {
        tracing::warn!(addr = %options.addr, "binding a non-loopback address: only loopback Host headers are accepted unless --allowed-host is given");
    }
    let shutdown = CancellationToken::new();
    let app = router(state, &options, shutdown.clone());
    let listener = tokio::net::TcpListener::bind(options.addr).await.with_context(|| format!("cannot listen on {}", options.addr))?;
    let local = listener.local_addr()?;
    eprintln!("skill-operator: listening on http://{local}/mcp");
    let signal = shutdown.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            signal.cancel();
        })
        .await
        .context("HTTP server failed")?;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
