//! Running the controllers: three kube-runtime controllers, each watching
//! its resource and the children it owns, plus a small HTTP server for
//! `/metrics`, `/healthz` and `/readyz`, all stopped by one shutdown value.
//! [`command`] is `skill-operator controller`: flags to a [`Context`], then [`run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, reflector, ObjectRef};
use kube::runtime::utils::Predicate;
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;

use super::builders::{LABEL_MANAGED_BY, MANAGED_BY};
use super::context::{Context, Error};
use super::{binding, package, skilljob, source, triggers};
use crate::api::binding::SkillBinding;
use crate::api::job::SkillJob;
use crate::api::package::SkillPackage;
use crate::api::source::SkillSource;

fn error_policy<K>(kind: &'static str) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |_obj, error, ctx| {
        if error.is_stale() {
            // Expected after a restart or a lost watch: the cache catches up within a moment.
            tracing::debug!(kind, %error, "reconcile worked from an old copy");
            ctx.metrics.failed(kind, "stale");
            return Action::requeue(Duration::from_secs(1));
        }
        tracing::warn!(kind, %error, "reconcile failed");
        ctx.metrics.failed(kind, error.metric_label());
        // A package or binding still in use is retried slowly; API errors quickly.
        match error {
            Error::InUse(_) => Action::requeue(Duration::from_secs(20)),
            _ => Action::requeue(Duration::from_secs(5)),
        }
    }
}

/// The metrics (for the scrapers `access` lets in) and health endpoints.
pub fn web(metrics: Arc<super::metrics::Metrics>, access: crate::metrics_access::MetricsAccess) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(metrics): State<Arc<super::metrics::Metrics>>| async move { metrics.render() })
                .route_layer(axum::middleware::from_fn_with_state(access, crate::metrics_access::guard)),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(metrics)
}

/// Serve [`web`] on the shared listener ([`crate::listener`]) until shutdown;
/// its counters are part of `/metrics`.
pub async fn serve_web(
    listener: tokio::net::TcpListener,
    metrics: Arc<super::metrics::Metrics>,
    access: crate::metrics_access::MetricsAccess,
    bounds: crate::listener::Bounds,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let counters = metrics.listener.clone();
    crate::listener::serve(listener, web(metrics, access), bounds, counters, shutdown).await
}

#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// Metrics and health endpoints.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// The metrics endpoint's timeouts and connection caps.
    #[command(flatten)]
    pub listener: crate::listener::ListenerArgs,
    /// Who may read /metrics.
    #[command(flatten)]
    pub metrics_access: crate::metrics_access::MetricsAccessArgs,
    /// Once leading, probe whether the CNI enforces NetworkPolicy: a pod in
    /// the operator's namespace under a deny-all policy tries to reach the
    /// artifact endpoint (its finding goes on every SkillJob's
    /// NetworkPolicyEnforced condition, over --network-policy).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub network_policy_probe: bool,
    /// This binary's image (init and sidecar containers of every run).
    #[arg(long, value_name = "IMAGE")]
    pub operator_image: String,
    /// How run pods pull --operator-image (the operator's own pods' policy; default: IfNotPresent
    /// when pinned by digest, else Always). Never: an image loaded onto the nodes is never pulled.
    #[arg(long, value_name = "POLICY", value_parser = crate::controller::builders::PULL_POLICIES)]
    pub operator_image_pull_policy: Option<String>,
    /// The artifact endpoint runs reach (pods have no DNS: an IP, or a name resolved here at start-up).
    #[arg(long, value_name = "URL")]
    pub artifact_endpoint: String,
    /// The port the artifact endpoint's pods listen on, when it is not the URL's (a Service mapping another port).
    #[arg(long, value_name = "PORT")]
    pub artifact_pod_port: Option<u16>,
    /// The operator's namespace (NetworkPolicy peer of every run).
    #[arg(long, value_name = "NS")]
    pub operator_namespace: String,
    /// Labels of the artifact endpoint pods, `key=value` (repeatable).
    #[arg(long = "operator-pod-label", value_name = "KEY=VALUE")]
    pub operator_pod_labels: Vec<String>,
    /// Label namespaces pod-security.kubernetes.io/enforce=restricted when they lack it.
    #[arg(long)]
    pub label_namespaces: bool,
    /// File holding the key per-job artifact tokens derive from.
    #[arg(long, value_name = "FILE")]
    pub token_key_file: PathBuf,
    /// Registries reached over plain HTTP (repeatable).
    #[arg(long = "plain-http-registry", value_name = "HOST:PORT")]
    pub plain_http_registries: Vec<String>,
    /// SkillJob reconciles at once (0: no limit).
    #[arg(long, default_value_t = 32)]
    pub reconcile_concurrency: u16,
    /// Once the caches are in sync, drop the mappings of the binary's code that only start-up ran
    /// (most of the idle controller's resident set; docs/benchmarks.md#code-only-start-up-ran).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub release_startup_code: bool,
    /// Warm run pods a namespace may hold across its bindings' pools (SkillBinding `spec.warm`), unless the Namespace's `skill-operator.dev/warm-pods` annotation says otherwise. 0: none.
    #[arg(long, default_value_t = crate::core::limits::WARM_NAMESPACE_DEFAULT_BUDGET)]
    pub warm_pods_per_namespace: u32,
    /// Where SkillSource packages are pushed (HOST[:PORT]/REPO). Default: `sources` in the artifact endpoint's built-in store.
    #[arg(long, value_name = "HOST/REPO")]
    pub source_repository: Option<String>,
    /// Reconcile only SkillPackages, SkillBindings and SkillJobs with this label (`key=value`):
    /// several controllers (or a test's) on one cluster.
    #[arg(long, value_name = "KEY=VALUE")]
    pub selector: Option<String>,
    #[command(flatten)]
    pub prepare: PrepareArgs,
    #[command(flatten)]
    pub egress: EgressArgs,
    /// Audit records (docs/audit.md): a `run.verdict` per SkillJob that ends, to stdout and to --audit-file.
    #[command(flatten)]
    pub audit: crate::audit::AuditArgs,
    #[command(flatten)]
    pub election: ElectionArgs,
    #[command(flatten)]
    pub api: super::api_client::ApiArgs,
}

/// Several replicas with one writing (docs/operations.md, "High availability").
#[derive(Debug, clap::Args)]
pub struct ElectionArgs {
    /// Elect one leader among the replicas on a coordination.k8s.io Lease; the others keep warm caches and stand by.
    #[arg(long)]
    pub leader_elect: bool,
    /// The Lease's name (in --operator-namespace).
    #[arg(long, value_name = "NAME", default_value = "skill-operator-controller", requires = "leader_elect")]
    pub leader_elect_lease_name: String,
    /// How long the lease must stay unchanged before a standby takes it.
    #[arg(long, value_name = "SECONDS", default_value_t = super::leader::DEFAULT_LEASE_DURATION.as_secs(), requires = "leader_elect")]
    pub leader_elect_lease_duration: u64,
    /// How long the leader goes on without renewing before it exits (less than the lease duration).
    #[arg(long, value_name = "SECONDS", default_value_t = super::leader::DEFAULT_RENEW_DEADLINE.as_secs(), requires = "leader_elect")]
    pub leader_elect_renew_deadline: u64,
    /// The pause between attempts to take or renew the lease.
    #[arg(long, value_name = "SECONDS", default_value_t = super::leader::DEFAULT_RETRY_PERIOD.as_secs(), requires = "leader_elect")]
    pub leader_elect_retry_period: u64,
}

impl ElectionArgs {
    pub fn lease(&self, namespace: &str) -> Result<Option<super::leader::LeaseConfig>, super::leader::LeaderError> {
        if !self.leader_elect {
            return Ok(None);
        }
        let config = super::leader::LeaseConfig {
            duration: Duration::from_secs(self.leader_elect_lease_duration),
            renew_deadline: Duration::from_secs(self.leader_elect_renew_deadline),
            retry_period: Duration::from_secs(self.leader_elect_retry_period),
            ..super::leader::LeaseConfig::new(namespace, &self.leader_elect_lease_name, &super::leader::identity())
        };
        config.validate()?;
        Ok(Some(config))
    }
}

/// The egress proxy runs reach allowed hosts through, and the CNI's part.
#[derive(Debug, clap::Args)]
pub struct EgressArgs {
    /// HOST:PORT of the egress proxy Service for run pods (an IP, or a name resolved here once: pods have no DNS). Without it no run gets any network.
    #[arg(long, value_name = "HOST:PORT")]
    pub egress_proxy: Option<String>,
    /// Namespace of the egress proxy pods (default: --operator-namespace).
    #[arg(long, value_name = "NS", requires = "egress_proxy")]
    pub egress_proxy_namespace: Option<String>,
    /// Labels of the egress proxy pods, `key=value` (repeatable; at least one with --egress-proxy).
    #[arg(long = "egress-proxy-pod-label", value_name = "KEY=VALUE", requires = "egress_proxy")]
    pub egress_proxy_pod_labels: Vec<String>,
    /// The port the proxy pods listen on, when it is not --egress-proxy's (a Service mapping another port).
    #[arg(long, value_name = "PORT", requires = "egress_proxy")]
    pub egress_proxy_pod_port: Option<u16>,
    /// Whether the cluster's CNI enforces NetworkPolicy; every SkillJob shows it as its NetworkPolicyEnforced condition.
    #[arg(long, value_enum, default_value = "unknown")]
    pub network_policy: super::egress::NetworkPolicyEnforcement,
    /// Also keep a CiliumNetworkPolicy on the proxy pods: toFQDNs for the union of every SkillPackage's allowed hosts, on their ports, and DNS. Needs Cilium with its DNS proxy; off by default.
    #[arg(long, requires = "egress_proxy")]
    pub egress_cilium_fqdn_policy: bool,
    /// Name of that CiliumNetworkPolicy (in the proxy's namespace).
    #[arg(long, value_name = "NAME", default_value = super::cilium::DEFAULT_NAME)]
    pub egress_cilium_policy_name: String,
    /// Namespace of the cluster DNS pods the proxy asks (the policy's DNS peer).
    #[arg(long, value_name = "NS", default_value = "kube-system")]
    pub egress_cilium_dns_namespace: String,
    /// Labels of those DNS pods, `key=value` (repeatable; default k8s-app=kube-dns).
    #[arg(long = "egress-cilium-dns-pod-label", value_name = "KEY=VALUE")]
    pub egress_cilium_dns_pod_labels: Vec<String>,
}

fn label_pairs(flag: &str, pairs: &[String]) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut labels = std::collections::BTreeMap::new();
    for pair in pairs {
        let (k, v) = pair.split_once('=').with_context(|| format!("{flag} {pair:?}: use key=value"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    Ok(labels)
}

/// The proxy as run pods reach it: an `ip:port`, resolved here once.
async fn egress_target(a: &EgressArgs, operator_namespace: &str) -> anyhow::Result<Option<super::context::EgressProxyTarget>> {
    let Some(proxy) = &a.egress_proxy else { return Ok(None) };
    let addr = tokio::net::lookup_host(proxy.as_str())
        .await
        .with_context(|| format!("--egress-proxy {proxy:?}: expected HOST:PORT that resolves here"))?
        .next()
        .with_context(|| format!("--egress-proxy {proxy:?} has no address"))?;
    let pod_labels = label_pairs("--egress-proxy-pod-label", &a.egress_proxy_pod_labels)?;
    anyhow::ensure!(!pod_labels.is_empty(), "--egress-proxy needs --egress-proxy-pod-label (the NetworkPolicy peer of runs with egress)");
    let cilium_fqdn_policy = match a.egress_cilium_fqdn_policy {
        false => None,
        true => {
            let mut config = super::cilium::CiliumPolicyConfig {
                name: a.egress_cilium_policy_name.clone(),
                dns_namespace: a.egress_cilium_dns_namespace.clone(),
                ..Default::default()
            };
            if !a.egress_cilium_dns_pod_labels.is_empty() {
                config.dns_pod_labels = label_pairs("--egress-cilium-dns-pod-label", &a.egress_cilium_dns_pod_labels)?;
            }
            Some(config)
        }
    };
    Ok(Some(super::context::EgressProxyTarget {
        address: addr.to_string(),
        namespace: a.egress_proxy_namespace.clone().unwrap_or_else(|| operator_namespace.to_string()),
        pod_labels,
        pod_port: a.egress_proxy_pod_port.unwrap_or(addr.port()),
        cilium_fqdn_policy,
    }))
}

/// Prepared run images (`runtime.prepare`).
#[derive(Debug, clap::Args)]
pub struct PrepareArgs {
    /// Repository prepared images are pushed to (HOST[:PORT]/REPO). Without it, preparation is refused.
    #[arg(long, value_name = "HOST/REPO")]
    pub image_repository: Option<String>,
    /// Docker config JSON with credentials for the image repository and the bases' registries.
    #[arg(long, value_name = "FILE")]
    pub image_registry_config: Option<PathBuf>,
    /// Base of Python packages whose profile names no image.
    #[arg(long, value_name = "IMAGE", default_value = "python:3.12-slim")]
    pub base_image_python: String,
    /// Base of Node packages whose profile names no image.
    #[arg(long, value_name = "IMAGE", default_value = "node:22-bookworm-slim")]
    pub base_image_node: String,
    /// Base of Bash packages whose profile names no image.
    #[arg(long, value_name = "IMAGE", default_value = "debian:bookworm-slim")]
    pub base_image_bash: String,
    /// pip index (PEP 503 simple) builds install from unless the profile names one; the build pod reaches this host only.
    #[arg(long, value_name = "URL")]
    pub pip_index_url: Option<String>,
    /// npm registry builds install from unless the profile names one.
    #[arg(long, value_name = "URL")]
    pub npm_registry: Option<String>,
    /// Mode of profiles that name none.
    #[arg(long, value_enum, default_value = "composed")]
    pub image_mode: crate::api::package::PrepareMode,
    /// Whether image volumes may be used: auto checks the API server's version and the nodes' runtimes at start.
    #[arg(long, value_enum, default_value = "auto")]
    pub image_volumes: super::decide::ImageVolumes,
    /// Namespace dependency build Jobs run in (default: --operator-namespace). It should enforce Pod Security restricted.
    #[arg(long, value_name = "NS")]
    pub build_namespace: Option<String>,
    /// Platform dependencies are installed for (the build nodes'), e.g. linux/amd64 (default: the controller's).
    #[arg(long, value_name = "OS/ARCH")]
    pub build_platform: Option<String>,
    /// Where layers and dependency trees are spooled (default: the temp dir); size it for the largest tree twice.
    #[arg(long, value_name = "DIR")]
    pub prepare_spool_dir: Option<PathBuf>,
}

/// Whether image volumes can be used, checked once at start (see
/// [`super::decide::image_volume_support`]).
pub async fn probe_image_volumes(client: &kube::Client, flag: super::decide::ImageVolumes) -> Result<(), String> {
    use k8s_openapi::api::core::v1::Node;
    if flag != super::decide::ImageVolumes::Auto {
        return super::decide::image_volume_support(flag, None, Ok(&[]));
    }
    let version = client.apiserver_version().await.ok().and_then(|v| {
        let num = |s: &str| s.trim_end_matches(|c: char| !c.is_ascii_digit()).parse::<u32>().ok();
        Some((num(&v.major)?, num(&v.minor)?))
    });
    let runtimes: Result<Vec<String>, String> = Api::<Node>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
        .map(|l| {
            l.items.iter().filter_map(|n| n.status.as_ref()?.node_info.as_ref().map(|i| i.container_runtime_version.clone())).collect()
        })
        .map_err(|e| e.to_string());
    super::decide::image_volume_support(flag, version, runtimes.as_deref().map_err(Clone::clone))
}

/// The preparation settings from the flags.
async fn prepare_config(
    a: &PrepareArgs,
    client: &kube::Client,
    operator_namespace: &str,
) -> anyhow::Result<(super::prepare::PrepareConfig, Vec<(String, crate::oci::Auth)>)> {
    use super::prepare::{BaseImages, PrepareConfig};
    if let Some(repo) = &a.image_repository {
        crate::image::remote::parse_ref(repo).with_context(|| format!("--image-repository {repo:?}: expected HOST[:PORT]/REPO"))?;
        anyhow::ensure!(
            !repo.contains('@') && !repo.rsplit('/').next().unwrap_or("").contains(':'),
            "--image-repository {repo:?}: give HOST/REPO without tag or digest"
        );
    }
    let build_platform = match &a.build_platform {
        Some(p) => crate::image::Platform::parse(p)?,
        None => crate::image::Platform::host(),
    };
    let image_volumes = probe_image_volumes(client, a.image_volumes).await;
    match &image_volumes {
        Ok(()) => tracing::info!("image volumes can be used"),
        Err(why) => tracing::info!(%why, "image volumes are not used"),
    }
    let mut auths = Vec::new();
    if let Some(path) = &a.image_registry_config {
        let json = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let refs = [a.image_repository.as_deref(), Some(&a.base_image_python), Some(&a.base_image_node), Some(&a.base_image_bash)];
        for r in refs.into_iter().flatten() {
            let registry = crate::oci::registry_of(r)?;
            let auth = crate::oci::Auth::from_docker_config(&json, &registry)?;
            if !matches!(auth, crate::oci::Auth::Anonymous) && !auths.iter().any(|(g, _)| g == &registry) {
                auths.push((registry, auth));
            }
        }
    }
    let config = PrepareConfig {
        repository: a.image_repository.clone(),
        bases: BaseImages { python: a.base_image_python.clone(), node: a.base_image_node.clone(), bash: a.base_image_bash.clone() },
        pip_index_url: a.pip_index_url.clone(),
        npm_registry: a.npm_registry.clone(),
        mode: a.image_mode,
        image_volumes,
        build_namespace: a.build_namespace.clone().unwrap_or_else(|| operator_namespace.to_string()),
        build_platform,
        spool_dir: a.prepare_spool_dir.clone(),
    };
    Ok((config, auths))
}

/// Run pods have no DNS: a named artifact endpoint is resolved here, once,
/// and handed to the pods as a hosts entry.
async fn endpoint_aliases(endpoint: &str) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let uri: http::Uri = endpoint.parse().with_context(|| format!("--artifact-endpoint {endpoint:?} is not a URL"))?;
    let host = uri.host().context("--artifact-endpoint has no host")?.trim_matches(['[', ']']).to_string();
    if host.parse::<std::net::IpAddr>().is_ok() {
        return Ok(Default::default());
    }
    let port = uri.port_u16().unwrap_or(80);
    let ip = tokio::net::lookup_host((host.as_str(), port))
        .await
        .with_context(|| format!("cannot resolve the artifact endpoint host {host}"))?
        .next()
        .with_context(|| format!("the artifact endpoint host {host} has no address"))?
        .ip();
    Ok([(host, ip.to_string())].into())
}

/// The port a URL names, or its scheme's.
fn endpoint_port(endpoint: &str) -> anyhow::Result<u16> {
    let uri: http::Uri = endpoint.parse().with_context(|| format!("--artifact-endpoint {endpoint:?} is not a URL"))?;
    match (uri.port_u16(), uri.scheme_str()) {
        (Some(port), _) => Ok(port),
        (None, Some("https")) => Ok(443),
        (None, Some("http")) => Ok(80),
        _ => anyhow::bail!("--artifact-endpoint {endpoint:?} names no port and no http(s) scheme"),
    }
}

/// Where the NetworkPolicy probe's pod tries to connect: the artifact
/// endpoint as run pods address it (an IP, or a name their host aliases
/// map to one), on the URL's port.
fn probe_target(config: &super::context::OperatorConfig) -> Option<String> {
    let uri: http::Uri = config.artifact_endpoint.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let ip: std::net::IpAddr = host.parse().ok().or_else(|| config.host_aliases.get(host)?.parse().ok())?;
    let port = endpoint_port(&config.artifact_endpoint).ok()?;
    Some(std::net::SocketAddr::new(ip, port).to_string())
}

/// `skill-operator controller`: reconcile until shutdown.
pub async fn command(args: ControllerArgs, shutdown: crate::shutdown::Shutdown) -> anyhow::Result<()> {
    use super::context::OperatorConfig;
    use super::metrics::Metrics;
    use super::resolver::{OciResolver, PinnedCache};
    use crate::artifacts::operator::HttpArtifacts;
    crate::tls::install_crypto_provider();
    let token_key =
        std::fs::read(&args.token_key_file).with_context(|| format!("cannot read the token key {}", args.token_key_file.display()))?;
    anyhow::ensure!(token_key.len() >= 32, "the token key in {} is shorter than 32 bytes", args.token_key_file.display());
    let mut labels = std::collections::BTreeMap::new();
    for pair in &args.operator_pod_labels {
        let (k, v) = pair.split_once('=').with_context(|| format!("--operator-pod-label {pair:?}: use key=value"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    let leader_election = args.election.lease(&args.operator_namespace)?;
    let (client, watch_client) = super::api_client::clients(&args.api).await?;
    let host_aliases = endpoint_aliases(&args.artifact_endpoint).await?;
    // Pods call the endpoint's versioned API.
    let artifact_endpoint = crate::artifacts::operator::versioned_endpoint(&args.artifact_endpoint);
    let artifact_port = match args.artifact_pod_port {
        Some(port) => port,
        None => endpoint_port(&artifact_endpoint)?,
    };
    let (prepare, auths) = prepare_config(&args.prepare, &client, &args.operator_namespace).await?;
    let egress_proxy = egress_target(&args.egress, &args.operator_namespace).await?;
    let store = crate::artifacts::operator::store_access(&args.artifact_endpoint, &token_key);
    let sources = source_target(args.source_repository.as_deref(), store.as_ref(), &args.plain_http_registries, &auths)?;
    let images = super::prepare::images::RegistryImages::new(
        crate::oci::RegistryOptions { plain_http: args.plain_http_registries.clone(), ..Default::default() },
        auths,
        prepare.spool_dir.clone(),
    );
    let config = OperatorConfig {
        operator_image: args.operator_image,
        operator_image_pull_policy: args.operator_image_pull_policy,
        artifact_endpoint,
        artifact_port,
        operator_namespace: args.operator_namespace,
        operator_pod_labels: labels,
        label_namespaces: args.label_namespaces,
        token_key,
        host_aliases,
        reconcile_concurrency: args.reconcile_concurrency,
        prepare,
        selector: args.selector,
        egress_proxy,
        network_policy: args.egress.network_policy,
        leader_election,
        warm_budget: args.warm_pods_per_namespace,
        release_startup_code: args.release_startup_code,
        watch_timeout: args.api.watch_timeout,
    };
    // Every SkillJob pulls its pinned package: keep up to 64 MiB of them.
    // SkillPackages may name the artifact endpoint's built-in store (the chart's samples do).
    let mut oci = OciResolver { plain_http: args.plain_http_registries, credentials: Vec::new() };
    if let Some(store) = store {
        if store.plain_http {
            oci.plain_http.push(store.registry.clone());
        }
        oci.credentials.push((store.registry, store.auth));
    }
    let resolver = Arc::new(PinnedCache::new(Arc::new(oci), 64 << 20));
    let artifacts = Arc::new(HttpArtifacts::new(&config.artifact_endpoint, &config.token_key));
    let audit = args.audit.open("controller", true)?;
    let access = crate::metrics_access::MetricsAccess::from_args(args.metrics_access, Some(client.clone())).await?;
    let probe_target = if args.network_policy_probe { probe_target(&config) } else { None };
    let ctx = Arc::new(
        Context::new(client, Arc::new(Metrics::default()), config, resolver, artifacts)
            .with_metrics_access(access)
            .with_network_probe_opt(probe_target)
            .with_watch_client(watch_client)
            .with_images(Arc::new(images))
            .with_audit(audit)
            .with_sources(sources),
    );
    run_bounded(ctx, args.listen, args.listener.bounds()?, shutdown).await
}

/// Where SkillSource packages go: `--source-repository`, else `sources` in
/// the artifact endpoint's built-in store, pushed with the operator
/// credential there and the image registry credentials elsewhere.
fn source_target(
    repository: Option<&str>,
    store: Option<&crate::artifacts::operator::StoreAccess>,
    plain_http: &[String],
    auths: &[(String, crate::oci::Auth)],
) -> anyhow::Result<super::context::SourceTarget> {
    let mut options = crate::oci::RegistryOptions { plain_http: plain_http.to_vec(), credentials: auths.to_vec(), ..Default::default() };
    if let Some(store) = store {
        if store.plain_http {
            options.plain_http.push(store.registry.clone());
        }
        options.credentials.insert(0, (store.registry.clone(), store.auth.clone()));
    }
    let repository = match (repository, store) {
        (Some(repo), _) => {
            crate::image::remote::parse_ref(repo).with_context(|| format!("--source-repository {repo:?}: expected HOST[:PORT]/REPO"))?;
            repo.trim_end_matches('/').to_string()
        }
        (None, Some(store)) => format!("{}/sources", store.registry),
        (None, None) => anyhow::bail!("--artifact-endpoint is not a URL with a host, so there is no default --source-repository; give one"),
    };
    Ok(super::context::SourceTarget { repository, options })
}

/// Run every controller until shutdown, the metrics endpoint under the default bounds.
pub async fn run(ctx: Arc<Context>, listen: SocketAddr, shutdown: crate::shutdown::Shutdown) -> anyhow::Result<()> {
    run_bounded(ctx, listen, crate::listener::Bounds::default(), shutdown).await
}

/// Run every controller until shutdown.
pub async fn run_bounded(
    ctx: Arc<Context>,
    listen: SocketAddr,
    bounds: crate::listener::Bounds,
    shutdown: crate::shutdown::Shutdown,
) -> anyhow::Result<()> {
    // Its own client (own connections): renewals never queue behind
    // reconcile traffic.
    let election = match &ctx.config.leader_election {
        Some(lease) => {
            let config = kube::Config::infer().await.context("leader election: cannot configure its API client")?;
            let own = kube::Client::try_from(config).context("leader election: cannot make its API client")?;
            Some(super::leader::Elector::new(own, lease.clone(), ctx.leadership.clone())?)
        }
        None => None,
    };
    run_elected(ctx, listen, bounds, shutdown, election).await
}

/// [`run_bounded`] with an explicit election (tests hand in their own client).
pub async fn run_elected(
    ctx: Arc<Context>,
    listen: SocketAddr,
    bounds: crate::listener::Bounds,
    shutdown: crate::shutdown::Shutdown,
    election: Option<super::leader::Elector>,
) -> anyhow::Result<()> {
    let client = ctx.client.clone();
    // Watches go through their own client, and are renewed every --watch-timeout ([`super::api_client`]).
    let watches = ctx.watch_client.clone();
    let renewed = watcher::Config::default().timeout(ctx.config.watch_timeout);
    // The election stops only after every controller has (their last
    // writes are still a leader's); then it releases the lease.
    let stop_election = crate::shutdown::Shutdown::new();
    let (lost_tx, lost) = tokio::sync::oneshot::channel::<super::leader::LeaderError>();
    // Aborted with this future: a controller dropped mid-run (a test's
    // "kill") must not leave its election renewing.
    let election = election.map(|elector| {
        let stop = stop_election.clone();
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            match elector.run(stop.wait_owned()).await {
                super::leader::Ended::Stopped(elector) => elector.release().await,
                super::leader::Ended::Lost(err) => {
                    let _ = lost_tx.send(err);
                }
            }
        }))
    });
    // Once this replica leads: is NetworkPolicy enforced here at all?
    let netpol_probe = {
        let (ctx, mut changes) = (ctx.clone(), ctx.leadership.changes());
        async move {
            let Some(target) = ctx.network_probe_target.clone() else { return };
            while !*changes.borrow_and_update() {
                if changes.changed().await.is_err() {
                    return;
                }
            }
            super::netpol_probe::probe(&ctx, target).await;
        }
    };
    let gauge = {
        let (metrics, mut changes) = (ctx.metrics.clone(), ctx.leadership.changes());
        async move {
            loop {
                metrics.leading.set(i64::from(*changes.borrow_and_update()));
                if changes.changed().await.is_err() {
                    break;
                }
            }
        }
    };
    let gauge = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(gauge));
    // Fail early with an actionable message when the CRDs are not installed.
    let probe: Api<SkillPackage> = Api::all(client.clone());
    if let Err(err) = probe.list(&kube::api::ListParams::default().limit(1)).await {
        anyhow::bail!("cannot list SkillPackages ({err}): install the CRDs first (`kubectl apply -f crds/` or the Helm chart)");
    }

    // With --selector, only the labelled objects are ours (children are
    // found by the managed-by label and their owners, as always).
    let ours = || match &ctx.config.selector {
        Some(s) => renewed.clone().labels(s),
        None => renewed.clone(),
    };
    // Each watch backs off by itself (see `triggers`), before any filter.
    let (package_store, package_writer) = reflector::store::<SkillPackage>();
    let package_events =
        reflector(package_writer, watcher(Api::<SkillPackage>::all(watches.clone()), ours())).default_backoff().applied_objects();
    let packages = triggers::controller(package_events, package_store);
    let (binding_store, binding_writer) = reflector::store::<SkillBinding>();
    let binding_events =
        reflector(binding_writer, watcher(Api::<SkillBinding>::all(watches.clone()), ours())).default_backoff().applied_objects();
    let bindings = triggers::controller(binding_events, binding_store);
    // SkillJob reconciles read bindings and packages from these caches.
    ctx.lookups.set_stores(bindings.store(), packages.store());
    let build_ns = ctx.config.prepare.build_namespace.clone();
    let packages = packages
        // A binding going away may unblock a package's deletion.
        .watches_stream(triggers::touched(Api::<SkillBinding>::all(watches.clone()), ours()), |b| {
            Some(ObjectRef::<SkillPackage>::new(&b.spec.package))
        })
        // A build Job's progress moves its package's preparation on.
        .watches_stream(
            triggers::touched(
                Api::<Job>::namespaced(watches.clone(), &build_ns),
                renewed.clone().labels(super::builders::build_job::LABEL_BUILD),
            ),
            |j| {
                j.owner_references()
                    .iter()
                    .find(|o| o.kind == "SkillPackage" && o.controller == Some(true))
                    .map(|o| ObjectRef::<SkillPackage>::new(&o.name))
            },
        )
        .graceful_shutdown_on(shutdown.wait_owned())
        .run(package::reconcile, error_policy::<SkillPackage>("SkillPackage"), ctx.clone())
        .for_each(|_| async {});

    let lookups = ctx.lookups.clone();
    let siblings = ctx.lookups.clone();
    let of_package = ctx.lookups.clone();
    let bindings = bindings
        // Two bindings serving one skill name refuse each other: the first
        // must hear of the second (and of its going).
        .watches_stream(triggers::touched(Api::<SkillBinding>::all(watches.clone()), ours()), move |b| {
            b.namespace().map(|ns| siblings.sibling_bindings(&ns, &b.name_any())).unwrap_or_default()
        })
        // A package's readiness is its bindings' (a prepared image arriving, a failed one).
        .watches_stream(triggers::touched(Api::<SkillPackage>::all(watches.clone()), ours()), move |p| {
            of_package.bindings_of_package(&p.name_any())
        })
        // A SkillJob going away may unblock a binding's deletion. Only a
        // binding being deleted cares: waking every binding on every
        // SkillJob status change was most of the API load under a burst.
        .watches_stream(triggers::touched(Api::<SkillJob>::all(watches.clone()), ours()), move |j| {
            let ns = j.namespace()?;
            lookups.binding_is_deleting(&ns, &j.spec.binding).then(|| ObjectRef::<SkillBinding>::new(&j.spec.binding).within(&ns))
        })
        .graceful_shutdown_on(shutdown.wait_owned())
        .run(binding::reconcile, error_policy::<SkillBinding>("SkillBinding"), ctx.clone())
        .for_each(|_| async {});

    // The children are watched once, by label, into stores the SkillJob
    // reconciler reads instead of asking the API server each time.
    let children = renewed.clone().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}")).page_size(CHILD_LIST_PAGE);
    let (job_store, job_writer) = reflector::store::<Job>();
    let (policy_store, policy_writer) = reflector::store::<NetworkPolicy>();
    ctx.lookups.set_child_stores(job_store.clone(), policy_store);
    let job_events = reflector(job_writer, watcher(Api::<Job>::all(watches.clone()), children.clone()).modify(slim_job))
        .default_backoff()
        .touched_objects();
    let policy_events = reflector(
        policy_writer,
        watcher(Api::<NetworkPolicy>::all(watches.clone()), children.clone()).modify(|p| p.managed_fields_mut().clear()),
    )
    .default_backoff()
    .touched_objects();
    // Pods of runs: their events wake the SkillJob (through the owning Job
    // in the cache: pod labels are the creator's to write), so without an
    // announced result the verdict follows the run container's end instead
    // of the Job's completion, and a run with egress records its address
    // before the script starts.
    let (pod_store, pod_writer) = reflector::store::<Pod>();
    ctx.lookups.set_pod_store(pod_store.clone());
    let run_pods =
        reflector(pod_writer, watcher(Api::<Pod>::all(watches.clone()), children).modify(slim_pod)).default_backoff().touched_objects();
    // The namespaces' run policies are shared by every run there: one changed
    // or deleted by someone is put back at once.
    let repairs = {
        let ctx = ctx.clone();
        policy_events.take_until(shutdown.wait_owned()).for_each(move |event| {
            let ctx = ctx.clone();
            async move {
                if let Ok(policy) = event {
                    skilljob::repair_run_policies(&ctx, &policy).await;
                }
            }
        })
    };
    // Staged packages no run names any more, swept by the leader.
    let sweeps = super::staged::sweep_every(ctx.clone(), shutdown.wait_owned());
    // Warm run pods, kept by the leader; namespaces' metadata for their
    // budgets (a change wakes the pools).
    // As Controller::new makes it, with the cache holding no managedFields:
    // with 10,000 retained SkillJobs the controller held 147.5 MiB with them, 97.9 without.
    let (skilljob_store, skilljob_writer) = reflector::store::<SkillJob>();
    let (namespace_store, namespace_writer) = reflector::store();
    ctx.lookups.set_namespace_store(namespace_store);
    let namespace_events = reflector(
        namespace_writer,
        watcher(Api::<kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>>::all(watches.clone()), renewed.clone()),
    )
    .default_backoff()
    .touched_objects();
    // A namespace being deleted lets go of its deleted SkillJobs whose names
    // are held for their tokens (nothing can be made there again): woken
    // from this watch, after the cache above has the deletion.
    let (held_tx, held_rx) = futures::channel::mpsc::unbounded();
    let pools = {
        let (waker, held) = (ctx.clone(), skilljob_store.clone());
        let woken = namespace_events.take_until(shutdown.wait_owned()).for_each(move |ns| {
            waker.warm.wake();
            if let Ok(ns) = ns {
                for sj in skilljob::held_in(&ns, &held) {
                    let _ = held_tx.unbounded_send(sj);
                }
            }
            std::future::ready(())
        });
        futures::future::join(woken, super::warm::pool::maintain_every(ctx.clone(), shutdown.wait_owned()))
    };
    let owners = ctx.lookups.clone();
    let skilljob_events = reflector(
        skilljob_writer,
        watcher(Api::<SkillJob>::all(watches.clone()), ours()).modify(|sj| {
            sj.managed_fields_mut().clear();
        }),
    )
    .default_backoff()
    .applied_objects();
    let startup_over = {
        let (skilljobs, jobs, pods) = (skilljob_store.clone(), job_store, pod_store);
        let enabled = ctx.config.release_startup_code;
        async move {
            if !enabled {
                return;
            }
            // Start-up is over when the biggest caches have their first lists.
            if skilljobs.wait_until_ready().await.is_err()
                || jobs.wait_until_ready().await.is_err()
                || pods.wait_until_ready().await.is_err()
            {
                return;
            }
            match crate::memory::release_startup_code() {
                Ok(released) => tracing::info!(
                    mappings = released.mappings,
                    resident_bytes = released.resident_bytes,
                    "released the mappings of start-up code"
                ),
                Err(error) => tracing::warn!(%error, "could not release the mappings of start-up code; the controller runs on as it is"),
            }
        }
    };
    let jobs = triggers::controller(skilljob_events, skilljob_store)
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.config.reconcile_concurrency))
        .owns_stream(job_events)
        .reconcile_on(held_rx)
        .watches_stream(run_pods, move |pod: Pod| {
            let ns = pod.namespace()?;
            // A claimed warm pod: its SkillJob owns it (the claim's patch says so).
            if let Some(owner) = pod.owner_references().iter().find(|o| o.kind == "SkillJob" && o.controller == Some(true)) {
                return Some(ObjectRef::<SkillJob>::new(&owner.name).within(&ns));
            }
            let job = pod.owner_references().iter().find(|o| o.kind == "Job" && o.controller == Some(true))?.name.clone();
            let job = owners.cached_job(&ns, &job)?;
            let owner = job.owner_references().iter().find(|o| o.kind == "SkillJob" && o.controller == Some(true))?.name.clone();
            Some(ObjectRef::<SkillJob>::new(&owner).within(&ns))
        })
        // A run's stored result decides it before its pod's end is reported.
        .reconcile_on(skilljob::follow_stored(ctx.clone()))
        .graceful_shutdown_on(shutdown.wait_owned())
        .run(skilljob::reconcile, error_policy::<SkillJob>("SkillJob"), ctx.clone())
        .for_each(|_| async {});

    // The proxy's CiliumNetworkPolicy once at start, packages or not (with
    // none it allows DNS only), so a cluster without the resource says so now.
    let cilium = {
        let ctx = ctx.clone();
        let stop = shutdown.wait_owned();
        async move {
            tokio::select! {
                _ = async { ctx.leadership.until_leading().await; super::cilium::sync(&ctx, None).await } => {}
                _ = stop => {}
            }
        }
    };

    // SkillSources, where their CRD is installed (a cluster upgraded from a
    // release without it keeps working, and says so).
    let sources = {
        let installed = Api::<SkillSource>::all(client.clone()).list(&kube::api::ListParams::default().limit(1)).await.is_ok();
        let api = Api::<SkillSource>::all(watches.clone());
        let ctx = ctx.clone();
        let stop = shutdown.wait_owned();
        let selector = ours();
        async move {
            if !installed {
                tracing::warn!("SkillSources cannot be listed (is the CRD installed?); sources are not reconciled");
                return;
            }
            // Woken by its spec and its annotations (refresh, approve), not
            // by its own status writes: a fetch that fails the same way each
            // time must not loop on the status it wrote.
            let (reader, writer) = reflector::store::<SkillSource>();
            let wanted = |s: &SkillSource| kube::runtime::predicates::generation(s);
            let events = reflector(writer, watcher(api, selector))
                .default_backoff()
                .applied_objects()
                .predicate_filter(wanted.combine(|s: &SkillSource| kube::runtime::predicates::annotations(s)), Default::default());
            triggers::controller(events, reader)
                .graceful_shutdown_on(stop)
                .run(source::reconcile, error_policy::<SkillSource>("SkillSource"), ctx)
                .for_each(|_| async {})
                .await
        }
    };

    let listener = crate::listener::bind(listen)?;
    tracing::info!(%listen, "metrics and health endpoints up");
    let server = serve_web(listener, ctx.metrics.clone(), ctx.metrics_access.clone(), bounds, shutdown.wait_owned());
    // Each on the heap: together they were one future too large for a
    // worker thread's stack in a debug build.
    let (packages, bindings, jobs, sources) = (Box::pin(packages), Box::pin(bindings), Box::pin(jobs), Box::pin(sources));
    let (repairs, sweeps, pools, cilium) = (Box::pin(repairs), Box::pin(sweeps), Box::pin(pools), Box::pin(cilium));
    let (startup_over, server, netpol_probe) = (Box::pin(startup_over), Box::pin(server), Box::pin(netpol_probe));
    let everything =
        async { tokio::join!(packages, bindings, jobs, repairs, sweeps, pools, cilium, sources, startup_over, server, netpol_probe) };
    // Only a lost lease sends: with no election, or a stopped one, this waits forever.
    let lost = async {
        match lost.await {
            Ok(err) => err,
            Err(_) => std::future::pending().await,
        }
    };
    let served = tokio::select! {
        (_, _, _, _, _, _, _, _, _, served, _) = everything => served,
        err = lost => {
            // Dropping the controllers cancels every reconcile in flight;
            // the caller exits (the pod restarts as a standby).
            tracing::error!(error = %err, "stopping at once");
            return Err(err.into());
        }
    };
    stop_election.trigger();
    if let Some(election) = election {
        let _ = election.await;
    }
    drop(gauge);
    served?;
    Ok(())
}

/// How many Jobs or pods one list request of their caches asks for. A page
/// is held whole, as the API server sent it, until each object in it is
/// slimmed for the cache ([`slim_job`], [`slim_pod`]): at client-go's 500 a
/// page of full Jobs (pod template, managedFields) was the controller's heap
/// peak when it started on a backlog.
pub const CHILD_LIST_PAGE: u32 = 100;

/// What the Job cache keeps: metadata and status, which is all the
/// reconcilers read from it (owner, name, start, conditions). The pod
/// template and managedFields were most of a cached Job's memory (a
/// heap profile of the 1,000-SkillJob backlog: Job clones into the store
/// were its largest consumer); a reconciler that needs a Job's spec reads
/// it from the API server.
pub(crate) fn slim_job(job: &mut Job) {
    job.managed_fields_mut().clear();
    if let Some(spec) = job.spec.as_mut() {
        spec.template = Default::default();
    }
}

/// What the run pod cache keeps: metadata and status (container states,
/// the pod IP, the phase), which is all the reconcilers read from it.
pub(crate) fn slim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    pod.spec = None;
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn cached_jobs_and_pods_keep_what_reconcilers_read_and_drop_their_specs() {
        let mut job: Job = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "skilljob-1", "namespace": "team", "uid": "u", "labels": { "a": "b" },
                          "ownerReferences": [{ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob", "name": "report", "uid": "s", "controller": true }],
                          "managedFields": [{ "manager": "x", "operation": "Update" }] },
            "spec": { "backoffLimit": 0, "template": { "metadata": { "labels": { "a": "b" } }, "spec": { "containers": [{ "name": "run", "image": "i" }] } } },
            "status": { "startTime": "2026-01-01T00:00:00Z", "succeeded": 1 }
        }))
        .unwrap();
        let before = job.clone();
        slim_job(&mut job);
        assert_eq!(job.metadata.owner_references, before.metadata.owner_references);
        assert_eq!((job.metadata.uid.as_deref(), job.metadata.labels.as_ref()), (Some("u"), before.metadata.labels.as_ref()));
        assert_eq!(job.status, before.status);
        assert!(job.metadata.managed_fields.as_ref().is_none_or(|m| m.is_empty()));
        let spec = job.spec.unwrap();
        assert!(spec.template.spec.is_none() && spec.template.metadata.is_none(), "the pod template stayed in the cache");
        assert_eq!(spec.backoff_limit, Some(0));

        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p", "ownerReferences": [{ "apiVersion": "batch/v1", "kind": "Job", "name": "skilljob-1", "uid": "u", "controller": true }] },
            "spec": { "containers": [{ "name": "run", "image": "i" }] },
            "status": { "phase": "Running", "podIP": "10.0.0.7", "containerStatuses": [{ "name": "run", "image": "i", "imageID": "", "ready": true, "restartCount": 0 }] }
        }))
        .unwrap();
        let before = pod.clone();
        slim_pod(&mut pod);
        assert!(pod.spec.is_none());
        assert_eq!((pod.status, pod.metadata.owner_references), (before.status, before.metadata.owner_references));
    }

    #[derive(Parser)]
    struct Flags {
        #[arg(long, default_value = "skill-system")]
        operator_namespace: String,
        #[command(flatten)]
        egress: EgressArgs,
    }

    async fn target(args: &[&str]) -> anyhow::Result<Option<super::super::context::EgressProxyTarget>> {
        let flags = Flags::try_parse_from(std::iter::once("controller").chain(args.iter().copied()))?;
        egress_target(&flags.egress, &flags.operator_namespace).await
    }

    const PROXY: [&str; 2] = ["--egress-proxy=10.0.0.60:3128", "--egress-proxy-pod-label=app=proxy"];

    #[tokio::test]
    async fn the_cilium_policy_is_off_unless_asked_and_needs_the_proxy() {
        let off = target(&PROXY).await.unwrap().unwrap();
        assert_eq!(off.cilium_fqdn_policy, None, "off by default");

        let err = target(&["--egress-cilium-fqdn-policy"]).await.unwrap_err();
        assert!(err.to_string().contains("--egress-proxy"), "{err}");

        let on = target(&[PROXY[0], PROXY[1], "--egress-cilium-fqdn-policy"]).await.unwrap().unwrap();
        assert_eq!(on.cilium_fqdn_policy, Some(super::super::cilium::CiliumPolicyConfig::default()));

        let named = target(&[
            PROXY[0],
            PROXY[1],
            "--egress-cilium-fqdn-policy",
            "--egress-cilium-policy-name=rel-egress-proxy",
            "--egress-cilium-dns-namespace=dns",
            "--egress-cilium-dns-pod-label=app=coredns",
        ])
        .await
        .unwrap()
        .unwrap();
        let config = named.cilium_fqdn_policy.unwrap();
        assert_eq!(
            (config.name.as_str(), config.dns_namespace.as_str(), config.dns_pod_labels),
            ("rel-egress-proxy", "dns", std::collections::BTreeMap::from([("app".to_string(), "coredns".to_string())]))
        );
    }
}
