//! What may run: a declared script's status given the package, the grant and
//! the interpreters this deployment can run.
//!
//! Shared by `skill_list` (which reports every declared script as runnable,
//! unavailable or ungranted, so "nothing runs" is never mistaken for "nothing
//! declared") and, later, by every runner before it starts anything.

use std::collections::BTreeSet;

use super::catalog::{DeclaredScript, Skill};
use super::declaration::Interpreter;
use super::grants::Grants;

/// The status of one declared script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScriptStatus {
    /// May run, receiving exactly these granted variables (names).
    Runnable { env: Vec<String> },
    /// Cannot run here whatever the grant says: the package or the deployment forbids it.
    Unavailable(String),
    /// Could run, but the owner has not granted it.
    Ungranted(String),
}

impl ScriptStatus {
    pub fn label(&self) -> &'static str {
        match self {
            ScriptStatus::Runnable { .. } => "runnable",
            ScriptStatus::Unavailable(_) => "unavailable",
            ScriptStatus::Ungranted(_) => "ungranted",
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            ScriptStatus::Runnable { .. } => None,
            ScriptStatus::Unavailable(r) | ScriptStatus::Ungranted(r) => Some(r),
        }
    }
}

/// The interpreters a deployment can run.
pub fn interpreter_set_text(available: &BTreeSet<Interpreter>) -> String {
    if available.is_empty() {
        "none".into()
    } else {
        available.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
    }
}

/// Decide one script's status. Unavailable wins over ungranted: a grant
/// cannot make a missing file or an absent interpreter runnable.
pub fn script_status(skill: &Skill, script: &DeclaredScript, grants: &Grants, available: &BTreeSet<Interpreter>) -> ScriptStatus {
    if let Some(reason) = &script.unavailable {
        return ScriptStatus::Unavailable(reason.clone());
    }
    let Some(interpreter) = script.decl.interpreter else {
        return ScriptStatus::Unavailable("no interpreter from the closed set is declared".into());
    };
    if !available.contains(&interpreter) {
        return ScriptStatus::Unavailable(format!(
            "interpreter `{interpreter}` is not available in this deployment (it runs: {})",
            interpreter_set_text(available)
        ));
    }
    match grants.decide(&skill.name, script.decl.script.as_str(), &script.decl.env) {
        Ok(env) => ScriptStatus::Runnable { env },
        Err(reason) => ScriptStatus::Ungranted(reason),
    }
}
