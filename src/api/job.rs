//! `SkillJob`: one run of one declared script of a bound skill.
// kube's derives generate a `pub` validation helper that is not reachable from the crate root.
#![allow(unreachable_pub)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::core::owner::{OwnerClaim, OwnerSeal, SealRefusal};

/// Who asked for the run: the principal the gateway authenticated. Proven
/// only together with [`OWNER_SEAL_ANNOTATION`] ([`SkillJob::proven_owner`]).
pub const REQUESTED_BY_ANNOTATION: &str = "skill-operator.dev/requested-by";
/// The gateway's seal over the namespace, name, principal and spec
/// ([`crate::core::owner`]).
pub const OWNER_SEAL_ANNOTATION: &str = "skill-operator.dev/owner-seal";

/// One run of a declared script of a bound skill, with input files in and
/// output files out (MCPBox's job). The spec is immutable: a second run is a
/// new SkillJob.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "skill-operator.dev",
    version = "v1alpha1",
    kind = "SkillJob",
    doc = "One run of a declared script of a bound skill, with input and output files. Its spec is immutable.",
    plural = "skilljobs",
    shortname = "skj",
    namespaced,
    status = "SkillJobStatus",
    printcolumn = r#"{"name":"Skill","type":"string","jsonPath":".status.skill"}"#,
    printcolumn = r#"{"name":"Script","type":"string","jsonPath":".spec.script"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Exit","type":"integer","jsonPath":".status.exitCode"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("a SkillJob's spec is immutable: create a new SkillJob to run again"))]
#[serde(rename_all = "camelCase")]
pub struct SkillJobSpec {
    /// The SkillBinding (in this namespace) whose skill runs.
    #[schemars(length(min = 1, max = 253))]
    pub binding: String,
    /// A script the skill declares and the package's runtime profile allows.
    #[schemars(length(min = 1, max = 1024))]
    pub script: String,
    /// Arguments, passed as they are (no shell): at most 64, 8 KiB in total.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub args: Vec<String>,
    /// Input files, by digest, already uploaded to the artifact endpoint.
    #[serde(default)]
    #[schemars(length(max = 2000))]
    pub inputs: Vec<InputFile>,
    /// Wall-clock limit in seconds (1-300); at most the profile's timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 300))]
    pub timeout_seconds: Option<u32>,
}

/// An input file placed in /work before the run.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InputFile {
    /// Path inside /work.
    pub path: String,
    /// `sha256:<hex>` of the content, as stored by the artifact endpoint.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
}

/// Where a SkillJob is in its one-way life.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SkillJobPhase {
    /// Accepted, the Job not yet running.
    Pending,
    /// The pod runs.
    Running,
    /// The script exited 0 and the outputs are stored.
    Succeeded,
    /// The script exited non-zero, was killed, or the run could not start.
    Failed,
    /// The deadline passed and the pod was stopped.
    TimedOut,
    /// Cancelled (the SkillJob was deleted or cancelled before the end).
    Cancelled,
    /// The stop could not be confirmed: files are withheld until an operator looks.
    Locked,
}

/// A captured stream.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StreamRef {
    /// `sha256:<hex>` of the stored bytes.
    pub digest: String,
    /// Bytes the script wrote.
    pub size: u64,
    /// More than 1 MiB was written; the rest was discarded.
    pub truncated: bool,
}

/// An output file stored by the run.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutputFile {
    /// Path inside /work.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// `sha256:<hex>`.
    pub digest: String,
}

/// What happened to the run.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillJobStatus {
    /// Pending, Running, Succeeded, Failed, TimedOut, Cancelled or Locked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SkillJobPhase>,
    /// The skill name (from the binding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// The script's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the script, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// When the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Captured stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<StreamRef>,
    /// Captured stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StreamRef>,
    /// Output files stored by the run.
    #[serde(default)]
    pub outputs: Vec<OutputFile>,
    /// The Kubernetes Job that runs it (named from this SkillJob's UID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// The warm pod this run was claimed onto (instead of a Job), when its binding keeps a pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_pod: Option<String>,
    /// The run's network: what the skill proposed, what it may reach, and the pod address the egress proxy accepts its credential from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<JobEgress>,
    /// A sentence a person can act on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Conditions in the standard shape.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A SkillJob's network (`status.egress`). The egress proxy serves a job
/// from this record alone: its allowlist, and the one source address its
/// credential is accepted from, sealed by the controller.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobEgress {
    /// Hosts the skill proposes (its `mcp-host.egress`).
    #[serde(default)]
    pub proposed: Vec<String>,
    /// The effective allowlist (the profile's allowed hosts ∩ the binding's narrowing), `host:ports`. Empty: no network at all (no proxy, no rule).
    #[serde(default)]
    pub allowed: Vec<String>,
    /// The run pod's address, recorded once the pod has one: the proxy refuses this job's credential from any other address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// The controller's MAC over namespace, uid, `allowed` and `podIP`: the proxy ignores a record that does not verify (a status written by anyone but the controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
}

impl SkillJob {
    /// The sha256 of the spec's JSON: what an owner seal binds of the run.
    pub fn spec_digest(&self) -> String {
        crate::core::package::digest(&serde_json::to_vec(&self.spec).unwrap_or_default())
    }

    /// Names `principal` as the one who asked for the run and seals the
    /// claim at `sealed_at` (Unix seconds): what the gateway does to every
    /// SkillJob it writes (the name, namespace and spec must be final).
    pub fn seal_owner(&mut self, seal: &OwnerSeal, principal: &str, sealed_at: i64) {
        let claim = OwnerClaim {
            namespace: self.metadata.namespace.as_deref().unwrap_or_default(),
            name: self.metadata.name.as_deref().unwrap_or_default(),
            principal,
            spec_digest: &self.spec_digest(),
        };
        let sealed = seal.seal(&claim, sealed_at);
        let annotations = self.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(REQUESTED_BY_ANNOTATION.to_string(), principal.to_string());
        annotations.insert(OWNER_SEAL_ANNOTATION.to_string(), sealed);
    }

    /// The principal the gateway sealed this SkillJob for, and when it
    /// sealed it: `Err` for a SkillJob nobody sealed (made with `kubectl`)
    /// and for one whose annotation claims a principal its seal does not
    /// prove (never anyone's).
    pub fn proven_owner(&self, seal: &OwnerSeal) -> Result<(&str, i64), SealRefusal> {
        let annotations = self.metadata.annotations.as_ref();
        let principal = annotations.and_then(|a| a.get(REQUESTED_BY_ANNOTATION)).ok_or(SealRefusal::Missing)?;
        let claim = OwnerClaim {
            namespace: self.metadata.namespace.as_deref().unwrap_or_default(),
            name: self.metadata.name.as_deref().unwrap_or_default(),
            principal,
            spec_digest: &self.spec_digest(),
        };
        let created = self.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
        let sealed_at = seal.verify(&claim, annotations.and_then(|a| a.get(OWNER_SEAL_ANNOTATION)).map(String::as_str), created)?;
        Ok((principal, sealed_at))
    }
}
