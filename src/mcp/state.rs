//! The server's view of the world: the catalog, the grant, the interpreters,
//! and caches derived from them. Built once; shared by every session.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use rmcp::model::CacheScope;

use crate::core::catalog::{Catalog, Skill};
use crate::core::declaration::Interpreter;
use crate::core::discovery::{self, Limits};
use crate::core::grants::Grants;
use crate::core::policy::{script_status, ScriptStatus};
use crate::core::problems::Problem;

use super::extension;

/// Everything a request handler needs.
pub struct ServerState {
    pub catalog: Catalog,
    pub grants: Grants,
    /// Interpreters this deployment can run (found on PATH at start-up).
    pub interpreters: BTreeSet<Interpreter>,
    /// Catalog problems plus grant audit plus extension exclusions.
    pub problems: Vec<Problem>,
    /// Names of skills listed by `skills/list` (SEP-2640 rules hold for them).
    pub extension_names: BTreeSet<String>,
    /// Who may cache `skills/list` answers.
    pub cache_scope: CacheScope,
    /// The execution backend (`None`: this server only reads skills).
    pub execution: Option<std::sync::Arc<super::run::Execution>>,
    /// Digest cache: (skill, path) -> (size, mtime, digest).
    digests: Mutex<HashMap<(String, String), (u64, SystemTime, String)>>,
}

impl ServerState {
    pub fn new(catalog: Catalog, grants: Grants, interpreters: BTreeSet<Interpreter>) -> Self {
        let mut problems = catalog.problems.clone();
        problems.extend(grants.audit(&catalog));
        let mut extension_names = BTreeSet::new();
        for skill in &catalog.skills {
            match extension::eligibility(skill) {
                Ok(()) => {
                    extension_names.insert(skill.name.clone());
                }
                Err(problem) => problems.push(problem),
            }
        }
        ServerState {
            catalog,
            grants,
            interpreters,
            problems,
            extension_names,
            cache_scope: CacheScope::Public,
            execution: None,
            digests: Mutex::new(HashMap::new()),
        }
    }

    /// Attach an execution backend.
    pub fn with_execution(mut self, execution: std::sync::Arc<super::run::Execution>) -> Self {
        self.execution = Some(execution);
        self
    }

    /// Scan `roots` and build the state (blocking: call from a blocking context).
    pub fn scan(roots: &[PathBuf], grants: Grants, interpreters: BTreeSet<Interpreter>) -> Self {
        ServerState::new(discovery::discover(roots, Limits::default()), grants, interpreters)
    }

    pub fn status(&self, skill: &Skill, script: &crate::core::catalog::DeclaredScript) -> ScriptStatus {
        script_status(skill, script, &self.grants, &self.interpreters)
    }

    /// Problems concerning one skill, including grant findings.
    pub fn problems_of(&self, name: &str) -> Vec<Problem> {
        self.problems.iter().filter(|p| p.skill.as_deref() == Some(name)).cloned().collect()
    }

    /// The `sha256:` digest of a skill file, cached while its size and
    /// modification time stay the same.
    pub fn digest(&self, skill: &Skill, path: &str, real: &std::path::Path) -> std::io::Result<(u64, String)> {
        let meta = std::fs::metadata(real)?;
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let key = (skill.name.clone(), path.to_string());
        if let Ok(cache) = self.digests.lock() {
            if let Some((size, when, digest)) = cache.get(&key) {
                if *size == meta.len() && *when == mtime {
                    return Ok((*size, digest.clone()));
                }
            }
        }
        let digest = crate::core::content::file_digest(real)?;
        if let Ok(mut cache) = self.digests.lock() {
            cache.insert(key, (meta.len(), mtime, digest.clone()));
        }
        Ok((meta.len(), digest))
    }
}
