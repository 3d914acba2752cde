//! The SkillJob's batch/v1 Job.
//!
//! Pod shape (argoexec-style: the run image needs nothing of ours):
//!
//! ```text
//! initContainers:
//!   fetch   (operator image)  skill-operator fetch  --endpoint URL --job UID --package /package --work /work
//!                                                    --token-file /var/run/skill-operator/token --tools /tools
//!           rw: package, work, tools; ro: token.  Downloads the package and inputs and copies its own
//!           binary to /tools/skill-operator.
//!   upload  (operator image, restartPolicy Always = native sidecar)
//!                             skill-operator upload --endpoint URL --job UID --work /work --result /result/result.json
//!                                                    --token-file /var/run/skill-operator/token
//!           ro: work, token; rw: result (its own).  Listens on the verdict channel (an abstract socket),
//!           takes the launcher's one connection, writes the verdict it sends into /result, uploads
//!           outputs, stdout/stderr and the result, writes a digest to /dev/termination-log
//!           (terminationMessagePolicy File, ≤ 4 KiB).
//! containers:
//!   run     (run image)       /tools/skill-operator launch --timeout SECS
//!                                    --allow-env NAME ... -- INTERPRETER /package/SCRIPT ARGS...
//!           ro: package, tools; rw: work (workingDir), tmp.  No token, no SA token, no result
//!           volume: the verdict goes over the channel ([`crate::artifacts::verdict`]).
//! ```
//!
//! The token is the pod's own projected ServiceAccount token, with the
//! artifact endpoint's audience for this job ([`crate::artifacts::pod_token_audience`]):
//! the endpoint verifies it by TokenReview, the API server refuses it (not
//! its audience), and it stops being valid when the pod is deleted.
//!
//! A prepared package ([`PackageDelivery`]) changes three things and
//! nothing else: fetch gets no `--package` (it still fetches the inputs and
//! copies the launcher), the script runs from `/skill` instead of
//! `/package`, and the dependencies' variables reach the launcher:
//! - `InImage`: `run` starts from the prepared image by digest, which holds
//!   `/skill` and `/deps` and sets `PYTHONPATH`/`NODE_PATH` in its config;
//!   the launcher passes those names through (`--allow-env`), the values
//!   come from the image.
//! - `ImageVolume`: `run` starts from the unmodified base by digest; the
//!   prepared image is an image volume (`volumes[].image`, allowed by
//!   restricted Pod Security since 1.33) mounted read-only twice, with
//!   `subPath: skill` at `/skill` and `subPath: deps` at `/deps`; the pod
//!   sets the variables itself.
//!
//! Only `PYTHONPATH=/deps/python` and `NODE_PATH=/deps/node/node_modules`
//! are accepted there ([`JobParams::validate`]): a value pointing at
//! `/work` would let an input file be imported as code.
//!
//! fetch and upload get no /tmp and no env: with a read-only root they must
//! write only under their mounts. The operator binary must be on the
//! operator image's PATH as `skill-operator`.
//!
//! The launcher applies the fence (argv only, env allowlist, timeout with a
//! process-group kill, 1 MiB per stream) and writes the result; the
//! `--allow-env` list is exactly the variables this builder sets, because the
//! container also inherits the image's `ENV` and Kubernetes' own
//! `KUBERNETES_SERVICE_*` variables (injected even with enableServiceLinks
//! false).
//!
//! Decisions (see the constants for values):
//! - Every container runs as the same non-root uid/gid with a read-only root
//!   filesystem, no privilege escalation, all capabilities dropped and the
//!   runtime's default seccomp profile; requests == limits everywhere.
//! - Resources: `run` gets the SkillJob's quantities (default 1 CPU / 512Mi /
//!   1Gi ephemeral). fetch and upload get 100m / 128Mi / 512Mi: 128Mi because
//!   they stream packages of up to 16 MiB and TLS, 512Mi ephemeral because the
//!   fixed-size volumes (package 256Mi + tools 128Mi + tmp 64Mi + result 16Mi
//!   = 464Mi) must fit in the pod's ephemeral budget (the sum of container
//!   limits) next to `work`, which is sized by `run`'s ephemeral quantity.
//! - activeDeadlineSeconds = timeout + [`DEADLINE_SLACK_SECS`] (180 s): the
//!   deadline runs from Job start, so it has to cover scheduling, two image
//!   pulls, fetch, the launcher's own kill/drain (≈ 3.3 s after the timeout)
//!   and the upload. It is a backstop; the launcher enforces the real timeout.
//! - terminationGracePeriodSeconds = [`TERMINATION_GRACE_SECS`] (30 s, not 5):
//!   when `run` exits the kubelet SIGTERMs the upload sidecar, and the grace
//!   period is all the time it has left to finish uploading.
//! - DNS: unless `allow_dns`, the pod gets `dnsPolicy: None` with a resolver
//!   of 127.0.0.1, so lookups fail at once instead of timing out against the
//!   blocked cluster DNS (DNS is a tunnel). The artifact endpoint and the
//!   egress proxy are therefore addressed by IP literal (the Service's
//!   ClusterIP) or through `host_aliases` (/etc/hosts); [`JobParams::validate`]
//!   enforces that.
//! - Image pull policy: `IfNotPresent` for digest-pinned references,
//!   `Always` for tags (tags move).
//! - Name: `skilljob-` + the first 12 hex digits of the SkillJob UID (21
//!   chars, DNS-1123). Labels: managed-by, skilljob (name, shortened to a
//!   label value when needed), skilljob-uid (what selectors use).

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{
    Job, JobSpec, PodFailurePolicy, PodFailurePolicyOnExitCodesRequirement, PodFailurePolicyOnPodConditionsPattern, PodFailurePolicyRule,
};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, HostAlias, ImageVolumeSource, LocalObjectReference, PodDNSConfig,
    PodOS, PodSecurityContext, PodSpec, PodTemplateSpec, ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::{
    is_ip_literal, label_value, require_label_name, require_quantity, require_subdomain, uid_hex, url_host, validate_labels, Error, Result,
    LABEL_MANAGED_BY, LABEL_SKILLJOB, LABEL_SKILLJOB_UID, MANAGED_BY,
};

/// Upper bound for a SkillJob timeout: the project's one hard ceiling.
pub const MAX_TIMEOUT_SECS: u32 = crate::core::limits::MAX_TIMEOUT_SECS as u32;
/// Added to the timeout for activeDeadlineSeconds (scheduling, image pulls,
/// fetch, launcher kill/drain, upload).
pub const DEADLINE_SLACK_SECS: i64 = 180;
/// ttlSecondsAfterFinished: backstop garbage collection; the controller
/// normally deletes the Job once it has recorded the result.
pub const TTL_AFTER_FINISHED_SECS: i32 = 3600;
/// Pod terminationGracePeriodSeconds: the upload sidecar's budget after `run` exits.
pub const TERMINATION_GRACE_SECS: i64 = 30;
/// The sidecar retries an unreachable endpoint for its patience, and its
/// last attempt still needs time to send the outputs before the kubelet's
/// SIGKILL.
const _: () = assert!(crate::artifacts::client::ENDPOINT_PATIENCE.as_secs() as i64 + 10 <= TERMINATION_GRACE_SECS);
/// Default run-as uid and gid (distroless "nonroot").
pub const DEFAULT_RUN_AS: i64 = 65532;
pub use crate::core::limits::{MAX_ARGS, MAX_ARG_BYTES};

/// Container names. `run` is also named by the podFailurePolicy.
pub const CONTAINER_FETCH: &str = "fetch";
pub const CONTAINER_UPLOAD: &str = "upload";
pub const CONTAINER_RUN: &str = "run";

/// The operator binary as found on the operator image's PATH.
pub const OPERATOR_BIN: &str = "skill-operator";
/// Where fetch copies the operator binary for `run` (the `tools` volume).
pub const TOOLS_DIR: &str = "/tools";
pub const LAUNCHER: &str = "/tools/skill-operator";
pub const PACKAGE_DIR: &str = "/package";
pub const WORK_DIR: &str = "/work";
pub const TMP_DIR: &str = "/tmp";
pub const RESULT_DIR: &str = "/result";
/// Where a prepared package is (in the image, or the image volume's `skill`).
pub const SKILL_DIR: &str = "/skill";
/// Where prepared dependencies are (the image volume's `deps`).
pub const DEPS_DIR: &str = "/deps";
pub const RESULT_FILE: &str = "/result/result.json";
pub const TOKEN_DIR: &str = "/var/run/skill-operator";
pub const TOKEN_FILE: &str = "/var/run/skill-operator/token";
/// The token's file name inside its volume.
pub const TOKEN_KEY: &str = "token";
pub const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// Volume names.
pub const VOL_PACKAGE: &str = "package";
pub const VOL_WORK: &str = "work";
pub const VOL_TMP: &str = "tmp";
pub const VOL_RESULT: &str = "result";
pub const VOL_TOOLS: &str = "tools";
pub const VOL_TOKEN: &str = "token";
/// The prepared image as an image volume.
pub const VOL_PREPARED: &str = "prepared";

/// emptyDir size limits (work is sized by the run's ephemeral quantity).
pub const SIZE_PACKAGE: &str = "256Mi";
pub const SIZE_TMP: &str = "64Mi";
pub const SIZE_RESULT: &str = "16Mi";
pub const SIZE_TOOLS: &str = "128Mi";

/// fetch/upload resources (requests == limits).
pub const HELPER_CPU: &str = "100m";
pub const HELPER_MEMORY: &str = "128Mi";
pub const HELPER_EPHEMERAL: &str = "512Mi";

/// The run container's fixed PATH.
pub const RUN_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Env names a grant may not use: the project's one list ([`crate::core::env`]),
/// which covers what this builder sets itself and every loader injector.
pub use crate::core::env::is_reserved as is_reserved_env;

/// One granted environment variable, delivered only through `secretKeyRef`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvGrant {
    /// Variable name in the script's environment.
    pub name: String,
    /// Secret (in the SkillJob's namespace) holding the value.
    pub secret_name: String,
    /// Key inside that Secret.
    pub secret_key: String,
}

impl<N: Into<String>, S: Into<String>, K: Into<String>> From<(N, S, K)> for EnvGrant {
    fn from((name, secret_name, secret_key): (N, S, K)) -> Self {
        Self { name: name.into(), secret_name: secret_name.into(), secret_key: secret_key.into() }
    }
}

/// The run container's resources; requests and limits are both set to these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunResources {
    /// CPU quantity (default `1`).
    pub cpu: String,
    /// Memory quantity (default `512Mi`).
    pub memory: String,
    /// Ephemeral storage (default `1Gi`); also the `work` emptyDir's sizeLimit.
    pub ephemeral_storage: String,
}

impl Default for RunResources {
    fn default() -> Self {
        Self { cpu: "1".into(), memory: "512Mi".into(), ephemeral_storage: "1Gi".into() }
    }
}

/// How the package reaches the run (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PackageDelivery {
    /// `fetch` downloads the package into `/package` at every run.
    #[default]
    Fetched,
    /// `run_image` is the prepared image (digest-pinned) holding `/skill`;
    /// `env` names the variables its config sets for the dependencies.
    InImage { env: Vec<String> },
    /// `run_image` is the unmodified base; `reference` (digest-pinned) is
    /// mounted read-only at `/skill` (and at `/deps` when `deps`); `env`
    /// sets the dependencies' variables.
    ImageVolume { reference: String, deps: bool, env: Vec<(String, String)> },
}

/// The variables a prepared dependency tree may set, with the only values
/// they may have.
pub const PREPARED_ENV: [(&str, &str); 2] = [("PYTHONPATH", crate::image::deps::PYTHON_PATH), ("NODE_PATH", crate::image::deps::NODE_PATH)];

/// Everything [`build_job`] needs. Plain data; validate with [`JobParams::validate`].
#[derive(Debug, Clone, PartialEq)]
pub struct JobParams {
    /// The SkillJob's name.
    pub skilljob_name: String,
    /// The SkillJob's namespace (the Job goes there too).
    pub namespace: String,
    /// The SkillJob's UID; the Job name and the pod selector derive from it.
    pub skilljob_uid: String,
    /// Reference to the SkillJob; the builder forces controller=true and
    /// blockOwnerDeletion=true.
    pub owner: OwnerReference,
    /// Image the script runs in (digest-pinned preferred).
    pub run_image: String,
    /// This project's own image (fetch and upload; its binary is copied into `run`).
    pub operator_image: String,
    /// How the kubelet pulls it (`None`: [`pull_policy`]'s rule); the
    /// operator's own pods' policy, so a loaded image is never pulled.
    pub operator_pull_policy: Option<String>,
    /// Absolute interpreter path in the run image, e.g. `/usr/bin/python3`.
    pub interpreter: String,
    /// Script path relative to the package root, e.g. `scripts/report.py`.
    pub script: String,
    /// Script arguments, one argv entry each (never through a shell).
    pub args: Vec<String>,
    /// Granted env vars, each from a Secret key.
    pub env: Vec<EnvGrant>,
    /// Script timeout enforced by the launcher (1..=MAX_TIMEOUT_SECS).
    pub timeout_secs: u32,
    /// Run container quantities.
    pub resources: RunResources,
    /// Artifact endpoint base URL (operator's artifact service). Its host must
    /// be an IP literal or appear in `host_aliases` unless `allow_dns`.
    pub artifact_endpoint: String,
    /// Dedicated ServiceAccount without RBAC (its token is never mounted anyway).
    pub service_account: String,
    /// uid for every container (non-zero; default 65532).
    pub run_as_user: i64,
    /// gid and fsGroup for every container (non-zero; default 65532).
    pub run_as_group: i64,
    /// Extra labels for the Job and its pods (reserved keys refused).
    pub labels: BTreeMap<String, String>,
    /// Egress proxy URL when the skill was granted egress hosts; sets
    /// HTTP(S)_PROXY for `run`. `None`: no proxy, no egress.
    pub egress_proxy: Option<String>,
    /// Give the pod cluster DNS (`dnsPolicy: ClusterFirst`). Off by default:
    /// DNS is a tunnel; the NetworkPolicy must allow it too for it to work.
    pub allow_dns: bool,
    /// host name → IP entries written to the pod's /etc/hosts, so endpoints
    /// can be named (TLS) without DNS.
    pub host_aliases: BTreeMap<String, String>,
    /// imagePullSecrets for the run and operator images.
    pub image_pull_secrets: Vec<String>,
    /// Fetched at every run (default), or prepared.
    pub delivery: PackageDelivery,
    /// A fetched package staged once for the whole namespace, by its pinned
    /// digest (`sha256:<hex>`): fetch asks for that copy, and the Job says
    /// which it is ([`ANNOTATION_PACKAGE_DIGEST`]) so the sweep of staged
    /// packages keeps it while the Job lives. `None`: the job's own copy.
    pub staged_package: Option<String>,
}

/// On a run Job: the namespace's staged package its pod fetches.
pub const ANNOTATION_PACKAGE_DIGEST: &str = "skill-operator.dev/package-digest";

impl Default for JobParams {
    /// Defaults for the optional knobs; the identifying fields are empty and
    /// fail validation until set.
    fn default() -> Self {
        Self {
            skilljob_name: String::new(),
            namespace: String::new(),
            skilljob_uid: String::new(),
            owner: OwnerReference::default(),
            run_image: String::new(),
            operator_image: String::new(),
            operator_pull_policy: None,
            interpreter: String::new(),
            script: String::new(),
            args: Vec::new(),
            env: Vec::new(),
            timeout_secs: 60,
            resources: RunResources::default(),
            artifact_endpoint: String::new(),
            service_account: String::new(),
            run_as_user: DEFAULT_RUN_AS,
            run_as_group: DEFAULT_RUN_AS,
            labels: BTreeMap::new(),
            egress_proxy: None,
            allow_dns: false,
            host_aliases: BTreeMap::new(),
            image_pull_secrets: Vec::new(),
            delivery: PackageDelivery::Fetched,
            staged_package: None,
        }
    }
}

impl JobParams {
    /// Checks every rule [`build_job`] relies on. `build_job` itself never
    /// fails; call this first and put the error in the SkillJob's status.
    pub fn validate(&self) -> Result<()> {
        self.validate_identity()?;
        self.validate_run()?;
        self.validate_shape()
    }

    /// The SkillJob this Job is for, and its owner reference.
    fn validate_identity(&self) -> Result<()> {
        require_subdomain("skilljob_name", &self.skilljob_name)?;
        require_label_name("namespace", &self.namespace)?;
        if uid_hex(&self.skilljob_uid).is_none() {
            return Err(Error::InvalidUid(self.skilljob_uid.clone()));
        }
        let owner_problem = if self.owner.uid != self.skilljob_uid {
            Some(format!("owner uid is {:?}", self.owner.uid))
        } else if self.owner.name != self.skilljob_name {
            Some(format!("owner name is {:?}", self.owner.name))
        } else if self.owner.kind != "SkillJob" {
            Some(format!("owner kind is {:?}", self.owner.kind))
        } else if self.owner.api_version.is_empty() {
            Some("owner apiVersion is empty".to_string())
        } else {
            None
        };
        if let Some(problem) = owner_problem {
            return Err(Error::OwnerMismatch { name: self.skilljob_name.clone(), uid: self.skilljob_uid.clone(), problem });
        }
        Ok(())
    }

    /// What one run asks for: its interpreter, script, arguments, timeout and granted variables.
    fn validate_run(&self) -> Result<()> {
        if !self.interpreter.starts_with('/') || self.interpreter.contains('\0') || self.interpreter.len() > 1024 {
            return Err(Error::InvalidInterpreter(self.interpreter.clone()));
        }
        if !is_package_relative(&self.script) {
            return Err(Error::InvalidScript(self.script.clone()));
        }
        if self.args.len() > MAX_ARGS {
            return Err(Error::InvalidArgs(format!("{} arguments, at most {MAX_ARGS}", self.args.len())));
        }
        let bytes: usize = self.args.iter().map(String::len).sum();
        if bytes > MAX_ARG_BYTES {
            return Err(Error::InvalidArgs(format!("{bytes} bytes, at most {MAX_ARG_BYTES}")));
        }
        if self.args.iter().any(|a| a.contains('\0')) {
            return Err(Error::InvalidArgs("an argument contains a NUL byte".into()));
        }
        if self.timeout_secs == 0 || self.timeout_secs > MAX_TIMEOUT_SECS {
            return Err(Error::InvalidTimeout(self.timeout_secs));
        }
        let mut seen = std::collections::BTreeSet::new();
        for grant in &self.env {
            let bad = |problem| Err(Error::InvalidEnv { name: grant.name.clone(), problem });
            if !is_env_name(&grant.name) {
                return bad("must match [A-Za-z_][A-Za-z0-9_]*");
            }
            if is_reserved_env(&grant.name) {
                return bad("is reserved");
            }
            if !seen.insert(grant.name.as_str()) {
                return bad("is granted twice");
            }
            if !super::is_dns1123_subdomain(&grant.secret_name) {
                return bad("secret name is not a DNS-1123 subdomain");
            }
            if !is_secret_key(&grant.secret_key) {
                return bad("secret key must be 1-253 chars of [-._a-zA-Z0-9]");
            }
        }
        Ok(())
    }

    /// The pod's shape, which a warm pod shares with a run's: images,
    /// quantities, identity on the node, names it may reach, delivery.
    pub(super) fn validate_shape(&self) -> Result<()> {
        require_label_name("namespace", &self.namespace)?;
        for (field, image) in [("run_image", &self.run_image), ("operator_image", &self.operator_image)] {
            if image.is_empty() || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(Error::InvalidImage { field, value: image.clone() });
            }
        }
        if let Some(policy) = &self.operator_pull_policy {
            if !PULL_POLICIES.contains(&policy.as_str()) {
                return Err(Error::InvalidImage { field: "operator_pull_policy", value: policy.clone() });
            }
        }
        require_quantity("resources.cpu", &self.resources.cpu)?;
        require_quantity("resources.memory", &self.resources.memory)?;
        require_quantity("resources.ephemeral_storage", &self.resources.ephemeral_storage)?;
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
        validate_labels(&self.labels)?;
        for (host, ip) in &self.host_aliases {
            if !super::is_dns1123_subdomain(host) {
                return Err(Error::InvalidName { field: "host_aliases", value: host.clone(), kind: "host name" });
            }
            if !is_ip_literal(ip) {
                return Err(Error::InvalidName { field: "host_aliases", value: ip.clone(), kind: "IP address" });
            }
        }
        self.check_endpoint("artifact_endpoint", &self.artifact_endpoint)?;
        if let Some(proxy) = &self.egress_proxy {
            self.check_endpoint("egress_proxy", proxy)?;
        }
        self.check_delivery()
    }

    /// A prepared package runs by digest, with only the dependency
    /// variables the builder knows, at their fixed values.
    fn check_delivery(&self) -> Result<()> {
        let pinned = |field: &'static str, image: &str| {
            if image.contains("@sha256:") {
                Ok(())
            } else {
                Err(Error::InvalidImage { field, value: format!("{image} (a prepared package runs by digest: image@sha256:…)") })
            }
        };
        let known = |name: &str| PREPARED_ENV.iter().any(|(n, _)| *n == name);
        if let Some(digest) = &self.staged_package {
            if self.delivery != PackageDelivery::Fetched {
                let problem = "a prepared image holds its package: nothing is staged for it";
                return Err(Error::InvalidStagedPackage { value: digest.clone(), problem });
            }
            if crate::artifacts::namespace_package_tag(&self.namespace, digest).is_none() {
                return Err(Error::InvalidStagedPackage {
                    value: digest.clone(),
                    problem: "must be a package digest, sha256:<64 lowercase hex>",
                });
            }
        }
        match &self.delivery {
            PackageDelivery::Fetched => Ok(()),
            PackageDelivery::InImage { env } => {
                pinned("run_image", &self.run_image)?;
                for name in env {
                    if !known(name) {
                        return Err(Error::InvalidEnv { name: name.clone(), problem: "is not a prepared dependency variable" });
                    }
                }
                Ok(())
            }
            PackageDelivery::ImageVolume { reference, env, .. } => {
                pinned("run_image", &self.run_image)?;
                if reference.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(Error::InvalidImage { field: "delivery.reference", value: reference.clone() });
                }
                pinned("delivery.reference", reference)?;
                for (name, value) in env {
                    if !PREPARED_ENV.iter().any(|(n, v)| n == name && v == value) {
                        return Err(Error::InvalidEnv {
                            name: name.clone(),
                            problem: "is not a prepared dependency variable at its fixed value",
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// Where the script's package is in the `run` container.
    fn package_root(&self) -> &'static str {
        match self.delivery {
            PackageDelivery::Fetched => PACKAGE_DIR,
            _ => SKILL_DIR,
        }
    }

    fn check_endpoint(&self, field: &'static str, url: &str) -> Result<()> {
        let (_, host) = url_host(field, url)?;
        if self.allow_dns || is_ip_literal(&host) || self.host_aliases.contains_key(&host) {
            Ok(())
        } else {
            Err(Error::NeedsDns { field, host })
        }
    }
}

fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_') && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn is_secret_key(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s != "."
        && s != ".."
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Relative, normalised, inside the package: no leading '/', no empty, `.`
/// or `..` segments, no NUL, ≤ 1024 bytes.
fn is_package_relative(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 1024
        && !path.contains('\0')
        && !path.starts_with('/')
        && path.split('/').all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// The Job's name: `skilljob-` + the first 12 hex digits of the UID (dashes
/// removed, lowercased). 21 characters, a DNS-1123 label. Falls back to the
/// sanitised UID when it is not hex (validation refuses that case).
pub fn job_name(skilljob_uid: &str) -> String {
    let hex = uid_hex(skilljob_uid)
        .unwrap_or_else(|| skilljob_uid.chars().filter(|c| c.is_ascii_alphanumeric()).map(|c| c.to_ascii_lowercase()).collect());
    format!("skilljob-{}", &hex[..hex.len().min(12)])
}

/// The labels that select exactly this SkillJob's pods (the NetworkPolicy's
/// podSelector). Always non-empty.
pub fn pod_selector_labels(skilljob_uid: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_SKILLJOB_UID.to_string(), label_value(skilljob_uid))])
}

/// Labels on the Job and its pods: the caller's, then ours (ours win).
pub(crate) fn object_labels(extra: &BTreeMap<String, String>, skilljob_name: &str, skilljob_uid: &str) -> BTreeMap<String, String> {
    let mut labels = extra.clone();
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    labels.insert(LABEL_SKILLJOB.into(), label_value(skilljob_name));
    labels.extend(pod_selector_labels(skilljob_uid));
    labels
}

/// The owner reference with controller and blockOwnerDeletion forced on.
pub(crate) fn controller_owner(owner: &OwnerReference) -> OwnerReference {
    OwnerReference { controller: Some(true), block_owner_deletion: Some(true), ..owner.clone() }
}

/// Builds the Job. Never fails; see [`JobParams::validate`] for the rules it
/// assumes.
pub fn build_job(p: &JobParams) -> Job {
    let labels = object_labels(&p.labels, &p.skilljob_name, &p.skilljob_uid);
    let mut pod_labels = labels.clone();
    if p.egress_proxy.is_some() {
        pod_labels.insert(super::LABEL_EGRESS.into(), "true".into());
    }
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: Some(BTreeMap::from([("kubectl.kubernetes.io/default-container".to_string(), CONTAINER_RUN.to_string())])),
            ..Default::default()
        }),
        spec: Some(pod_spec(p)),
    };
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&p.skilljob_uid)),
            namespace: Some(p.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![controller_owner(&p.owner)]),
            annotations: p.staged_package.as_ref().map(|d| BTreeMap::from([(ANNOTATION_PACKAGE_DIGEST.to_string(), d.clone())])),
            ..Default::default()
        },
        spec: Some(JobSpec {
            // Tool calls are not idempotent: never retry a failed run.
            backoff_limit: Some(0),
            completions: Some(1),
            parallelism: Some(1),
            active_deadline_seconds: Some(i64::from(p.timeout_secs) + DEADLINE_SLACK_SECS),
            ttl_seconds_after_finished: Some(TTL_AFTER_FINISHED_SECS),
            pod_failure_policy: Some(pod_failure_policy(CONTAINER_RUN)),
            template,
            ..Default::default()
        }),
        status: None,
    }
}

fn pod_spec(p: &JobParams) -> PodSpec {
    run_pod_spec(p, vec![fetch_container(p), upload_container(p)], vec![run_container(p)], volumes(p))
}

/// A run pod's spec around these containers and volumes (a run's, a warm pod's).
pub(super) fn run_pod_spec(p: &JobParams, init_containers: Vec<Container>, containers: Vec<Container>, volumes: Vec<Volume>) -> PodSpec {
    hardened_pod_spec(PodShape {
        init_containers,
        containers,
        volumes,
        service_account: &p.service_account,
        run_as_user: p.run_as_user,
        run_as_group: p.run_as_group,
        allow_dns: p.allow_dns,
        host_aliases: &p.host_aliases,
        image_pull_secrets: &p.image_pull_secrets,
    })
}

/// What differs between the operator's pods (a run's, a build's).
pub(super) struct PodShape<'a> {
    pub init_containers: Vec<Container>,
    pub containers: Vec<Container>,
    pub volumes: Vec<Volume>,
    pub service_account: &'a str,
    pub run_as_user: i64,
    pub run_as_group: i64,
    pub allow_dns: bool,
    pub host_aliases: &'a BTreeMap<String, String>,
    pub image_pull_secrets: &'a [String],
}

/// A pod of the operator's: no service-account token, no service links,
/// no host namespaces, non-root with the runtime's seccomp profile, and
/// no DNS unless allowed (a tunnel): names come as host aliases.
pub(super) fn hardened_pod_spec(s: PodShape<'_>) -> PodSpec {
    PodSpec {
        init_containers: Some(s.init_containers),
        containers: s.containers,
        volumes: Some(s.volumes),
        restart_policy: Some("Never".into()),
        service_account_name: Some(s.service_account.to_string()),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        share_process_namespace: Some(false),
        host_network: Some(false),
        host_pid: Some(false),
        host_ipc: Some(false),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECS),
        os: Some(PodOS { name: "linux".into() }),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(s.run_as_user),
            run_as_group: Some(s.run_as_group),
            fs_group: Some(s.run_as_group),
            seccomp_profile: Some(runtime_default_seccomp()),
            ..Default::default()
        }),
        dns_policy: Some(if s.allow_dns { "ClusterFirst" } else { "None" }.into()),
        dns_config: (!s.allow_dns).then(|| PodDNSConfig {
            // Nothing listens here: lookups fail fast instead of timing out.
            nameservers: Some(vec!["127.0.0.1".into()]),
            ..Default::default()
        }),
        host_aliases: (!s.host_aliases.is_empty()).then(|| host_aliases(s.host_aliases)),
        image_pull_secrets: (!s.image_pull_secrets.is_empty())
            .then(|| s.image_pull_secrets.iter().map(|n| LocalObjectReference { name: n.clone() }).collect()),
        ..Default::default()
    }
}

/// One HostAlias per IP, host names sorted (deterministic output).
pub(super) fn host_aliases(map: &BTreeMap<String, String>) -> Vec<HostAlias> {
    let mut by_ip: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (host, ip) in map {
        by_ip.entry(ip.as_str()).or_default().push(host.clone());
    }
    by_ip.into_iter().map(|(ip, hostnames)| HostAlias { ip: ip.into(), hostnames: Some(hostnames) }).collect()
}

pub(super) fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }
}

/// The locked-down container securityContext shared by all three containers.
fn container_security(p: &JobParams) -> SecurityContext {
    restricted_security(p.run_as_user, p.run_as_group)
}

/// Every restricted field, plus a read-only root (the build Job's too).
pub(super) fn restricted_security(run_as_user: i64, run_as_group: i64) -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(run_as_user),
        run_as_group: Some(run_as_group),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// requests == limits for cpu, memory and ephemeral-storage.
pub(super) fn guaranteed(cpu: &str, memory: &str, ephemeral: &str) -> ResourceRequirements {
    let map = BTreeMap::from([
        ("cpu".to_string(), Quantity(cpu.into())),
        ("ephemeral-storage".to_string(), Quantity(ephemeral.into())),
        ("memory".to_string(), Quantity(memory.into())),
    ]);
    ResourceRequirements { requests: Some(map.clone()), limits: Some(map), claims: None }
}

/// The kubelet's image pull policies.
pub const PULL_POLICIES: [&str; 3] = ["Always", "IfNotPresent", "Never"];

pub(super) fn pull_policy(image: &str) -> String {
    if image.contains("@sha256:") { "IfNotPresent" } else { "Always" }.into()
}

/// The operator image's policy: the one the admin gave the operator's own
/// pods (`--operator-image-pull-policy`), else [`pull_policy`]'s rule.
pub(crate) fn operator_pull_policy(image: &str, given: Option<&str>) -> String {
    given.map_or_else(|| pull_policy(image), str::to_string)
}

pub(super) fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: path.into(), read_only: Some(read_only), ..Default::default() }
}

pub(super) fn helper_container(p: &JobParams, name: &str, command: Vec<String>, mounts: Vec<VolumeMount>) -> Container {
    Container {
        name: name.into(),
        image: Some(p.operator_image.clone()),
        image_pull_policy: Some(operator_pull_policy(&p.operator_image, p.operator_pull_policy.as_deref())),
        command: Some(command),
        volume_mounts: Some(mounts),
        security_context: Some(container_security(p)),
        resources: Some(guaranteed(HELPER_CPU, HELPER_MEMORY, HELPER_EPHEMERAL)),
        termination_message_path: Some(TERMINATION_MESSAGE_PATH.into()),
        // The helpers write their error line there; should one die before it
        // can (a panic, a missing library), the kubelet takes its log's tail.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
}

/// `skill-operator <sub> --endpoint … --namespace … --job …` followed by `rest`:
/// the argv both pod-side helpers share.
pub(super) fn helper_command(p: &JobParams, sub: &str, rest: &[&str]) -> Vec<String> {
    let head = [OPERATOR_BIN, sub, "--endpoint", &p.artifact_endpoint, "--namespace", &p.namespace, "--job", &p.skilljob_uid];
    head.iter().chain(rest).map(|s| s.to_string()).collect()
}

/// Evicted or preempted pods do not count against `backoffLimit`; a
/// non-zero exit of `container` fails the Job at once (with restartPolicy
/// Never). The run and build Jobs share it.
pub(super) fn pod_failure_policy(container: &str) -> PodFailurePolicy {
    PodFailurePolicy {
        rules: vec![
            PodFailurePolicyRule {
                action: "Ignore".into(),
                on_pod_conditions: Some(vec![PodFailurePolicyOnPodConditionsPattern {
                    type_: "DisruptionTarget".into(),
                    status: Some("True".into()),
                }]),
                on_exit_codes: None,
            },
            PodFailurePolicyRule {
                action: "FailJob".into(),
                on_exit_codes: Some(PodFailurePolicyOnExitCodesRequirement {
                    container_name: Some(container.into()),
                    operator: "NotIn".into(),
                    values: vec![0],
                }),
                on_pod_conditions: None,
            },
        ],
    }
}

pub(super) fn fetch_container(p: &JobParams) -> Container {
    let fetched = p.delivery == PackageDelivery::Fetched;
    // A prepared package is in the image: fetch brings only the inputs and the launcher.
    let package: &[&str] = if fetched { &["--package", PACKAGE_DIR] } else { &[] };
    let staged: Vec<&str> = p.staged_package.iter().flat_map(|d| ["--staged-package", d.as_str()]).collect();
    let rest: Vec<&str> =
        package.iter().copied().chain(staged).chain(["--work", WORK_DIR, "--token-file", TOKEN_FILE, "--tools", TOOLS_DIR]).collect();
    let command = helper_command(p, "fetch", &rest);
    let mut mounts = Vec::new();
    if fetched {
        mounts.push(mount(VOL_PACKAGE, PACKAGE_DIR, false));
    }
    mounts.extend([mount(VOL_WORK, WORK_DIR, false), mount(VOL_TOOLS, TOOLS_DIR, false), mount(VOL_TOKEN, TOKEN_DIR, true)]);
    helper_container(p, CONTAINER_FETCH, command, mounts)
}

pub(super) fn upload_container(p: &JobParams) -> Container {
    let command = helper_command(p, "upload", &["--work", WORK_DIR, "--result", RESULT_FILE, "--token-file", TOKEN_FILE]);
    Container {
        // Native sidecar: starts after fetch, runs beside `run`, gets SIGTERM
        // once `run` has exited.
        restart_policy: Some("Always".into()),
        ..helper_container(
            p,
            CONTAINER_UPLOAD,
            command,
            // The result volume is the sidecar's alone: the verdict reaches
            // it over the launcher's channel, never through the run container.
            vec![mount(VOL_WORK, WORK_DIR, true), mount(VOL_RESULT, RESULT_DIR, false), mount(VOL_TOKEN, TOKEN_DIR, true)],
        )
    }
}

/// The env the run container gets, in order: fixed vars, proxy vars, grants.
pub(super) fn run_env(p: &JobParams) -> Vec<EnvVar> {
    let plain = |name: &str, value: &str| EnvVar { name: name.into(), value: Some(value.into()), value_from: None };
    let mut env = vec![plain("HOME", TMP_DIR), plain("TMPDIR", TMP_DIR), plain("PATH", RUN_PATH)];
    if let PackageDelivery::ImageVolume { env: deps, .. } = &p.delivery {
        env.extend(deps.iter().map(|(n, v)| plain(n, v)));
    }
    if let Some(proxy) = &p.egress_proxy {
        env.extend(crate::egress::proxy_env(proxy).iter().map(|(n, v)| plain(n, v)));
    }
    env.extend(p.env.iter().map(|g| EnvVar {
        name: g.name.clone(),
        value: None,
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: g.secret_name.clone(), key: g.secret_key.clone(), optional: Some(false) }),
            ..Default::default()
        }),
    }));
    env
}

pub(super) fn run_container(p: &JobParams) -> Container {
    let env = run_env(p);
    let mut command: Vec<String> = [LAUNCHER, "launch", "--timeout", &p.timeout_secs.to_string()].iter().map(|s| s.to_string()).collect();
    // The image's own config sets these (not the pod), so they are named
    // here without a value: the launcher passes them through.
    let from_image: &[String] = match &p.delivery {
        PackageDelivery::InImage { env } => env,
        _ => &[],
    };
    for name in env.iter().map(|v| &v.name).chain(from_image) {
        command.push("--allow-env".into());
        command.push(name.clone());
    }
    command.push("--".into());
    command.push(p.interpreter.clone());
    command.push(format!("{}/{}", p.package_root(), p.script));
    command.extend(p.args.iter().cloned());
    let mut mounts = Vec::new();
    match &p.delivery {
        PackageDelivery::Fetched => mounts.push(mount(VOL_PACKAGE, PACKAGE_DIR, true)),
        PackageDelivery::InImage { .. } => {}
        PackageDelivery::ImageVolume { deps, .. } => {
            mounts.push(VolumeMount { sub_path: Some("skill".into()), ..mount(VOL_PREPARED, SKILL_DIR, true) });
            if *deps {
                mounts.push(VolumeMount { sub_path: Some("deps".into()), ..mount(VOL_PREPARED, DEPS_DIR, true) });
            }
        }
    }
    mounts.extend([mount(VOL_WORK, WORK_DIR, false), mount(VOL_TMP, TMP_DIR, false), mount(VOL_TOOLS, TOOLS_DIR, true)]);
    Container {
        name: CONTAINER_RUN.into(),
        image: Some(p.run_image.clone()),
        image_pull_policy: Some(pull_policy(&p.run_image)),
        command: Some(command),
        working_dir: Some(WORK_DIR.into()),
        env: Some(env),
        volume_mounts: Some(mounts),
        security_context: Some(container_security(p)),
        resources: Some(guaranteed(&p.resources.cpu, &p.resources.memory, &p.resources.ephemeral_storage)),
        termination_message_path: Some(TERMINATION_MESSAGE_PATH.into()),
        termination_message_policy: Some("File".into()),
        ..Default::default()
    }
}

pub(super) fn empty_dir(name: &str, size: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource { size_limit: Some(Quantity(size.into())), ..Default::default() }),
        ..Default::default()
    }
}

pub(super) fn volumes(p: &JobParams) -> Vec<Volume> {
    let package = match &p.delivery {
        PackageDelivery::Fetched => Some(empty_dir(VOL_PACKAGE, SIZE_PACKAGE)),
        PackageDelivery::InImage { .. } => None,
        // Read-only by nature; pulled like the run image (by digest, so once per node).
        PackageDelivery::ImageVolume { reference, .. } => Some(Volume {
            name: VOL_PREPARED.into(),
            image: Some(ImageVolumeSource { reference: Some(reference.clone()), pull_policy: Some(pull_policy(reference)) }),
            ..Default::default()
        }),
    };
    package
        .into_iter()
        .chain([
            empty_dir(VOL_WORK, &p.resources.ephemeral_storage),
            empty_dir(VOL_TMP, SIZE_TMP),
            empty_dir(VOL_RESULT, SIZE_RESULT),
            empty_dir(VOL_TOOLS, SIZE_TOOLS),
            Volume {
                name: VOL_TOKEN.into(),
                // The pod's own ServiceAccount token for the artifact endpoint
                // alone, and for this job alone (its audience): no per-job
                // Secret to write and delete, and it dies with the pod.
                projected: Some(ProjectedVolumeSource {
                    sources: Some(vec![VolumeProjection {
                        service_account_token: Some(ServiceAccountTokenProjection {
                            audience: Some(crate::artifacts::pod_token_audience(&p.namespace, &p.skilljob_uid)),
                            expiration_seconds: Some(crate::artifacts::POD_TOKEN_EXPIRATION_SECS),
                            path: TOKEN_KEY.into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    // r--r-----: readable by the fsGroup (= run_as_group) only.
                    default_mode: Some(0o440),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_name_is_short_dns_label() {
        let name = job_name("0F1E2D3C-4B5A-6978-8796-a5b4c3d2e1f0");
        assert_eq!(name, "skilljob-0f1e2d3c4b5a");
        assert!(super::super::is_dns1123_label(&name));
    }

    #[test]
    fn script_paths() {
        for ok in ["run.py", "scripts/run.py", "a/b/c.sh", "scripts/.hidden.py"] {
            assert!(is_package_relative(ok), "{ok}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a/", "a\0b"] {
            assert!(!is_package_relative(bad), "{bad:?}");
        }
    }

    #[test]
    fn env_names() {
        assert!(is_env_name("API_TOKEN") && is_env_name("_x1"));
        assert!(!is_env_name("1A") && !is_env_name("A-B") && !is_env_name("") && !is_env_name("A=B"));
    }
}
