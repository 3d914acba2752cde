//! Starting etcd and kube-apiserver from `KUBEBUILDER_ASSETS` (envtest-style).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use serde_json::json;

use skill_operator::api::{SkillBinding, SkillPackage};
use skill_operator::controller::context::{Context, FetchedPackage, OperatorConfig, PackageResolver};
use skill_operator::controller::metrics::Metrics;

pub(crate) fn assets() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("KUBEBUILDER_ASSETS")?);
    (dir.join("etcd").is_file() && dir.join("kube-apiserver").is_file()).then_some(dir)
}

/// Starts tried when a picked port was taken in the meantime.
const PORT_ATTEMPTS: usize = 3;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub(crate) struct Envtest {
    etcd: Child,
    apiserver: Child,
    /// How kube-apiserver was started, to start it again ([`Envtest::restart_apiserver`]).
    apiserver_command: (PathBuf, Vec<String>),
    _dir: tempfile::TempDir,
    pub client: Client,
    /// Admin kubeconfig, for processes started beside the test (a controller binary).
    #[allow(dead_code)]
    pub kubeconfig: PathBuf,
}

impl Drop for Envtest {
    fn drop(&mut self) {
        let _ = self.apiserver.kill();
        let _ = self.etcd.kill();
        let _ = self.apiserver.wait();
        let _ = self.etcd.wait();
    }
}

impl Envtest {
    // The children are killed and reaped by `Drop` once stored; a panic in
    // between (a failed openssl step) leaves them to the test process's end.
    #[allow(clippy::zombie_processes)]
    pub(crate) async fn start(assets: &Path) -> Envtest {
        // The ports are picked free and then handed over, so another test's
        // process can take one in between: such a start is tried again on
        // new ports.
        for _ in 0..PORT_ATTEMPTS - 1 {
            if let Some(envtest) = Envtest::try_start(assets).await {
                return envtest;
            }
        }
        Envtest::try_start(assets).await.expect("etcd or kube-apiserver exited at start every time (a port taken in between each time?)")
    }

    /// None when a port was taken before etcd or kube-apiserver bound it.
    #[allow(clippy::zombie_processes)]
    async fn try_start(assets: &Path) -> Option<Envtest> {
        let dir = tempfile::tempdir().unwrap();
        let (client_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let etcd = Command::new(assets.join("etcd"))
            .args(["--data-dir", dir.path().join("etcd").to_str().unwrap()])
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client_port}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client_port}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer_port}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer_port}")])
            .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer_port}")])
            .arg("--unsafe-no-fsync")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd");
        let key = dir.path().join("sa.key");
        let public = dir.path().join("sa.pub");
        assert!(Command::new("openssl").args(["genrsa", "-out"]).arg(&key).arg("2048").status().unwrap().success());
        assert!(Command::new("openssl").args(["rsa", "-in"]).arg(&key).args(["-pubout", "-out"]).arg(&public).status().unwrap().success());
        let token = "envtest-admin-token";
        std::fs::write(dir.path().join("tokens.csv"), format!("{token},admin,admin,system:masters\n")).unwrap();
        let extra: Vec<String> =
            std::env::var("ENVTEST_APISERVER_FLAGS").unwrap_or_default().split_whitespace().map(String::from).collect();
        let args: Vec<String> = [
            vec![format!("--etcd-servers=http://127.0.0.1:{client_port}")],
            vec![format!("--cert-dir={}", dir.path().join("certs").display())],
            vec![format!("--secure-port={api_port}"), "--bind-address=127.0.0.1".into()],
            vec!["--service-account-issuer=https://kubernetes.default.svc".into()],
            vec![format!("--service-account-key-file={}", public.display())],
            vec![format!("--service-account-signing-key-file={}", key.display())],
            vec![format!("--token-auth-file={}", dir.path().join("tokens.csv").display())],
            vec!["--authorization-mode=RBAC".into(), "--service-cluster-ip-range=10.0.0.0/24".into(), "--allow-privileged=false".into()],
            extra,
        ]
        .concat();
        let apiserver_command = (assets.join("kube-apiserver"), args);
        let apiserver = spawn_apiserver(&apiserver_command, &dir.path().join("apiserver.log"));
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: envtest\n  cluster:\n    server: https://127.0.0.1:{api_port}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: envtest\n  context:\n    cluster: envtest\n    user: admin\ncurrent-context: envtest\n"
        );
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, kubeconfig).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(&path).unwrap(), &KubeConfigOptions::default()).await.unwrap();
        let client = Client::try_from(config).unwrap();
        let mut envtest = Envtest { etcd, apiserver, apiserver_command, _dir: dir, client, kubeconfig: path };
        for _ in 0..120 {
            if envtest.client.apiserver_version().await.is_ok() {
                return Some(envtest);
            }
            // etcd logs nowhere; at start it exits only when it cannot bind.
            let etcd_gone = envtest.etcd.try_wait().ok().flatten().is_some();
            let port_taken = || {
                std::fs::read_to_string(envtest._dir.path().join("apiserver.log")).is_ok_and(|log| log.contains("address already in use"))
            };
            if etcd_gone || (envtest.apiserver.try_wait().ok().flatten().is_some() && port_taken()) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let log = std::fs::read_to_string(envtest._dir.path().join("apiserver.log")).unwrap_or_default();
        panic!(
            "kube-apiserver did not become ready in 60 s; last log lines:\n{}",
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
    }
}

impl Envtest {
    /// SIGKILLs kube-apiserver, leaves it down for `down`, and starts it
    /// again on the same port and etcd; returns once it answers.
    #[allow(dead_code, clippy::zombie_processes)]
    pub(crate) async fn restart_apiserver(&mut self, down: Duration) {
        let _ = self.apiserver.kill();
        let _ = self.apiserver.wait();
        tokio::time::sleep(down).await;
        self.apiserver = spawn_apiserver(&self.apiserver_command, &self._dir.path().join("apiserver.log"));
        for _ in 0..120 {
            if self.client.apiserver_version().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("kube-apiserver did not answer within 60 s of its restart");
    }
}

fn spawn_apiserver((program, args): &(PathBuf, Vec<String>), log: &Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
    Command::new(program).args(args).stdout(Stdio::null()).stderr(log).spawn().expect("start kube-apiserver")
}

/// Create the committed CRDs and wait until they are served.
#[allow(dead_code)] // not every suite needs the CRDs
pub(crate) async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let crd: CustomResourceDefinition = serde_norway::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            api.create(&PostParams::default(), &crd).await.unwrap();
        }
    }
    wait_for(
        || async {
            let list = api.list(&Default::default()).await.ok()?;
            let established = list
                .items
                .iter()
                .filter(|c| {
                    c.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
                })
                .count();
            (established >= 3).then_some(())
        },
        "the CRDs to be established",
    )
    .await;
}

/// Serves one sample skill (`config/samples/skills/<name>`) as the package behind any reference.
struct SamplePackage(&'static str);

impl PackageResolver for SamplePackage {
    fn fetch<'a>(
        &'a self,
        _: &'a skill_operator::api::package::OciSource,
    ) -> BoxFuture<'a, Result<FetchedPackage, skill_operator::controller::context::ResolveError>> {
        Box::pin(async {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/skills").join(self.0);
            let archive = skill_operator::core::package::build_from_dir(&dir)?;
            Ok(FetchedPackage { digest: skill_operator::core::package::digest(&archive), archive })
        })
    }
}

#[allow(dead_code)] // each suite uses one of the two
pub(crate) fn spawn_controller(client: Client) -> tokio::task::JoinHandle<()> {
    spawn_controller_with(client, "csv-stats", |_| {})
}

/// The controller serving the sample `sample` for every package, its
/// configuration adjusted by `tweak`.
#[allow(dead_code)]
pub(crate) fn spawn_controller_with(
    client: Client,
    sample: &'static str,
    tweak: impl FnOnce(&mut OperatorConfig),
) -> tokio::task::JoinHandle<()> {
    spawn_controller_ctx(client, sample, tweak).0
}

/// [`spawn_controller_with`], also handing back the controller's context
/// (its metrics).
#[allow(dead_code)]
pub(crate) fn spawn_controller_ctx(
    client: Client,
    sample: &'static str,
    tweak: impl FnOnce(&mut OperatorConfig),
) -> (tokio::task::JoinHandle<()>, Arc<Context>) {
    let (ctx, _) = context_with(client, sample, tweak);
    (spawn_context(ctx.clone()), ctx)
}

/// The context [`spawn_controller_ctx`] runs, not started (and its settings).
#[allow(dead_code)]
pub(crate) fn context_with(
    client: Client,
    sample: &'static str,
    tweak: impl FnOnce(&mut OperatorConfig),
) -> (Arc<Context>, OperatorConfig) {
    let mut config = operator_config();
    tweak(&mut config);
    let ctx = Arc::new(Context::new(
        client,
        Arc::new(Metrics::default()),
        config.clone(),
        Arc::new(SamplePackage(sample)),
        Arc::new(skill_operator::controller::context::NoArtifacts),
    ));
    (ctx, config)
}

/// Runs every controller with `ctx` until the test ends.
#[allow(dead_code)]
pub(crate) fn spawn_context(ctx: Arc<Context>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(err) =
            skill_operator::controller::run::run(ctx, "127.0.0.1:0".parse().unwrap(), skill_operator::shutdown::Shutdown::new()).await
        {
            eprintln!("controller stopped: {err:#}");
        }
    })
}

/// The operator settings every envtest suite starts from.
pub(crate) fn operator_config() -> OperatorConfig {
    OperatorConfig {
        operator_image: "registry.local/skill-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000".into(),
        operator_image_pull_policy: None,
        artifact_endpoint: "http://10.0.0.10:8443".into(),
        artifact_port: 8443,
        operator_namespace: "skill-system".into(),
        operator_pod_labels: [("app.kubernetes.io/name".to_string(), "skill-operator".to_string())].into(),
        label_namespaces: false,
        token_key: b"envtest-key".to_vec(),
        host_aliases: Default::default(),
        reconcile_concurrency: 32,
        prepare: Default::default(),
        selector: None,
        egress_proxy: None,
        network_policy: Default::default(),
        leader_election: None,
        warm_budget: skill_operator::core::limits::WARM_NAMESPACE_DEFAULT_BUDGET,
        release_startup_code: false,
        watch_timeout: skill_operator::controller::api_client::DEFAULT_WATCH_TIMEOUT_SECS,
    }
}

/// Create namespace `name`, enforcing Pod Security `restricted` when asked.
/// Create `object` (JSON in the API's own shape) through `api`; the created object back.
pub(crate) async fn create<K>(api: &Api<K>, object: serde_json::Value) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let object: K = serde_json::from_value(object).expect("the test's object has the API's shape");
    api.create(&PostParams::default(), &object).await.expect("the API server created the test's object")
}

pub(crate) async fn create_namespace(client: &Client, name: &str, restricted: bool) {
    let labels = if restricted { serde_json::json!({ "pod-security.kubernetes.io/enforce": "restricted" }) } else { serde_json::json!({}) };
    let ns: k8s_openapi::api::core::v1::Namespace = serde_json::from_value(
        serde_json::json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name, "labels": labels } }),
    )
    .unwrap();
    Api::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
}

pub(crate) fn ready(conditions: &[Condition]) -> Option<()> {
    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True").then_some(())
}

pub(crate) async fn wait_for<T, F, Fut>(probe: F, what: &str) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for_within(probe, what, Duration::from_secs(30)).await
}

/// [`wait_for`] for `within` (probing every 500 ms).
pub(crate) async fn wait_for_within<T, F, Fut>(mut probe: F, what: &str, within: Duration) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        if tokio::time::Instant::now() >= until {
            panic!("timed out after {} s waiting for {what}", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The SkillPackage `csv-stats-1`: python, `scripts/stats.py` allowed, from
/// a reference the test's resolver answers.
#[allow(dead_code)]
pub(crate) fn csv_stats_package() -> serde_json::Value {
    json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage",
        "metadata": { "name": "csv-stats-1" },
        "spec": {
            "source": { "oci": { "reference": "registry.local/skills/csv-stats:1" } },
            "runtime": { "interpreter": "python", "image": "python@sha256:1111111111111111111111111111111111111111111111111111111111111111",
                         "interpreterPath": "/usr/bin/python3", "allowedScripts": ["scripts/stats.py"], "timeoutSeconds": 60 }
        }
    })
}

/// The sample package `csv-stats-1` (python, `scripts/stats.py` allowed) and
/// its binding `csv-stats` in namespace `team`, both Ready.
#[allow(dead_code)]
pub(crate) async fn csv_stats_bound(client: &Client) {
    let packages: Api<SkillPackage> = Api::all(client.clone());
    create(&packages, csv_stats_package()).await;
    wait_for(|| async { ready(&packages.get("csv-stats-1").await.ok()?.status?.conditions) }, "the SkillPackage to be Ready").await;

    let bindings: Api<SkillBinding> = Api::namespaced(client.clone(), "team");
    create(
        &bindings,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding",
            "metadata": { "name": "csv-stats", "namespace": "team" },
            "spec": { "package": "csv-stats-1" }
        }),
    )
    .await;
    wait_for(|| async { ready(&bindings.get("csv-stats").await.ok()?.status?.conditions) }, "the SkillBinding to be Ready").await;
}
