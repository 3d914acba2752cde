//! `SkillSource`: a git repository (or a ZIP) the controller turns into one
//! pinned SkillPackage per skill it finds.
// kube's derives generate a `pub` validation helper that is not reachable from the crate root.
#![allow(unreachable_pub)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::package::RuntimeProfile;

/// Label on every SkillPackage a source made: the source's name.
pub const SOURCE_LABEL: &str = "skill-operator.dev/source";
/// Annotation on a source's SkillPackage: the served name of its skill.
pub const SOURCE_SKILL_ANNOTATION: &str = "skill-operator.dev/source-skill";
/// Set on a SkillSource to fetch again now (any new value is a new request),
/// whatever its update policy: `kubectl annotate skillsource x
/// skill-operator.dev/refresh=$(date +%s) --overwrite`.
pub const REFRESH_ANNOTATION: &str = "skill-operator.dev/refresh";
/// Set on a SkillSource with `updatePolicy: Check` to accept the commit
/// `status.available` reports: its value must be that commit.
pub const APPROVE_ANNOTATION: &str = "skill-operator.dev/approve-commit";

/// A repository of skills: resolved to a commit, walked with the recursive
/// layout rules, and turned into one SkillPackage per skill, each pinned to
/// the commit and to the digest of its files.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "skill-operator.dev",
    version = "v1alpha1",
    kind = "SkillSource",
    doc = "A git repository or ZIP of skills, resolved to a commit and turned into one pinned SkillPackage per skill.",
    plural = "skillsources",
    shortname = "sksrc",
    status = "SkillSourceStatus",
    printcolumn = r#"{"name":"Commit","type":"string","jsonPath":".status.shortCommit"}"#,
    printcolumn = r#"{"name":"Skills","type":"integer","jsonPath":".status.skillCount"}"#,
    printcolumn = r#"{"name":"Problems","type":"integer","jsonPath":".status.problemCount"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Update","type":"string","jsonPath":".status.available.commit","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.git) != has(self.zip)").message("give exactly one of git and zip"))]
#[serde(rename_all = "camelCase")]
pub struct SkillSourceSpec {
    /// A git repository, read object by object: nothing in it runs (no hooks, filters, LFS or submodules).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitSource>,
    /// A ZIP archive over HTTPS, pinned by its SHA-256.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zip: Option<ZipSource>,
    /// What happens when the ref moves: `Manual` (default: fetched once; the `skill-operator.dev/refresh` annotation fetches again), `Check` (reports a newer commit and what would change in `status.available`, touching nothing; the `skill-operator.dev/approve-commit` annotation accepts it) or `Auto` (new SkillPackages for what changed). Existing SkillPackages are never changed: bindings keep their content until someone points them at a new package.
    #[serde(default)]
    pub update_policy: UpdatePolicy,
    /// Seconds between checks for a newer commit under `Check` and `Auto` (60-86400, default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60, max = 86400))]
    pub check_interval_seconds: Option<u32>,
    /// Runtime profile given to every SkillPackage this source makes. Without it they serve instructions and files only, and nothing runs until an admin sets a profile on a package.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeProfile>,
}

/// A git repository and the folder of it to walk.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitSource {
    /// `https://host/owner/repo`, `ssh://git@host/owner/repo` or `git@host:owner/repo` (with a secretRef holding the key and the pinned host key), or `git://`; `http://` only with `insecure`. Local paths and `file://` are refused: the controller's own files are not a source.
    #[schemars(length(min = 1, max = 512))]
    pub url: String,
    /// A branch, tag or 40-hex commit (default: the remote's HEAD). A branch or tag is resolved to a commit and pinned in `status.commit`.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub reference: Option<String>,
    /// The folder to walk (default: the repository root). A folder holding SKILL.md is one skill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub path: Option<String>,
    /// A Secret in the operator's namespace for a private repository. HTTPS: key `token` (sent as HTTP Basic `x-access-token:<token>` to the URL's host only) and optional `username`. SSH: `ssh-privatekey` and `known_hosts` (the server's host key, pinned: a key it does not list is refused, never learned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// Allow `http://` (in-cluster test servers only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// Hosts (like `github.com`) from which plugins the repository's `.claude-plugin/marketplace.json` lists in other repositories (`github`, `url`, `git-subdir` sources) are fetched too, when the entry pins a `sha`. Empty: such plugins are reported, not fetched. The token goes to the source's own host only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 253)))]
    pub follow_hosts: Vec<String>,
}

/// A ZIP archive of skills.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZipSource {
    /// `https://…` (`http://` only with `insecure`).
    #[schemars(length(min = 1, max = 512))]
    pub url: String,
    /// `sha256:<64 hex>` of the archive: a download with other bytes is refused.
    #[schemars(regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub digest: String,
    /// The folder inside the archive to walk (default: its root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub path: Option<String>,
    /// Allow `http://` (in-cluster test servers only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
}

/// See `spec.updatePolicy`.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum UpdatePolicy {
    #[default]
    Manual,
    Check,
    Auto,
}

/// What the controller found.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillSourceStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The commit the packages come from (40 hex), or the ZIP's digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Its first 12 characters (the printer column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub short_commit: Option<String>,
    /// The last `skill-operator.dev/refresh` value acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refreshed: Option<String>,
    /// When the source was last fetched or checked (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<String>,
    #[serde(default)]
    pub skill_count: u32,
    #[serde(default)]
    pub problem_count: u32,
    /// One entry per skill at `commit`, sorted by name.
    #[serde(default)]
    pub skills: Vec<SourcedSkill>,
    /// What kept a skill or a file out (at most 100, then a count), e.g. a symlink, a submodule, a name that cannot be served.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// Under `Check`: a newer commit and what taking it would change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<AvailableUpdate>,
    /// Plugins of other repositories the marketplace lists, fetched at the commits it pins (`spec.git.followHosts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub followed: Vec<FollowedPlugin>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A plugin of another repository that the source's marketplace lists.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FollowedPlugin {
    /// Its name in the marketplace (its skills are `<plugin>/<skill>`).
    pub plugin: String,
    pub url: String,
    /// Its folder in that repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The commit fetched: the `sha` the marketplace pins.
    pub commit: String,
}

/// One skill of the source at its commit.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourcedSkill {
    /// The served name (from its path below the walked folder, e.g. `document-skills/xlsx`).
    pub name: String,
    /// Its folder in the repository.
    pub path: String,
    /// The package's OCI digest (the digest of its files).
    pub digest: String,
    /// The SkillPackage holding it.
    pub package: String,
    /// `sha256:` of its package archive: what `Check` compares to say it changed.
    pub content: String,
}

/// A newer commit and its changes, by skill name.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AvailableUpdate {
    pub commit: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
    /// Skills whose files differ (by content digest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changed: Vec<String>,
}
