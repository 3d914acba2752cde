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
    fn fetch<'a>(&'a self, source: &'a OciSource) -> BoxFuture<'a, Result<FetchedPackage, String>>;
}

/// The operator's settings (from flags; the Helm chart sets them).
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// The image holding this binary (init and sidecar containers).
    pub operator_image: String,
    /// The artifact endpoint URL pods use for inputs and outputs.
    pub artifact_endpoint: String,
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
        Context { client, recorder, metrics, config: Arc::new(config), resolver, artifacts, lookups: Default::default() }
    }
}

/// Every way a reconcile fails. Each variant is a metrics label.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer handling failed: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("could not unpack the package: {0}")]
    Unpack(String),
    #[error("{0}")]
    InUse(String),
    #[error("artifact endpoint: {0}")]
    Artifacts(String),
    #[error("object has no {0}")]
    Missing(&'static str),
    #[error("could not encode: {0}")]
    Encode(#[from] serde_json::Error),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Finalizer(_) => "finalizer",
            Error::Unpack(_) => "unpack",
            Error::Missing(_) => "missing",
            Error::InUse(_) => "in-use",
            Error::Artifacts(_) => "artifacts",
            Error::Encode(_) => "encode",
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
    fn stage_package<'a>(&'a self, namespace: &'a str, uid: &'a str, archive: Vec<u8>) -> BoxFuture<'a, Result<(), String>>;
    fn delete<'a>(&'a self, namespace: &'a str, uid: &'a str) -> BoxFuture<'a, Result<(), String>>;
    /// The outputs manifest the upload sidecar stored (`None`: nothing stored).
    fn outputs<'a>(&'a self, namespace: &'a str, uid: &'a str) -> BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, String>>;
    /// One stored output file (`result/result.json`, `work/<path>`).
    fn output_file<'a>(&'a self, namespace: &'a str, uid: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, String>>;
    /// The input files staged for the job (empty when none were). A store
    /// that cannot hold inputs has none.
    fn staged_inputs<'a>(&'a self, _namespace: &'a str, _uid: &'a str) -> BoxFuture<'a, Result<Vec<crate::artifacts::SetFile>, String>> {
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
            http: reqwest::Client::new(),
        }
    }

    /// GET a JSON document under the API base; `None` on 404.
    async fn get_json<T: serde::de::DeserializeOwned>(&self, path: &str, what: &str) -> Result<Option<T>, String> {
        let url = format!("{}/{path}", self.base);
        let response = self.http.get(url).header("Authorization", &self.bearer).send().await.map_err(|e| format!("read {what}: {e}"))?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(format!("read {what}: the artifact endpoint answered {}", response.status()));
        }
        let bytes = response.bytes().await.map_err(|e| format!("read {what}: {e}"))?;
        serde_json::from_slice(&bytes).map(Some).map_err(|e| format!("the manifest of {what} is not valid: {e}"))
    }

    async fn check(response: Result<reqwest::Response, reqwest::Error>, what: &str) -> Result<(), String> {
        let response = response.map_err(|e| format!("{what}: the artifact endpoint is unreachable: {e}"))?;
        if response.status().is_success() || response.status() == reqwest::StatusCode::NOT_FOUND && what.starts_with("delete") {
            return Ok(());
        }
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        Err(format!("{what}: the artifact endpoint answered {status}: {}", body.chars().take(300).collect::<String>()))
    }
}

impl ArtifactStore for HttpArtifacts {
    fn output_file<'a>(&'a self, namespace: &'a str, uid: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, String>> {
        Box::pin(async move {
            let url = format!("{}/jobs/{namespace}/{uid}/outputs/{path}", self.base);
            let response =
                self.http.get(url).header("Authorization", &self.bearer).send().await.map_err(|e| format!("read {path}: {e}"))?;
            if !response.status().is_success() {
                return Err(format!("read {path}: the artifact endpoint answered {}", response.status()));
            }
            Ok(response.bytes().await.map_err(|e| format!("read {path}: {e}"))?.to_vec())
        })
    }

    fn outputs<'a>(&'a self, namespace: &'a str, uid: &'a str) -> BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, String>> {
        Box::pin(async move { self.get_json(&format!("jobs/{namespace}/{uid}/outputs"), "the outputs").await })
    }

    fn staged_inputs<'a>(&'a self, namespace: &'a str, uid: &'a str) -> BoxFuture<'a, Result<Vec<crate::artifacts::SetFile>, String>> {
        Box::pin(async move {
            // The endpoint answers an empty manifest when nothing is staged; 404 is a wrong route.
            let manifest: Option<crate::artifacts::InputsManifest> =
                self.get_json(&format!("jobs/{namespace}/{uid}/inputs"), "the staged inputs").await?;
            manifest.map(|m| m.files).ok_or_else(|| "read the staged inputs: the artifact endpoint answered 404 Not Found".to_string())
        })
    }

    fn stage_package<'a>(&'a self, namespace: &'a str, uid: &'a str, archive: Vec<u8>) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let url = format!("{}/jobs/{namespace}/{uid}/package", self.base);
            Self::check(self.http.put(url).header("Authorization", &self.bearer).body(archive).send().await, "stage the package").await
        })
    }

    fn delete<'a>(&'a self, namespace: &'a str, uid: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let url = format!("{}/jobs/{namespace}/{uid}", self.base);
            Self::check(self.http.delete(url).header("Authorization", &self.bearer).send().await, "delete the job's artifacts").await
        })
    }
}

/// An artifact store that keeps nothing (tests without an endpoint).
pub struct NoArtifacts;

impl ArtifactStore for NoArtifacts {
    fn output_file<'a>(&'a self, _: &'a str, _: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, String>> {
        Box::pin(async move { Err(format!("no artifact store: {path}")) })
    }
    fn outputs<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<Option<crate::artifacts::OutputManifest>, String>> {
        Box::pin(async { Ok(None) })
    }
    fn stage_package<'a>(&'a self, _: &'a str, _: &'a str, _: Vec<u8>) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    fn delete<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}
