//! The gated real-cluster half of `tests/gateway_executor.rs`.
//!
//! On the cluster `KUBECONFIG` names (with the CRDs installed) it starts,
//! as parts of this test process: a `docker-registry` on loopback (the
//! artifact store), the artifact endpoint on the pod network's gateway
//! address (pods reach this machine there: `POD_GW`, default 10.88.0.1),
//! and the controller's reconcilers (watching only this test's namespace
//! and package); the operator image is this build's binary
//! pushed by `skill-operator image self` to the node's registry
//! (`IMAGE_REGISTRY`, default 127.0.0.1:5000), which also holds the run
//! image (`RUN_IMAGE`, default `<IMAGE_REGISTRY>/runtime:trixie`).
//!
//! Everything a run creates is named from its prefix ([`Names`]: the
//! executor's run `gw-exec-…`, the HTTP run of [`super::over_http`] `gwfiles-…`;
//! namespaces `<prefix>-a`, `<prefix>-b`, `<prefix>-system`, SkillPackage
//! `<prefix>-echo`), so the two can run at once, and removed at the end, SkillJobs first while the controller still runs (their
//! finalizer needs it); leftovers of an interrupted run are removed first.
//! Without `KUBECONFIG`, or when the cluster does not answer, it prints
//! SKIPPED.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use skill_operator::api::{SkillBinding, SkillJob, SkillJobPhase, SkillPackage};
use skill_operator::artifacts::operator::HttpArtifacts;
use skill_operator::artifacts::server::{self, AppState, ServerConfig};
use skill_operator::controller::context::{Context, FetchedPackage, OperatorConfig, PackageResolver, ResolveError};
use skill_operator::controller::metrics::Metrics;
use skill_operator::core::declaration::Interpreter;
use skill_operator::core::fence::{Decision, RunPlan};
use skill_operator::core::paths::RelPath;
use skill_operator::gateway::executor::{KubeExecutor, KubeOptions, TaskState};
use skill_operator::jobs::{InputMatch, JobState, ReadTarget};
use skill_operator::mcp::executor::{Caller, Executor, RunControl};

use crate::oci_common::TestRegistry;

/// The executor suite's namespaces (the default prefix, [`setup`]): the
/// run-overhead bench names them too.
pub(crate) const NS_A: &str = "gw-exec-a";
pub(crate) const NS_GW: &str = "gw-exec-system";
const DEFAULT_PREFIX: &str = "gw-exec";

/// The names one run of a suite uses, all starting with its prefix, so
/// two suites sharing the cluster never touch each other's objects.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub prefix: String,
    /// The namespace with the binding and the controller's attention.
    pub a: String,
    /// A second namespace, which must see nothing of the first.
    pub b: String,
    /// The gateway's own namespace (draft records).
    pub gw: String,
    pub package: String,
}

impl Names {
    pub(crate) fn new(prefix: &str) -> Names {
        Names {
            prefix: prefix.into(),
            a: format!("{prefix}-a"),
            b: format!("{prefix}-b"),
            gw: format!("{prefix}-system"),
            package: format!("{prefix}-echo"),
        }
    }
}
pub(crate) const SKILL: &str = "gw-exec-echo";
pub(crate) const KEY: &[u8] = b"gw-exec-cluster-test-key-0123456789abcdef";
const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");

pub(crate) const SKILL_MD: &str = "---\nname: gw-exec-echo\ndescription: Test skill for the gateway executor suite. Prints its arguments and its input, writes an output file.\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/echo.sh\n      interpreter: bash\n      timeout: 60\n---\n# gw-exec-echo\n";
pub(crate) const ECHO_SH: &str = "#!/usr/bin/env bash\nset -eu\nif [ \"${1:-}\" = sleep ]; then echo started; sleep 120 & wait; fi\nif [ -f big.in ]; then cp big.in big.out; fi\necho \"args: $*\"\nif [ -f in.txt ]; then echo \"input: $(cat in.txt)\"; fi\necho made > out.txt\necho to-stderr >&2\n";

/// The test skill as the package behind any reference.
struct EchoPackage;

impl PackageResolver for EchoPackage {
    fn fetch<'a>(&'a self, _: &'a skill_operator::api::package::OciSource) -> BoxFuture<'a, Result<FetchedPackage, ResolveError>> {
        Box::pin(async {
            let dir = tempfile::tempdir()?;
            std::fs::create_dir_all(dir.path().join("scripts"))?;
            std::fs::write(dir.path().join("SKILL.md"), SKILL_MD)?;
            std::fs::write(dir.path().join("scripts/echo.sh"), ECHO_SH)?;
            let archive = skill_operator::core::package::build_from_dir(dir.path())?;
            Ok(FetchedPackage { digest: skill_operator::core::package::digest(&archive), archive })
        })
    }
}

pub(crate) fn plan(args: &[&str]) -> RunPlan {
    RunPlan {
        decision: Decision {
            skill: SKILL.into(),
            script: RelPath::parse("scripts/echo.sh").unwrap(),
            interpreter: Interpreter::Bash,
            args: args.iter().map(|a| a.to_string()).collect(),
            granted_env: Vec::new(),
            timeout_secs: 60,
            egress: Vec::new(),
            egress_granted: false,
        },
        skill_dir: Default::default(),
    }
}

pub(crate) async fn wait_for<T, F, Fut>(mut probe: F, secs: u64, what: &str) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn ready(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> Option<()> {
    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True").then_some(())
}

/// Delete our namespaces (their SkillJobs go with them: the controller
/// removes their finalizers, at once in a namespace being deleted, even for
/// one whose name it holds for a confirmation token), then the package.
async fn clean(client: &Client, n: &Names) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [n.a.as_str(), n.b.as_str(), n.gw.as_str()] {
        let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    }
    let packages: Api<SkillPackage> = Api::all(client.clone());
    let _ = packages.delete(n.package.as_str(), &DeleteParams::default()).await;
    for ns in [n.a.as_str(), n.b.as_str(), n.gw.as_str()] {
        wait_for(
            || async { namespaces.get_opt(ns).await.ok().map(|n| n.is_none()).and_then(|gone| gone.then_some(())) },
            180,
            "a namespace to go",
        )
        .await;
    }
}

async fn create_namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": name, "labels": { "pod-security.kubernetes.io/enforce": "restricted" } }
    }))
    .unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
}

/// The controller's three reconcilers, as `controller::run` wires them, but
/// watching only this test's objects (namespace A and its package), so a
/// controller another suite runs on the shared cluster is not raced for
/// its SkillJobs and packages.
async fn scoped_controller(ctx: Arc<Context>, shutdown: skill_operator::shutdown::Shutdown, n: Names) {
    use futures::StreamExt;
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::runtime::controller::{Action, Controller};
    use kube::runtime::{reflector, watcher, WatchStreamExt};
    use skill_operator::controller::{binding, package, skilljob};

    fn retry<K>(_: Arc<K>, err: &skill_operator::controller::context::Error, _: Arc<Context>) -> Action {
        eprintln!("reconcile failed: {err}");
        Action::requeue(Duration::from_secs(2))
    }
    let client = ctx.client.clone();
    let mine = watcher::Config::default().fields(&format!("metadata.name={}", n.package));
    let packages = Controller::new(Api::<SkillPackage>::all(client.clone()), mine);
    let bindings = Controller::new(Api::<SkillBinding>::namespaced(client.clone(), n.a.as_str()), watcher::Config::default());
    ctx.lookups.set_stores(bindings.store(), packages.store());
    let packages = packages.graceful_shutdown_on(shutdown.wait_owned()).run(package::reconcile, retry, ctx.clone()).for_each(|_| async {});
    let bindings = bindings.graceful_shutdown_on(shutdown.wait_owned()).run(binding::reconcile, retry, ctx.clone()).for_each(|_| async {});
    let children = watcher::Config::default().labels("app.kubernetes.io/managed-by=skill-operator");
    let (job_store, job_writer) = reflector::store::<Job>();
    let (policy_store, policy_writer) = reflector::store::<NetworkPolicy>();
    ctx.lookups.set_child_stores(job_store, policy_store);
    let job_events = reflector(job_writer, watcher(Api::<Job>::namespaced(client.clone(), n.a.as_str()), children.clone()))
        .default_backoff()
        .touched_objects();
    let policy_events = reflector(policy_writer, watcher(Api::<NetworkPolicy>::namespaced(client.clone(), n.a.as_str()), children))
        .default_backoff()
        .touched_objects();
    // Namespace A's metadata into the lookups' cache, and its deletion
    // waking its held SkillJobs from that same watch (as controller::run).
    let jobs = Controller::new(Api::<SkillJob>::namespaced(client.clone(), n.a.as_str()), watcher::Config::default());
    let (namespace_store, namespace_writer) = reflector::store();
    ctx.lookups.set_namespace_store(namespace_store);
    let (held_tx, held_rx) = futures::channel::mpsc::unbounded();
    let held = jobs.store();
    let only_a = watcher::Config::default().fields(&format!("metadata.name={}", n.a));
    let namespaces = reflector(namespace_writer, watcher(Api::<kube::core::PartialObjectMeta<Namespace>>::all(client.clone()), only_a))
        .default_backoff()
        .touched_objects()
        .take_until(shutdown.wait_owned())
        .for_each(move |ns| {
            if let Ok(ns) = ns {
                for sj in skilljob::held_in(&ns, &held) {
                    let _ = held_tx.unbounded_send(sj);
                }
            }
            async {}
        });
    let jobs = jobs
        .owns_stream(job_events)
        .owns_stream(policy_events)
        .reconcile_on(held_rx)
        .graceful_shutdown_on(shutdown.wait_owned())
        .run(skilljob::reconcile, retry, ctx.clone())
        .for_each(|_| async {});
    tokio::join!(packages, bindings, jobs, namespaces);
}

/// What the cluster says about a namespace's pods and the node, for a
/// failed run's message: a run that never started (an image pull, a node
/// under disk pressure) otherwise shows only as a passed deadline.
pub(crate) async fn pod_story(client: &Client, ns: &str) -> String {
    use k8s_openapi::api::core::v1::{Event, Node};
    let mut story = String::new();
    for pod in Api::<Pod>::namespaced(client.clone(), ns).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        let status = pod.status.unwrap_or_default();
        story += &format!("\npod {}: {}", pod.metadata.name.unwrap_or_default(), status.phase.unwrap_or_default());
        for c in status.conditions.iter().flatten().filter(|c| c.status != "True") {
            story += &format!("; {} {}", c.type_, c.message.as_deref().unwrap_or_default());
        }
        for c in status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten()) {
            if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
                story += &format!(
                    "; {} waiting: {} {}",
                    c.name,
                    w.reason.as_deref().unwrap_or_default(),
                    w.message.as_deref().unwrap_or_default()
                );
            }
        }
    }
    for e in Api::<Event>::namespaced(client.clone(), ns).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        if e.type_.as_deref() == Some("Warning") {
            story += &format!("\nevent {}: {}", e.reason.unwrap_or_default(), e.message.unwrap_or_default());
        }
    }
    for node in Api::<Node>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        let pressed = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_.ends_with("Pressure") && c.status == "True");
        for c in pressed {
            story += &format!("\nnode {}: {} {}", node.metadata.name.clone().unwrap_or_default(), c.type_, c.message.unwrap_or_default());
        }
    }
    story
}

/// Wait until the run's script container runs (a cancel must then stop a live script).
pub(crate) async fn script_running(client: &Client, n: &Names, skilljob: &str) {
    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), n.a.as_str());
    let pods: Api<Pod> = Api::namespaced(client.clone(), n.a.as_str());
    let uid = wait_for(|| async { skilljobs.get(skilljob).await.ok()?.metadata.uid }, 60, "the SkillJob").await;
    let selector = format!("skill-operator.dev/skilljob-uid={uid}");
    wait_for(
        || async {
            let list = pods.list(&ListParams::default().labels(&selector)).await.ok()?;
            list.items
                .iter()
                .flat_map(|p| p.status.iter().flat_map(|s| s.container_statuses.iter().flatten()))
                .any(|c| c.name == "run" && c.state.as_ref().is_some_and(|st| st.running.is_some()))
                .then_some(())
        },
        120,
        "the run's script to be running",
    )
    .await;
}

/// What [`setup`] started: the cluster's client, the artifact endpoint's
/// operator client, the skill's binding, and the in-process controller.
pub(crate) struct Setup {
    pub client: Client,
    pub artifacts: Arc<HttpArtifacts>,
    pub bindings: Arc<BTreeMap<String, String>>,
    pub names: Names,
    shutdown: skill_operator::shutdown::Shutdown,
    controller: tokio::task::JoinHandle<()>,
    _registry: TestRegistry,
    _spool: tempfile::TempDir,
}

impl Setup {
    /// Remove what the run made (the controller still runs), then stop it.
    pub(crate) async fn teardown(self) {
        clean(&self.client, &self.names).await;
        self.shutdown.trigger();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.controller).await;
    }
}

/// Everything a run through the executor needs on the cluster, or `None`
/// (SKIPPED printed) when there is no cluster to use.
pub(crate) async fn setup(what: &str) -> Option<Setup> {
    let n = Names::new(DEFAULT_PREFIX);
    assert_eq!((n.a.as_str(), n.gw.as_str()), (NS_A, NS_GW), "the names the bench uses are the default prefix's");
    setup_named(what, DEFAULT_PREFIX).await
}

/// [`setup`], every name starting with `prefix`.
pub(crate) async fn setup_named(what: &str, prefix: &str) -> Option<Setup> {
    let n = Names::new(prefix);
    if std::env::var_os("KUBECONFIG").is_none() {
        skill_operator::gated::skip(what, "KUBECONFIG is not set");
        return None;
    }
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            skill_operator::gated::skip(what, &format!("KUBECONFIG gives no client: {e}"));
            return None;
        }
    };
    if let Err(e) = tokio::time::timeout(Duration::from_secs(5), client.apiserver_version())
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
    {
        skill_operator::gated::skip(what, &format!("the cluster does not answer: {e}"));
        return None;
    }
    if Api::<SkillPackage>::all(client.clone()).list(&ListParams::default().limit(1)).await.is_err() {
        skill_operator::gated::skip(what, "the skill-operator CRDs are not installed on the cluster");
        return None;
    }
    skill_operator::tls::install_crypto_provider();
    let pod_gw = std::env::var("POD_GW").unwrap_or_else(|_| "10.88.0.1".into());
    let image_registry = std::env::var("IMAGE_REGISTRY").unwrap_or_else(|_| "127.0.0.1:5000".into());
    let run_image = std::env::var("RUN_IMAGE").unwrap_or_else(|_| format!("{image_registry}/runtime:trixie"));

    // The operator image: this build's binary.
    let out = Command::new(BIN)
        .args(["image", "self", "--registry", &format!("{image_registry}/{}/skill-operator", n.prefix), "--plain-http"])
        .output()
        .unwrap();
    assert!(out.status.success(), "image self: {}", String::from_utf8_lossy(&out.stderr));
    let operator_image = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim().to_string();
    assert!(operator_image.contains("@sha256:"), "{operator_image}");

    // The artifact store and endpoint; pods reach the endpoint at the pod gateway.
    let registry = TestRegistry::start().await;
    let spool = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::new(format!("{}/{}/jobs", registry.addr, n.prefix), KEY.to_vec());
    cfg.plain_http = true;
    cfg.spool_dir = Some(spool.path().into());
    // Run pods present their projected ServiceAccount tokens, as with the chart's `--pod-tokens`.
    cfg.pod_tokens = Some(server::pod_tokens::PodTokens::new(client.clone()));
    let listener = tokio::net::TcpListener::bind((pod_gw.as_str(), 0)).await.expect("listen on the pod gateway address (POD_GW)");
    let endpoint_port = listener.local_addr().unwrap().port();
    let endpoint = format!("http://{pod_gw}:{endpoint_port}/v1");
    tokio::spawn(server::serve(listener, AppState::new(cfg).unwrap(), std::future::pending()));

    // The controller, in process.
    let config = OperatorConfig {
        operator_image,
        operator_image_pull_policy: None,
        artifact_endpoint: endpoint.clone(),
        artifact_port: endpoint_port,
        operator_namespace: n.gw.as_str().into(),
        operator_pod_labels: BTreeMap::from([("app.kubernetes.io/name".to_string(), format!("{}-test", n.prefix))]),
        label_namespaces: false,
        token_key: KEY.to_vec(),
        host_aliases: Default::default(),
        reconcile_concurrency: 4,
        prepare: Default::default(),
        selector: None,
        egress_proxy: None,
        network_policy: Default::default(),
        leader_election: None,
        warm_budget: skill_operator::core::limits::WARM_NAMESPACE_DEFAULT_BUDGET,
        release_startup_code: false,
        watch_timeout: skill_operator::controller::api_client::DEFAULT_WATCH_TIMEOUT_SECS,
    };
    let artifacts = Arc::new(HttpArtifacts::new(&endpoint, KEY));
    let ctx = Arc::new(Context::new(client.clone(), Arc::new(Metrics::default()), config, Arc::new(EchoPackage), artifacts.clone()));
    let shutdown = skill_operator::shutdown::Shutdown::new();
    let controller = tokio::spawn(scoped_controller(ctx, shutdown.clone(), n.clone()));

    clean(&client, &n).await;
    for ns in [n.a.as_str(), n.b.as_str(), n.gw.as_str()] {
        create_namespace(&client, ns).await;
    }
    let package: SkillPackage = serde_json::from_value(json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage",
        "metadata": { "name": n.package.as_str() },
        "spec": {
            "source": { "oci": { "reference": "registry.local/gw-exec/echo:1" } },
            "runtime": { "interpreter": "bash", "image": run_image, "interpreterPath": "/bin/bash", "allowedScripts": ["scripts/echo.sh"], "timeoutSeconds": 60 }
        }
    }))
    .unwrap();
    let packages: Api<SkillPackage> = Api::all(client.clone());
    packages.create(&PostParams::default(), &package).await.unwrap();
    wait_for(|| async { ready(&packages.get(n.package.as_str()).await.ok()?.status?.conditions) }, 60, "the SkillPackage to be Ready")
        .await;
    {
        let ns = n.a.as_str();
        let bindings: Api<SkillBinding> = Api::namespaced(client.clone(), ns);
        let binding: SkillBinding = serde_json::from_value(json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding",
            "metadata": { "name": "echo", "namespace": ns }, "spec": { "package": n.package.as_str() }
        }))
        .unwrap();
        bindings.create(&PostParams::default(), &binding).await.unwrap();
        wait_for(|| async { ready(&bindings.get("echo").await.ok()?.status?.conditions) }, 60, "the SkillBinding to be Ready").await;
    }

    let bindings: Arc<BTreeMap<String, String>> = Arc::new(BTreeMap::from([(SKILL.to_string(), "echo".to_string())]));
    Some(Setup { client, artifacts, bindings, names: n, shutdown, controller, _registry: registry, _spool: spool })
}

pub(crate) async fn runs_on_the_real_cluster() {
    let Some(setup) = setup("the gateway executor on a real cluster").await else { return };
    let n = setup.names.clone();
    let (client, artifacts, bindings) = (setup.client.clone(), setup.artifacts.clone(), setup.bindings.clone());
    // A's executor lists from the shared SkillJob cache, as the gateway's do; B's asks the API server.
    let index = skill_operator::gateway::executor::index::JobIndex::spawn(client.clone(), setup.shutdown.clone());
    assert!(index.wait_until_ready().await);
    let exec_a = KubeExecutor::new(
        client.clone(),
        artifacts.clone(),
        bindings.clone(),
        KubeOptions::new(n.a.as_str(), n.gw.as_str(), skill_operator::core::owner::OwnerSeal::new(KEY)),
    )
    .with_index(index.clone());
    let exec_b = KubeExecutor::new(
        client.clone(),
        artifacts.clone(),
        bindings.clone(),
        KubeOptions::new(n.b.as_str(), n.gw.as_str(), skill_operator::core::owner::OwnerSeal::new(KEY)),
    );
    let alice = Caller::named(format!("system:serviceaccount:{}:alice", n.a));

    // skill_run: a SkillJob the real controller runs in a real pod.
    let progress: Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let sink = progress.clone();
    let control = RunControl {
        key: format!("cluster-{}", uuid::Uuid::new_v4().simple()),
        progress: Some(Arc::new(move |u| sink.lock().unwrap().push(u.phase))),
        cancel: CancellationToken::new(),
    };
    let inputs = vec![("in.txt".to_string(), b"hello from the caller".to_vec())];
    let report =
        tokio::time::timeout(Duration::from_secs(300), exec_a.run_new(&alice, plan(&["one", "two words"]), inputs, control.clone()))
            .await
            .expect("the run ended within 300 s")
            .expect("the run's report");
    let stdout = String::from_utf8_lossy(&report.stdout);
    if report.record.state != JobState::Succeeded {
        panic!("the run ended {:?}: {report:?}{}", report.record.state, pod_story(&client, n.a.as_str()).await);
    }
    assert_eq!(report.record.run.as_ref().unwrap().outcome.exit_code, Some(0));
    assert!(stdout.contains("args: one two words") && stdout.contains("input: hello from the caller"), "stdout: {stdout}");
    assert_eq!(String::from_utf8_lossy(&report.stderr).trim(), "to-stderr");
    let out = report.outputs.files.iter().find(|f| f.path == "out.txt").expect("out.txt listed");
    assert_eq!(out.input, InputMatch::NotAnInput);
    assert!(report.outputs.files.iter().any(|f| f.path == "in.txt" && f.input == InputMatch::Unchanged), "{:?}", report.outputs);
    assert!(!progress.lock().unwrap().is_empty(), "no progress was reported");
    let job = report.record.id.clone();
    let sj = Api::<SkillJob>::namespaced(client.clone(), n.a.as_str()).get(&job).await.unwrap();
    assert_eq!(
        sj.metadata.annotations.as_ref().unwrap()["skill-operator.dev/requested-by"],
        alice.principal,
        "the audit trail names the caller"
    );

    // The same confirmed call again: the same run, not a second SkillJob.
    let again = exec_a
        .run_new(&alice, plan(&["one", "two words"]), vec![("in.txt".into(), b"hello from the caller".to_vec())], control)
        .await
        .unwrap();
    assert_eq!(again.record.id, job);
    assert_eq!(Api::<SkillJob>::namespaced(client.clone(), n.a.as_str()).list(&ListParams::default()).await.unwrap().items.len(), 1);

    // Reads in chunks, the job's owner only.
    let chunk = exec_a.read(&alice, &job, ReadTarget::File("out.txt".into()), 0, 4).await.unwrap();
    assert_eq!((chunk.data.as_slice(), chunk.size, chunk.eof), (&b"made"[..], 5, false));
    assert_eq!(exec_a.read(&Caller::named("mallory"), &job, ReadTarget::Stdout, 0, 10).await.unwrap_err().code, "job-not-found");

    // A draft: created, uploaded in two chunks, then run naming its inputs by digest.
    let draft = exec_a.create(&alice, SKILL).await.unwrap();
    assert_eq!(draft.state, JobState::Created);
    exec_a.upload(&alice, &draft.id, "in.txt", 0, b"first half, ".to_vec()).await.unwrap();
    assert_eq!(exec_a.upload(&alice, &draft.id, "in.txt", 3, b"x".to_vec()).await.unwrap_err().code, "job-wrong-offset");
    let info = exec_a.upload(&alice, &draft.id, "in.txt", 12, b"second half".to_vec()).await.unwrap();
    assert_eq!((info.size, info.sha256.clone()), (23, skill_operator::core::package::digest(b"first half, second half")));
    let record = exec_a.get(&alice, &draft.id).await.unwrap();
    let confirmed: Vec<(String, String)> = record.inputs.iter().map(|f| (f.path.clone(), f.sha256.clone())).collect();
    let ran = tokio::time::timeout(
        Duration::from_secs(300),
        exec_a.run(&alice, &draft.id, plan(&["drafted"]), confirmed, RunControl { key: "draft".into(), ..Default::default() }),
    )
    .await
    .expect("the draft's run ended within 300 s")
    .expect("the draft's report");
    assert_eq!(ran.record.id, draft.id, "the job id stays the draft's");
    assert!(String::from_utf8_lossy(&ran.stdout).contains("input: first half, second half"), "{:?}", String::from_utf8_lossy(&ran.stdout));
    assert_eq!(exec_a.upload(&alice, &draft.id, "late.txt", 0, b"x".to_vec()).await.unwrap_err().code, "job-uploads-closed");
    let listed = exec_a.list(&alice).await.unwrap();
    assert_eq!(listed.iter().map(|r| r.id.as_str()).collect::<std::collections::BTreeSet<_>>(), [job.as_str(), draft.id.as_str()].into());

    // Namespace B's executor knows none of namespace A's jobs, whoever asks.
    for id in [&job, &draft.id] {
        assert_eq!(exec_b.get(&alice, id).await.unwrap_err().code, "job-not-found");
        assert_eq!(exec_b.status(&alice, id).await.unwrap_err().code, "job-not-found");
        assert_eq!(exec_b.read(&alice, id, ReadTarget::Stdout, 0, 10).await.unwrap_err().code, "job-not-found");
        assert_eq!(exec_b.delete(&alice, id).await.unwrap_err().code, "job-not-found");
        assert_eq!(exec_b.task_status(&alice, id).await.unwrap_err().code(), "job-not-found");
    }
    assert!(exec_b.list(&alice).await.unwrap().is_empty());
    // And its drafts are its own: a draft of A is not uploadable through B.
    let other = exec_a.create(&alice, SKILL).await.unwrap();
    assert_eq!(exec_b.upload(&alice, &other.id, "a.txt", 0, b"x".to_vec()).await.unwrap_err().code, "job-not-found");
    exec_a.delete(&alice, &other.id).await.unwrap();

    // The caller going away cancels its run: the pod is stopped, the phase Cancelled.
    let cancel = CancellationToken::new();
    let key = format!("gone-{}", uuid::Uuid::new_v4().simple());
    let control = RunControl { key: key.clone(), progress: None, cancel: cancel.clone() };
    let running = tokio::spawn({
        let (client, alice) = (client.clone(), alice.clone());
        let exec = KubeExecutor::new(
            client,
            artifacts.clone(),
            bindings.clone(),
            KubeOptions::new(n.a.as_str(), n.gw.as_str(), skill_operator::core::owner::OwnerSeal::new(KEY)),
        );
        async move { exec.run_new(&alice, plan(&["sleep"]), Vec::new(), control).await }
    });
    // It goes as soon as its Job exists (the pod may still be starting).
    {
        let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), n.a.as_str());
        let name = skill_operator::gateway::executor::names::run_name(n.a.as_str(), &alice.principal, &key);
        wait_for(|| async { (skilljobs.get(&name).await.ok()?.status?.job_name.is_some()).then_some(()) }, 60, "the run's Job").await;
    }
    cancel.cancel();
    let report = tokio::time::timeout(Duration::from_secs(60), running)
        .await
        .expect("the cancel came back within 60 s")
        .unwrap()
        .expect("a cancelled report");
    assert_eq!(report.record.state, JobState::Cancelled);
    let gone = report.record.id.clone();
    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), n.a.as_str());
    wait_for(
        || async {
            let sj = skilljobs.get(&gone).await.ok()?;
            let s = sj.status?;
            (s.phase == Some(SkillJobPhase::Cancelled) && s.conditions.iter().any(|c| c.type_ == "Complete" && c.status == "True"))
                .then_some(())
        },
        120,
        "the disconnected run to be Cancelled with its pod stopped",
    )
    .await;
    let uid = skilljobs.get(&gone).await.unwrap().metadata.uid.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), n.a.as_str());
    let selector = format!("skill-operator.dev/skilljob-uid={uid}");
    assert!(pods.list(&ListParams::default().labels(&selector)).await.unwrap().items.is_empty(), "the run's pod is still there");

    // Tasks: submitted (returns at once), read, cancelled while the script runs, all from the SkillJob.
    let task = exec_a.submit(&alice, &plan(&["sleep"]), &[], "task-key").await.unwrap();
    assert_eq!(task, skill_operator::gateway::executor::names::run_name(n.a.as_str(), &alice.principal, "task-key"));
    assert_eq!(exec_a.task_status(&alice, &task).await.unwrap().state, TaskState::Working);
    assert_eq!(exec_a.task_status(&Caller::named("mallory"), &task).await.unwrap_err().code(), "job-not-found");
    assert_eq!(exec_a.task_cancel(&Caller::named("mallory"), &task).await.unwrap_err().code(), "job-not-found");
    assert_eq!(exec_b.task_cancel(&alice, &task).await.unwrap_err().code(), "job-not-found");
    script_running(&client, &n, &task).await;
    exec_a.task_cancel(&alice, &task).await.unwrap();
    let done = wait_for(
        || async { exec_a.task_status(&alice, &task).await.ok().filter(|s| s.state != TaskState::Working) },
        120,
        "the cancelled task to settle",
    )
    .await;
    assert_eq!(done.state, TaskState::Cancelled);
    assert_eq!(done.report.expect("a cancelled task has a report").record.state, JobState::Cancelled);

    // The cache shows the caller their own writes at once: a list right after
    // a run or a delete holds it or not, with no wait in the test.
    let listed: Vec<String> = exec_a.list(&alice).await.unwrap().into_iter().map(|r| r.id).collect();
    assert!(listed.contains(&task) && listed.contains(&gone), "{listed:?}");
    exec_a.delete(&alice, &gone).await.unwrap();
    let listed: Vec<String> = exec_a.list(&alice).await.unwrap().into_iter().map(|r| r.id).collect();
    assert!(!listed.contains(&gone) && listed.contains(&job), "{listed:?}");
    assert!(exec_a.list(&Caller::named("mallory")).await.unwrap().is_empty(), "the cache lists the caller's jobs only");

    setup.teardown().await;
}
