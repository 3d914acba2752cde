//! `SkillPackage`: one skill at one immutable version, and the admin's
//! runtime profile for it.
// kube's derives generate a `pub` validation helper that is not reachable from the crate root.
#![allow(unreachable_pub)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::core::declaration::Interpreter;
use crate::core::problems::Problem;

/// Set on a SkillPackage to prepare its run image (as `runtime.prepare: true`
/// does); any value but `"false"` asks for it. The value is part of the
/// attempt: changing it (`retry-2`) tries a failed preparation again.
pub const PREPARE_ANNOTATION: &str = "skill-operator.dev/prepare";

/// A skill package in the cluster's library: where it comes from (pinned by
/// digest once resolved) and, optionally, how its scripts may run.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "skill-operator.dev",
    version = "v1alpha1",
    kind = "SkillPackage",
    doc = "A skill package in the cluster library: one skill at one immutable version, pinned by OCI digest, with the admin's runtime profile.",
    plural = "skillpackages",
    shortname = "skpkg",
    status = "SkillPackageStatus",
    printcolumn = r#"{"name":"Skill","type":"string","jsonPath":".status.skillName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Digest","type":"string","jsonPath":".status.digest","priority":1}"#,
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".status.imageMode","priority":1}"#,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".status.image","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SkillPackageSpec {
    /// Where the package comes from. Immutable: a new version is a new SkillPackage.
    #[x_kube(validation = Rule::new("self == oldSelf").message("source is immutable: create a new SkillPackage for a new version"))]
    pub source: PackageSource,
    /// The admin's runtime profile. Without it the skill's instructions and
    /// files are served and nothing runs. Changing it resets readiness.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeProfile>,
}

/// Where a package comes from.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PackageSource {
    /// An OCI artifact: this project's package format (`skill-operator package push`) or a ToolHive skill artifact.
    pub oci: OciSource,
}

/// An OCI artifact reference.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OciSource {
    /// `registry/repository:tag` or `registry/repository@sha256:…`. A tag is
    /// resolved once and pinned: `status.digest` is what every run uses.
    #[schemars(length(min = 1, max = 512))]
    pub reference: String,
    /// A docker-registry Secret in the operator's namespace for private registries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
    /// Talk plain HTTP to this registry (in-cluster test registries only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
}

/// The admin's runtime profile: how this package's scripts may run.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeProfile {
    /// The interpreter every allowed script runs with: node, python or bash.
    pub interpreter: Interpreter,
    /// The run image (digest-pinned `image@sha256:…` preferred) holding the interpreter. With `prepare`, the base the run image is composed on (default: the controller's base for the interpreter: python:3.12-slim, node:22-bookworm-slim or debian:bookworm-slim). Required without `prepare`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Absolute path of the interpreter inside the image (default: /usr/local/bin/node, /usr/local/bin/python3 or /bin/bash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter_path: Option<String>,
    /// Scripts allowed to run; each must be declared by the skill's mcp-host block.
    #[serde(default)]
    pub allowed_scripts: Vec<String>,
    /// Hosts runs may reach, through the egress proxy only: `host[:port,...]`, `*.suffix[:ports]` (IDNs as punycode or Unicode) or an IP literal (`203.0.113.7`, `[2001:db8::1]`), port 443 unless ports are listed. The skill's own `mcp-host.egress` is only its author's proposal: nothing it names is reachable unless listed here. Empty (the default): no network at all. A binding may narrow this list, never widen it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub allowed_egress: Vec<String>,
    /// Ceiling on a run's wall-clock limit in seconds (1-300); without it the declaration's timeout stands (60 when it names none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 300))]
    pub timeout_seconds: Option<u32>,
    /// CPU, memory and ephemeral storage per run (requests equal limits).
    #[serde(default)]
    pub resources: RunResources,
    /// Prepare a run image for this package (the annotation `skill-operator.dev/prepare: "true"` does the same): the base image pinned by digest, the package under /skill and its dependencies (requirements.txt: wheels only; package-lock.json: npm ci --ignore-scripts) installed by a restricted build Job, pushed to the controller's image repository. Runs then start from that image by digest and fetch no package. Readiness waits for it (conditions Preparing, Prepared, PreparationFailed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prepare: bool,
    /// How a prepared package reaches its runs: `composed` (one run image), `imageVolume` (the package and dependencies as a read-only image volume on the unmodified base; needs image volume support in the API server and the nodes' runtime) or `auto` (imageVolume where supported, composed elsewhere). Default: the controller's --image-mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_mode: Option<PrepareMode>,
    /// Where the build Job installs dependencies from. Default: the controller's --pip-index-url and --npm-registry. The build pod may reach these hosts and the artifact endpoint, nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<DependencySource>,
}

/// How a prepared package reaches its runs (see `runtime.imageMode`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, clap::ValueEnum)]
#[serde(rename_all = "camelCase")]
#[value(rename_all = "kebab-case")]
pub enum PrepareMode {
    /// Image volumes where the cluster supports them, a composed image elsewhere.
    Auto,
    /// One run image: base + package + dependencies.
    Composed,
    /// The unmodified base with the package and dependencies mounted read-only from an image volume.
    ImageVolume,
}

/// The package indexes (mirrors) the dependency build uses.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DependencySource {
    /// A PEP 503 simple index for pip (`--index-url`), e.g. `https://pypi.example/simple`. Wheels only: a requirement without a wheel there refuses the preparation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub pip_index_url: Option<String>,
    /// An npm registry (`--registry`), e.g. `https://npm.example/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub npm_registry: Option<String>,
}

impl SkillPackage {
    /// Whether a run image is prepared for this package (a runtime profile
    /// with `prepare: true`, or the annotation).
    pub fn wants_preparation(&self) -> bool {
        let Some(profile) = &self.spec.runtime else { return false };
        profile.prepare || self.prepare_annotation().is_some_and(|v| v != "false")
    }

    /// The `skill-operator.dev/prepare` annotation's value.
    pub fn prepare_annotation(&self) -> Option<&str> {
        self.metadata.annotations.as_ref().and_then(|a| a.get(PREPARE_ANNOTATION)).map(String::as_str)
    }
}

impl RuntimeProfile {
    /// This profile as the fence sees it.
    pub fn fence_profile(&self) -> crate::core::fence::Profile {
        crate::core::fence::Profile {
            interpreters: [self.interpreter].into(),
            allowed_scripts: Some(self.allowed_scripts.iter().cloned().collect()),
            timeout_ceiling_secs: self.timeout_seconds.map(u64::from),
        }
    }
}

/// Resources of one run; requests equal limits.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunResources {
    /// CPU quantity (default 1).
    #[serde(default = "default_cpu")]
    pub cpu: String,
    /// Memory quantity (default 512Mi).
    #[serde(default = "default_memory")]
    pub memory: String,
    /// Ephemeral storage quantity for /work and /tmp (default 1Gi).
    #[serde(default = "default_ephemeral")]
    pub ephemeral_storage: String,
}

impl Default for RunResources {
    fn default() -> Self {
        RunResources { cpu: default_cpu(), memory: default_memory(), ephemeral_storage: default_ephemeral() }
    }
}

fn default_cpu() -> String {
    "1".into()
}
fn default_memory() -> String {
    "512Mi".into()
}
fn default_ephemeral() -> String {
    "1Gi".into()
}

/// What the controller found in the package.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillPackageStatus {
    /// The manifest digest the source resolved to; every run uses exactly this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The skill's name (from the package's SKILL.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_name: Option<String>,
    /// The skill's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Number of files in the package.
    #[serde(default)]
    pub files: u64,
    /// Total bytes of the package's files.
    #[serde(default)]
    pub bytes: u64,
    /// The package's license, when SKILL.md states one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    /// Scripts the skill declares, with what each asks for.
    #[serde(default)]
    pub scripts: Vec<DeclaredScriptStatus>,
    /// Hosts the skill proposes to reach (its `mcp-host.egress`): a proposal, reachable only where `runtime.allowedEgress` allows.
    #[serde(default)]
    pub egress: Vec<String>,
    /// The hosts the runtime profile allows (`runtime.allowedEgress`, normalised: `host:ports`). Empty: runs get no network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_egress: Vec<String>,
    /// Proposed hosts (or ports) the profile does not allow, each with why: runs that need them will see the proxy refuse them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress_not_allowed: Vec<String>,
    /// Dependency requirements: `unknown` unless the package states them (requirements.txt, package-lock.json).
    #[serde(default = "unknown")]
    pub requirements: String,
    /// Problems found by the same discovery and frontmatter rules as the standalone server.
    #[serde(default)]
    pub problems: Vec<Problem>,
    /// What the package's dependency files declare (read without installing anything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dependencies: Option<DependencyPlanStatus>,
    /// The prepared image, pinned by digest: the run image (`composed`) or the image volume (`imageVolume`). A failed preparation keeps the last good one; runs use it only while `preparation.preparedKey` equals `preparation.key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// How runs get the package: `composed` (they start from `image`), `imageVolume` (`image` mounted read-only on `baseImage`) or `fetched` (the package is fetched into every run's pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_mode: Option<ImageMode>,
    /// The base `image` was prepared on, pinned by digest (the run image of `imageVolume` runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_image: Option<String>,
    /// The digest the base reference resolved to (an index's, for a multi-platform base).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_digest: Option<String>,
    /// The dependency lock digest `image` was built from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_digest: Option<String>,
    /// The CycloneDX SBOM referrer attached to `image` (its manifest digest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sbom_digest: Option<String>,
    /// Preparation bookkeeping: what `image` was made from, what is being made now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preparation: Option<PreparationStatus>,
    /// Resolved, Validated and Ready (and Preparing, Prepared, PreparationFailed for prepared packages), in the standard shape.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

fn unknown() -> String {
    "unknown".into()
}

/// How runs get a package (`status.imageMode`).
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ImageMode {
    /// Runs start from the composed run image `status.image`; nothing is fetched but inputs.
    Composed,
    /// Runs start from `status.baseImage` with `status.image` mounted read-only as an image volume.
    ImageVolume,
    /// The package is fetched into every run's pod from the artifact endpoint.
    Fetched,
}

/// The package's dependency files, as planned (nothing installed).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DependencyPlanStatus {
    /// `sha256:` over the normalised requirements.txt and the canonical package-lock.json; absent when nothing is declared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock_digest: Option<String>,
    /// A requirements.txt is installed (pip, wheels only).
    #[serde(default)]
    pub python: bool,
    /// A package.json with package-lock.json is installed (npm ci --ignore-scripts --omit=dev).
    #[serde(default)]
    pub node: bool,
    /// Why the files cannot be installed as they are (no lockfile, an option or URL in requirements.txt, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// Preparation bookkeeping (`status.preparation`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreparationStatus {
    /// `sha256:` of everything the wanted image depends on (package digest, base reference, dependency lock, indexes, mode, repository): a changed profile changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The key `status.image` was prepared for; runs use the image only while it equals `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared_key: Option<String>,
    /// The package digest `status.image` holds (checked against `status.digest` before every run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_digest: Option<String>,
    /// Variables the prepared dependencies need (`PYTHONPATH=/deps/python`, `NODE_PATH=/deps/node/node_modules`).
    #[serde(default)]
    pub env: Vec<String>,
    /// The dependency build Job (`namespace/name`) of the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_job: Option<String>,
    /// The base of the current attempt, pinned by digest when its build started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_base: Option<String>,
    /// The attempt that failed (key and the `skill-operator.dev/prepare` annotation's value): it is not tried again until either changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_attempt: Option<String>,
}

/// One declared script.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeclaredScriptStatus {
    /// Path inside the package.
    pub script: String,
    /// The declared interpreter as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<String>,
    /// Variables the script asks for.
    #[serde(default)]
    pub env: Vec<String>,
    /// Timeout in seconds from the declaration.
    pub timeout_seconds: u64,
    /// Whether the runtime profile allows it.
    pub allowed: bool,
    /// Why the package itself keeps it from running (missing file, refused declaration), whatever the profile says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// Why it cannot run, when it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
