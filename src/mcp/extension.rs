//! The MCP Skills extension (SEP-2640, `io.modelcontextprotocol/skills`).
//!
//! `skills/list` and `skills/get` describe each skill with its verbatim
//! frontmatter and a manifest of `sha256:` digests. The extension has rules
//! of its own that the tools do not: the URI's last skill segment must equal
//! a spec-valid frontmatter `name` (a nested name like `document-skills/xlsx`
//! is served at `skill://document-skills/xlsx/SKILL.md`, its leaf `xlsx` is
//! the one compared), and a manifest holds at most 512 files
//! and 16 MiB. A skill that breaks them is still served by the tools,
//! prompts and resources, and is reported `extension-excluded` instead of
//! breaking the whole listing.

use rmcp::model::{Skill as WireSkill, SkillFrontmatter, SkillResource, SkillResources};
use serde_json::Value;

use crate::core::catalog::Skill;
use crate::core::limits::{EXTENSION_BYTES_MAX, EXTENSION_FILES_MAX};
use crate::core::problems::{Problem, Reason};
use crate::core::spec::{leaf, spec_name};

use super::uri::file_uri;

/// Skills per `skills/list` page.
pub const PAGE_SIZE: usize = 100;
/// How long a listing may be treated as fresh.
pub const TTL_MS: u64 = 300_000;

/// Whether a skill can be listed by the extension, or the problem saying why not.
pub fn eligibility(skill: &Skill) -> Result<(), Problem> {
    let exclude = |detail: String| {
        Err(Problem::new(
            skill.shown.file("SKILL.md"),
            Reason::ExtensionExcluded,
            format!("{detail}; still served by the tools, prompts and resources"),
        )
        .for_skill(&skill.name))
    };
    match skill.frontmatter.get("name") {
        Some(Value::String(name)) if name == leaf(&skill.name) => {}
        _ => return exclude("skills/list needs a frontmatter `name` equal to the directory name".into()),
    }
    if spec_name(leaf(&skill.name)).is_err() {
        return exclude("skills/list needs a spec-valid name (lowercase letters, digits, single hyphens)".into());
    }
    if skill.files.len() > EXTENSION_FILES_MAX {
        return exclude(format!("{} files; skills/list manifests hold at most {EXTENSION_FILES_MAX}", skill.files.len()));
    }
    if skill.bytes > EXTENSION_BYTES_MAX {
        return exclude(format!("{} bytes; skills/list manifests hold at most 16 MiB", skill.bytes));
    }
    let probe = WireSkill::new(
        skill_uri(&skill.name),
        frontmatter(skill),
        SkillResources::Files(vec![SkillResource::new(skill_uri(&skill.name), format!("sha256:{}", "0".repeat(64)), 0)]),
    );
    if let Err(err) = probe.validate() {
        return exclude(format!("the entry breaks SEP-2640: {err}"));
    }
    Ok(())
}

pub fn skill_uri(name: &str) -> String {
    file_uri(name, "SKILL.md")
}

pub(super) fn frontmatter(skill: &Skill) -> SkillFrontmatter {
    let mut extra = skill.frontmatter.clone();
    extra.remove("name");
    extra.remove("description");
    let mut fm = SkillFrontmatter::new(leaf(&skill.name).to_string(), skill.meta.description.clone());
    fm.extra = extra;
    fm
}
