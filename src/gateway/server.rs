//! `skill-operator gateway`: the flags, the cluster wiring of every
//! namespace ([`ClusterBackend`]: snapshots from the reflector stores and
//! the package cache, runs and the file route as SkillJobs, callers asked
//! of the API server) and the listener.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use futures::stream::BoxStream;
use hmac::{Hmac, Mac};
use kube::ResourceExt;
use rmcp::transport::streamable_http_server::StreamableHttpServerConfig;
use sha2::Sha256;

use crate::api::{SkillBinding, SkillPackage};
use crate::artifacts::operator::HttpArtifacts;
use crate::catalog::live::LiveCatalog;
use crate::core::confirm::{ConfirmMode, SignedConfirmations, TOKEN_TTL};
use crate::core::limits::{GATEWAY_NAMESPACES_MAX, GATEWAY_SESSIONS_PER_NAMESPACE};
use crate::core::owner::OwnerSeal;
use crate::mcp::snapshot::Snapshot;
use crate::mcp::state::{Authorize, Execution};
use crate::shutdown::Shutdown;

use super::auth::{AuthArgs, Authenticator};
use super::catalog::{CacheOptions, KubeSecrets, PackageCache, ServedIndex};
use super::executor::{KubeExecutor, KubeOptions, OnDisconnect};
use super::file_url::JobFiles;
use super::http::{router, Readiness};
use super::namespaces::{Backend, Namespaces, ServiceOptions};
use super::ratelimits;
use super::watch::{self, Stores};

#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// Where `/mcp/{namespace}`, the console (`/ui/`), `/healthz`, `/readyz` and `/metrics` are served.
    #[arg(long, default_value = "0.0.0.0:8090")]
    pub listen: SocketAddr,
    /// Who may read /metrics.
    #[command(flatten)]
    pub metrics_access: crate::metrics_access::MetricsAccessArgs,
    /// The artifact endpoint (inputs are staged and results read there).
    #[arg(long, value_name = "URL")]
    pub artifact_endpoint: String,
    /// The key artifact tokens derive from (the controller's); confirmation tokens are sealed with a key derived from it, so every replica accepts every replica's.
    #[arg(long, value_name = "FILE")]
    pub token_key_file: PathBuf,
    /// Host header values accepted (the gateway Service's in-cluster names); loopback names always are.
    #[arg(long = "allowed-host", value_name = "HOST")]
    pub allowed_hosts: Vec<String>,
    /// Origin values accepted (browser clients such as the Inspector); loopback origins always are.
    #[arg(long = "allowed-origin", value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Confirmation before a run: ask (preview + token, or the client asks its user), auto, refuse.
    #[arg(long, default_value = "ask", value_name = "MODE")]
    pub confirm: String,
    /// What a run does when its caller disconnects before it ends (a task client's run always keeps going).
    #[arg(long, value_enum, default_value = "cancel")]
    pub on_disconnect: OnDisconnect,
    /// Where pulled packages are unpacked (one tree per digest, shared by namespaces).
    #[arg(long, value_name = "DIR", default_value = "/var/cache/skill-operator")]
    pub cache_dir: PathBuf,
    /// Unpacked bytes the cache keeps; least recently used trees no snapshot holds go first.
    #[arg(long, value_name = "BYTES")]
    pub cache_max_bytes: Option<u64>,
    /// Registries (`host:port`) reached over plain HTTP (repeatable).
    #[arg(long = "plain-http-registry", value_name = "HOST:PORT")]
    pub plain_http_registries: Vec<String>,
    /// The namespace whose Secrets hold packages' pull secrets (the operator's); without it a package naming one is not served.
    #[arg(long, value_name = "NS")]
    pub pull_secret_namespace: Option<String>,
    /// The gateway's own namespace (drafts of job_create are kept there as ConfigMaps).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    pub namespace: String,
    /// Namespaces served at once by this replica.
    #[arg(long, default_value_t = GATEWAY_NAMESPACES_MAX)]
    pub max_namespaces: usize,
    /// MCP sessions (2025-11-25 and older) per namespace.
    #[arg(long, default_value_t = GATEWAY_SESSIONS_PER_NAMESPACE)]
    pub max_sessions: usize,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub listener: crate::listener::ListenerArgs,
    /// Tool calls and runs per principal in each namespace, per replica.
    #[command(flatten)]
    pub rate_limits: crate::mcp::ratelimit::RateLimits,
    /// Each namespace's own figures, from its annotation.
    #[command(flatten)]
    pub namespace_limits: super::ratelimits::NamespaceLimitArgs,
    /// Audit records (docs/audit.md): JSON lines to stdout and to --audit-file.
    #[command(flatten)]
    pub audit: crate::audit::AuditArgs,
}

/// The confirmation key: the token key under a label of its own, so a
/// confirmation token can never pass for an artifact token or the reverse.
fn confirmation_key(token_key: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(token_key).unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
    mac.update(b"skill-operator gateway confirmations v1");
    mac.finalize().into_bytes().to_vec()
}

/// Every namespace, wired to the cluster.
pub struct ClusterBackend {
    client: kube::Client,
    stores: std::sync::OnceLock<Stores>,
    cache: Arc<PackageCache>,
    /// Which binding each namespace's last build serves each skill from.
    served: Arc<ServedIndex>,
    artifacts: Arc<HttpArtifacts>,
    confirmations: Arc<SignedConfirmations>,
    auth: Option<Authenticator>,
    mode: ConfirmMode,
    on_disconnect: OnDisconnect,
    gateway_namespace: String,
    /// `--public-url` (empty: none), for the file route URLs messages name.
    public_base: String,
    /// The catalog of public skills, kept on the cluster's ConfigMap.
    catalog: Arc<LiveCatalog>,
    /// What proves a SkillJob is a caller's (under the token key).
    owner_seal: OwnerSeal,
}

impl ClusterBackend {
    /// The SkillJob executor of `namespace` (once the watches are running).
    fn executor(&self, namespace: &str) -> Option<Arc<KubeExecutor>> {
        let stores = self.stores.get()?;
        let mut options = KubeOptions::new(namespace, self.gateway_namespace.clone(), self.owner_seal.clone());
        options.on_disconnect = self.on_disconnect;
        options.public_base = self.public_base.clone();
        let executor = KubeExecutor::new(self.client.clone(), self.artifacts.clone(), self.served.namespace(namespace), options);
        Some(Arc::new(executor.with_index(stores.jobs.clone())))
    }
}

#[async_trait::async_trait]
impl Backend for ClusterBackend {
    async fn snapshot(&self, namespace: &str) -> Snapshot {
        // Set right after the watches start, before anything is served.
        let Some(stores) = self.stores.get() else {
            return self.served.build(namespace, &[], &BTreeMap::new(), &self.cache).await;
        };
        let bindings: Vec<SkillBinding> = stores
            .bindings
            .state()
            .iter()
            .filter(|b| b.namespace().as_deref() == Some(namespace))
            .map(|b| SkillBinding::clone(b))
            .collect();
        let packages: BTreeMap<String, SkillPackage> =
            stores.packages.state().iter().map(|p| (p.name_any(), SkillPackage::clone(p))).collect();
        self.served.build(namespace, &bindings, &packages, &self.cache).await
    }

    fn execution(&self, namespace: &str) -> Option<Execution> {
        let executor = self.executor(namespace)?;
        Some(Execution::new(executor.clone(), self.mode).with_confirmations(self.confirmations.clone(), namespace).with_tasks(executor))
    }

    fn files(&self, namespace: &str) -> Option<Arc<dyn JobFiles>> {
        Some(self.executor(namespace)?)
    }

    fn authorizer(&self, namespace: &str) -> Option<Arc<dyn Authorize>> {
        self.auth.as_ref().map(|a| a.namespace_authorizer(namespace))
    }

    fn catalog(&self) -> Option<Arc<LiveCatalog>> {
        Some(self.catalog.clone())
    }
}

/// The console's view of the cluster: the namespaces the binding
/// reflector holds, and a watch of the caller's SkillJobs.
impl super::ui::Directory for ClusterBackend {
    fn bound_namespaces(&self) -> std::collections::BTreeSet<String> {
        let Some(stores) = self.stores.get() else { return Default::default() };
        stores.bindings.state().iter().filter_map(|b| b.namespace()).collect()
    }

    fn job_changes(&self, namespace: &str, caller: &crate::mcp::executor::Caller) -> Option<BoxStream<'static, super::ui::JobChange>> {
        Some(super::ui::feed::skilljobs(self.stores.get()?.jobs.clone(), self.owner_seal.clone(), namespace, caller))
    }
}

/// `skill-operator gateway`: serve until shutdown.
pub async fn command(args: GatewayArgs, shutdown: Shutdown) -> anyhow::Result<()> {
    let token_key =
        std::fs::read(&args.token_key_file).with_context(|| format!("cannot read the token key {}", args.token_key_file.display()))?;
    anyhow::ensure!(token_key.len() >= 32, "the token key in {} is shorter than 32 bytes", args.token_key_file.display());
    let mode = ConfirmMode::parse(&args.confirm);
    if mode == ConfirmMode::Refuse && args.confirm.trim() != "refuse" {
        tracing::warn!(value = %args.confirm, "unknown --confirm value: nothing will run (refuse)");
    }
    let auth_config = args.auth.into_config().context("invalid authentication flags")?;
    let client = kube::Client::try_default().await.context("cannot reach the API server (in-cluster config or KUBECONFIG)")?;
    let metrics_access = crate::metrics_access::MetricsAccess::from_args(args.metrics_access, Some(client.clone())).await?;

    let mut cache_options = CacheOptions::new(&args.cache_dir);
    if let Some(cap) = args.cache_max_bytes {
        cache_options.cap_bytes = cap;
    }
    cache_options.plain_http = args.plain_http_registries.clone();
    // SkillPackages may name the artifact endpoint's built-in store (the chart's samples do).
    if let Some(store) = crate::artifacts::operator::store_access(&args.artifact_endpoint, &token_key) {
        if store.plain_http {
            cache_options.plain_http.push(store.registry.clone());
        }
        cache_options.credentials.push((store.registry, store.auth));
    }
    if let Some(ns) = &args.pull_secret_namespace {
        cache_options.secrets = Some(Arc::new(KubeSecrets::new(client.clone(), ns)));
    }
    let cache = Arc::new(PackageCache::new(cache_options).context("cannot set up the package cache")?);
    let public_base = auth_config.public_base.clone().unwrap_or_default();
    let audit = args.audit.open("gateway", true)?;
    let authenticator = Authenticator::new(client.clone(), auth_config);
    authenticator.set_audit(audit.clone());
    // The embedded snapshot serves until the cluster's catalog is seen.
    let catalog = Arc::new(LiveCatalog::from_snapshot().context("the embedded catalog snapshot does not load")?);
    super::catalog_watch::spawn(client.clone(), &args.namespace, catalog.clone(), shutdown.clone());
    let backend = Arc::new(ClusterBackend {
        client: client.clone(),
        stores: std::sync::OnceLock::new(),
        cache,
        served: Arc::default(),
        artifacts: Arc::new(HttpArtifacts::new(&crate::artifacts::operator::versioned_endpoint(&args.artifact_endpoint), &token_key)),
        confirmations: Arc::new(SignedConfirmations::new(&confirmation_key(&token_key), TOKEN_TTL)),
        auth: Some(authenticator.clone()),
        mode,
        on_disconnect: args.on_disconnect,
        gateway_namespace: args.namespace.clone(),
        public_base,
        catalog,
        owner_seal: OwnerSeal::new(&token_key),
    });

    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into(), "[::1]".into()];
    hosts.extend(args.allowed_hosts.iter().cloned());
    let mut origins: Vec<String> = vec!["http://localhost:*".into(), "http://127.0.0.1:*".into(), "http://[::1]:*".into()];
    origins.extend(args.allowed_origins.iter().cloned());
    let http = StreamableHttpServerConfig::default()
        .with_allowed_hosts(hosts.clone())
        .with_allowed_origins(origins)
        .enforce_origin_validation()
        .with_cancellation_token(shutdown.token());
    let (limits, limit_events) = if args.namespace_limits.namespace_rate_limits {
        let (limits, events) = ratelimits::watch(client.clone(), args.rate_limits, args.namespace_limits.rate_limits_unreadable);
        (limits, Some(events))
    } else {
        (Arc::new(ratelimits::NamespaceLimits::fixed(args.rate_limits)), None)
    };
    let refusals_audit = audit.clone();
    let options =
        ServiceOptions { http, max_sessions: args.max_sessions, max_namespaces: args.max_namespaces, rate_limits: limits.clone(), audit };
    let namespaces = Arc::new(Namespaces::new(backend.clone(), options));
    if let Some(events) = limit_events {
        let served = namespaces.clone();
        tokio::spawn(ratelimits::drive(events, limits.clone(), move |which| served.apply_rate_limits(which), shutdown.clone()));
    }
    let ready = Readiness::default();
    let stores = watch::spawn(client, namespaces.clone(), limits, ready.clone(), shutdown.clone());
    let _ = backend.stores.set(stores);

    let stats_auth = authenticator.clone();
    let counters = crate::listener::ListenerMetrics::default();
    let listener_counters = counters.clone();
    let metrics = Arc::new(move || listener_counters.render_after(&super::metrics::render(&stats_auth)));
    let gate = axum::middleware::from_fn_with_state(authenticator.clone(), super::auth::require_caller);
    let console = super::ui::Console::new(namespaces.clone(), ready.clone(), authenticator.clone(), backend.clone())
        .with_allowed_hosts(hosts.clone())
        .with_rate_limits(args.rate_limits);
    let app = router(namespaces, ready, metrics, metrics_access, gate)
        .merge(super::auth::metadata_routes(authenticator))
        .merge(super::ui::routes(console))
        // Outermost: every refusal any route (or rmcp) answers is in the trail once.
        .layer(axum::middleware::from_fn_with_state(refusals_audit, crate::audit::http::record_refusals));
    let listener = crate::listener::bind(args.listen).with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, "gateway serving /mcp/{{namespace}} and the console at /ui/");
    let bounds = args.listener.bounds()?;
    crate::listener::serve(listener, app, bounds, counters, shutdown.wait_owned()).await.context("the gateway's HTTP server failed")?;
    Ok(())
}
