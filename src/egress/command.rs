//! `skill-operator egress-proxy`: the flags and the process around
//! [`Proxy`]: key, jobs file (re-read when it changes), system resolver,
//! optional metrics endpoint, shutdown on SIGTERM or Ctrl-C.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use super::config::{self, JobLimits, Limits, ProxyConfig};
use super::registry::{MemoryRegistry, RegistryError};
use super::resolve::SystemResolver;
use super::server::{Proxy, ProxyError};

/// How often the jobs file is checked for changes.
const JOBS_POLL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Where jobs connect (HTTPS_PROXY=http://job:<token>@<this address>).
    #[arg(long, default_value = "0.0.0.0:3128", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// File holding the operator key (the controller's --token-key-file); credentials derive from it.
    #[arg(long, value_name = "FILE")]
    pub token_key_file: PathBuf,
    /// The jobs: JSON {"jobs": [{"namespace", "uid", "source", "allow", "limits"}]}, re-read when it changes.
    #[arg(long, value_name = "FILE")]
    pub jobs: Option<PathBuf>,
    /// Serve the SkillJobs the controller sealed (watches SkillJobs in every namespace; needs get/list/watch on skilljobs).
    #[arg(long, conflicts_with = "jobs")]
    pub watch_skilljobs: bool,
    /// With --watch-skilljobs: only SkillJobs with this label (`key=value`), like the controller's --selector.
    #[arg(long, value_name = "KEY=VALUE", requires = "watch_skilljobs")]
    pub skilljob_selector: Option<String>,
    /// Never dial this range (repeatable): the cluster's pod and service CIDRs.
    #[arg(long = "deny-cidr", value_name = "CIDR")]
    pub deny_cidrs: Vec<IpNet>,
    /// Dial this range although it is internal (repeatable): for tests, and for an internal host reached on purpose.
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    pub allow_cidrs: Vec<IpNet>,
    /// A CONNECT port where the stream must be TLS with SNI = the CONNECT host (repeatable).
    #[arg(long = "tls-port", value_name = "PORT", default_values_t = config::DEFAULT_TLS_PORTS.to_vec())]
    pub tls_ports: Vec<u16>,
    /// Serve GET /metrics and /healthz here.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Request head bytes before 431.
    #[arg(long, default_value_t = config::DEFAULT_MAX_HEADER_BYTES)]
    pub max_header_bytes: usize,
    /// Milliseconds for the request head to arrive.
    #[arg(long, default_value_t = config::DEFAULT_HEADER_TIMEOUT.as_millis() as u64)]
    pub header_timeout_ms: u64,
    /// Milliseconds for a name to resolve.
    #[arg(long, default_value_t = config::DEFAULT_RESOLVE_TIMEOUT.as_millis() as u64)]
    pub resolve_timeout_ms: u64,
    /// Milliseconds to connect upstream.
    #[arg(long, default_value_t = config::DEFAULT_CONNECT_TIMEOUT.as_millis() as u64)]
    pub connect_timeout_ms: u64,
    /// Milliseconds for the ClientHello after 200.
    #[arg(long, default_value_t = config::DEFAULT_CLIENT_HELLO_TIMEOUT.as_millis() as u64)]
    pub client_hello_timeout_ms: u64,
    /// Seconds without a byte before a tunnel is cut.
    #[arg(long, default_value_t = config::DEFAULT_IDLE_TIMEOUT.as_secs())]
    pub idle_timeout_secs: u64,
    /// Seconds a tunnel may last.
    #[arg(long, default_value_t = config::DEFAULT_TUNNEL_LIFETIME.as_secs())]
    pub tunnel_lifetime_secs: u64,
    /// Tunnels open at once, all jobs.
    #[arg(long, default_value_t = config::DEFAULT_MAX_TUNNELS)]
    pub max_tunnels: usize,
    /// Connections sending their head at once, all jobs.
    #[arg(long, default_value_t = config::DEFAULT_MAX_PENDING)]
    pub max_pending: usize,
    /// Connections sending their head at once from one client address.
    #[arg(long, default_value_t = config::DEFAULT_MAX_PENDING_PER_ADDRESS)]
    pub max_pending_per_address: usize,
    /// The metrics endpoint's timeouts and connection caps.
    #[command(flatten)]
    pub metrics_listener: crate::listener::ListenerArgs,
    /// Who may read /metrics.
    #[command(flatten)]
    pub metrics_access: crate::metrics_access::MetricsAccessArgs,
    /// Default tunnels per job.
    #[arg(long, default_value_t = config::DEFAULT_JOB_MAX_CONNECTIONS)]
    pub job_max_connections: u32,
    /// Default bytes up per job.
    #[arg(long, default_value_t = config::DEFAULT_JOB_MAX_BYTES_UP)]
    pub job_max_bytes_up: u64,
    /// Default bytes down per job.
    #[arg(long, default_value_t = config::DEFAULT_JOB_MAX_BYTES_DOWN)]
    pub job_max_bytes_down: u64,
    /// Copy every byte through user space instead of splice(2) (for comparison; splice falls back to this by itself where it fails).
    #[arg(long)]
    pub no_zero_copy: bool,
    /// Audit records (docs/audit.md): one per connection, to stdout and to --audit-file.
    #[command(flatten)]
    pub audit: crate::audit::AuditArgs,
}

impl ProxyArgs {
    /// The configuration these flags describe.
    pub fn config(&self, operator_key: Vec<u8>) -> ProxyConfig {
        let mut cfg = ProxyConfig::new(operator_key);
        cfg.limits = Limits {
            max_header_bytes: self.max_header_bytes,
            header_timeout: Duration::from_millis(self.header_timeout_ms),
            resolve_timeout: Duration::from_millis(self.resolve_timeout_ms),
            connect_timeout: Duration::from_millis(self.connect_timeout_ms),
            client_hello_timeout: Duration::from_millis(self.client_hello_timeout_ms),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs),
            tunnel_lifetime: Duration::from_secs(self.tunnel_lifetime_secs),
            max_tunnels: self.max_tunnels,
            max_pending: self.max_pending,
            max_pending_per_address: self.max_pending_per_address,
            job: JobLimits {
                max_connections: self.job_max_connections,
                max_bytes_up: self.job_max_bytes_up,
                max_bytes_down: self.job_max_bytes_down,
            },
            ..Limits::default()
        };
        cfg.deny_cidrs = self.deny_cidrs.clone();
        cfg.allow_cidrs = self.allow_cidrs.clone();
        cfg.tls_ports = self.tls_ports.clone();
        cfg.zero_copy = !self.no_zero_copy;
        cfg
    }
}

/// Why `egress-proxy` stopped.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot read the token key {path}: {source}")]
    Key {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Jobs(#[from] RegistryError),
    #[error(transparent)]
    Proxy(#[from] ProxyError),
    #[error("cannot listen on {addr}: {source} (is the port taken?)")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the Kubernetes API for --watch-skilljobs (in-cluster config or KUBECONFIG): {0}")]
    Kube(#[source] kube::Error),
    #[error("the proxy stopped: {0}")]
    Serve(#[source] std::io::Error),
    #[error(transparent)]
    Bounds(#[from] crate::listener::BoundsError),
    #[error(transparent)]
    Audit(#[from] crate::audit::SinkError),
    #[error("{0}")]
    MetricsAccess(String),
}

/// Run the proxy until `shutdown`. Prints `skill-operator: egress proxy on
/// <addr>` on stderr once listening (tests and the benchmark read it).
pub async fn run(args: ProxyArgs, shutdown: impl Future<Output = ()>) -> Result<(), CommandError> {
    let key = std::fs::read(&args.token_key_file)
        .map_err(|source| CommandError::Key { path: args.token_key_file.display().to_string(), source })?;
    let registry = MemoryRegistry::new();
    let mut watcher = None;
    if let Some(path) = &args.jobs {
        registry.load_file(path)?;
        watcher = Some(tokio::spawn(watch_jobs(registry.clone(), path.clone())));
    }
    let mut client = None;
    if args.watch_skilljobs {
        let made = kube::Client::try_default().await.map_err(CommandError::Kube)?;
        client = Some(made.clone());
        let client = made;
        let mut config = kube::runtime::watcher::Config::default();
        if let Some(selector) = &args.skilljob_selector {
            config = config.labels(selector);
        }
        let api = kube::Api::<crate::api::job::SkillJob>::all(client);
        watcher = Some(tokio::spawn(super::cluster::watch(api, config, registry.clone(), key.clone())));
    }
    let mut config = args.config(key);
    config.audit = args.audit.open("egress-proxy", true)?;
    let proxy = Proxy::new(config, Arc::new(registry.clone()), Arc::new(SystemResolver))?;
    let listener = crate::listener::bind(args.listen).map_err(|source| CommandError::Listen { addr: args.listen, source })?;
    let local = listener.local_addr().map_err(CommandError::Serve)?;
    let mut metrics_task = None;
    if let Some(addr) = args.metrics_listen {
        let access = crate::metrics_access::MetricsAccess::from_args(args.metrics_access, client)
            .await
            .map_err(|e| CommandError::MetricsAccess(format!("{e:#}")))?;
        let metrics_listener = crate::listener::bind(addr).map_err(|source| CommandError::Listen { addr, source })?;
        let bounds = args.metrics_listener.bounds()?;
        metrics_task = Some(tokio::spawn(serve_metrics(metrics_listener, proxy.clone(), access, bounds)));
    }
    eprintln!("skill-operator: egress proxy on {local} ({} jobs)", registry.len());
    let result = proxy.serve_tcp(listener, shutdown).await.map_err(CommandError::Serve);
    for task in [watcher, metrics_task].into_iter().flatten() {
        task.abort();
    }
    result
}

/// Re-read the jobs file when its modification time changes; a bad file
/// is reported and the previous jobs stay.
async fn watch_jobs(registry: MemoryRegistry, path: PathBuf) {
    let mtime = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let mut seen = mtime(&path);
    loop {
        tokio::time::sleep(JOBS_POLL).await;
        let now = mtime(&path);
        if now == seen {
            continue;
        }
        seen = now;
        match registry.load_file(&path) {
            Ok(n) => tracing::info!(target: "skill_operator::egress", jobs = n, "jobs file reloaded"),
            Err(e) => tracing::warn!(target: "skill_operator::egress", error = %e, "jobs file not reloaded; keeping the previous jobs"),
        }
    }
}

/// What the proxy's `/metrics` serves: its counters and its listener's.
pub fn metrics_registry(
    proxy: &crate::egress::metrics::ProxyMetrics,
    listener: &crate::listener::ListenerMetrics,
) -> prometheus_client::registry::Registry {
    let mut registry = prometheus_client::registry::Registry::with_prefix("skill_operator");
    proxy.register(&mut registry);
    crate::audit::register_metrics(&mut registry);
    listener.register(&mut registry);
    registry
}

/// `/metrics` (for the scrapers `access` lets in) and `/healthz` on the shared listener ([`crate::listener`]).
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    proxy: Proxy,
    access: crate::metrics_access::MetricsAccess,
    bounds: crate::listener::Bounds,
) {
    use axum::routing::get;
    let counters = crate::listener::ListenerMetrics::default();
    let registry = Arc::new(metrics_registry(proxy.metrics(), &counters));
    let app = axum::Router::new().route("/healthz", get(|| async { "ok" })).route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            async move {
                let mut out = String::new();
                let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
                out
            }
        })
        .route_layer(axum::middleware::from_fn_with_state(access, crate::metrics_access::guard)),
    );
    if let Err(e) = crate::listener::serve(listener, app, bounds, counters, std::future::pending()).await {
        tracing::warn!(target: "skill_operator::egress", error = %e, "metrics endpoint stopped");
    }
}
