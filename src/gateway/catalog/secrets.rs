//! Registry credentials for a SkillPackage's `pullSecret`: a
//! `kubernetes.io/dockerconfigjson` (or old `dockercfg`) Secret in the
//! operator's namespace, read when a package is pulled and never kept.

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

/// Where pull secrets come from: the API server in the gateway, a fixed
/// map in tests of the cache against a registry with authentication.
pub trait PullSecrets: Send + Sync {
    /// The docker config JSON of Secret `name` (`.dockerconfigjson` or `.dockercfg`).
    fn docker_config<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<u8>, String>>;
}

/// Secrets read from one namespace (the operator's) through the API server.
pub struct KubeSecrets {
    api: Api<Secret>,
    namespace: String,
}

impl KubeSecrets {
    pub fn new(client: kube::Client, namespace: &str) -> Self {
        KubeSecrets { api: Api::namespaced(client, namespace), namespace: namespace.to_string() }
    }
}

impl PullSecrets for KubeSecrets {
    fn docker_config<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<u8>, String>> {
        Box::pin(async move {
            let secret = self.api.get(name).await.map_err(|e| format!("cannot read Secret {}/{name}: {e}", self.namespace))?;
            docker_config_of(&secret).ok_or_else(|| {
                format!(
                    "Secret {}/{name} has no .dockerconfigjson or .dockercfg key; create it with `kubectl create secret docker-registry`",
                    self.namespace
                )
            })
        })
    }
}

/// The docker config held by a docker-registry Secret.
pub fn docker_config_of(secret: &Secret) -> Option<Vec<u8>> {
    let data = secret.data.as_ref()?;
    data.get(".dockerconfigjson").or_else(|| data.get(".dockercfg")).map(|b| b.0.clone())
}

/// Fixed secrets by name (tests, or a gateway given credentials some other way).
#[derive(Default)]
pub struct StaticSecrets(pub std::collections::BTreeMap<String, Vec<u8>>);

impl PullSecrets for StaticSecrets {
    fn docker_config<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<u8>, String>> {
        Box::pin(async move { self.0.get(name).cloned().ok_or_else(|| format!("no pull secret named `{name}`")) })
    }
}
