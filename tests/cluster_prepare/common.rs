//! Shared by the real-cluster suite `tests/cluster_prepare.rs` and the
//! benchmark `benches/cluster_prepare.rs`: the gate (a cluster with a Ready
//! node, the registry pods pull from, the pod gateway to listen on), the
//! operator image from this build's binary, the artifact endpoint and the
//! controller as tasks of the calling process (pods reach them at the
//! gateway, as they would the chart's Service), and the small steps both
//! take (push a package, bind it, run a SkillJob to its end).
// Each of the two users takes a part.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use skill_operator::api::{SkillBinding, SkillJob, SkillJobPhase, SkillPackage};
use skill_operator::controller::context::{Context, HttpArtifacts, OperatorConfig};
use skill_operator::controller::metrics::Metrics;
use skill_operator::controller::prepare::images::RegistryImages;
use skill_operator::controller::prepare::PrepareConfig;
use skill_operator::controller::resolver::{OciResolver, PinnedCache};
use skill_operator::image::{Platform, Remote};
use skill_operator::oci::{Registry, RegistryOptions, SkillConfig};

pub(crate) const REGISTRY: &str = "127.0.0.1:5000";
/// The host as pods see it (the pod bridge's gateway).
pub(crate) const GATEWAY: &str = "10.88.0.1";
pub(crate) const TEST_LABEL: &str = "skill-operator.dev/test";

pub(crate) fn registry_options() -> RegistryOptions {
    RegistryOptions { plain_http: vec![REGISTRY.into()], ..Default::default() }
}

/// The cluster, or why the suite cannot run here.
pub(crate) async fn cluster() -> Result<Client, String> {
    if std::env::var_os("KUBECONFIG").is_none() {
        return Err("KUBECONFIG is not set".into());
    }
    let client = tokio::time::timeout(Duration::from_secs(10), Client::try_default())
        .await
        .map_err(|_| "the kubeconfig's server did not answer in 10 s".to_string())?
        .map_err(|e| format!("no client from KUBECONFIG: {e}"))?;
    tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .map_err(|_| "the API server did not answer in 10 s".to_string())?
        .map_err(|e| format!("the API server is unreachable: {e}"))?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let ready = nodes.list(&ListParams::default()).await.map_err(|e| e.to_string())?.items.iter().any(|n| {
        n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    });
    if !ready {
        return Err("no Ready node (a kubelet is needed)".into());
    }
    let v2 = reqwest::get(format!("http://{REGISTRY}/v2/")).await.map_err(|e| format!("no registry on {REGISTRY}: {e}"))?;
    if !v2.status().is_success() {
        return Err(format!("the registry on {REGISTRY} answered {}", v2.status()));
    }
    std::net::TcpListener::bind((GATEWAY, 0)).map_err(|e| format!("cannot listen on the pod gateway {GATEWAY}: {e}"))?;
    Ok(client)
}

/// Removes what the test made in the cluster, even when it panics.
pub(crate) struct Cleanup {
    pub(crate) namespaces: Vec<String>,
    pub(crate) label: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // Finalizers are the controller's; without it (a panic stopped it)
        // they are cleared so the objects can go.
        let selector = format!("{TEST_LABEL}={}", self.label);
        for kind in ["skilljobs", "skillbindings"] {
            for ns in &self.namespaces {
                let _ = Command::new("kubectl")
                    .args(["-n", ns, "patch", kind, "-l", &selector, "--type", "merge", "-p", r#"{"metadata":{"finalizers":null}}"#])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let _ = Command::new("kubectl")
            .args(["patch", "skillpackages", "-l", &selector, "--type", "merge", "-p", r#"{"metadata":{"finalizers":null}}"#])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("kubectl")
            .args(["delete", "skillpackages", "-l", &selector, "--wait=false"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        for ns in &self.namespaces {
            let _ = Command::new("kubectl")
                .args(["delete", "namespace", ns, "--wait=false"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// This build's binary, stripped (the pods copy it into a 128 MiB emptyDir),
/// as the operator image (`image self`).
pub(crate) async fn operator_image(id: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let stripped = dir.path().join("skill-operator");
    let ok = Command::new("strip").arg("-o").arg(&stripped).arg(env!("CARGO_BIN_EXE_skill-operator")).status().is_ok_and(|s| s.success());
    if !ok {
        std::fs::copy(env!("CARGO_BIN_EXE_skill-operator"), &stripped).unwrap();
    }
    let mut opts = skill_operator::image::SelfImageOptions::current().unwrap();
    opts.binary = stripped;
    let remote = Remote::new(registry_options()).unwrap();
    let composed = skill_operator::image::push_self(&remote, &format!("{REGISTRY}/{id}/skill-operator"), Some("test"), opts).await.unwrap();
    composed.reference
}

/// A skill directory: SKILL.md declaring `script` (python), plus `files`.
pub(crate) fn skill(name: &str, script: &str, files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("SKILL.md"),
        format!("---\nname: {name}\ndescription: Test skill {name}.\nmcp-host:\n  version: 1\n  run:\n    - script: {script}\n      interpreter: python\n      timeout: 60\n---\nbody\n"),
    )
    .unwrap();
    for (path, content) in files {
        let p = d.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    d
}

/// Pushes a skill directory as a package; returns its pinned reference.
pub(crate) async fn push_package(id: &str, name: &str, dir: &Path) -> String {
    let archive = skill_operator::core::package::build_from_dir(dir).unwrap();
    let config = SkillConfig::for_package(&archive, name.to_string(), "", None).unwrap();
    let registry = Registry::new(registry_options()).unwrap();
    let repo = format!("{REGISTRY}/{id}/skills/{name}");
    let digest = registry.push(&format!("{repo}:1"), &archive, &config).await.unwrap();
    format!("{repo}@{digest}")
}

pub(crate) async fn create_namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": name, "labels": { "pod-security.kubernetes.io/enforce": "restricted" } }
    }))
    .unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
}

/// The committed CRDs on the cluster (created, or replaced when they differ).
pub(crate) async fn install_crds(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (file, yaml) in skill_operator::api::crds_yaml().unwrap() {
        let mut crd: CustomResourceDefinition = serde_norway::from_str(&yaml).unwrap();
        let name = crd.metadata.name.clone().unwrap();
        match api.get_opt(&name).await.unwrap() {
            None => {
                api.create(&PostParams::default(), &crd).await.unwrap();
            }
            Some(existing) if existing.spec != crd.spec => {
                println!("replacing the cluster's {file} with this build's");
                crd.metadata.resource_version = existing.metadata.resource_version.clone();
                api.replace(&name, &PostParams::default(), &crd).await.unwrap();
            }
            Some(_) => {}
        }
        let established = await_condition(api.clone(), &name, |c: Option<&CustomResourceDefinition>| {
            c.and_then(|c| c.status.as_ref()?.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
        });
        tokio::time::timeout(Duration::from_secs(60), established).await.unwrap().unwrap();
    }
}

/// Records the last state of every object a watch delivers.
pub(crate) fn record<K>(api: Api<K>, config: watcher::Config) -> Arc<Mutex<HashMap<String, K>>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let seen: Arc<Mutex<HashMap<String, K>>> = Arc::default();
    let sink = seen.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, config));
        while let Ok(Some(event)) = events.try_next().await {
            if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = event {
                sink.lock().unwrap().insert(o.name_any(), o);
            }
        }
    });
    seen
}

pub(crate) fn condition(p: &SkillPackage, t: &str) -> Option<(String, String, String)> {
    p.status.as_ref()?.conditions.iter().find(|c| c.type_ == t).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

pub(crate) fn is(p: Option<&SkillPackage>, t: &str) -> bool {
    p.and_then(|p| condition(p, t)).is_some_and(|(s, _, _)| s == "True")
}

pub(crate) async fn wait_package(
    api: &Api<SkillPackage>,
    name: &str,
    limit: Duration,
    what: &str,
    done: fn(Option<&SkillPackage>) -> bool,
) -> SkillPackage {
    match tokio::time::timeout(limit, await_condition(api.clone(), name, done)).await {
        Ok(Ok(Some(p))) => p,
        _ => {
            let now = api.get(name).await.ok();
            panic!("{name}: {what} did not happen in {} s; status now: {:#?}", limit.as_secs(), now.and_then(|p| p.status))
        }
    }
}

pub(crate) fn final_phase(j: Option<&SkillJob>) -> bool {
    j.and_then(|j| j.status.as_ref()?.phase).is_some_and(|p| !matches!(p, SkillJobPhase::Pending | SkillJobPhase::Running))
}

pub(crate) fn package_object(name: &str, label: &str, reference: &str, runtime: serde_json::Value) -> SkillPackage {
    serde_json::from_value(json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage",
        "metadata": { "name": name, "labels": { TEST_LABEL: label } },
        "spec": { "source": { "oci": { "reference": reference, "insecure": true } }, "runtime": runtime }
    }))
    .unwrap()
}

pub(crate) async fn bind(client: &Client, ns: &str, label: &str, name: &str, package: &str) {
    let b: SkillBinding = serde_json::from_value(json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding",
        "metadata": { "name": name, "namespace": ns, "labels": { TEST_LABEL: label } },
        "spec": { "package": package }
    }))
    .unwrap();
    Api::<SkillBinding>::namespaced(client.clone(), ns).create(&PostParams::default(), &b).await.unwrap();
}

/// Creates a SkillJob and waits for its end: (the SkillJob, seconds from create to final).
pub(crate) async fn run_once(client: &Client, ns: &str, label: &str, name: &str, binding: &str, script: &str) -> (SkillJob, f64) {
    let api: Api<SkillJob> = Api::namespaced(client.clone(), ns);
    let sj: SkillJob = serde_json::from_value(json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
        "metadata": { "name": name, "namespace": ns, "labels": { TEST_LABEL: label } },
        "spec": { "binding": binding, "script": script }
    }))
    .unwrap();
    api.create(&PostParams::default(), &sj).await.unwrap();
    let start = Instant::now();
    let done = tokio::time::timeout(Duration::from_secs(400), await_condition(api.clone(), name, final_phase)).await;
    let took = start.elapsed().as_secs_f64();
    match done {
        Ok(Ok(Some(j))) => (j, took),
        _ => panic!("SkillJob {ns}/{name} did not finish in 400 s: {:#?}", api.get(name).await.ok().and_then(|j| j.status)),
    }
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The artifact endpoint and the controller, running in this process.
pub(crate) struct Stack {
    pub(crate) artifacts: Arc<HttpArtifacts>,
    pub(crate) image_volumes: Result<(), String>,
    shutdown: skill_operator::shutdown::Shutdown,
    controller: tokio::task::JoinHandle<()>,
}

impl Stack {
    /// The endpoint on the gateway, job artifacts in `REGISTRY/<id>/jobs`,
    /// prepared images in `REGISTRY/<id>/prepared`, build Jobs in the
    /// namespace `id`; the controller sees only objects labelled `TEST_LABEL=id`.
    pub(crate) async fn start(client: &Client, id: &str, operator_image: &str) -> Stack {
        let key = format!("{id}-token-key-0123456789abcdef0123456789").into_bytes();
        let shutdown = skill_operator::shutdown::Shutdown::new();
        let mut server_cfg = skill_operator::artifacts::server::ServerConfig::new(format!("{REGISTRY}/{id}/jobs"), key.clone());
        server_cfg.plain_http = true;
        // Run pods present their projected ServiceAccount tokens, as with the chart's `--pod-tokens`.
        server_cfg.pod_tokens = Some(skill_operator::artifacts::server::pod_tokens::PodTokens::new(client.clone()));
        let state = skill_operator::artifacts::server::AppState::new(server_cfg).unwrap();
        let listener = tokio::net::TcpListener::bind((GATEWAY, 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(skill_operator::artifacts::server::serve(listener, state, shutdown.wait_owned()));
        let endpoint = format!("http://{GATEWAY}:{port}/v1");

        let image_volumes =
            skill_operator::controller::run::probe_image_volumes(client, skill_operator::controller::decide::ImageVolumes::Auto).await;
        let config = OperatorConfig {
            operator_image: operator_image.to_string(),
            operator_image_pull_policy: None,
            artifact_endpoint: endpoint.clone(),
            artifact_port: port,
            operator_namespace: id.to_string(),
            operator_pod_labels: BTreeMap::from([("app.kubernetes.io/name".to_string(), "skill-operator".to_string())]),
            label_namespaces: false,
            token_key: key.clone(),
            host_aliases: BTreeMap::new(),
            reconcile_concurrency: 8,
            prepare: PrepareConfig {
                repository: Some(format!("{REGISTRY}/{id}/prepared")),
                image_volumes: image_volumes.clone(),
                build_namespace: id.to_string(),
                build_platform: Platform::linux("amd64"),
                ..Default::default()
            },
            selector: Some(format!("{TEST_LABEL}={id}")),
            egress_proxy: None,
            network_policy: Default::default(),
            leader_election: None,
            warm_budget: skill_operator::core::limits::WARM_NAMESPACE_DEFAULT_BUDGET,
            release_startup_code: false,
            watch_timeout: skill_operator::controller::api_client::DEFAULT_WATCH_TIMEOUT_SECS,
        };
        let artifacts = Arc::new(HttpArtifacts::new(&endpoint, &key));
        let resolver =
            Arc::new(PinnedCache::new(Arc::new(OciResolver { plain_http: vec![REGISTRY.into()], credentials: Vec::new() }), 64 << 20));
        let ctx = Context::new(client.clone(), Arc::new(Metrics::default()), config, resolver, artifacts.clone())
            .with_images(Arc::new(RegistryImages::new(registry_options(), vec![], None)));
        let controller_shutdown = shutdown.clone();
        let controller = tokio::spawn(async move {
            if let Err(e) = skill_operator::controller::run::run(Arc::new(ctx), "127.0.0.1:0".parse().unwrap(), controller_shutdown).await {
                eprintln!("controller stopped: {e:#}");
            }
        });
        Stack { artifacts, image_volumes, shutdown, controller }
    }

    /// Deletes the labelled SkillJobs, SkillBindings and SkillPackages while
    /// the controller still runs (it removes their finalizers), then stops it.
    pub(crate) async fn stop(self, client: &Client, namespaces: &[String], id: &str) {
        let selector = format!("{TEST_LABEL}={id}");
        let lp = ListParams::default().labels(&selector);
        for ns in namespaces {
            let _ = Api::<SkillJob>::namespaced(client.clone(), ns).delete_collection(&DeleteParams::default(), &lp).await;
            let _ = Api::<SkillBinding>::namespaced(client.clone(), ns).delete_collection(&DeleteParams::default(), &lp).await;
        }
        let packages: Api<SkillPackage> = Api::all(client.clone());
        let _ = packages.delete_collection(&DeleteParams::default(), &lp).await;
        let gone = async {
            let mut events = std::pin::pin!(watcher(packages.clone(), watcher::Config::default().labels(&selector)));
            while !packages.list(&lp).await.map(|l| l.items.is_empty()).unwrap_or(true) {
                let _ = events.try_next().await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(60), gone).await;
        self.shutdown.trigger();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.controller).await;
    }
}
