//! The dependency build Job of a prepared SkillPackage, and its
//! NetworkPolicy.
//!
//! Pod shape (the run Job's, with `image deps` as the script):
//!
//! ```text
//! initContainers:
//!   fetch   (operator image)  skill-operator fetch --endpoint URL --namespace NS --job BUILD_UID
//!                                 --package /package --work /work --token-file … --tools /tools
//!   upload  (operator image, native sidecar)  skill-operator upload … --work /work --result /result/result.json
//! containers:
//!   build   (the base, by digest)  /tools/skill-operator launch --result /result/result.json --timeout SECS
//!                                    --allow-env HOME --allow-env TMPDIR --allow-env PATH --
//!                                    /tools/skill-operator image deps --package /package --out /work/deps
//!                                    --report /work/deps-report.json --refuse-lifecycle-scripts
//!                                    [--index-url URL [--trusted-host HOST]] [--npm-registry URL]
//!           ro: package, tools; rw: work, tmp, result.  No token, no SA token.
//! ```
//!
//! Why it is shaped like a run: the build runs in exactly the base the
//! image is composed on (so pip picks wheels for that Python), with the
//! same restricted pod security, and everything it makes comes back the way
//! a run's outputs do: the upload sidecar sends `/work` (the tree and the
//! report) and the launcher's result, stdout and stderr (the log tail a
//! failed preparation quotes) to the artifact endpoint under the build's
//! UID. The launcher gives the wall-clock limit and the process-group kill;
//! `image deps` runs no package code (wheels only, `npm ci --ignore-scripts`,
//! lifecycle scripts refused).
//!
//! What the build may not do: write to the package (`/package` is read-only
//! for `build`), hold a credential (the per-build token is mounted into
//! fetch and upload only, the service-account token nowhere), or reach
//! anything but the artifact endpoint and the configured package indexes
//! ([`build_network_policy`]). NetworkPolicy cannot name hosts, so an index
//! is allowed by address (`ipBlock` of the address the controller resolved,
//! on the URL's port) and the pod gets that address as a hosts entry (it
//! has no DNS). That is the documented per-package exception until the
//! egress proxy carries build traffic: a mirror sharing its address with
//! other services (a CDN) lets the build reach those too, on that port.
//!
//! Names: the Job and its NetworkPolicy are `skillbuild-<12 hex>` of the
//! build's inputs (package digest, lock digest, base, indexes, attempt), so
//! a restarted controller finds the build it started. Labels: managed-by,
//! [`LABEL_BUILD`] (what the policy selects), the package (informative).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, EnvVar, KeyToPath, PodSpec, PodTemplateSpec, SecretVolumeSource, Volume};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::job::{
    empty_dir, guaranteed, hardened_pod_spec, mount, pull_policy, restricted_security, PodShape, RunResources, CONTAINER_FETCH,
    CONTAINER_UPLOAD, DEADLINE_SLACK_SECS, LAUNCHER, OPERATOR_BIN, PACKAGE_DIR, RESULT_DIR, RESULT_FILE, RUN_PATH, SIZE_PACKAGE,
    SIZE_RESULT, SIZE_TMP, SIZE_TOOLS, TERMINATION_MESSAGE_PATH, TMP_DIR, TOKEN_DIR, TOKEN_FILE, TOKEN_KEY, TOOLS_DIR, VOL_PACKAGE,
    VOL_RESULT, VOL_TMP, VOL_TOKEN, VOL_TOOLS, VOL_WORK, WORK_DIR,
};
use super::network_policy::Peer;
use super::{
    is_ip_literal, label_value, require_label_name, require_quantity, require_subdomain, url_host, Error, Result, LABEL_MANAGED_BY,
    MANAGED_BY,
};
use crate::core::limits::{BUILD_CPU, BUILD_EPHEMERAL, BUILD_MEMORY, BUILD_TIMEOUT_SECS, BUILD_TTL_SECS};

/// Selects a build's pods (the NetworkPolicy's podSelector); its value is the Job's name.
pub const LABEL_BUILD: &str = "skill-operator.dev/build";
/// The SkillPackage a build is for (informative: package names may be longer than a label value).
pub const LABEL_PACKAGE: &str = "skill-operator.dev/package";
/// The build's main container.
pub const CONTAINER_BUILD: &str = "build";
/// Where `image deps` writes the tree, under the uploaded `/work`.
pub const DEPS_OUT: &str = "/work/deps";
/// Where `image deps` writes its JSON report, under the uploaded `/work`.
pub const DEPS_REPORT: &str = "/work/deps-report.json";
/// The report and the tree as the outputs manifest names them.
pub const OUTPUT_REPORT: &str = "work/deps-report.json";
pub const OUTPUT_DEPS_PREFIX: &str = "work/deps/";

/// The build container's resources (requests = limits).
pub fn build_resources() -> RunResources {
    RunResources { cpu: BUILD_CPU.into(), memory: BUILD_MEMORY.into(), ephemeral_storage: BUILD_EPHEMERAL.into() }
}

/// Everything [`build_build_job`] needs. Validate with [`BuildParams::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct BuildParams {
    /// The SkillPackage's name (informative label).
    pub package: String,
    /// The Job's and NetworkPolicy's name (`skillbuild-<12 hex>`).
    pub name: String,
    /// The UID the artifact endpoint files this build under (`build-<32 hex>`).
    pub build_uid: String,
    /// Where the build runs (the controller's `--build-namespace`).
    pub namespace: String,
    /// The SkillPackage (controller and blockOwnerDeletion are forced on).
    pub owner: OwnerReference,
    /// The base image, pinned by digest: the build runs in what the image is composed on.
    pub base_image: String,
    /// This project's image (fetch and upload; its binary is copied into `build`).
    pub operator_image: String,
    /// How the kubelet pulls it (see [`super::job::JobParams::operator_pull_policy`]).
    pub operator_pull_policy: Option<String>,
    /// Artifact endpoint base URL (an IP literal or a `host_aliases` name).
    pub artifact_endpoint: String,
    /// Secret holding the per-build token under key `token`.
    pub token_secret: String,
    /// A ServiceAccount without RBAC (its token is never mounted anyway).
    pub service_account: String,
    pub run_as_user: i64,
    pub run_as_group: i64,
    /// The launcher's limit (1..=[`BUILD_TIMEOUT_SECS`]).
    pub timeout_secs: u32,
    pub resources: RunResources,
    /// pip `--index-url` (a PEP 503 simple index).
    pub pip_index_url: Option<String>,
    /// npm `--registry`.
    pub npm_registry: Option<String>,
    /// host → IP entries for /etc/hosts (the artifact endpoint's and the indexes' names).
    pub host_aliases: BTreeMap<String, String>,
    pub image_pull_secrets: Vec<String>,
}

impl Default for BuildParams {
    /// Defaults for the optional knobs; the identifying fields are empty and fail validation.
    fn default() -> Self {
        BuildParams {
            package: String::new(),
            name: String::new(),
            build_uid: String::new(),
            namespace: String::new(),
            owner: OwnerReference::default(),
            base_image: String::new(),
            operator_image: String::new(),
            operator_pull_policy: None,
            artifact_endpoint: String::new(),
            token_secret: String::new(),
            service_account: String::new(),
            run_as_user: super::job::DEFAULT_RUN_AS,
            run_as_group: super::job::DEFAULT_RUN_AS,
            timeout_secs: BUILD_TIMEOUT_SECS as u32,
            resources: build_resources(),
            pip_index_url: None,
            npm_registry: None,
            host_aliases: BTreeMap::new(),
            image_pull_secrets: Vec::new(),
        }
    }
}

impl BuildParams {
    /// Checks every rule the builders rely on; they never fail themselves.
    pub fn validate(&self) -> Result<()> {
        require_subdomain("package", &self.package)?;
        require_label_name("name", &self.name)?;
        require_label_name("namespace", &self.namespace)?;
        crate::artifacts::check_uid(&self.build_uid).map_err(|_| Error::InvalidUid(self.build_uid.clone()))?;
        if self.owner.kind != "SkillPackage"
            || self.owner.name != self.package
            || self.owner.uid.is_empty()
            || self.owner.api_version.is_empty()
        {
            return Err(Error::OwnerMismatch {
                name: self.package.clone(),
                uid: self.owner.uid.clone(),
                problem: format!("owner is {} {:?}; a build is owned by its SkillPackage", self.owner.kind, self.owner.name),
            });
        }
        for (field, image) in [("base_image", &self.base_image), ("operator_image", &self.operator_image)] {
            if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(Error::InvalidImage { field, value: image.clone() });
            }
        }
        if !self.base_image.contains("@sha256:") {
            return Err(Error::InvalidImage {
                field: "base_image",
                value: format!("{} (the build runs in the base pinned by digest: the image is composed on exactly that)", self.base_image),
            });
        }
        if self.timeout_secs == 0 || u64::from(self.timeout_secs) > BUILD_TIMEOUT_SECS {
            return Err(Error::InvalidTimeout(self.timeout_secs));
        }
        require_quantity("resources.cpu", &self.resources.cpu)?;
        require_quantity("resources.memory", &self.resources.memory)?;
        require_quantity("resources.ephemeral_storage", &self.resources.ephemeral_storage)?;
        require_subdomain("token_secret", &self.token_secret)?;
        require_subdomain("service_account", &self.service_account)?;
        for name in &self.image_pull_secrets {
            require_subdomain("image_pull_secrets", name)?;
        }
        if self.run_as_user <= 0 {
            return Err(Error::RootId { field: "run_as_user", value: self.run_as_user });
        }
        if self.run_as_group <= 0 {
            return Err(Error::RootId { field: "run_as_group", value: self.run_as_group });
        }
        for (host, ip) in &self.host_aliases {
            if !super::is_dns1123_subdomain(host) {
                return Err(Error::InvalidName { field: "host_aliases", value: host.clone(), kind: "host name" });
            }
            if !is_ip_literal(ip) {
                return Err(Error::InvalidName { field: "host_aliases", value: ip.clone(), kind: "IP address" });
            }
        }
        self.reachable("artifact_endpoint", &self.artifact_endpoint)?;
        if self.pip_index_url.is_none() && self.npm_registry.is_none() {
            return Err(Error::Missing { field: "pip_index_url or npm_registry" });
        }
        for (field, url) in [("pip_index_url", &self.pip_index_url), ("npm_registry", &self.npm_registry)] {
            if let Some(url) = url {
                self.reachable(field, url)?;
            }
        }
        Ok(())
    }

    /// The pod has no DNS: every host it talks to is an IP or a hosts entry.
    fn reachable(&self, field: &'static str, url: &str) -> Result<()> {
        let (_, host) = url_host(field, url)?;
        if is_ip_literal(&host) || self.host_aliases.contains_key(&host) {
            Ok(())
        } else {
            Err(Error::NeedsDns { field, host })
        }
    }
}

/// Labels of the build Job, its pod and its NetworkPolicy.
pub fn build_labels(name: &str, package: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_BUILD.to_string(), name.to_string()),
        (LABEL_PACKAGE.to_string(), label_value(package)),
    ])
}

/// Builds the Job. Never fails; see [`BuildParams::validate`].
pub fn build_build_job(p: &BuildParams) -> Job {
    let labels = build_labels(&p.name, &p.package);
    let owner = OwnerReference { controller: Some(true), block_owner_deletion: Some(true), ..p.owner.clone() };
    Job {
        metadata: ObjectMeta {
            name: Some(p.name.clone()),
            namespace: Some(p.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            // A failed install is a fact about the inputs: never retried by the Job.
            backoff_limit: Some(0),
            completions: Some(1),
            parallelism: Some(1),
            active_deadline_seconds: Some(i64::from(p.timeout_secs) + DEADLINE_SLACK_SECS),
            ttl_seconds_after_finished: Some(BUILD_TTL_SECS),
            pod_failure_policy: Some(super::job::pod_failure_policy(CONTAINER_BUILD)),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: Some(BTreeMap::from([(
                        "kubectl.kubernetes.io/default-container".to_string(),
                        CONTAINER_BUILD.to_string(),
                    )])),
                    ..Default::default()
                }),
                spec: Some(pod_spec(p)),
            },
            ..Default::default()
        }),
        status: None,
    }
}

fn pod_spec(p: &BuildParams) -> PodSpec {
    // No DNS (a tunnel): the indexes and the endpoint are hosts entries or IPs.
    hardened_pod_spec(PodShape {
        init_containers: vec![fetch_container(p), upload_container(p)],
        containers: vec![build_container(p)],
        volumes: volumes(p),
        service_account: &p.service_account,
        run_as_user: p.run_as_user,
        run_as_group: p.run_as_group,
        allow_dns: false,
        host_aliases: &p.host_aliases,
        image_pull_secrets: &p.image_pull_secrets,
    })
}

fn helper(p: &BuildParams, name: &str, sub: &str, rest: &[&str], mounts: Vec<k8s_openapi::api::core::v1::VolumeMount>) -> Container {
    let head = [OPERATOR_BIN, sub, "--endpoint", &p.artifact_endpoint, "--namespace", &p.namespace, "--job", &p.build_uid];
    Container {
        name: name.into(),
        image: Some(p.operator_image.clone()),
        image_pull_policy: Some(super::job::operator_pull_policy(&p.operator_image, p.operator_pull_policy.as_deref())),
        command: Some(head.iter().chain(rest).map(|s| s.to_string()).collect()),
        volume_mounts: Some(mounts),
        security_context: Some(restricted_security(p.run_as_user, p.run_as_group)),
        resources: Some(guaranteed(super::job::HELPER_CPU, super::job::HELPER_MEMORY, super::job::HELPER_EPHEMERAL)),
        termination_message_path: Some(TERMINATION_MESSAGE_PATH.into()),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

fn fetch_container(p: &BuildParams) -> Container {
    helper(
        p,
        CONTAINER_FETCH,
        "fetch",
        &["--package", PACKAGE_DIR, "--work", WORK_DIR, "--token-file", TOKEN_FILE, "--tools", TOOLS_DIR],
        vec![
            mount(VOL_PACKAGE, PACKAGE_DIR, false),
            mount(VOL_WORK, WORK_DIR, false),
            mount(VOL_TOOLS, TOOLS_DIR, false),
            mount(VOL_TOKEN, TOKEN_DIR, true),
        ],
    )
}

fn upload_container(p: &BuildParams) -> Container {
    Container {
        restart_policy: Some("Always".into()),
        ..helper(
            p,
            CONTAINER_UPLOAD,
            "upload",
            &["--work", WORK_DIR, "--result", RESULT_FILE, "--token-file", TOKEN_FILE],
            // The result volume is the sidecar's alone (see job.rs).
            vec![mount(VOL_WORK, WORK_DIR, true), mount(VOL_RESULT, RESULT_DIR, false), mount(VOL_TOKEN, TOKEN_DIR, true)],
        )
    }
}

/// `image deps` with the configured indexes (and `--trusted-host` for a
/// plain-HTTP pip index, which pip ignores otherwise).
pub fn deps_command(p: &BuildParams) -> Vec<String> {
    let mut cmd: Vec<String> = [LAUNCHER, "image", "deps", "--package", PACKAGE_DIR, "--out", DEPS_OUT, "--report", DEPS_REPORT]
        .iter()
        .map(|s| s.to_string())
        .collect();
    cmd.push("--refuse-lifecycle-scripts".into());
    if let Some(url) = &p.pip_index_url {
        cmd.extend(["--index-url".into(), url.clone()]);
        match url_host("pip_index_url", url) {
            Ok((scheme, host)) if scheme == "http" => cmd.extend(["--trusted-host".into(), host]),
            _ => {}
        }
    }
    if let Some(url) = &p.npm_registry {
        cmd.extend(["--npm-registry".into(), url.clone()]);
    }
    cmd
}

fn build_container(p: &BuildParams) -> Container {
    let plain = |name: &str, value: &str| EnvVar { name: name.into(), value: Some(value.into()), value_from: None };
    let env = vec![plain("HOME", TMP_DIR), plain("TMPDIR", TMP_DIR), plain("PATH", RUN_PATH)];
    let mut command: Vec<String> = [LAUNCHER, "launch", "--timeout", &p.timeout_secs.to_string()].iter().map(|s| s.to_string()).collect();
    for var in &env {
        command.extend(["--allow-env".to_string(), var.name.clone()]);
    }
    command.push("--".into());
    command.extend(deps_command(p));
    Container {
        name: CONTAINER_BUILD.into(),
        image: Some(p.base_image.clone()),
        image_pull_policy: Some(pull_policy(&p.base_image)),
        command: Some(command),
        working_dir: Some(WORK_DIR.into()),
        env: Some(env),
        volume_mounts: Some(vec![
            mount(VOL_PACKAGE, PACKAGE_DIR, true),
            mount(VOL_WORK, WORK_DIR, false),
            mount(VOL_TMP, TMP_DIR, false),
            mount(VOL_TOOLS, TOOLS_DIR, true),
        ]),
        security_context: Some(restricted_security(p.run_as_user, p.run_as_group)),
        resources: Some(guaranteed(&p.resources.cpu, &p.resources.memory, &p.resources.ephemeral_storage)),
        termination_message_path: Some(TERMINATION_MESSAGE_PATH.into()),
        termination_message_policy: Some("File".into()),
        ..Default::default()
    }
}

fn volumes(p: &BuildParams) -> Vec<Volume> {
    vec![
        empty_dir(VOL_PACKAGE, SIZE_PACKAGE),
        empty_dir(VOL_WORK, &p.resources.ephemeral_storage),
        empty_dir(VOL_TMP, SIZE_TMP),
        empty_dir(VOL_RESULT, SIZE_RESULT),
        empty_dir(VOL_TOOLS, SIZE_TOOLS),
        Volume {
            name: VOL_TOKEN.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(p.token_secret.clone()),
                items: Some(vec![KeyToPath { key: TOKEN_KEY.into(), path: TOKEN_KEY.into(), ..Default::default() }]),
                default_mode: Some(0o440),
                optional: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        },
    ]
}

/// A package index the build may reach: an address and a TCP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexAddress {
    pub ip: IpAddr,
    pub port: u16,
}

/// Everything [`build_network_policy`] needs.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildNetPolParams {
    /// The build's name (the policy's name and its pod selector).
    pub name: String,
    pub namespace: String,
    pub package: String,
    /// The build Job (the policy goes with it).
    pub owner: OwnerReference,
    /// The artifact endpoint pods.
    pub artifact: Peer,
    /// The indexes, by the address the controller resolved.
    pub indexes: Vec<IndexAddress>,
}

impl BuildNetPolParams {
    pub fn validate(&self) -> Result<()> {
        require_label_name("name", &self.name)?;
        require_label_name("namespace", &self.namespace)?;
        require_subdomain("package", &self.package)?;
        if self.owner.kind != "Job" || self.owner.name != self.name || self.owner.uid.is_empty() {
            return Err(Error::OwnerMismatch {
                name: self.name.clone(),
                uid: self.owner.uid.clone(),
                problem: format!("owner is {} {:?}; the policy is owned by its build Job", self.owner.kind, self.owner.name),
            });
        }
        if let Some(problem) = self.artifact.problem() {
            return Err(Error::InvalidPeer { field: "artifact", problem });
        }
        if self.indexes.is_empty() {
            return Err(Error::InvalidPeer { field: "indexes", problem: "no index: a build with nothing to reach has nothing to install" });
        }
        for i in &self.indexes {
            if i.port == 0 || i.ip.is_unspecified() {
                return Err(Error::InvalidPeer { field: "indexes", problem: "an index address is unspecified or has port 0" });
            }
        }
        Ok(())
    }
}

/// Deny all, then egress to the artifact endpoint and to each index
/// address on its port. Never fails; see [`BuildNetPolParams::validate`].
pub fn build_network_policy(p: &BuildNetPolParams) -> NetworkPolicy {
    let tcp = |port: i32| NetworkPolicyPort { protocol: Some("TCP".into()), port: Some(IntOrString::Int(port)), end_port: None };
    let mut egress = Vec::new();
    if p.artifact.problem().is_none() {
        egress.push(NetworkPolicyEgressRule { to: Some(vec![p.artifact.to_peer()]), ports: Some(vec![tcp(p.artifact.port)]) });
    }
    for i in &p.indexes {
        let cidr = match i.ip {
            IpAddr::V4(a) => format!("{a}/32"),
            IpAddr::V6(a) => format!("{a}/128"),
        };
        egress.push(NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer { ip_block: Some(IPBlock { cidr, except: None }), ..Default::default() }]),
            ports: Some(vec![tcp(i32::from(i.port))]),
        });
    }
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(p.name.clone()),
            namespace: Some(p.namespace.clone()),
            labels: Some(build_labels(&p.name, &p.package)),
            owner_references: Some(vec![OwnerReference { controller: Some(true), block_owner_deletion: Some(false), ..p.owner.clone() }]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(LABEL_BUILD.to_string(), p.name.clone())])),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(Vec::new()),
            egress: Some(egress),
        }),
    }
}
