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
}

/// Shared reconciler state.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub config: Arc<OperatorConfig>,
    pub resolver: Arc<dyn PackageResolver>,
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, config: OperatorConfig, resolver: Arc<dyn PackageResolver>) -> Self {
        let recorder = Recorder::new(client.clone(), Reporter { controller: "skill-operator".into(), instance: std::env::var("POD_NAME").ok() });
        Context { client, recorder, metrics, config: Arc::new(config), resolver }
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
            Error::Encode(_) => "encode",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
