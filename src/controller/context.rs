//! What every reconciler shares: the client, the event recorder, metrics,
//! the operator's configuration and the package resolver.

use std::sync::Arc;

use futures::future::BoxFuture;
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;

use super::metrics::Metrics;
use crate::api::package::OciSource;
// The artifact endpoint's operator-credential client lives with the artifacts
// (the gateway uses it too); the controller reaches it through these names.
pub use crate::artifacts::operator::{ArtifactError, ArtifactStore, HttpArtifacts, NoArtifacts};

/// A package fetched from its source: the pinned digest and the archive.
#[derive(Debug, Clone)]
pub struct FetchedPackage {
    pub digest: String,
    /// The package archive (this project's deterministic tar.gz).
    pub archive: Vec<u8>,
}

/// Where packages come from. The OCI implementation pulls from a registry;
/// tests substitute a fixed answer.
pub trait PackageResolver: Send + Sync {
    fn fetch<'a>(&'a self, source: &'a OciSource) -> BoxFuture<'a, Result<FetchedPackage, ResolveError>>;

    /// Offers a package this controller has just pushed under `source`'s
    /// digest-pinned reference, so resolving it later needs no pull. A
    /// resolver that keeps nothing ignores it.
    fn seed(&self, _source: &OciSource, _package: FetchedPackage) {}
}

/// Why a package could not be resolved into something the controller serves.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("pulling {reference}: {source}")]
    Pull {
        reference: String,
        #[source]
        source: crate::oci::OciError,
    },
    #[error("the registry returned {got} for a reference pinned to {pinned}")]
    PinMismatch { pinned: String, got: String },
    #[error("the source now resolves to {got}, not the pinned {previous}; a new version is a new SkillPackage")]
    Moved { previous: String, got: String },
    #[error("the package cannot be unpacked: {0}")]
    Unpack(#[from] crate::core::package::PackageError),
    #[error("{0}")]
    NotServable(String),
    #[error("a temporary directory for the package: {0}")]
    TempDir(#[from] std::io::Error),
    #[error("the unpack task failed: {0}")]
    Task(String),
}

impl ResolveError {
    /// Whether trying again later may succeed (an unreachable or failing
    /// registry), as opposed to a package that is wrong as it is.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ResolveError::Pull { source: crate::oci::OciError::Unreachable { .. } | crate::oci::OciError::Registry { .. }, .. }
                | ResolveError::TempDir(_)
                | ResolveError::Task(_)
        )
    }
}

/// The operator's settings (from flags; the Helm chart sets them).
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// The image holding this binary (init and sidecar containers).
    pub operator_image: String,
    /// How run, build and probe pods pull it (`None`: pinned → IfNotPresent, tag → Always).
    pub operator_image_pull_policy: Option<String>,
    /// The artifact endpoint URL pods use for inputs and outputs.
    pub artifact_endpoint: String,
    /// The port the artifact endpoint's pods listen on (the NetworkPolicy's
    /// peer port, which is the pods', not the Service's).
    pub artifact_port: u16,
    /// The operator's namespace (for NetworkPolicy peers).
    pub operator_namespace: String,
    /// Labels selecting the operator's pods (NetworkPolicy peer).
    pub operator_pod_labels: std::collections::BTreeMap<String, String>,
    /// Label namespaces with the restricted Pod Security profile when they lack it.
    pub label_namespaces: bool,
    /// The key per-job artifact tokens are derived from.
    pub token_key: Vec<u8>,
    /// Host name -> IP entries for run pods (they have no DNS), e.g. the
    /// artifact endpoint's Service name resolved at start-up.
    pub host_aliases: std::collections::BTreeMap<String, String>,
    /// SkillJob reconciles at once (0: no limit). A backlog of a thousand
    /// would otherwise start a thousand at once, each holding its package and
    /// request buffers: a memory spike, and no faster.
    pub reconcile_concurrency: u16,
    /// Prepared run images: repository, bases, indexes, modes, build namespace.
    pub prepare: super::prepare::PrepareConfig,
    /// Reconcile only SkillPackages, SkillBindings and SkillJobs with this
    /// label selector (`key=value`): several controllers on one cluster.
    pub selector: Option<String>,
    /// The egress proxy runs reach the network through. `None`: no run is
    /// given any network (a run whose binding grants hosts fails, saying so).
    pub egress_proxy: Option<EgressProxyTarget>,
    /// Whether the CNI enforces NetworkPolicy, as the admin states it.
    pub network_policy: super::egress::NetworkPolicyEnforcement,
    /// Several replicas, one writing: the Lease they elect the leader on
    /// (`None`: this replica writes from the start).
    pub leader_election: Option<super::leader::LeaseConfig>,
    /// Warm run pods a namespace may hold across its bindings' pools, unless
    /// its `skill-operator.dev/warm-pods` annotation says otherwise.
    pub warm_budget: u32,
    /// Drop the mappings of the code only start-up ran once the caches are in sync ([`crate::memory`]).
    pub release_startup_code: bool,
    /// Seconds each watch lasts before it is renewed ([`super::api_client`]).
    pub watch_timeout: u32,
}

/// Where runs reach the egress proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressProxyTarget {
    /// `ip:port` the pods connect to (the Service's ClusterIP: pods have no DNS).
    pub address: String,
    /// The proxy pods' namespace and labels, and their port: the NetworkPolicy peer.
    pub namespace: String,
    pub pod_labels: std::collections::BTreeMap<String, String>,
    pub pod_port: u16,
    /// The proxy pods' own CiliumNetworkPolicy (`--egress-cilium-fqdn-policy`,
    /// off: `None`). Here because it selects these pods: it cannot be on
    /// without a proxy.
    pub cilium_fqdn_policy: Option<super::cilium::state::CiliumPolicyConfig>,
}

/// Where the controller pushes the packages it cuts from SkillSources.
#[derive(Debug, Clone)]
pub struct SourceTarget {
    /// `HOST[:PORT]/REPO`: a skill's package is `<repo>/<source>/<skill>:<commit>`.
    pub repository: String,
    /// Plain-HTTP registries and credentials (the built-in store's operator one).
    pub options: crate::oci::RegistryOptions,
}

impl SourceTarget {
    /// Whether the repository is reached over plain HTTP (its SkillPackages say so).
    pub fn insecure(&self) -> bool {
        crate::oci::registry_of(&self.repository).is_ok_and(|r| self.options.plain_http.contains(&r))
    }
}

/// Shared reconciler state.
#[derive(Clone)]
pub struct Context {
    /// Requests (reads and writes), each bounded by the API timeout.
    pub client: Client,
    /// Watches and their lists ([`super::api_client`]); the request client unless set.
    pub watch_client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub config: Arc<OperatorConfig>,
    pub resolver: Arc<dyn PackageResolver>,
    pub artifacts: Arc<dyn ArtifactStore>,
    /// Cached reads (bindings, packages, namespace checks).
    pub lookups: Arc<super::lookups::Lookups>,
    /// Registry work of preparation ([`super::prepare::NoImages`] unless set).
    pub images: Arc<dyn super::prepare::ImageService>,
    /// Runs whose outputs the endpoint announced as stored.
    pub stored: Arc<super::skilljob::hints::StoredHints>,
    /// The egress proxy's CiliumNetworkPolicy, last applied (when it is on).
    pub cilium: Arc<super::cilium::state::CiliumSync>,
    /// Where each SkillJob's `run.verdict` audit record goes (off unless set).
    pub audit: crate::audit::Audit,
    /// Who may read `/metrics` (open unless set: tests and benches).
    pub metrics_access: crate::metrics_access::MetricsAccess,
    /// Where the NetworkPolicy probe tries to connect (`IP:PORT`; `None`: no probe, tests and benches).
    pub network_probe_target: Option<String>,
    /// What the probe found ([`super::netpol_probe`]).
    pub network_probe: Arc<super::egress::Observed>,
    /// Where SkillSource packages are pushed (`None`: sources are fetched
    /// and reported, and say they cannot publish).
    pub sources: Option<Arc<SourceTarget>>,
    /// Whether this replica may write (every reconciler asks first).
    pub leadership: super::leader::Leadership,
    /// Packages staged per namespace, and the gate their sweep shares with runs.
    pub staged: Arc<super::staged::memory::StagedPackages>,
    /// The warm pools' use (when each binding last ran, its misses).
    pub warm: Arc<super::warm::WarmPools>,
    /// Which cached SkillJobs may be believed when they say their run has not started.
    pub start_guard: Arc<super::skilljob::start_guard::StartGuard>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        config: OperatorConfig,
        resolver: Arc<dyn PackageResolver>,
        artifacts: Arc<dyn ArtifactStore>,
    ) -> Self {
        let recorder =
            Recorder::new(client.clone(), Reporter { controller: "skill-operator".into(), instance: std::env::var("POD_NAME").ok() });
        let leadership = match config.leader_election {
            Some(_) => super::leader::Leadership::standby(),
            None => super::leader::Leadership::always(),
        };
        Context {
            leadership,
            watch_client: client.clone(),
            client,
            recorder,
            metrics,
            config: Arc::new(config),
            resolver,
            artifacts,
            lookups: Default::default(),
            images: Arc::new(super::prepare::NoImages),
            stored: Default::default(),
            cilium: Default::default(),
            audit: Default::default(),
            metrics_access: crate::metrics_access::MetricsAccess::open(),
            network_probe_target: None,
            network_probe: Arc::default(),
            sources: None,
            staged: Default::default(),
            warm: Default::default(),
            start_guard: Default::default(),
        }
    }

    /// Where SkillSource packages are pushed.
    pub fn with_sources(mut self, target: SourceTarget) -> Self {
        self.sources = Some(Arc::new(target));
        self
    }

    /// Probe whether NetworkPolicy is enforced once this replica leads,
    /// trying to reach `target` (`IP:PORT`; `None`: no probe).
    pub fn with_network_probe_opt(mut self, target: Option<String>) -> Self {
        self.network_probe_target = target;
        self
    }

    /// The `NetworkPolicyEnforced` condition of a run: the admin's statement, unless the probe found otherwise.
    pub fn network_policy_condition(&self) -> (Option<bool>, &'static str, &'static str) {
        super::egress::combined(self.config.network_policy, self.network_probe.get())
    }

    /// `/metrics` only for scrapers `access` lets in.
    pub fn with_metrics_access(mut self, access: crate::metrics_access::MetricsAccess) -> Self {
        self.metrics_access = access;
        self
    }

    /// Writes a `run.verdict` audit record for every SkillJob that ends.
    pub fn with_audit(mut self, audit: crate::audit::Audit) -> Self {
        self.audit = audit;
        self
    }

    /// The client watches go through (its own connections and timeouts).
    pub fn with_watch_client(mut self, client: Client) -> Self {
        self.watch_client = client;
        self
    }

    /// The registry work preparation uses.
    pub fn with_images(mut self, images: Arc<dyn super::prepare::ImageService>) -> Self {
        self.images = images;
        self
    }
}

/// Every way a reconcile fails. Each variant is a metrics label.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer handling failed: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("{0}")]
    Resolve(#[from] ResolveError),
    #[error("{0}")]
    InUse(String),
    #[error("artifact endpoint: {0}")]
    Artifacts(#[from] ArtifactError),
    #[error("object has no {0}")]
    Missing(&'static str),
    #[error("could not encode: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("prepared image: {0}")]
    Prepare(Box<super::prepare::PrepareError>),
    #[error("the run's NetworkPolicy cannot be built: {0}")]
    Policy(#[from] super::builders::Error),
    /// The object changed after the copy this reconcile worked from was
    /// read (a cache behind the API server): nothing was written, and the
    /// next look starts from the newer copy.
    #[error("{0} changed since this reconcile read it; nothing was written and it is looked at again")]
    Stale(String),
    /// A claimed warm pod's hand-over that cannot be made now (its key or
    /// its run's variables unreadable): looked at again.
    #[error("warm pod hand-over: {0}")]
    Warm(String),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Finalizer(_) => "finalizer",
            Error::Resolve(_) => "resolve",
            Error::Missing(_) => "missing",
            Error::InUse(_) => "in-use",
            Error::Artifacts(e) => e.metric_label(),
            Error::Encode(_) => "encode",
            Error::Prepare(_) => "prepare",
            Error::Policy(_) => "policy",
            Error::Stale(_) => "stale",
            Error::Warm(_) => "warm",
        }
    }

    /// A write refused because the reconcile's copy was old: not a
    /// failure of anything, only a reason to look again soon.
    pub fn is_stale(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        match self {
            Error::Stale(_) => true,
            Error::Finalizer(inner) => matches!(inner.as_ref(), F::ApplyFailed(e) | F::CleanupFailed(e) if e.is_stale()),
            _ => false,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The field manager of every status this operator writes.
pub const MANAGER: &str = "skill-operator";

/// Write an object's status with server-side apply under [`MANAGER`].
pub async fn apply_status<K>(api: &kube::Api<K>, name: &str, status: &impl serde::Serialize) -> Result<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(name, &kube::api::PatchParams::apply(MANAGER).force(), &kube::api::Patch::Apply(status_apply::<K>(status))).await?;
    Ok(())
}

/// The server-side apply body of a status.
fn status_apply<K: kube::Resource<DynamicType = ()>>(status: &impl serde::Serialize) -> serde_json::Value {
    serde_json::json!({ "apiVersion": K::api_version(&()), "kind": K::kind(&()), "status": status })
}

/// [`apply_status`], only if the object is still at `resource_version`:
/// the status is derived from that copy, and written over a newer one it
/// could take a finished object back (a reconcile handed a cached copy
/// that is behind the API server, after a restart or a lost watch). The
/// API server checks the precondition; a mismatch is [`Error::Stale`].
pub async fn apply_status_at<K>(
    api: &kube::Api<K>,
    name: &str,
    resource_version: &str,
    status: &impl serde::Serialize,
) -> Result<Option<String>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut patch = status_apply::<K>(status);
    patch["metadata"] = serde_json::json!({ "resourceVersion": resource_version });
    match api.patch_status(name, &kube::api::PatchParams::apply(MANAGER).force(), &kube::api::Patch::Apply(patch)).await {
        Ok(written) => Ok(written.meta().resource_version.clone()),
        // Forced applies have no field conflicts: a 409 is the precondition.
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::Stale(format!("{} {name}", K::kind(&())))),
        Err(e) => Err(e.into()),
    }
}
