//! Grants: the owner's word on what may run, intersected with what skills declare.
//!
//! `MCP_SKILL_RUN` (or a grants file for `serve --grants`) holds JSON rows
//! `{skill, script, env?}`. What may run is the declaration intersected with
//! the grant: a row naming an undeclared script, or a variable the script
//! did not ask for, grants nothing and is reported. No way of writing a
//! grant makes something runnable that a skill did not declare, which is
//! what makes it safe to read from an environment that also holds a
//! deployment's own variables.
//!
//! When no grant is given, the default depends on who started the process.
//! Hosted (any variable a host injects is present): nothing runs, fail
//! closed, because one process environment holds every credential and a
//! skill naming its neighbour's variable would receive it. Standalone (no
//! marker): the person who pointed the server at a directory is the owner,
//! and each skill's declaration stands.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::catalog::Catalog;
use super::problems::{Problem, Reason};

/// Variables whose presence means a host started this process.
pub const HOST_MARKERS: &[&str] = &["MCP_SKILLS_PATH", "MCP_HOST_METER_FILE", "MCP_DATA_DIR", "MCP_BLOB_BASE_URL"];
/// The grant variable.
pub const GRANT_VAR: &str = "MCP_SKILL_RUN";

/// One grant row.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantRow {
    pub skill: String,
    pub script: String,
    #[serde(default)]
    pub env: Vec<String>,
    /// Allow the network for the hosts the skill declares (sandboxed runs have none otherwise).
    #[serde(default)]
    pub egress: bool,
}

/// Where the effective grant came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantSource {
    /// Standalone, no grant given: each skill's declaration stands.
    Declaration,
    /// Hosted, no grant given: nothing runs.
    HostedDefault { markers: Vec<String> },
    /// `MCP_SKILL_RUN`.
    Env,
    /// A grants file.
    File(PathBuf),
}

impl GrantSource {
    /// The `grantFrom` value shown by `skill_list`.
    pub fn label(&self) -> String {
        match self {
            GrantSource::Declaration => "declaration".into(),
            GrantSource::HostedDefault { .. } => "hosted-default".into(),
            GrantSource::Env => GRANT_VAR.into(),
            GrantSource::File(path) => format!("file:{}", path.display()),
        }
    }
}

/// The effective grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    pub source: GrantSource,
    /// `None` means "the declaration stands" (standalone default).
    rows: Option<Vec<GrantRow>>,
    /// Set when the grant could not be read: nothing runs, and this says why.
    pub error: Option<String>,
}

impl Grants {
    /// Decide from the process environment (a lookup function, so tests need
    /// no real environment) and an optional grants file.
    pub fn resolve(lookup: &dyn Fn(&str) -> Option<String>, file: Option<&Path>) -> Grants {
        let env_value = lookup(GRANT_VAR).filter(|v| is_set(v));
        match (env_value, file) {
            (Some(_), Some(path)) => Grants {
                source: GrantSource::File(path.to_path_buf()),
                rows: Some(Vec::new()),
                error: Some(format!("both {GRANT_VAR} and a grants file are given; give one, nothing runs until then")),
            },
            (Some(text), None) => Grants::from_text(GrantSource::Env, &text),
            (None, Some(path)) => match std::fs::read_to_string(path) {
                Ok(text) => Grants::from_text(GrantSource::File(path.to_path_buf()), &text),
                Err(err) => Grants {
                    source: GrantSource::File(path.to_path_buf()),
                    rows: Some(Vec::new()),
                    error: Some(format!("cannot read the grants file: {err}")),
                },
            },
            (None, None) => {
                let markers: Vec<String> =
                    HOST_MARKERS.iter().filter(|m| lookup(m).is_some_and(|v| is_set(&v))).map(|m| m.to_string()).collect();
                if markers.is_empty() {
                    Grants { source: GrantSource::Declaration, rows: None, error: None }
                } else {
                    Grants { source: GrantSource::HostedDefault { markers }, rows: Some(Vec::new()), error: None }
                }
            }
        }
    }

    fn from_text(source: GrantSource, text: &str) -> Grants {
        match serde_json::from_str::<Vec<GrantRow>>(text) {
            Ok(rows) => Grants { source, rows: Some(rows), error: None },
            Err(err) => Grants {
                source,
                rows: Some(Vec::new()),
                error: Some(format!("the grant is not a JSON list of {{skill, script, env?}} rows: {err}; nothing runs")),
            },
        }
    }

    /// A note for `skill_list` when the grant explains why nothing runs.
    pub fn note(&self) -> Option<String> {
        if let Some(err) = &self.error {
            return Some(err.clone());
        }
        match &self.source {
            GrantSource::HostedDefault { markers } => Some(format!(
                "hosted ({} set) and no {GRANT_VAR} grant: nothing runs; instructions and files are still served",
                markers.join(", ")
            )),
            _ => None,
        }
    }

    /// What the grant allows for one declared script: `Ok(variables)` or the reason it is not granted.
    pub fn decide(&self, skill: &str, script: &str, requested: &[String]) -> Result<Vec<String>, String> {
        if let Some(err) = &self.error {
            return Err(format!("the grant is broken: {err}"));
        }
        let Some(rows) = &self.rows else {
            return Ok(requested.to_vec());
        };
        let matching: Vec<&GrantRow> = rows.iter().filter(|r| r.skill == skill && r.script == script).collect();
        if matching.is_empty() {
            return Err(match &self.source {
                GrantSource::HostedDefault { .. } => format!("hosted without a {GRANT_VAR} grant: nothing runs"),
                source => format!("no grant row in {} names this script", source.label()),
            });
        }
        let granted: BTreeSet<&String> = matching.iter().flat_map(|r| r.env.iter()).collect();
        Ok(requested.iter().filter(|v| granted.contains(v)).cloned().collect())
    }

    /// Whether a run of this script may use the network for the skill's
    /// declared egress: standalone, the declaration stands; with a grant, a
    /// row for the script must say `"egress": true`.
    pub fn egress_allowed(&self, skill: &str, script: &str) -> bool {
        if self.error.is_some() {
            return false;
        }
        match &self.rows {
            None => true,
            Some(rows) => rows.iter().any(|r| r.skill == skill && r.script == script && r.egress),
        }
    }

    /// Report rows that grant nothing: unknown skill, undeclared script,
    /// variables the script did not ask for.
    pub fn audit(&self, catalog: &Catalog) -> Vec<Problem> {
        let where_ = self.source.label();
        let mut problems = Vec::new();
        if let Some(err) = &self.error {
            problems.push(Problem::new(&where_, Reason::Grant, err.clone()));
            return problems;
        }
        for row in self.rows.iter().flatten() {
            let Some(skill) = catalog.get(&row.skill) else {
                problems.push(Problem::new(
                    &where_,
                    Reason::Grant,
                    format!("grant names skill `{}`, which is not served; grants nothing", row.skill),
                ));
                continue;
            };
            let Some(script) = skill.script(&row.script) else {
                let declared: Vec<&str> = skill.scripts.iter().map(|s| s.decl.script.as_str()).collect();
                problems.push(
                    Problem::new(
                        &where_,
                        Reason::Grant,
                        format!(
                            "grant names {}, which `{}` does not declare (declared: {}); grants nothing",
                            row.script,
                            row.skill,
                            list_or_none(&declared)
                        ),
                    )
                    .for_skill(&row.skill),
                );
                continue;
            };
            for var in &row.env {
                if !script.decl.env.contains(var) {
                    problems.push(
                        Problem::new(
                            &where_,
                            Reason::Grant,
                            format!("grant hands {var} to {}, which did not ask for it; not handed over", row.script),
                        )
                        .for_skill(&row.skill),
                    );
                }
            }
        }
        problems
    }
}

/// Blank, or a literal `${...}` left by a template, counts as unset.
pub fn is_set(value: &str) -> bool {
    let v = value.trim();
    !(v.is_empty() || (v.starts_with("${") && v.ends_with('}')))
}

fn list_or_none(items: &[&str]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn standalone_declaration_stands() {
        let g = Grants::resolve(&env(&[]), None);
        assert_eq!(g.source, GrantSource::Declaration);
        assert_eq!(g.decide("s", "a.js", &["K".into()]), Ok(vec!["K".to_string()]));
        assert!(g.note().is_none());
    }

    #[test]
    fn hosted_markers_fail_closed() {
        for marker in HOST_MARKERS {
            let g = Grants::resolve(&env(&[(marker, "/x")]), None);
            assert!(matches!(g.source, GrantSource::HostedDefault { .. }), "{marker}");
            assert!(g.decide("s", "a.js", &[]).is_err());
            assert!(g.note().unwrap().contains(marker));
        }
        // Blank and template placeholders are unset.
        let g = Grants::resolve(&env(&[("MCP_DATA_DIR", " "), ("MCP_SKILLS_PATH", "${SKILLS}")]), None);
        assert_eq!(g.source, GrantSource::Declaration);
    }

    #[test]
    fn env_grant_intersects() {
        let g = Grants::resolve(
            &env(&[("MCP_SKILL_RUN", r#"[{"skill":"s","script":"a.js","env":["K","OTHER"]}]"#), ("MCP_DATA_DIR", "/d")]),
            None,
        );
        assert_eq!(g.source, GrantSource::Env);
        assert_eq!(g.decide("s", "a.js", &["K".into(), "NOT_GRANTED".into()]), Ok(vec!["K".to_string()]));
        assert!(g.decide("s", "b.js", &[]).is_err());
        assert!(g.decide("t", "a.js", &[]).is_err());
    }

    #[test]
    fn a_nested_skill_name_is_granted_by_its_whole_name() {
        let rows = r#"[{"skill":"document-skills/xlsx","script":"a.js","env":["K"]}]"#;
        let g = Grants::resolve(&env(&[("MCP_SKILL_RUN", rows)]), None);
        assert_eq!(g.decide("document-skills/xlsx", "a.js", &["K".into()]), Ok(vec!["K".to_string()]));
        for other in ["xlsx", "document-skills", "document-skills/xlsx/", "other/xlsx"] {
            assert!(g.decide(other, "a.js", &[]).is_err(), "{other}");
        }
    }

    #[test]
    fn malformed_grant_runs_nothing() {
        for bad in ["{", r#"{"skill":"s"}"#, r#"[{"skill":"s"}]"#, r#"[{"skill":"s","script":"a","extra":1}]"#] {
            let g = Grants::resolve(&env(&[("MCP_SKILL_RUN", bad)]), None);
            assert!(g.error.is_some(), "{bad}");
            assert!(g.decide("s", "a", &[]).unwrap_err().contains("broken"));
        }
    }

    #[test]
    fn egress_needs_the_declaration_or_a_row_that_says_so() {
        assert!(Grants::resolve(&env(&[]), None).egress_allowed("s", "a.js"));
        let rows = r#"[{"skill":"s","script":"a.js"},{"skill":"s","script":"b.js","egress":true}]"#;
        let g = Grants::resolve(&env(&[("MCP_SKILL_RUN", rows)]), None);
        assert!(!g.egress_allowed("s", "a.js"));
        assert!(g.egress_allowed("s", "b.js"));
        assert!(!Grants::resolve(&env(&[("MCP_DATA_DIR", "/d")]), None).egress_allowed("s", "b.js"));
    }

    #[test]
    fn file_grant_and_conflict() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("grants.json");
        std::fs::write(&file, r#"[{"skill":"s","script":"a.js"}]"#).unwrap();
        let g = Grants::resolve(&env(&[]), Some(&file));
        assert!(matches!(g.source, GrantSource::File(_)));
        assert_eq!(g.decide("s", "a.js", &["K".into()]), Ok(vec![]));
        let both = Grants::resolve(&env(&[("MCP_SKILL_RUN", "[]")]), Some(&file));
        assert!(both.error.is_some());
        let missing = Grants::resolve(&env(&[]), Some(&dir.path().join("nope.json")));
        assert!(missing.error.unwrap().contains("cannot read"));
    }
}
