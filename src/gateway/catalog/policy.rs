//! [`BindingPolicy`]: what may run in a namespace, per skill, decided
//! exactly as the controller admits a SkillJob: the grant is the skill's
//! SkillBinding ([`BindingGrant`]: variables by name only, values stay in
//! Secrets; the network when it says `egress: true`) and the profile is its
//! SkillPackage's runtime profile ([`RuntimeProfile::fence_profile`]: one
//! interpreter, the allowed scripts, the timeout ceiling). A package without
//! a runtime profile serves instructions and files, and nothing of it runs.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::binding::SkillBinding;
use crate::api::package::RuntimeProfile;
use crate::controller::decide::BindingGrant;
use crate::core::catalog::Catalog;
use crate::core::declaration::Interpreter;
use crate::core::env::is_reserved;
use crate::core::fence::{script_status, AnyGrant, Grant, Profile, ScriptFacts, ScriptStatus};
use crate::core::problems::{Problem, Reason};
use crate::mcp::snapshot::RunPolicy;

use super::cache::PackageLease;

/// A served skill's binding, package and what they allow.
pub struct BoundSkill {
    /// The SkillBinding's name (what a SkillJob names).
    pub binding: String,
    /// The SkillPackage's name.
    pub package: String,
    /// The pinned digest the skill's files come from.
    pub digest: String,
    /// The package's runtime profile (the run image and interpreter path included).
    pub runtime: Option<RuntimeProfile>,
    grant: OwnedBindingGrant,
    profile: Profile,
}

impl BoundSkill {
    pub fn new(binding: SkillBinding, package: String, digest: String, runtime: Option<RuntimeProfile>) -> Self {
        let profile = runtime.as_ref().map_or(NOTHING_RUNS, RuntimeProfile::fence_profile);
        BoundSkill {
            binding: binding.metadata.name.clone().unwrap_or_default(),
            package,
            digest,
            runtime,
            grant: OwnedBindingGrant(binding),
            profile,
        }
    }

    /// The binding's env grant names (values stay in their Secrets).
    pub fn granted_names(&self) -> Vec<String> {
        self.grant.0.spec.env.iter().map(|g| g.name.clone()).collect()
    }

    pub fn egress(&self) -> bool {
        self.grant.0.spec.egress
    }
}

/// The controller's [`BindingGrant`] over a binding the policy owns: the
/// gateway and the controller decide with the same code.
struct OwnedBindingGrant(SkillBinding);

impl Grant for OwnedBindingGrant {
    fn env(&self, skill: &str, script: &str, requested: &[String]) -> Result<Vec<String>, String> {
        BindingGrant(&self.0).env(skill, script, requested)
    }
    fn egress(&self, skill: &str, script: &str) -> bool {
        BindingGrant(&self.0).egress(skill, script)
    }
}

/// The grant of a skill no binding serves (never reached through the
/// fence, which refuses an unknown skill first).
struct NotBound;

impl Grant for NotBound {
    fn env(&self, _: &str, _: &str, _: &[String]) -> Result<Vec<String>, String> {
        Err("no SkillBinding in this namespace serves this skill".into())
    }
    fn egress(&self, _: &str, _: &str) -> bool {
        false
    }
}

/// No interpreter, no script: what a package without a runtime profile runs.
const NOTHING_RUNS: Profile = Profile { interpreters: BTreeSet::new(), allowed_scripts: Some(BTreeSet::new()), timeout_ceiling_secs: None };
static NOTHING_RUNS_HERE: Profile = NOTHING_RUNS;

/// A namespace's run policy. It holds the leases of the packages its
/// snapshot serves, so their files stay on disk while the snapshot lives.
pub struct BindingPolicy {
    namespace: String,
    skills: BTreeMap<String, BoundSkill>,
    _leases: Vec<PackageLease>,
}

impl BindingPolicy {
    /// `skills`: served skill name → its binding.
    pub fn new(namespace: &str, skills: BTreeMap<String, BoundSkill>, leases: Vec<PackageLease>) -> Self {
        BindingPolicy { namespace: namespace.to_string(), skills, _leases: leases }
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The binding serving `skill`.
    pub fn bound(&self, skill: &str) -> Option<&BoundSkill> {
        self.skills.get(skill)
    }

    pub fn skills(&self) -> impl Iterator<Item = (&String, &BoundSkill)> {
        self.skills.iter()
    }
}

/// Where a binding-level problem is reported: the binding, kubectl-style.
pub fn binding_path(binding: &str) -> String {
    format!("skillbinding/{binding}")
}

impl RunPolicy for BindingPolicy {
    fn grant(&self, skill: &str) -> &dyn Grant {
        match self.skills.get(skill) {
            Some(b) => &b.grant,
            None => &NotBound,
        }
    }

    fn profile(&self, skill: &str) -> &Profile {
        match self.skills.get(skill) {
            Some(b) => &b.profile,
            None => &NOTHING_RUNS_HERE,
        }
    }

    fn source_label(&self) -> String {
        format!("skillbindings:{}", self.namespace)
    }

    fn note(&self) -> Option<String> {
        let idle: Vec<String> =
            self.skills.iter().filter(|(_, b)| b.runtime.is_none()).map(|(s, b)| format!("`{s}` (SkillPackage {})", b.package)).collect();
        if idle.is_empty() {
            return None;
        }
        let what = if idle.len() == self.skills.len() { "nothing runs in this namespace" } else { "some skills run nothing" };
        Some(format!(
            "{what}: no runtime profile on the package of {}; their instructions and files are served (an admin adds spec.runtime to let scripts run)",
            idle.join(", ")
        ))
    }

    fn interpreters(&self) -> BTreeSet<Interpreter> {
        self.skills.values().flat_map(|b| b.profile.interpreters.iter().copied()).collect()
    }

    /// Env grants that hand nothing over: a reserved name, or a variable no
    /// script the profile allows asks for (the binding status's `ignoredEnv`).
    fn audit(&self, catalog: &Catalog) -> Vec<Problem> {
        let mut problems = Vec::new();
        for (name, bound) in &self.skills {
            let Some(skill) = catalog.get(name) else { continue };
            let asked: BTreeSet<&str> = skill
                .scripts
                .iter()
                .filter(|d| matches!(script_status(name, &ScriptFacts::from(*d), &AnyGrant, &bound.profile), ScriptStatus::Runnable { .. }))
                .flat_map(|d| d.decl.env.iter().map(String::as_str))
                .collect();
            for var in bound.granted_names() {
                let why = if is_reserved(&var) {
                    format!("grants {var}, a name the runner reserves; never handed over")
                } else if !asked.contains(var.as_str()) {
                    format!("grants {var}, which no script of `{name}` that may run asks for; not handed over")
                } else {
                    continue;
                };
                problems.push(Problem::new(binding_path(&bound.binding), Reason::Grant, why).for_skill(name));
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::binding::{EnvGrant, SecretKeyRef, SkillBindingSpec};
    use crate::core::discovery::{discover, Limits};
    use crate::mcp::snapshot::Snapshot;

    fn skill(root: &std::path::Path, name: &str) {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("scripts")).unwrap();
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: {name}\ndescription: d\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/a.py\n      interpreter: python\n      env: [API_KEY]\n    - script: scripts/b.py\n      interpreter: python\n      env: [B_ONLY]\n---\n"),
        )
        .unwrap();
        std::fs::write(dir.join("scripts/a.py"), "").unwrap();
        std::fs::write(dir.join("scripts/b.py"), "").unwrap();
    }

    fn bound(name: &str, env: &[&str], runtime: Option<RuntimeProfile>) -> BoundSkill {
        let b = SkillBinding::new(
            name,
            SkillBindingSpec {
                package: format!("{name}-pkg"),
                env: env
                    .iter()
                    .map(|n| EnvGrant { name: n.to_string(), secret_key_ref: SecretKeyRef { name: "s".into(), key: "k".into() } })
                    .collect(),
                egress: false,
                egress_hosts: None,
                warm: None,
            },
        );
        BoundSkill::new(b, format!("{name}-pkg"), "sha256:00".into(), runtime)
    }

    fn python(allowed: &[&str]) -> RuntimeProfile {
        serde_json::from_value(serde_json::json!({"interpreter": "python", "image": "i", "allowedScripts": allowed})).unwrap()
    }

    fn snapshot(skills: Vec<(&str, BoundSkill)>) -> (tempfile::TempDir, Snapshot) {
        let t = tempfile::tempdir().unwrap();
        let roots: Vec<_> = skills
            .iter()
            .map(|(n, _)| {
                skill(t.path(), n);
                t.path().join(n)
            })
            .collect();
        let mut catalog = Catalog::default();
        for root in &roots {
            let c = discover(std::slice::from_ref(root), Limits::default());
            catalog.skills.extend(c.skills);
        }
        catalog.skills.sort_by(|a, b| a.name.cmp(&b.name));
        let map = skills.into_iter().map(|(n, b)| (n.to_string(), b)).collect();
        (t, Snapshot::new(catalog, Box::new(BindingPolicy::new("ns", map, vec![]))))
    }

    #[test]
    fn a_grant_for_a_script_the_profile_forbids_is_reported() {
        // B_ONLY is asked for by b.py, which the profile does not allow; LD_PRELOAD is reserved.
        let (_t, snap) =
            snapshot(vec![("one", bound("one-binding", &["API_KEY", "B_ONLY", "LD_PRELOAD"], Some(python(&["scripts/a.py"]))))]);
        let grants: Vec<&Problem> = snap.problems.iter().filter(|p| p.reason == Reason::Grant).collect();
        assert_eq!(grants.len(), 2, "{grants:?}");
        assert!(grants.iter().all(|p| p.path == "skillbinding/one-binding" && p.skill.as_deref() == Some("one")));
        assert!(grants[0].detail.contains("B_ONLY") && grants[0].detail.contains("not handed over"), "{}", grants[0].detail);
        assert!(grants[1].detail.contains("LD_PRELOAD") && grants[1].detail.contains("reserves"), "{}", grants[1].detail);
        let one = snap.catalog.get("one").unwrap();
        assert_eq!(snap.status(one, &one.scripts[0]), ScriptStatus::Runnable { env: vec!["API_KEY".into()] });
        assert!(matches!(snap.status(one, &one.scripts[1]), ScriptStatus::NotAllowed(_)));
        assert!(snap.policy.note().is_none());
    }

    #[test]
    fn without_a_runtime_profile_nothing_runs_and_the_note_says_why() {
        let (_t, snap) = snapshot(vec![("one", bound("b1", &[], None))]);
        let one = snap.catalog.get("one").unwrap();
        assert!(one.scripts.iter().all(|d| matches!(snap.status(one, d), ScriptStatus::NotAllowed(_))));
        let note = snap.policy.note().unwrap();
        assert!(note.starts_with("nothing runs in this namespace") && note.contains("`one` (SkillPackage b1-pkg)"), "{note}");
        assert!(snap.policy.interpreters().is_empty());
        let (_t, snap) = snapshot(vec![("one", bound("b1", &[], None)), ("two", bound("b2", &[], Some(python(&[]))))]);
        assert!(snap.policy.note().unwrap().starts_with("some skills run nothing"));
    }

    #[test]
    fn a_skill_no_binding_serves_gets_nothing() {
        let policy = BindingPolicy::new("ns", BTreeMap::new(), vec![]);
        assert!(policy.grant("ghost").env("ghost", "a.py", &["K".into()]).is_err());
        assert!(!policy.grant("ghost").egress("ghost", "a.py"));
        assert!(policy.profile("ghost").interpreters.is_empty());
        assert_eq!(policy.profile("ghost").allowed_scripts, Some(BTreeSet::new()));
    }
}
