//! The `problems` list: everything that kept a directory, a file or a
//! declaration from being served, with a stable reason code.
//!
//! Discovery never drops anything silently: a bad skill harms only itself and
//! the reason shows up here. The codes are a published, additive set (the
//! table in docs/reference.md is checked against [`Reason::ALL`] by a test): clients may
//! branch on them, so a code is never renamed or reused.

use std::fmt;
use std::path::Path;

use serde::Serialize;

/// Why something was not served, or served with a caveat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Reason {
    /// A root given to the server could not be read.
    RootUnreadable,
    /// A candidate directory has no `SKILL.md`.
    NoSkillMd,
    /// `SKILL.md` exists but could not be read (permissions, not a file, not UTF-8).
    UnreadableSkillMd,
    /// `SKILL.md` is larger than the read cap; only the head was read.
    SkillMdTruncated,
    /// The frontmatter block is missing, unterminated, too large, not YAML, or not a mapping.
    MalformedFrontmatter,
    /// The frontmatter has no usable `description`: the skill is not served.
    NoDescription,
    /// The frontmatter `name` differs from the directory name (the directory wins).
    NameMismatch,
    /// A field breaks the Agent Skills spec (name form, lengths, metadata, allowed-tools).
    SpecViolation,
    /// A frontmatter key the Agent Skills spec does not define.
    UnknownKey,
    /// The directory name (with `--layout recursive`, a segment of the name its path gives) cannot be served as a skill name.
    UnusableName,
    /// Two directories claim the same skill name: both are refused.
    DuplicateName,
    /// The same directory was reached twice (a symlink alias or overlapping roots); served once.
    DuplicatePath,
    /// The `mcp-host:` block is broken: the skill keeps its instructions, loses its scripts.
    Declaration,
    /// A key inside `mcp-host:` that this server does not know; ignored.
    DeclarationUnknownKey,
    /// `mcp-host.version` names a major version this server does not read; the block is ignored.
    DeclarationVersion,
    /// A script asks for a variable the server reserves (loader or interpreter injectors, own config).
    ReservedEnv,
    /// A script timeout above the ceiling, clamped.
    TimeoutClamped,
    /// A declared script is not in the package (or is not a regular file).
    DeclaredScriptMissing,
    /// A symlink leaves the root or its skill; not followed.
    SymlinkEscape,
    /// A symlink points nowhere.
    BrokenSymlink,
    /// A directory symlink leads back to one of its own ancestors; not followed.
    SymlinkLoop,
    /// A file or directory name the read tools cannot address (control characters, `\`, `%`, too long).
    UnusablePath,
    /// More files in one skill than the per-skill cap; the rest are not served.
    FileLimit,
    /// More directories in one skill than the per-skill cap; the rest are not walked (`--layout recursive`: also a skill nested too deep, or a root with too many folders).
    DirLimit,
    /// More skills than the server's cap; the rest are not served.
    SkillLimit,
    /// A hidden directory at a root holds a `SKILL.md`; hidden root folders are not scanned (`--layout recursive`: any hidden folder but agent homes and `skills/` groups).
    HiddenSkipped,
    /// The skill is served by the tools but left out of `skills/list` (SEP-2640 rules).
    ExtensionExcluded,
    /// A grant row or grant source is malformed or grants nothing.
    Grant,
    /// `--layout recursive` does not follow a symlinked folder while looking for skills.
    SymlinkNotFollowed,
    /// A `.claude-plugin/marketplace.json` or `plugin.json` is unreadable, names a path outside the root, or a remote plugin source `serve` does not fetch.
    Marketplace,
}

impl Reason {
    /// Every code, in documentation order.
    pub const ALL: &'static [Reason] = &[
        Reason::RootUnreadable,
        Reason::NoSkillMd,
        Reason::UnreadableSkillMd,
        Reason::SkillMdTruncated,
        Reason::MalformedFrontmatter,
        Reason::NoDescription,
        Reason::NameMismatch,
        Reason::SpecViolation,
        Reason::UnknownKey,
        Reason::UnusableName,
        Reason::DuplicateName,
        Reason::DuplicatePath,
        Reason::Declaration,
        Reason::DeclarationUnknownKey,
        Reason::DeclarationVersion,
        Reason::ReservedEnv,
        Reason::TimeoutClamped,
        Reason::DeclaredScriptMissing,
        Reason::SymlinkEscape,
        Reason::BrokenSymlink,
        Reason::SymlinkLoop,
        Reason::UnusablePath,
        Reason::FileLimit,
        Reason::DirLimit,
        Reason::SkillLimit,
        Reason::HiddenSkipped,
        Reason::ExtensionExcluded,
        Reason::Grant,
        Reason::SymlinkNotFollowed,
        Reason::Marketplace,
    ];

    /// The wire code, e.g. `no-skill-md`.
    pub fn code(self) -> &'static str {
        match self {
            Reason::RootUnreadable => "root-unreadable",
            Reason::NoSkillMd => "no-skill-md",
            Reason::UnreadableSkillMd => "unreadable-skill-md",
            Reason::SkillMdTruncated => "skill-md-truncated",
            Reason::MalformedFrontmatter => "malformed-frontmatter",
            Reason::NoDescription => "no-description",
            Reason::NameMismatch => "name-mismatch",
            Reason::SpecViolation => "spec-violation",
            Reason::UnknownKey => "unknown-key",
            Reason::UnusableName => "unusable-name",
            Reason::DuplicateName => "duplicate-name",
            Reason::DuplicatePath => "duplicate-path",
            Reason::Declaration => "declaration",
            Reason::DeclarationUnknownKey => "declaration-unknown-key",
            Reason::DeclarationVersion => "declaration-version",
            Reason::ReservedEnv => "reserved-env",
            Reason::TimeoutClamped => "timeout-clamped",
            Reason::DeclaredScriptMissing => "declared-script-missing",
            Reason::SymlinkEscape => "symlink-escape",
            Reason::BrokenSymlink => "broken-symlink",
            Reason::SymlinkLoop => "symlink-loop",
            Reason::UnusablePath => "unusable-path",
            Reason::FileLimit => "file-limit",
            Reason::DirLimit => "dir-limit",
            Reason::SkillLimit => "skill-limit",
            Reason::HiddenSkipped => "hidden-skipped",
            Reason::ExtensionExcluded => "extension-excluded",
            Reason::Grant => "grant",
            Reason::SymlinkNotFollowed => "symlink-not-followed",
            Reason::Marketplace => "marketplace",
        }
    }

    /// Whether this reason keeps the skill from being served at all.
    pub fn refuses_skill(self) -> bool {
        matches!(
            self,
            Reason::NoSkillMd
                | Reason::UnreadableSkillMd
                | Reason::MalformedFrontmatter
                | Reason::NoDescription
                | Reason::UnusableName
                | Reason::DuplicateName
                | Reason::SkillLimit
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// One entry of the `problems` list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Problem {
    /// Where: the directory, file or grant source concerned.
    pub path: String,
    /// The skill it concerns, when there is one (its served name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// Stable reason code (what each means: the problem reasons table in docs/reference.md, or `skill-operator docs`).
    #[schemars(schema_with = "reason_codes")]
    pub reason: Reason,
    /// What exactly is wrong, in words a skill author can act on.
    pub detail: String,
}

/// `reason` in the tools' output schemas: the codes as a plain `enum`.
/// The derived schema of [`Reason`] describes every code (it makes the
/// table in docs/reference.md); sent in `skill_list`'s and `skill_load`'s output schemas
/// it was 3.7 KiB each, two fifths of every `tools/list` answer, telling a
/// client what the reference already says while each problem carries its own
/// `detail`.
fn reason_codes(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let codes: Vec<&str> = Reason::ALL.iter().map(|r| r.code()).collect();
    schemars::json_schema!({ "type": "string", "enum": codes })
}

impl Problem {
    pub fn new(path: impl AsRef<Path>, reason: Reason, detail: impl Into<String>) -> Self {
        Problem { path: path.as_ref().display().to_string(), skill: None, reason, detail: detail.into() }
    }

    pub fn for_skill(mut self, skill: impl Into<String>) -> Self {
        self.skill = Some(skill.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn codes_are_unique_and_match_serde() {
        let mut seen = std::collections::HashSet::new();
        for reason in Reason::ALL {
            assert!(seen.insert(reason.code()), "duplicate code {}", reason.code());
            let wire = serde_json::to_value(reason).unwrap();
            assert_eq!(wire, serde_json::Value::String(reason.code().into()));
        }
    }

    #[test]
    fn all_lists_every_variant() {
        // The generated schema enumerates every serde variant; ALL (and so
        // the reference table) must hold exactly those.
        let schema = serde_json::to_value(schemars::schema_for!(Reason)).unwrap();
        let mut wire: Vec<String> = match schema.get("oneOf") {
            Some(Value::Array(items)) => items.iter().filter_map(|i| i.get("const").and_then(Value::as_str).map(String::from)).collect(),
            _ => schema["enum"].as_array().unwrap().iter().filter_map(|v| v.as_str().map(String::from)).collect(),
        };
        wire.sort();
        let mut all: Vec<String> = Reason::ALL.iter().map(|r| r.code().to_string()).collect();
        all.sort();
        assert_eq!(wire, all);
    }

    #[test]
    fn problem_schema_enumerates_every_code_without_per_code_text() {
        let schema = serde_json::to_value(schemars::schema_for!(Problem)).unwrap();
        let reason = &schema["properties"]["reason"];
        let codes: Vec<&str> = reason["enum"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert_eq!(codes, Reason::ALL.iter().map(|r| r.code()).collect::<Vec<_>>());
        assert_eq!(reason["type"], "string");
        assert!(reason["description"].as_str().unwrap().contains("docs/reference.md"), "{reason}");
        assert!(schema.get("$defs").and_then(|d| d.get("Reason")).is_none(), "the described Reason schema is not inlined: {schema}");
    }
}
