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
    /// Let runs reach the hosts the skill declares (through the egress proxy).
    #[serde(default)]
    pub egress: bool,
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
    /// Ready (and why not), in the standard shape.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
