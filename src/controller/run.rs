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
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, reflector, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;

use super::builders::{LABEL_MANAGED_BY, MANAGED_BY};
use super::context::{Context, Error};
use super::{binding, package, skilljob};
use crate::api::binding::SkillBinding;
use crate::api::job::SkillJob;
use crate::api::package::SkillPackage;

fn error_policy<K>(kind: &'static str) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |_obj, error, ctx| {
        tracing::warn!(kind, %error, "reconcile failed");
        ctx.metrics.failed(kind, error.metric_label());
        // A package or binding still in use is retried slowly; API errors quickly.
        match error {
            Error::InUse(_) => Action::requeue(Duration::from_secs(20)),
            _ => Action::requeue(Duration::from_secs(5)),
        }
    }
}

/// The metrics and health endpoints.
pub fn web(ctx: Arc<Context>) -> Router {
    Router::new()
        .route("/metrics", get(|State(ctx): State<Arc<Context>>| async move { ctx.metrics.render() }))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(ctx)
}

#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// Metrics and health endpoints.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// This binary's image (init and sidecar containers of every run).
    #[arg(long, value_name = "IMAGE")]
    pub operator_image: String,
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

/// `skill-operator controller`: reconcile until shutdown.
pub async fn command(args: ControllerArgs, shutdown: crate::shutdown::Shutdown) -> anyhow::Result<()> {
    use super::context::OperatorConfig;
    use super::metrics::Metrics;
    use super::resolver::{OciResolver, PinnedCache};
    use crate::artifacts::operator::HttpArtifacts;
    crate::oci::install_crypto_provider();
    let token_key =
        std::fs::read(&args.token_key_file).with_context(|| format!("cannot read the token key {}", args.token_key_file.display()))?;
    anyhow::ensure!(token_key.len() >= 32, "the token key in {} is shorter than 32 bytes", args.token_key_file.display());
    let mut labels = std::collections::BTreeMap::new();
    for pair in &args.operator_pod_labels {
        let (k, v) = pair.split_once('=').with_context(|| format!("--operator-pod-label {pair:?}: use key=value"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    let client = kube::Client::try_default().await.context("cannot reach the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let host_aliases = endpoint_aliases(&args.artifact_endpoint).await?;
    // Pods call the endpoint's versioned API.
    let artifact_endpoint = match args.artifact_endpoint.trim_end_matches('/') {
        e if e.ends_with("/v1") => e.to_string(),
        e => format!("{e}/v1"),
    };
    let artifact_port = match args.artifact_pod_port {
        Some(port) => port,
        None => endpoint_port(&artifact_endpoint)?,
    };
    let config = OperatorConfig {
        operator_image: args.operator_image,
        artifact_endpoint,
        artifact_port,
        operator_namespace: args.operator_namespace,
        operator_pod_labels: labels,
        label_namespaces: args.label_namespaces,
        token_key,
        host_aliases,
        reconcile_concurrency: args.reconcile_concurrency,
    };
    // Every SkillJob pulls its pinned package: keep up to 64 MiB of them.
    let resolver = Arc::new(PinnedCache::new(Arc::new(OciResolver { plain_http: args.plain_http_registries }), 64 << 20));
    let artifacts = Arc::new(HttpArtifacts::new(&config.artifact_endpoint, &config.token_key));
    let ctx = Arc::new(Context::new(client, Arc::new(Metrics::default()), config, resolver, artifacts));
    run(ctx, args.listen, shutdown).await
}

/// Run every controller until shutdown.
pub async fn run(ctx: Arc<Context>, listen: SocketAddr, shutdown: crate::shutdown::Shutdown) -> anyhow::Result<()> {
    let client = ctx.client.clone();
    // Fail early with an actionable message when the CRDs are not installed.
    let probe: Api<SkillPackage> = Api::all(client.clone());
    if let Err(err) = probe.list(&kube::api::ListParams::default().limit(1)).await {
        anyhow::bail!("cannot list SkillPackages ({err}): install the CRDs first (`kubectl apply -f crds/` or the Helm chart)");
    }

    let packages = Controller::new(Api::<SkillPackage>::all(client.clone()), watcher::Config::default());
    let bindings = Controller::new(Api::<SkillBinding>::all(client.clone()), watcher::Config::default());
    // SkillJob reconciles read bindings and packages from these caches.
    ctx.lookups.set_stores(bindings.store(), packages.store());
    let packages = packages
        // A binding going away may unblock a package's deletion.
        .watches(Api::<SkillBinding>::all(client.clone()), watcher::Config::default(), |b| {
            Some(ObjectRef::<SkillPackage>::new(&b.spec.package))
        })
        .graceful_shutdown_on(shutdown.wait_owned())
        .run(package::reconcile, error_policy::<SkillPackage>("SkillPackage"), ctx.clone())
        .for_each(|_| async {});

    let lookups = ctx.lookups.clone();
    let siblings = ctx.lookups.clone();
    let bindings = bindings
        // Two bindings serving one skill name refuse each other: the first
        // must hear of the second (and of its going).
        .watches(Api::<SkillBinding>::all(client.clone()), watcher::Config::default(), move |b| {
            b.namespace().map(|ns| siblings.sibling_bindings(&ns, &b.name_any())).unwrap_or_default()
        })
        // A SkillJob going away may unblock a binding's deletion. Only a
        // binding being deleted cares: waking every binding on every
        // SkillJob status change was most of the API load under a burst.
        .watches(Api::<SkillJob>::all(client.clone()), watcher::Config::default(), move |j| {
            let ns = j.namespace()?;
            lookups.binding_is_deleting(&ns, &j.spec.binding).then(|| ObjectRef::<SkillBinding>::new(&j.spec.binding).within(&ns))
        })
        .graceful_shutdown_on(shutdown.wait_owned())
        .run(binding::reconcile, error_policy::<SkillBinding>("SkillBinding"), ctx.clone())
        .for_each(|_| async {});

    // The children are watched once, by label, into stores the SkillJob
    // reconciler reads instead of asking the API server each time.
    let children = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let (job_store, job_writer) = reflector::store::<Job>();
    let (policy_store, policy_writer) = reflector::store::<NetworkPolicy>();
    ctx.lookups.set_child_stores(job_store, policy_store);
    // managedFields are most of a Job's bytes and nothing here reads them.
    let job_events =
        reflector(job_writer, watcher(Api::<Job>::all(client.clone()), children.clone()).modify(|j| j.managed_fields_mut().clear()))
            .default_backoff()
            .touched_objects();
    let policy_events =
        reflector(policy_writer, watcher(Api::<NetworkPolicy>::all(client.clone()), children).modify(|p| p.managed_fields_mut().clear()))
            .default_backoff()
            .touched_objects();
    let jobs = Controller::new(Api::<SkillJob>::all(client.clone()), watcher::Config::default())
        .with_config(kube::runtime::controller::Config::default().concurrency(ctx.config.reconcile_concurrency))
        .owns_stream(job_events)
        .owns_stream(policy_events)
        .graceful_shutdown_on(shutdown.wait_owned())
        .run(skilljob::reconcile, error_policy::<SkillJob>("SkillJob"), ctx.clone())
        .for_each(|_| async {});

    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "metrics and health endpoints up");
    let server = axum::serve(listener, web(ctx.clone())).with_graceful_shutdown(shutdown.wait_owned());
    let (_, _, _, served) = tokio::join!(packages, bindings, jobs, server);
    served?;
    Ok(())
}
