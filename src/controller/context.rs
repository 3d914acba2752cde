//! What every reconciler shares: the client, the event recorder, metrics,
//! the operator's configuration and the package resolver.

use std::sync::Arc;

use futures::future::BoxFuture;
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;

use super::metrics::Metrics;
use crate::api::package::OciSource;

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

/// Why a call to the artifact endpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("{what}: the artifact endpoint is unreachable: {detail}")]
    Unreachable { what: String, detail: String },
    #[error("{what}: the artifact endpoint answered {status}: {body}")]
    Refused { what: String, status: u16, code: Option<crate::artifacts::ErrorCode>, body: String },
    #[error("{what}: {detail}")]
    Invalid { what: String, detail: String },
    #[error("{0}: no artifact store is configured")]
    Unsupported(String),
}

impl ArtifactError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            ArtifactError::Unreachable { .. } => "artifacts-unreachable",
            ArtifactError::Refused { .. } => "artifacts-refused",
            ArtifactError::Invalid { .. } => "artifacts-invalid",
            ArtifactError::Unsupported(_) => "artifacts-unsupported",
        }
    }
}

/// The operator's settings (from flags; the Helm chart sets them).
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// The image holding this binary (init and sidecar containers).
    pub operator_image: String,
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
}

/// Shared reconciler state.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub config: Arc<OperatorConfig>,
    pub resolver: Arc<dyn PackageResolver>,
    pub artifacts: Arc<dyn ArtifactStore>,
    /// Cached reads (bindings, packages, namespace checks).
    pub lookups: Arc<super::lookups::Lookups>,
    /// Registry work of preparation ([`super::prepare::NoImages`] unless set).
    pub images: Arc<dyn super::prepare::ImageService>,
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
        Context {
            client,
            recorder,
            metrics,
            config: Arc::new(config),
            resolver,
            artifacts,
            lookups: Default::default(),
            images: Arc::new(super::prepare::NoImages),
        }
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
    let patch = serde_json::json!({ "apiVersion": K::api_version(&()), "kind": K::kind(&()), "status": status });
    api.patch_status(name, &kube::api::PatchParams::apply(MANAGER).force(), &kube::api::Patch::Apply(patch)).await?;
    Ok(())
}

/// Where a run's files live: the controller stages a job's package before
/// the Job starts and removes the job's artifacts when the SkillJob goes.
pub trait ArtifactStore: Send + Sync {
    fn stage_package<'a>(&'a self, namespace: &'a str, uid: &'a str, archive: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>>;
    fn delete<'a>(&'a self, namespace: &'a str, uid: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>>;
    /// The outputs manifest the upload sidecar stored (`None`: nothing stored).
    fn outputs<'a>(
        &'a self,
        namespace: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, ArtifactError>>;
    /// One stored output file (`result/result.json`, `work/<path>`).
    fn output_file<'a>(&'a self, namespace: &'a str, uid: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, ArtifactError>>;
    /// The input files staged for the job (empty when none were). A store
    /// that cannot hold inputs has none.
    fn staged_inputs<'a>(
        &'a self,
        _namespace: &'a str,
        _uid: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::artifacts::SetFile>, ArtifactError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// The artifact endpoint over HTTP, with the operator credential.
pub struct HttpArtifacts {
    pub base: String,
    pub bearer: String,
    pub http: reqwest::Client,
}

impl HttpArtifacts {
    pub fn new(base: &str, key: &[u8]) -> Self {
        HttpArtifacts {
            base: base.trim_end_matches('/').to_string(),
            bearer: crate::artifacts::operator_bearer(key),
            // With no proxy from the environment and no CA bundle, building cannot fail.
            http: crate::tls::reqwest_builder().no_proxy().build().unwrap_or_default(),
        }
    }

    /// GET a JSON document under the API base; `None` on 404.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str, what: &str) -> Result<Option<T>, ArtifactError> {
        let url = format!("{}/{path}", self.base);
        let response = self.http.get(url).header("Authorization", &self.bearer).send().await;
        let response = match Self::answer(response, &format!("read {what}")).await {
            Ok(r) => r,
            Err(ArtifactError::Refused { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let bytes = response.bytes().await.map_err(|e| unreachable(&format!("read {what}"), &e))?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ArtifactError::Invalid { what: format!("read {what}"), detail: format!("the manifest is not valid: {e}") })
    }

    /// A success, or the endpoint's refusal with its code and the first bytes of its answer.
    async fn answer(response: Result<reqwest::Response, reqwest::Error>, what: &str) -> Result<reqwest::Response, ArtifactError> {
        let response = response.map_err(|e| unreachable(what, &e))?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let body = response.text().await.unwrap_or_default();
        let code =
            serde_json::from_str::<crate::artifacts::ErrorBody>(&body).ok().and_then(|b| crate::artifacts::ErrorCode::parse(&b.error.code));
        Err(ArtifactError::Refused { what: what.to_string(), status, code, body: body.chars().take(300).collect() })
    }

    async fn check(response: Result<reqwest::Response, reqwest::Error>, what: &str) -> Result<(), ArtifactError> {
        match Self::answer(response, what).await {
            Ok(_) => Ok(()),
            Err(ArtifactError::Refused { status: 404, .. }) if what.starts_with("delete") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn unreachable(what: &str, e: &reqwest::Error) -> ArtifactError {
    ArtifactError::Unreachable { what: what.to_string(), detail: crate::oci::error_chain(e) }
}

impl ArtifactStore for HttpArtifacts {
    fn output_file<'a>(&'a self, namespace: &'a str, uid: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, ArtifactError>> {
        Box::pin(async move {
            let url = format!("{}/jobs/{namespace}/{uid}/outputs/{path}", self.base);
            let what = format!("read {path}");
            let response = Self::answer(self.http.get(url).header("Authorization", &self.bearer).send().await, &what).await?;
            Ok(response.bytes().await.map_err(|e| unreachable(&what, &e))?.to_vec())
        })
    }

    fn outputs<'a>(
        &'a self,
        namespace: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, ArtifactError>> {
        Box::pin(async move { self.get_json(&format!("jobs/{namespace}/{uid}/outputs"), "the outputs").await })
    }

    fn staged_inputs<'a>(
        &'a self,
        namespace: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::artifacts::SetFile>, ArtifactError>> {
        Box::pin(async move {
            // The endpoint answers an empty manifest when nothing is staged; 404 is a wrong route.
            let manifest: Option<crate::artifacts::InputsManifest> =
                self.get_json(&format!("jobs/{namespace}/{uid}/inputs"), "the staged inputs").await?;
            manifest.map(|m| m.files).ok_or_else(|| ArtifactError::Refused {
                what: "read the staged inputs".into(),
                status: 404,
                code: None,
                body: "the inputs route is missing: is the endpoint this version's?".into(),
            })
        })
    }

    fn stage_package<'a>(&'a self, namespace: &'a str, uid: &'a str, archive: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async move {
            let url = format!("{}/jobs/{namespace}/{uid}/package", self.base);
            Self::check(self.http.put(url).header("Authorization", &self.bearer).body(archive).send().await, "stage the package").await
        })
    }

    fn delete<'a>(&'a self, namespace: &'a str, uid: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async move {
            let url = format!("{}/jobs/{namespace}/{uid}", self.base);
            Self::check(self.http.delete(url).header("Authorization", &self.bearer).send().await, "delete the job's artifacts").await
        })
    }
}

/// An artifact store that keeps nothing (tests without an endpoint).
pub struct NoArtifacts;

impl ArtifactStore for NoArtifacts {
    fn output_file<'a>(&'a self, _: &'a str, _: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, ArtifactError>> {
        Box::pin(async move { Err(ArtifactError::Unsupported(format!("read {path}"))) })
    }
    fn outputs<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, ArtifactError>> {
        Box::pin(async { Ok(None) })
    }
    fn stage_package<'a>(&'a self, _: &'a str, _: &'a str, _: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Ok(()) })
    }
    fn delete<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Ok(()) })
    }
}
