//! A [`Snapshot`]: everything the read tools, prompts, resources and the
//! fence need about the skills served at one moment, built once and never
//! changed. A server holds the current one behind a [`SnapshotCell`] and
//! swaps in a new one when the skills change (`serve --watch`, or a
//! namespace's bindings in the gateway); a call takes the current snapshot
//! when it starts and finishes on it, whatever is swapped in meanwhile.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use rmcp::model::CacheScope;

use crate::core::catalog::{Catalog, DeclaredScript, Skill};
use crate::core::declaration::Interpreter;
use crate::core::discovery::{self, Layout, Limits};
use crate::core::fence::{self, Grant, Profile, Refusal, Request, RunPlan, ScriptFacts, ScriptStatus};
use crate::core::grants::Grants;
use crate::core::problems::Problem;

use super::extension;

/// Who decides what runs, per skill: the standalone server's grants and
/// machine, or each SkillBinding and its package's runtime profile.
pub trait RunPolicy: Send + Sync {
    fn grant(&self, skill: &str) -> &dyn Grant;
    fn profile(&self, skill: &str) -> &Profile;
    /// Where the grant comes from, as `skill_list` shows it (`grantFrom`).
    fn source_label(&self) -> String;
    /// Why nothing runs, when the policy explains it.
    fn note(&self) -> Option<String>;
    /// Interpreters some skill may run with, for `skill_list`.
    fn interpreters(&self) -> BTreeSet<Interpreter>;
    /// Grant rows that grant nothing (reported as problems).
    fn audit(&self, catalog: &Catalog) -> Vec<Problem>;
}

/// The standalone server's policy: one grant and one machine for every skill.
pub struct StandalonePolicy {
    pub grants: Grants,
    pub profile: Profile,
}

impl StandalonePolicy {
    pub fn new(grants: Grants, interpreters: BTreeSet<Interpreter>) -> Self {
        StandalonePolicy { grants, profile: Profile::local(interpreters) }
    }
}

impl RunPolicy for StandalonePolicy {
    fn grant(&self, _skill: &str) -> &dyn Grant {
        &self.grants
    }
    fn profile(&self, _skill: &str) -> &Profile {
        &self.profile
    }
    fn source_label(&self) -> String {
        self.grants.source.label()
    }
    fn note(&self) -> Option<String> {
        self.grants.note()
    }
    fn interpreters(&self) -> BTreeSet<Interpreter> {
        self.profile.interpreters.clone()
    }
    fn audit(&self, catalog: &Catalog) -> Vec<Problem> {
        self.grants.audit(catalog)
    }
}

type DigestCache = HashMap<(String, String), (u64, SystemTime, String)>;

/// The skills served at one moment, and what may run.
pub struct Snapshot {
    pub catalog: Catalog,
    pub policy: Box<dyn RunPolicy>,
    /// Catalog problems plus grant audit plus extension exclusions.
    pub problems: Vec<Problem>,
    /// Names of skills listed by `skills/list` (SEP-2640 rules hold for them).
    pub extension_names: BTreeSet<String>,
    /// Who may cache `skills/list` answers.
    pub cache_scope: CacheScope,
    /// Something here is still being decided (a binding the controller has
    /// not called Ready or not-Ready yet): calls wait a moment for the
    /// verdict ([`crate::mcp::state::ServerState::settled`]) rather than
    /// answer from a snapshot that is about to change.
    pub settling: bool,
    /// Digest cache: (skill, path) -> (size, mtime, digest).
    digests: Mutex<DigestCache>,
}

impl Snapshot {
    pub fn new(catalog: Catalog, policy: Box<dyn RunPolicy>) -> Self {
        let mut problems = catalog.problems.clone();
        problems.extend(policy.audit(&catalog));
        let mut extension_names = BTreeSet::new();
        for skill in &catalog.skills {
            match extension::eligibility(skill) {
                Ok(()) => {
                    extension_names.insert(skill.name.clone());
                }
                Err(problem) => problems.push(problem),
            }
        }
        Snapshot {
            catalog,
            policy,
            problems,
            extension_names,
            cache_scope: CacheScope::Public,
            settling: false,
            digests: Mutex::new(HashMap::new()),
        }
    }

    /// The standalone server's snapshot of `roots` (blocking: it scans them).
    pub fn scan(roots: &[PathBuf], grants: Grants, interpreters: BTreeSet<Interpreter>) -> Self {
        Snapshot::scan_with(roots, Layout::Standard, grants, interpreters)
    }

    /// [`Snapshot::scan`] with the roots read in `layout`.
    pub fn scan_with(roots: &[PathBuf], layout: Layout, grants: Grants, interpreters: BTreeSet<Interpreter>) -> Self {
        Snapshot::new(discovery::discover_with(roots, Limits::default(), layout), Box::new(StandalonePolicy::new(grants, interpreters)))
    }

    /// One declared script's status under this snapshot's policy.
    pub fn status(&self, skill: &Skill, script: &DeclaredScript) -> ScriptStatus {
        fence::script_status(&skill.name, &ScriptFacts::from(script), self.policy.grant(&skill.name), self.policy.profile(&skill.name))
    }

    /// The fence's decision for a call of `skill`.
    pub fn plan(&self, skill: &str, request: &Request<'_>) -> Result<RunPlan, Refusal> {
        fence::plan(&self.catalog, self.policy.grant(skill), self.policy.profile(skill), skill, request)
    }

    /// Problems concerning one skill, including grant findings.
    pub fn problems_of(&self, name: &str) -> Vec<Problem> {
        self.problems.iter().filter(|p| p.skill.as_deref() == Some(name)).cloned().collect()
    }

    /// The SEP-2640 wire entry for one eligible skill, with a digest for
    /// every file (from this snapshot's digest cache).
    pub fn extension_entry(&self, skill: &Skill) -> std::io::Result<rmcp::model::Skill> {
        use rmcp::model::{SkillResource, SkillResources};
        let mut resources = Vec::with_capacity(skill.files.len());
        for file in &skill.files {
            let real = crate::core::paths::resolve_inside(&skill.dir, &file.path)
                .map_err(|e| std::io::Error::other(format!("{}: {e}", file.path)))?;
            let (size, digest) = self.digest(skill, file.path.as_str(), &real)?;
            resources.push(SkillResource::new(super::uri::file_uri(&skill.name, file.path.as_str()), digest, size));
        }
        Ok(rmcp::model::Skill::new(extension::skill_uri(&skill.name), extension::frontmatter(skill), SkillResources::Files(resources)))
    }

    /// The `sha256:` digest of a skill file, cached while its size and
    /// modification time stay the same.
    pub fn digest(&self, skill: &Skill, path: &str, real: &Path) -> std::io::Result<(u64, String)> {
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

    /// Whether two snapshots serve the same thing (a rebuild that changed
    /// nothing must not notify anyone).
    pub fn same_as(&self, other: &Snapshot) -> bool {
        fingerprint(self) == fingerprint(other)
    }
}

/// What a client can see of a snapshot, reduced to comparable values.
fn fingerprint(s: &Snapshot) -> impl PartialEq {
    let skills: Vec<_> = s
        .catalog
        .skills
        .iter()
        .map(|k| {
            // The network and the timeout ceiling too: a run decides by them, though no listing shows them.
            let grant = s.policy.grant(&k.name);
            let scripts: Vec<_> = k
                .scripts
                .iter()
                .map(|d| (d.decl.script.to_string(), s.status(k, d), grant.egress(&k.name, d.decl.script.as_str())))
                .collect();
            let ceiling = s.policy.profile(&k.name).timeout_ceiling_secs;
            let shown = k.shown.clone();
            (k.name.clone(), k.meta.description.clone(), k.frontmatter.clone(), k.files.clone(), scripts, k.egress.clone(), ceiling, shown)
        })
        .collect();
    let roots: Vec<_> = s.catalog.roots.iter().map(|r| (r.shown.clone(), r.skills, r.digest.clone())).collect();
    (skills, s.problems.clone(), s.policy.source_label(), s.policy.note(), roots, s.settling)
}

/// The current snapshot of a server, swappable while calls are in flight.
pub struct SnapshotCell {
    current: ArcSwap<Snapshot>,
    /// Bumped on every swap that changed what clients see.
    changes: tokio::sync::watch::Sender<u64>,
}

impl SnapshotCell {
    pub fn new(snapshot: Snapshot) -> Self {
        SnapshotCell { current: ArcSwap::from_pointee(snapshot), changes: tokio::sync::watch::channel(0).0 }
    }

    /// The snapshot a call works on from its start to its end.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Swap in `next`; returns whether clients can see a difference (and
    /// then wakes every [`Self::subscribe`]r). An unchanged rebuild is dropped.
    pub fn replace(&self, next: Snapshot) -> bool {
        if self.current.load().same_as(&next) {
            return false;
        }
        self.current.store(Arc::new(next));
        self.changes.send_modify(|n| *n += 1);
        true
    }

    /// Changes after this moment: `changed().await` returns once per swap that mattered.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }
}
