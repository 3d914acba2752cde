//! The operator's processes beside a real API server (an [`Envtest`]): a
//! Debian `docker-registry`, the `csv-stats` sample pushed into it by the
//! CLI, the `skill-operator artifacts` endpoint, and as many
//! `skill-operator controller` processes as a test starts. Only the kubelet
//! is missing: Jobs are created, never run. Shared by
//! benches/controller_throughput.rs and tests/controller_failover.rs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kube::api::{Api, PostParams};
use serde_json::json;
use skill_operator::api::{SkillBinding, SkillPackage};

use super::harness::{self, Envtest};
use super::oci_common::TestRegistry;

/// Kills the child on drop, so a panicking test leaves no process behind.
pub(crate) struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub(crate) async fn wait_http(url: &str) {
    for _ in 0..100 {
        if reqwest::get(url).await.is_ok_and(|r| r.status().is_success()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} did not answer in 10 s");
}

/// The key the endpoint and the controllers share (operator and job tokens).
pub(crate) const TOKEN_KEY: [u8; 32] = [7u8; 32];

pub(crate) struct Stack {
    pub env: Envtest,
    pub client: kube::Client,
    pub registry: TestRegistry,
    pub bin: &'static str,
    pub artifacts_port: u16,
    key: PathBuf,
    _work: tempfile::TempDir,
    artifacts: Option<Process>,
}

impl Stack {
    /// The API server with the CRDs and a restricted namespace `ns`, the
    /// registry with the sample, and the artifact endpoint answering.
    pub(crate) async fn start(assets: &Path, bin: &'static str, ns: &str) -> Stack {
        let env = Envtest::start(assets).await;
        let client = env.client.clone();
        harness::install_crds(&client).await;
        harness::create_namespace(&client, ns, true).await;

        let registry = TestRegistry::start().await;
        let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples/skills/csv-stats");
        let push = Command::new(bin)
            .args(["package", "push"])
            .arg(&sample)
            .args(["--registry", &format!("{}/skills", registry.addr), "--tag", "1", "--plain-http"])
            .output()
            .unwrap();
        assert!(push.status.success(), "package push: {}", String::from_utf8_lossy(&push.stderr));

        let work = tempfile::tempdir().unwrap();
        let key = work.path().join("token-key");
        std::fs::write(&key, TOKEN_KEY).unwrap();
        let mut stack = Stack { env, client, registry, bin, artifacts_port: free_port(), key, _work: work, artifacts: None };
        stack.start_artifacts().await;
        stack
    }

    /// The artifact endpoint, on its port, once it answers.
    pub(crate) async fn start_artifacts(&mut self) {
        self.artifacts = Some(Process(
            Command::new(self.bin)
                .args(["artifacts", "--listen", &format!("127.0.0.1:{}", self.artifacts_port), "--metrics-auth", "none"])
                .args(["--registry", &format!("{}/jobs", self.registry.addr), "--plain-http"])
                .arg("--token-key-file")
                .arg(&self.key)
                .env("SKILL_OPERATOR_LOG", "warn")
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        ));
        wait_http(&format!("http://127.0.0.1:{}/healthz", self.artifacts_port)).await;
    }

    /// Kills the artifact endpoint: an outage.
    pub(crate) fn stop_artifacts(&mut self) {
        self.artifacts = None;
    }

    /// A controller process with its metrics on `metrics_port`, `extra`
    /// flags, and `POD_NAME` as given (the Recorder's instance and the
    /// leader election identity's prefix).
    pub(crate) fn controller(&self, metrics_port: u16, extra: &[&str], pod_name: &str) -> Process {
        self.controller_via(&self.env.kubeconfig, metrics_port, extra, pod_name)
    }

    /// [`Stack::controller`], reaching the API server through `kubeconfig`
    /// (a fault-injecting proxy's, say).
    pub(crate) fn controller_via(&self, kubeconfig: &Path, metrics_port: u16, extra: &[&str], pod_name: &str) -> Process {
        // `CONTROLLER_WRAPPER` (a profiler such as heaptrack) runs the binary under it.
        let mut command = match std::env::var("CONTROLLER_WRAPPER") {
            Ok(wrapper) => {
                let mut c = Command::new(wrapper);
                c.arg(self.bin);
                c
            }
            Err(_) => Command::new(self.bin),
        };
        Process(
            command
                .args(["controller", "--listen", &format!("127.0.0.1:{metrics_port}")])
                .args(skill_operator::gated::CONTROLLER_WITHOUT_CLUSTER)
                .args([
                    "--operator-image",
                    "registry.local/skill-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000",
                ])
                .args(["--artifact-endpoint", &format!("http://127.0.0.1:{}", self.artifacts_port)])
                .args(["--operator-namespace", "skill-system", "--operator-pod-label", "app.kubernetes.io/name=skill-operator"])
                .arg("--token-key-file")
                .arg(&self.key)
                .args(["--plain-http-registry", &self.registry.addr])
                .args(extra)
                .env("KUBECONFIG", kubeconfig)
                .env("POD_NAME", pod_name)
                .env("SKILL_OPERATOR_LOG", std::env::var("CONTROLLER_LOG").unwrap_or_else(|_| "warn".into()))
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    }

    /// The sample's SkillPackage (made once) and its binding `csv-stats` in
    /// `ns`, both Ready (a controller must be running).
    pub(crate) async fn bind_csv_stats(&self, ns: &str) {
        let packages: Api<SkillPackage> = Api::all(self.client.clone());
        let created = packages
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage", "metadata": { "name": "csv-stats-1" },
                "spec": { "source": { "oci": { "reference": format!("{}/skills/csv-stats:1", self.registry.addr) } },
                          "runtime": { "interpreter": "python", "image": "python@sha256:1111111111111111111111111111111111111111111111111111111111111111", "allowedScripts": ["scripts/stats.py"] } }
            })).unwrap())
            .await;
        match created {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("create the SkillPackage: {e}"),
        }
        // A controller behind the lossy API server's proxy may be backing
        // off its watches when the objects appear: more time than a clean one.
        let within = std::time::Duration::from_secs(120);
        harness::wait_for_within(
            || async { harness::ready(&packages.get("csv-stats-1").await.ok()?.status?.conditions) },
            "package Ready",
            within,
        )
        .await;
        let bindings: Api<SkillBinding> = Api::namespaced(self.client.clone(), ns);
        bindings
            .create(&PostParams::default(), &serde_json::from_value(json!({
                "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding", "metadata": { "name": "csv-stats" }, "spec": { "package": "csv-stats-1" }
            })).unwrap())
            .await
            .unwrap();
        harness::wait_for_within(
            || async { harness::ready(&bindings.get("csv-stats").await.ok()?.status?.conditions) },
            "binding Ready",
            within,
        )
        .await;
    }
}
