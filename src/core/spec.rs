//! Agent Skills spec checks (agentskills.io) on a parsed frontmatter.
//!
//! Half of the published skills break the strict spec in some way (unknown
//! keys, capitals in names, lists for `allowed-tools`, long descriptions), so
//! every deviation is a reported problem, never a refusal. Only a missing
//! description refuses a skill: without it an agent cannot decide when to
//! use the skill at all.

use serde_json::{Map, Value};

use super::limits::{SPEC_COMPATIBILITY_MAX, SPEC_DESCRIPTION_MAX, SPEC_NAME_MAX};
use super::problems::Reason;

/// Frontmatter keys the spec defines, plus this project's `mcp-host`.
pub const KNOWN_KEYS: &[&str] = &["name", "description", "license", "compatibility", "metadata", "allowed-tools", "mcp-host"];

/// What the server needs from a frontmatter, after the checks.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillMeta {
    pub description: String,
    /// The frontmatter `name` when it is a string (served name is the directory's).
    pub frontmatter_name: Option<String>,
    pub license: Option<String>,
}

/// A deviation found by the checks: reason and detail.
pub type Finding = (Reason, String);

/// Check a frontmatter against the spec for a skill served as `served_name`.
/// `Err` only when the skill cannot be served (no usable description).
pub fn check(served_name: &str, fm: &Map<String, Value>) -> Result<(SkillMeta, Vec<Finding>), Finding> {
    let description = match fm.get("description") {
        Some(Value::String(text)) if !text.trim().is_empty() => text.clone(),
        Some(Value::String(_)) => return Err((Reason::NoDescription, "`description` is empty".into())),
        Some(other) => {
            return Err((Reason::NoDescription, format!("`description` must be text, found {}", kind(other))));
        }
        None => return Err((Reason::NoDescription, "the frontmatter has no `description`".into())),
    };
    let mut findings = Vec::new();
    let chars = description.chars().count();
    if chars > SPEC_DESCRIPTION_MAX {
        findings.push((
            Reason::SpecViolation,
            format!("`description` is {chars} characters; the spec allows {SPEC_DESCRIPTION_MAX} (served in full)"),
        ));
    }

    let frontmatter_name = match fm.get("name") {
        None => {
            findings.push((Reason::SpecViolation, format!("the frontmatter has no `name`; served as `{served_name}`")));
            None
        }
        Some(Value::String(name)) => {
            if let Err(why) = spec_name(name) {
                findings.push((Reason::SpecViolation, format!("`name` {name:?} {why}")));
            }
            if name != leaf(served_name) {
                findings.push((
                    Reason::NameMismatch,
                    format!("frontmatter `name` is {name:?}; the skill is served under its directory name `{served_name}`"),
                ));
            }
            Some(name.clone())
        }
        Some(other) => {
            findings.push((Reason::SpecViolation, format!("`name` must be text, found {}", kind(other))));
            None
        }
    };

    let license = match fm.get("license") {
        None => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(other) => {
            findings.push((Reason::SpecViolation, format!("`license` must be text, found {}", kind(other))));
            None
        }
    };

    match fm.get("compatibility") {
        None => {}
        Some(Value::String(text)) => {
            let n = text.chars().count();
            if n > SPEC_COMPATIBILITY_MAX {
                findings
                    .push((Reason::SpecViolation, format!("`compatibility` is {n} characters; the spec allows {SPEC_COMPATIBILITY_MAX}")));
            }
        }
        Some(other) => findings.push((Reason::SpecViolation, format!("`compatibility` must be text, found {}", kind(other)))),
    }

    match fm.get("metadata") {
        None => {}
        Some(Value::Object(map)) => {
            let odd: Vec<&str> = map.iter().filter(|(_, v)| !v.is_string()).map(|(k, _)| k.as_str()).collect();
            if !odd.is_empty() {
                findings.push((Reason::SpecViolation, format!("`metadata` values must be text; not text: {}", odd.join(", "))));
            }
        }
        Some(other) => findings.push((Reason::SpecViolation, format!("`metadata` must be a mapping, found {}", kind(other)))),
    }

    match fm.get("allowed-tools") {
        None | Some(Value::String(_)) => {}
        Some(Value::Array(_)) => {
            findings.push((Reason::SpecViolation, "`allowed-tools` is a list; the spec wants one space-separated string".into()))
        }
        Some(other) => findings.push((Reason::SpecViolation, format!("`allowed-tools` must be text, found {}", kind(other)))),
    }

    let unknown: Vec<&str> = fm.keys().map(String::as_str).filter(|k| !KNOWN_KEYS.contains(k)).collect();
    if !unknown.is_empty() {
        findings.push((Reason::UnknownKey, format!("keys the Agent Skills spec does not define: {}", unknown.join(", "))));
    }

    Ok((SkillMeta { description, frontmatter_name, license }, findings))
}

/// The spec's name form: 1-64 of `a-z`, `0-9`, `-`; no leading, trailing or double hyphen.
pub fn spec_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.chars().count() > SPEC_NAME_MAX {
        return Err("is longer than 64 characters");
    }
    if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return Err("may use only lowercase letters, digits and hyphens");
    }
    if name.starts_with('-') || name.ends_with('-') || name.contains("--") {
        return Err("may not start or end with a hyphen or contain `--`");
    }
    Ok(())
}

/// Whether a directory name can be served as a skill name: it must be a
/// single plain segment usable in `skill://<name>/...`, a prompt name and a
/// grant row. Capitals and dots are fine; spaces, `%` and controls are not.
pub fn servable_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 128 {
        return Err("must be 1-128 characters".into());
    }
    if name.starts_with('.') {
        return Err("must not start with a dot".into());
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Err(format!("contains {bad:?}; use letters, digits, `-`, `_` or `.`"));
    }
    Ok(())
}

/// The last segment of a served name (`document-skills/xlsx` is `xlsx`):
/// what the frontmatter `name` is compared with, and what a SkillSource's
/// package is served as by a binding.
pub fn leaf_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// Whether a served name can be served: one [`servable_name`] segment, or
/// (`serve --layout recursive`) several joined by `/`, each servable, 1-128
/// characters in all. A single segment gets exactly [`servable_name`]'s
/// answer; otherwise the answer names the failing segment.
pub fn servable_path_name(name: &str) -> Result<(), String> {
    if !name.contains('/') {
        return servable_name(name);
    }
    if name.len() > 128 {
        return Err("must be 1-128 characters in all".into());
    }
    for segment in name.split('/') {
        servable_name(segment).map_err(|why| format!("has a segment {segment:?} that {why}"))?;
    }
    Ok(())
}

/// The last segment of a served name: the part the frontmatter `name`
/// must equal (the Agent Skills rule), and SEP-2640's URI segment.
pub fn leaf(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

pub(crate) fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fm(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn reasons(findings: &[Finding]) -> Vec<Reason> {
        findings.iter().map(|f| f.0).collect()
    }

    #[test]
    fn clean_skill_has_no_findings() {
        let (meta, findings) =
            check("pdf", &fm(json!({"name":"pdf","description":"d","license":"MIT","metadata":{"a":"b"},"allowed-tools":"Read Bash"})))
                .unwrap();
        assert!(findings.is_empty(), "{findings:?}");
        assert_eq!(meta.license.as_deref(), Some("MIT"));
    }

    #[test]
    fn description_rules() {
        assert_eq!(check("a", &fm(json!({"name":"a"}))).unwrap_err().0, Reason::NoDescription);
        assert_eq!(check("a", &fm(json!({"description":"  "}))).unwrap_err().0, Reason::NoDescription);
        assert_eq!(check("a", &fm(json!({"description":["x"]}))).unwrap_err().0, Reason::NoDescription);
        let at_cap = "d".repeat(SPEC_DESCRIPTION_MAX);
        assert!(check("a", &fm(json!({"name":"a","description":at_cap}))).unwrap().1.is_empty());
        let over = "d".repeat(SPEC_DESCRIPTION_MAX + 1);
        let (meta, findings) = check("a", &fm(json!({"name":"a","description":over.clone()}))).unwrap();
        assert_eq!(reasons(&findings), vec![Reason::SpecViolation]);
        assert_eq!(meta.description, over, "served in full");
    }

    #[test]
    fn name_rules() {
        let (_, f) = check("dir", &fm(json!({"name":"Other Name","description":"d"}))).unwrap();
        assert_eq!(reasons(&f), vec![Reason::SpecViolation, Reason::NameMismatch]);
        let (_, f) = check("dir", &fm(json!({"description":"d"}))).unwrap();
        assert_eq!(reasons(&f), vec![Reason::SpecViolation]);
        let (_, f) = check("dir", &fm(json!({"name":7,"description":"d"}))).unwrap();
        assert_eq!(reasons(&f), vec![Reason::SpecViolation]);
        assert!(spec_name(&"a".repeat(64)).is_ok());
        assert!(spec_name(&"a".repeat(65)).is_err());
        for bad in ["", "-a", "a-", "a--b", "A", "a_b", "a b"] {
            assert!(spec_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn compatibility_metadata_allowed_tools_unknown_keys() {
        let ok = "c".repeat(SPEC_COMPATIBILITY_MAX);
        assert!(check("a", &fm(json!({"name":"a","description":"d","compatibility":ok}))).unwrap().1.is_empty());
        let over = "c".repeat(SPEC_COMPATIBILITY_MAX + 1);
        let (_, f) = check("a", &fm(json!({"name":"a","description":"d","compatibility":over}))).unwrap();
        assert_eq!(reasons(&f), vec![Reason::SpecViolation]);
        let (_, f) = check("a", &fm(json!({"name":"a","description":"d","metadata":{"version":1.2,"tags":["x"]}}))).unwrap();
        assert!(f[0].1.contains("version") && f[0].1.contains("tags"));
        let (_, f) = check("a", &fm(json!({"name":"a","description":"d","allowed-tools":["Read","Bash"]}))).unwrap();
        assert!(f[0].1.contains("list"));
        let (_, f) = check("a", &fm(json!({"name":"a","description":"d","requires":"x","tags":[1],"mcp-host":{}}))).unwrap();
        assert_eq!(reasons(&f), vec![Reason::UnknownKey]);
        assert!(f[0].1.contains("requires") && f[0].1.contains("tags") && !f[0].1.contains("mcp-host"));
    }

    #[test]
    fn nested_names_check_every_segment_and_compare_the_leaf() {
        for ok in ["pdf", "document-skills/xlsx", "a/b/c"] {
            assert!(servable_path_name(ok).is_ok(), "{ok}");
        }
        for bad in ["a//b", "/a", "a/", "a/.b", "a/has space", "a/..", &format!("a/{}", "x".repeat(127))] {
            assert!(servable_path_name(bad).is_err(), "{bad}");
        }
        assert!(servable_path_name("a/has space").unwrap_err().contains("\"has space\""));
        assert_eq!(servable_path_name(".x"), servable_name(".x"));
        assert_eq!(leaf("document-skills/xlsx"), "xlsx");
        assert_eq!(leaf("pdf"), "pdf");
        let (_, f) = check("document-skills/xlsx", &fm(json!({"name":"xlsx","description":"d"}))).unwrap();
        assert!(f.is_empty(), "{f:?}");
        let (_, f) = check("document-skills/xlsx", &fm(json!({"name":"document-skills","description":"d"}))).unwrap();
        assert_eq!(reasons(&f), vec![Reason::NameMismatch]);
    }

    #[test]
    fn servable_names() {
        for ok in ["pdf", "PDF-Tools", "docx_v2", "a.b"] {
            assert!(servable_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".hidden", "has space", "pct%2e", "uni\u{e9}", &"x".repeat(129)] {
            assert!(servable_name(bad).is_err(), "{bad}");
        }
    }
}
