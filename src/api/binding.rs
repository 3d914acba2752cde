//! `SkillBinding`: a package bound into a namespace, with environment grants.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Binds one SkillPackage into this namespace (MCPBox's project binding).
/// Its skill is then served by the namespace's MCP endpoint and its allowed
/// scripts may run as SkillJobs here.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "skill-operator.dev",
    version = "v1alpha1",
    kind = "SkillBinding",
    doc = "Binds a SkillPackage into this namespace, with environment grants from Secrets.",
    plural = "skillbindings",
    shortname = "skb",
    namespaced,
    status = "SkillBindingStatus",
    printcolumn = r#"{"name":"Package","type":"string","jsonPath":".spec.package"}"#,
    printcolumn = r#"{"name":"Skill","type":"string","jsonPath":".status.skillName"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct SkillBindingSpec {
    /// The SkillPackage (cluster-scoped) to bind.
    #[schemars(length(min = 1, max = 253))]
    pub package: String,
    /// Environment grants: variables a script asked for, taken from Secrets
    /// in this namespace. A grant for a variable no allowed script asked for
    /// is reported and not handed over.
    #[serde(default)]
    pub env: Vec<EnvGrant>,
    /// Let runs reach the hosts the package's runtime profile allows (`runtime.allowedEgress`), through the egress proxy only. False (the default): no network.
    #[serde(default)]
    pub egress: bool,
    /// Narrow the allowed hosts for this binding's runs (same form as `runtime.allowedEgress`). It never widens: an entry (or port) the profile does not allow is dropped and reported in `status.droppedEgress`. Absent: every allowed host; empty: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub egress_hosts: Option<Vec<String>>,
    /// Keep run pods warm for this binding's runs: started ahead of demand with the package fetched, each waiting for one run and then gone. A run that finds none starts cold, as without this. Capped by the namespace's warm-pod budget (the `skill-operator.dev/warm-pods` annotation on the Namespace, else the controller's `--warm-pods-per-namespace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmSpec>,
}

/// How many warm pods a binding keeps, and for how long without a run.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmSpec {
    /// Pods kept waiting while the binding is in use.
    #[serde(default = "default_warm_min")]
    #[schemars(range(min = 0, max = 20))]
    pub min: u32,
    /// At most this many waiting or starting pods: runs that found the pool empty grow it up to here.
    #[serde(default = "default_warm_max")]
    #[schemars(range(min = 1, max = 20))]
    pub max: u32,
    /// After this long without a run the pool empties; the next run starts cold and fills it again.
    #[serde(default = "default_warm_idle")]
    #[schemars(range(min = 30, max = 86400))]
    pub idle_timeout_seconds: u32,
}

fn default_warm_min() -> u32 {
    1
}

fn default_warm_max() -> u32 {
    crate::core::limits::WARM_POOL_DEFAULT_MAX
}

fn default_warm_idle() -> u32 {
    crate::core::limits::WARM_IDLE_DEFAULT_SECS
}

/// One granted variable.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvGrant {
    /// The variable name a script asked for.
    pub name: String,
    /// Where its value comes from.
    pub secret_key_ref: SecretKeyRef,
}

/// A key of a Secret in the binding's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Key inside the Secret.
    pub key: String,
}

/// What the controller decided about the binding.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillBindingStatus {
    /// The skill name this binding serves in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_name: Option<String>,
    /// The package digest runs of this binding use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Granted variables that are handed over (requested by an allowed script).
    #[serde(default)]
    pub effective_env: Vec<String>,
    /// Granted variables no allowed script asked for: reported, not handed over.
    #[serde(default)]
    pub ignored_env: Vec<String>,
    /// Hosts the skill proposes (its `mcp-host.egress`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proposed_egress: Vec<String>,
    /// What this binding's runs may reach: the profile's allowed hosts ∩ `spec.egressHosts`, and only with `spec.egress`. Empty: no network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effective_egress: Vec<String>,
    /// Narrowing entries that would have widened the profile's list (or did not parse): dropped, with why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dropped_egress: Vec<String>,
    /// Ready (and why not), in the standard shape.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
