//! A namespace's [`Snapshot`] from its SkillBindings and the SkillPackages
//! they name, and the [`Fingerprint`] of those inputs.
//!
//! Served: each binding the controller calls Ready ([`binding_verdict`]:
//! its own `Ready` condition, for its current generation) whose package is
//! Ready and pinned (`status.digest`), with the package's unpacked tree put
//! through the standalone server's discovery (so its problems are the ones
//! `serve` reports for the same directory). Everything else is a problem of
//! that binding, never a reason to serve less of the others: the binding
//! not Ready, a package missing, not Ready, not pinned, failing to pull,
//! tampered with, holding no servable skill.
//!
//! Two bindings serving one skill name: the controller refuses both
//! (`DuplicateSkillName`), so neither is served once it has seen them; the
//! one it called Ready before the second came keeps serving until then.
//! Two that both still read Ready (statuses the controller has not caught
//! up on): the one whose name sorts first is served, the other reported.
//! The choice is [`NamespaceCatalog::build_served`]'s alone; a run names
//! the binding that build chose ([`super::served::ServedIndex`]).
//!
//! A binding's own problems have the path `skillbinding/<name>` and the
//! published codes: `root-unreadable` (a binding is the gateway's root: its
//! package cannot be read), `duplicate-name`, `skill-limit`, and `grant`
//! (from [`super::policy::BindingPolicy`]'s audit).
//!
//! Clients see a package's skill at [`package_location`] (its root in
//! `skill_list`, with the pinned digest beside it, and the prefix of every
//! path in its problems), never at
//! the cache directory it is read from, which means nothing outside the pod.

use std::collections::BTreeMap;

use futures::StreamExt;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::cache::{PackageCache, PackageLease};
use super::limits::PULLS_PER_BUILD;
use super::policy::{binding_path, BindingPolicy, BoundSkill};
use crate::api::binding::SkillBinding;
use crate::api::package::SkillPackage;
use crate::controller::decide::{DUPLICATE_SKILL_NAME, PACKAGE_NOT_FOUND, PACKAGE_NOT_READY, RESOLVE_RETRYING};
use crate::core::catalog::Catalog;
use crate::core::limits::SKILLS_TOTAL;
use crate::core::problems::{Problem, Reason};
use crate::mcp::snapshot::Snapshot;

/// Builds namespace snapshots.
pub struct NamespaceCatalog;

/// Where clients are told a package's skill is: the SkillPackage's name
/// (its pinned digest is said once, on the root), never the gateway's
/// cache directory holding it.
pub fn package_location(package: &str) -> String {
    package.to_string()
}

/// Whether the controller's verdict on `binding` itself lets it serve: its
/// `Ready` condition is `True` and was set for the binding's current
/// generation (a verdict on an older spec says nothing about this one).
/// `Err` is the problem's reason and what to tell the operator.
pub fn binding_verdict(binding: &SkillBinding) -> Result<(), (Reason, String)> {
    let ready = binding.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let Some(ready) = ready else {
        return Err((Reason::RootUnreadable, "the controller has not decided on this binding yet (no Ready condition)".into()));
    };
    if ready.status != "True" {
        let reason = if ready.reason == DUPLICATE_SKILL_NAME { Reason::DuplicateName } else { Reason::RootUnreadable };
        return Err((reason, format!("the binding is not Ready ({}: {})", ready.reason, ready.message)));
    }
    match (ready.observed_generation, binding.metadata.generation) {
        (Some(seen), Some(now)) if seen != now => Err((
            Reason::RootUnreadable,
            format!("the binding changed (generation {now}) since the controller called it Ready (generation {seen}); it serves again once the controller has checked the change"),
        )),
        _ => Ok(()),
    }
}

/// Whether the controller has yet to decide on `binding` (no Ready
/// condition, or one from an older generation): a verdict is on its way.
fn undecided(binding: &SkillBinding) -> bool {
    let ready = binding.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    ready.is_none_or(|c| matches!((c.observed_generation, binding.metadata.generation), (Some(seen), Some(now)) if seen != now))
}

/// Whether a verdict on `binding` that is not Ready is still on its way:
/// the controller has not decided, or the binding waits on a package whose
/// own verdict is coming ([`package_settling`]), or that is Ready or
/// exists since (the controller re-decides its bindings then). A first call right after
/// `kubectl apply` must not get an empty namespace that fills a moment later.
fn binding_settling(binding: &SkillBinding, packages: &BTreeMap<String, SkillPackage>) -> bool {
    if undecided(binding) {
        return true;
    }
    let ready = binding.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let package = packages.get(binding.spec.package.as_str());
    match ready.map(|c| c.reason.as_str()) {
        // Created since: the controller re-decides the binding on that.
        Some(PACKAGE_NOT_FOUND) => package.is_some(),
        Some(PACKAGE_NOT_READY) => package.is_some_and(|p| {
            package_settling(p) || p.status.as_ref().is_some_and(|s| crate::api::conditions::is_true(&s.conditions, "Ready"))
        }),
        _ => false,
    }
}

/// Whether the controller's verdict on `package` is still to come: not
/// checked yet (no Ready condition, or one from an older generation), or
/// retrying a source that was unreachable ([`RESOLVE_RETRYING`]).
fn package_settling(package: &SkillPackage) -> bool {
    let ready = package.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    ready.is_none_or(|c| {
        c.reason == RESOLVE_RETRYING
            || matches!((c.observed_generation, package.metadata.generation), (Some(seen), Some(now)) if seen != now)
    })
}

/// A binding that may be served, once its package is in the cache.
struct Candidate<'a> {
    name: String,
    binding: &'a SkillBinding,
    package_name: &'a str,
    package: &'a SkillPackage,
    digest: String,
}

impl NamespaceCatalog {
    /// The snapshot of `namespace`: `bindings` are its SkillBindings,
    /// `packages` every SkillPackage by name. Packages are pulled into
    /// `cache` as needed; the snapshot holds leases on those it serves.
    pub async fn build(
        namespace: &str,
        bindings: &[SkillBinding],
        packages: &BTreeMap<String, SkillPackage>,
        cache: &PackageCache,
    ) -> Snapshot {
        Self::build_served(namespace, bindings, packages, cache).await.snapshot
    }

    /// [`Self::build`], with which binding serves each skill (what a
    /// SkillJob for a `skill_run` of that skill names).
    pub async fn build_served(
        namespace: &str,
        bindings: &[SkillBinding],
        packages: &BTreeMap<String, SkillPackage>,
        cache: &PackageCache,
    ) -> ServedNamespace {
        let mut problems: BTreeMap<String, Vec<Problem>> = BTreeMap::new();
        let mut candidates = Vec::new();
        let mut settling = false;
        let mut sorted: Vec<&SkillBinding> = bindings.iter().collect();
        sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        for binding in sorted {
            let Some(name) = binding.metadata.name.clone() else { continue };
            if let Err((reason, why)) = binding_verdict(binding) {
                settling |= binding_settling(binding, packages);
                let mut p = Problem::new(binding_path(&name), reason, format!("{why}; its skill is not served"));
                if let Some(s) = binding.status.as_ref().and_then(|s| s.skill_name.clone()) {
                    p = p.for_skill(s);
                }
                problems.entry(name.clone()).or_default().push(p);
                continue;
            }
            let package_name = binding.spec.package.as_str();
            let report = |detail: String| Problem::new(binding_path(&name), Reason::RootUnreadable, detail);
            let Some(package) = packages.get(package_name) else {
                problems.entry(name.clone()).or_default().push(report(format!(
                    "SkillPackage `{package_name}` does not exist; nothing is served for this binding until it does"
                )));
                continue;
            };
            let status = package.status.clone().unwrap_or_default();
            let skill = status.skill_name.clone();
            let with_skill = |p: Problem| match &skill {
                Some(s) => p.for_skill(s),
                None => p,
            };
            let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
            if ready.is_none_or(|c| c.status != "True") {
                settling |= package_settling(package);
                let why = ready.map_or_else(|| "not checked yet".to_string(), |c| format!("{}: {}", c.reason, c.message));
                problems
                    .entry(name.clone())
                    .or_default()
                    .push(with_skill(report(format!("SkillPackage `{package_name}` is not Ready ({why}); its skill is not served"))));
                continue;
            }
            let Some(digest) = status.digest.clone() else {
                problems.entry(name.clone()).or_default().push(with_skill(report(format!(
                    "SkillPackage `{package_name}` is Ready but not pinned (no status.digest); its skill is not served"
                ))));
                continue;
            };
            candidates.push(Candidate { name, binding, package_name, package, digest });
        }

        // Owned pull arguments: a closure borrowing the candidates makes a
        // future the compiler cannot prove `Send` for every lifetime, which
        // a caller behind `async_trait` needs.
        let pulls: Vec<_> = candidates.iter().map(|c| (c.package.spec.source.oci.clone(), c.digest.clone())).collect();
        let leases: Vec<_> = futures::stream::iter(pulls)
            .map(|(source, digest)| async move { cache.acquire(&source, &digest).await })
            .buffered(PULLS_PER_BUILD)
            .collect()
            .await;

        // Skill name → the candidates that produced it, in binding-name order,
        // each with its package's catalog as clients see it.
        let mut by_skill: BTreeMap<String, Vec<(&Candidate, PackageLease, Catalog)>> = BTreeMap::new();
        for (c, lease) in candidates.iter().zip(leases) {
            let lease = match lease {
                Ok(lease) => lease,
                Err(e) => {
                    tracing::warn!(binding = %c.name, package = %c.package_name, digest = %c.digest, error = %e, "a bound package cannot be served");
                    let mut p = Problem::new(
                        binding_path(&c.name),
                        Reason::RootUnreadable,
                        format!("the package of SkillPackage `{}` ({}) cannot be served: {}", c.package_name, c.digest, e.for_client()),
                    );
                    if let Some(s) = c.package.status.as_ref().and_then(|s| s.skill_name.clone()) {
                        p = p.for_skill(s);
                    }
                    problems.entry(c.name.clone()).or_default().push(p);
                    continue;
                }
            };
            let location = package_location(c.package_name);
            let mut found = lease.catalog.clone();
            found.relocate(&lease.skill_root, &location);
            for root in &mut found.roots {
                root.digest = Some(c.digest.clone());
            }
            match found.skills.first() {
                Some(skill) if found.skills.len() == 1 => {
                    by_skill.entry(skill.name.clone()).or_default().push((c, lease, found));
                }
                _ => {
                    let mut own = found.problems;
                    own.push(
                        Problem::new(
                            binding_path(&c.name),
                            Reason::RootUnreadable,
                            format!(
                                "the package of SkillPackage `{}` ({}) holds no servable skill; see the problems of {location}",
                                c.package_name, c.digest,
                            ),
                        )
                        .for_skill(&lease.name),
                    );
                    problems.entry(c.name.clone()).or_default().extend(own);
                }
            }
        }

        let mut catalog = Catalog::default();
        let mut bound = BTreeMap::new();
        let mut kept = Vec::new();
        for (skill_name, mut group) in by_skill {
            let (winner, lease, found) = group.remove(0);
            for (loser, _, _) in &group {
                problems.entry(loser.name.clone()).or_default().push(
                    Problem::new(
                        binding_path(&loser.name),
                        Reason::DuplicateName,
                        format!(
                            "skill `{skill_name}` is also bound by `{}`, which serves it (of two bindings both Ready the one whose name sorts first is served); this binding serves nothing until one of them goes",
                            winner.name
                        ),
                    )
                    .for_skill(&skill_name),
                );
            }
            if bound.len() >= SKILLS_TOTAL {
                problems.entry(winner.name.clone()).or_default().push(
                    Problem::new(binding_path(&winner.name), Reason::SkillLimit, format!("more than {SKILLS_TOTAL} skills; not served"))
                        .for_skill(&skill_name),
                );
                continue;
            }
            let Catalog { roots, skills, problems: found_problems } = found;
            let Some(skill) = skills.into_iter().next() else { continue };
            problems.entry(winner.name.clone()).or_default().extend(found_problems);
            catalog.roots.extend(roots);
            catalog.skills.push(skill);
            bound.insert(
                skill_name.clone(),
                BoundSkill::new(
                    winner.binding.clone(),
                    winner.package_name.to_string(),
                    winner.digest.clone(),
                    winner.package.spec.runtime.clone(),
                ),
            );
            kept.push(lease);
        }
        catalog.skills.sort_by(|a, b| a.name.cmp(&b.name));
        // By binding name, each binding's own findings in the order found.
        catalog.problems = problems.into_values().flatten().collect();
        let skills = bound
            .iter()
            .map(|(name, b)| {
                (name.clone(), ServedSkill { binding: b.binding.clone(), package: b.package.clone(), digest: b.digest.clone() })
            })
            .collect();
        let mut snapshot = Snapshot::new(catalog, Box::new(BindingPolicy::new(namespace, bound, kept)));
        snapshot.settling = settling;
        ServedNamespace { snapshot, skills }
    }

    /// A digest of everything [`Self::build`] reads: each binding's name,
    /// verdict ([`binding_verdict`]) and spec (env grants by name and Secret key, sorted; egress) and its
    /// package's name, source, runtime profile, readiness and pinned digest.
    /// No resourceVersion, generation or timestamps: saving an unchanged
    /// binding again gives the same fingerprint. Packages no binding names
    /// are not part of it. Equal fingerprints build equal snapshots (given
    /// the same registry content, which the digest pins).
    pub fn fingerprint(namespace: &str, bindings: &[SkillBinding], packages: &BTreeMap<String, SkillPackage>) -> Fingerprint {
        #[derive(Serialize)]
        struct PackageInput<'a> {
            name: &'a str,
            source: &'a crate::api::package::OciSource,
            runtime: &'a Option<crate::api::package::RuntimeProfile>,
            /// The Ready condition's status, reason and message (they are quoted in problems).
            ready: Option<(&'a str, &'a str, &'a str)>,
            digest: Option<&'a str>,
            skill_name: Option<&'a str>,
        }
        #[derive(Serialize)]
        struct BindingInput<'a> {
            name: &'a str,
            /// The controller's verdict as [`binding_verdict`] reads it.
            verdict: Result<(), (Reason, String)>,
            package_name: &'a str,
            env: Vec<(&'a str, &'a str, &'a str)>,
            egress: bool,
            package: Option<PackageInput<'a>>,
        }
        let mut inputs: Vec<BindingInput<'_>> = bindings
            .iter()
            .filter_map(|b| {
                let name = b.metadata.name.as_deref()?;
                let mut env: Vec<_> =
                    b.spec.env.iter().map(|g| (g.name.as_str(), g.secret_key_ref.name.as_str(), g.secret_key_ref.key.as_str())).collect();
                env.sort();
                let package = packages.get(&b.spec.package).map(|p| {
                    let status = p.status.as_ref();
                    PackageInput {
                        name: &b.spec.package,
                        source: &p.spec.source.oci,
                        runtime: &p.spec.runtime,
                        ready: status
                            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                            .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str())),
                        digest: status.and_then(|s| s.digest.as_deref()),
                        skill_name: status.and_then(|s| s.skill_name.as_deref()),
                    }
                });
                Some(BindingInput { name, verdict: binding_verdict(b), package_name: &b.spec.package, env, egress: b.spec.egress, package })
            })
            .collect();
        inputs.sort_by(|a, b| a.name.cmp(b.name));
        let mut h = Sha256::new();
        h.update(namespace.as_bytes());
        h.update([0]);
        // Serializing these plain structs cannot fail.
        h.update(serde_json::to_vec(&inputs).unwrap_or_default());
        Fingerprint(hex::encode(h.finalize()))
    }
}

/// A namespace's snapshot and the binding behind each served skill.
pub struct ServedNamespace {
    pub snapshot: Snapshot,
    /// Served skill name → where it comes from.
    pub skills: BTreeMap<String, ServedSkill>,
}

/// The binding serving one skill, and its package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedSkill {
    pub binding: String,
    pub package: String,
    pub digest: String,
}

/// What a namespace's snapshot was built from, as a comparable digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
