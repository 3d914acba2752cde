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
    /// The run image (digest-pinned `image@sha256:…` preferred) holding the interpreter.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Absolute path of the interpreter inside the image (default: /usr/local/bin/node, /usr/local/bin/python3 or /bin/bash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interpreter_path: Option<String>,
    /// Scripts allowed to run; each must be declared by the skill's mcp-host block.
    #[serde(default)]
    pub allowed_scripts: Vec<String>,
    /// Ceiling on a run's wall-clock limit in seconds (1-300); without it the declaration's timeout stands (60 when it names none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 300))]
    pub timeout_seconds: Option<u32>,
    /// CPU, memory and ephemeral storage per run (requests equal limits).
    #[serde(default)]
    pub resources: RunResources,
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
    /// Hosts the skill proposes to reach (its `mcp-host.egress`).
    #[serde(default)]
    pub egress: Vec<String>,
    /// Dependency requirements: `unknown` unless the package states them (requirements.txt, package-lock.json).
    #[serde(default = "unknown")]
    pub requirements: String,
    /// Problems found by the same discovery and frontmatter rules as the standalone server.
    #[serde(default)]
    pub problems: Vec<Problem>,
    /// Resolved, Validated and Ready, in the standard shape.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

fn unknown() -> String {
    "unknown".into()
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
