//! The controller's decisions as pure functions: what a package's status
//! is given what was found in it, whether a binding is usable, whether a
//! SkillJob may run and with what, and which phase a Job means. The
//! reconcilers only fetch inputs and apply these answers, so every rule is
//! unit-tested without an API server.

use std::collections::BTreeSet;

use k8s_openapi::api::batch::v1::Job;

use crate::api::binding::SkillBinding;
use crate::api::conditions::{is_true, set_condition};
use crate::api::job::{SkillJobPhase, SkillJobSpec};
use crate::api::package::{DeclaredScriptStatus, DependencyPlanStatus, ImageMode, PrepareMode, SkillPackage, SkillPackageStatus};
use crate::controller::builders::job::{PackageDelivery, PREPARED_ENV};
use crate::core::catalog::Catalog;
use crate::core::declaration::Interpreter;
use crate::core::env::is_reserved as is_reserved_env;
use crate::core::fence::{self, AnyGrant, Grant, Refusal, Request, ScriptFacts, SkillFacts};
use crate::core::limits::MAX_TIMEOUT_SECS;

/// What resolving and unpacking a package found.
#[derive(Debug, Clone)]
pub struct PackageFacts {
    /// The manifest digest the reference resolved to.
    pub digest: String,
    /// Discovery over the unpacked package (one skill expected).
    pub catalog: Catalog,
    /// Dependency files present at the package root.
    pub requirement_files: Vec<String>,
    /// What those files declare ([`crate::image::deps::plan`]), for preparation.
    pub dependencies: DependencyPlanStatus,
}

/// A dependency plan (or why there is none) as the status records it.
pub fn dependency_plan_status(plan: Result<crate::image::DepsPlan, crate::image::deps::DepsError>) -> DependencyPlanStatus {
    match plan {
        Ok(p) => {
            DependencyPlanStatus { lock_digest: p.lock_digest.clone(), python: p.requirements.is_some(), node: p.npm_lock, refused: None }
        }
        Err(e) => DependencyPlanStatus { refused: Some(e.to_string()), ..Default::default() },
    }
}

/// Files that state a skill's dependencies.
pub const REQUIREMENT_FILES: &[&str] = &["requirements.txt", "pyproject.toml", "package-lock.json", "package.json"];

/// The interpreter's path in a run image when the profile names none.
pub fn default_interpreter_path(interpreter: Interpreter) -> &'static str {
    match interpreter {
        Interpreter::Node => "/usr/local/bin/node",
        Interpreter::Python => "/usr/local/bin/python3",
        Interpreter::Bash => "/bin/bash",
    }
}

/// Status of a package from what resolving it found (`Err`: why it could not be resolved).
pub fn package_status(pkg: &SkillPackage, facts: Result<&PackageFacts, &super::context::ResolveError>) -> SkillPackageStatus {
    let generation = pkg.metadata.generation;
    let mut status = pkg.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    status.requirements = "unknown".into();
    let facts = match facts {
        Ok(facts) => facts,
        Err(why) => {
            set_condition(&mut status.conditions, "Resolved", false, "ResolveFailed", why.to_string(), generation);
            set_condition(&mut status.conditions, "Validated", false, "NotResolved", "the package could not be resolved", generation);
            // A registry that is down may come back: the verdict is still on its way.
            let (reason, message) = if why.is_transient() {
                (RESOLVE_RETRYING, "the package could not be resolved yet; trying again")
            } else {
                ("NotResolved", "the package could not be resolved")
            };
            set_condition(&mut status.conditions, "Ready", false, reason, message, generation);
            return status;
        }
    };
    status.digest = Some(facts.digest.clone());
    set_condition(&mut status.conditions, "Resolved", true, "Resolved", format!("pinned to {}", facts.digest), generation);
    status.problems = facts.catalog.problems.clone();
    let Some(skill) = facts.catalog.skills.first().filter(|_| facts.catalog.skills.len() == 1) else {
        let why = if facts.catalog.skills.is_empty() {
            let reasons: Vec<String> = facts.catalog.problems.iter().map(|p| format!("{}: {}", p.reason, p.detail)).collect();
            format!("the package holds no servable skill ({})", if reasons.is_empty() { "no SKILL.md".into() } else { reasons.join("; ") })
        } else {
            format!("the package holds {} skills; a SkillPackage is one skill", facts.catalog.skills.len())
        };
        set_condition(&mut status.conditions, "Validated", false, "InvalidPackage", why.clone(), generation);
        set_condition(&mut status.conditions, "Ready", false, "InvalidPackage", why, generation);
        return status;
    };
    status.dependencies = Some(facts.dependencies.clone());
    status.skill_name = Some(skill.name.clone());
    status.description = Some(skill.meta.description.clone());
    status.license = skill.meta.license.clone();
    status.files = skill.files.len() as u64;
    status.bytes = skill.bytes;
    if !facts.requirement_files.is_empty() {
        status.requirements = facts.requirement_files.join(", ");
    }
    set_condition(
        &mut status.conditions,
        "Validated",
        true,
        "Validated",
        format!("skill `{}` with {} files", skill.name, skill.files.len()),
        generation,
    );

    let runtime = pkg.spec.runtime.as_ref();
    status.egress = skill.egress.clone();
    let allowed = super::egress::allowed(runtime);
    let allowed_list = allowed.clone().unwrap_or_default();
    status.allowed_egress = super::egress::texts(&allowed_list);
    status.egress_not_allowed = super::egress::not_allowed(&skill.egress, &allowed_list);
    let facts = SkillFacts::from(skill);
    status.scripts = skill
        .scripts
        .iter()
        .zip(&facts.scripts)
        .map(|(s, f)| {
            // What the package and the profile allow, before any binding's grant.
            let reason = match runtime {
                None => Some("no runtime profile".to_string()),
                Some(profile) => fence::script_status(&skill.name, f, &AnyGrant, &profile.fence_profile()).reason().map(str::to_string),
            };
            DeclaredScriptStatus {
                script: f.script.clone(),
                interpreter: s.decl.interpreter_text.clone(),
                env: f.env.clone(),
                timeout_seconds: f.timeout_secs,
                allowed: reason.is_none(),
                unavailable: f.unavailable.clone(),
                reason,
            }
        })
        .collect();

    let prepare = pkg.wants_preparation();
    if !prepare {
        // Not (or no longer) prepared: runs fetch the package; the
        // preparation conditions go (the last image stays recorded).
        status.conditions.retain(|c| !PREPARATION_CONDITIONS.contains(&c.type_.as_str()));
        status.image_mode = runtime.map(|_| ImageMode::Fetched);
    }
    match runtime {
        None => set_condition(
            &mut status.conditions,
            "Ready",
            true,
            "InstructionsOnly",
            "no runtime profile: instructions and files are served, nothing runs",
            generation,
        ),
        Some(profile) if profile.image.is_none() && !prepare => set_condition(
            &mut status.conditions,
            "Ready",
            false,
            "NoRunImage",
            "runtime.image is not set: name the run image, or set runtime.prepare to compose one",
            generation,
        ),
        Some(profile) => {
            let declared: BTreeSet<&str> = skill.scripts.iter().map(|s| s.decl.script.as_str()).collect();
            let undeclared: Vec<&str> = profile.allowed_scripts.iter().map(String::as_str).filter(|s| !declared.contains(s)).collect();
            if let Err(why) = &allowed {
                set_condition(&mut status.conditions, "Ready", false, "InvalidEgress", why.clone(), generation);
            } else if !undeclared.is_empty() {
                set_condition(
                    &mut status.conditions,
                    "Ready",
                    false,
                    "ScriptNotDeclared",
                    format!(
                        "allowedScripts names scripts the skill does not declare: {}; only declared scripts run",
                        undeclared.join(", ")
                    ),
                    generation,
                );
            } else if profile.timeout_seconds.is_some_and(|t| t == 0 || u64::from(t) > MAX_TIMEOUT_SECS) {
                set_condition(&mut status.conditions, "Ready", false, "InvalidTimeout", "timeoutSeconds must be 1-300", generation);
            } else {
                let runnable = status.scripts.iter().filter(|s| s.allowed).count();
                let pinned = if prepare || profile.image.as_deref().is_some_and(|i| i.contains("@sha256:")) {
                    ""
                } else {
                    " (the run image is not digest-pinned: pin it for reproducible runs)"
                };
                set_condition(
                    &mut status.conditions,
                    "Ready",
                    true,
                    "Ready",
                    format!("{runnable} script(s) may run with {}{pinned}", profile.interpreter),
                    generation,
                );
            }
        }
    }
    status
}

/// What a binding resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingDecision {
    pub ready: Result<(), (String, String)>,
    pub skill_name: Option<String>,
    pub digest: Option<String>,
    pub effective_env: Vec<String>,
    pub ignored_env: Vec<String>,
    /// What the binding's runs may reach (see [`super::egress`]).
    pub egress: super::egress::BindingEgress,
    /// The skill's proposal.
    pub proposed_egress: Vec<String>,
}

/// The `Ready` reason of a binding refused because another binding in its
/// namespace serves the same skill name.
pub const DUPLICATE_SKILL_NAME: &str = "DuplicateSkillName";

/// The `Ready` reason of a binding whose package is not Ready (yet).
pub const PACKAGE_NOT_READY: &str = "PackageNotReady";

/// The `Ready` reason of a binding whose package does not exist (yet).
pub const PACKAGE_NOT_FOUND: &str = "PackageNotFound";

/// The `Ready` reason of a package whose source could not be read for a
/// reason that passes (the registry or store unreachable): it is tried
/// again ([`resolve_retry_after`]), so its verdict is still to come.
pub const RESOLVE_RETRYING: &str = "ResolveRetrying";

/// When a package [`RESOLVE_RETRYING`] since `since` is tried next: soon
/// at first (a store that is starting up answers within seconds), then
/// half the outage's age, at most 30 s (a long outage is not hammered).
pub fn resolve_retry_after(since: std::time::Duration) -> std::time::Duration {
    (since / 2).clamp(std::time::Duration::from_secs(1), std::time::Duration::from_secs(30))
}

/// The skill a package serves, when its status says it is Ready with a
/// resolved skill; else why not (`package` names it in the message).
///
/// Both a binding's readiness and a SkillJob's admission go through this:
/// the controller's package cache may lag its binding cache (a cut watch, a
/// 410 Gone), so a Ready binding does not prove the cached package has a
/// status yet, and an empty status read as "no scripts declared" would fail
/// a SkillJob that only had to wait.
pub fn ready_skill<'a>(package: &str, status: &'a SkillPackageStatus) -> Result<&'a str, String> {
    if !is_true(&status.conditions, "Ready") {
        return Err(format!("SkillPackage `{package}` is not ready"));
    }
    status.skill_name.as_deref().ok_or_else(|| format!("SkillPackage `{package}` has no skill name yet"))
}

/// Decide a binding from its package and the skill names other bindings in
/// the namespace serve (`(binding name, skill name)`).
pub fn binding_decision(binding: &SkillBinding, package: Option<&SkillPackage>, siblings: &[(String, String)]) -> BindingDecision {
    let mut d = BindingDecision {
        ready: Ok(()),
        skill_name: None,
        digest: None,
        effective_env: vec![],
        ignored_env: vec![],
        egress: Default::default(),
        proposed_egress: vec![],
    };
    let Some(package) = package else {
        d.ready = Err((PACKAGE_NOT_FOUND.into(), format!("no SkillPackage named `{}`", binding.spec.package)));
        return d;
    };
    let status = package.status.clone().unwrap_or_default();
    d.skill_name = status.skill_name.clone();
    d.digest = status.digest.clone();
    d.proposed_egress = status.egress.clone();
    d.egress = super::egress::binding_egress(binding, package);
    let requested: BTreeSet<&str> = status.scripts.iter().filter(|s| s.allowed).flat_map(|s| s.env.iter().map(String::as_str)).collect();
    for grant in &binding.spec.env {
        if requested.contains(grant.name.as_str()) && !is_reserved_env(&grant.name) {
            d.effective_env.push(grant.name.clone());
        } else {
            d.ignored_env.push(grant.name.clone());
        }
    }
    let name = match ready_skill(&binding.spec.package, &status) {
        Ok(name) => name,
        Err(why) => {
            d.ready = Err((PACKAGE_NOT_READY.into(), why));
            return d;
        }
    };
    let own = binding.metadata.name.clone().unwrap_or_default();
    let clashes: Vec<&str> = siblings.iter().filter(|(b, s)| b != &own && s == name).map(|(b, _)| b.as_str()).collect();
    if !clashes.is_empty() {
        d.ready = Err((
            DUPLICATE_SKILL_NAME.into(),
            format!("skill `{name}` is also bound by {} in this namespace; both are refused until one goes", clashes.join(", ")),
        ));
    }
    d
}

/// A SkillJob the controller may start, with everything the Job builder needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub skill: String,
    pub digest: String,
    /// The package's source, pinned to [`Self::digest`]: what is staged for the pod.
    pub source: crate::api::package::OciSource,
    pub image: String,
    pub interpreter_path: String,
    pub script: String,
    pub args: Vec<String>,
    /// (variable, secret name, secret key)
    pub env: Vec<(String, String, String)>,
    pub timeout_secs: u64,
    pub cpu: String,
    pub memory: String,
    pub ephemeral_storage: String,
    pub egress: bool,
    /// The effective allowlist (`host:ports`); empty: no network at all.
    pub egress_allowed: Vec<String>,
    /// The skill's proposal, for the status.
    pub egress_proposed: Vec<String>,
    /// Fetched at the run, or prepared (see [`delivery`]).
    pub delivery: PackageDelivery,
    /// The binding's warm pool, if it keeps one, and the binding's UID (its pods carry it).
    pub warm: Option<(crate::api::binding::WarmSpec, String)>,
}

/// Why a SkillJob may not run (yet).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitRefusal {
    #[error("no SkillBinding `{0}` in this namespace")]
    BindingNotFound(String),
    #[error("SkillBinding `{0}` is not ready")]
    BindingNotReady(String),
    #[error("SkillPackage `{0}` is gone")]
    PackageNotFound(String),
    /// The package's status is not (yet) Ready with a resolved skill; the message says which.
    #[error("{0}")]
    PackageNotReady(String),
    #[error("SkillPackage `{0}` has no runtime profile: its scripts do not run")]
    NoRuntime(String),
    #[error("SkillPackage `{0}` names no run image")]
    NoRunImage(String),
    #[error("SkillPackage `{0}` has no run image prepared for its current profile yet")]
    NotPrepared(String),
    /// The fence refused the call (the same refusal a local run gets).
    #[error(transparent)]
    Fence(#[from] Refusal),
}

impl AdmitRefusal {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            AdmitRefusal::BindingNotFound(_) => "BindingNotFound",
            AdmitRefusal::BindingNotReady(_) => "BindingNotReady",
            AdmitRefusal::PackageNotFound(_) => "PackageNotFound",
            AdmitRefusal::PackageNotReady(_) => PACKAGE_NOT_READY,
            AdmitRefusal::NoRuntime(_) => "NoRuntime",
            AdmitRefusal::NoRunImage(_) => "NoRunImage",
            AdmitRefusal::NotPrepared(_) => "NotPrepared",
            AdmitRefusal::Fence(r) => r.reason(),
        }
    }

    /// Whether waiting may change the answer (the SkillJob stays Pending and
    /// is tried again) or not (it fails now).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            AdmitRefusal::BindingNotReady(_)
                | AdmitRefusal::PackageNotFound(_)
                | AdmitRefusal::PackageNotReady(_)
                | AdmitRefusal::NotPrepared(_)
        )
    }
}

/// A SkillBinding as the fence's grant: a Ready binding grants each allowed
/// script the variables it asked for that the binding maps to a Secret
/// (reserved names never), and the network when it says `egress: true`.
pub struct BindingGrant<'a>(pub &'a SkillBinding);

impl Grant for BindingGrant<'_> {
    fn env(&self, _skill: &str, _script: &str, requested: &[String]) -> Result<Vec<String>, String> {
        Ok(requested.iter().filter(|n| !is_reserved_env(n) && self.0.spec.env.iter().any(|g| &&g.name == n)).cloned().collect())
    }
    fn egress(&self, _skill: &str, _script: &str) -> bool {
        self.0.spec.egress
    }
}

/// The fence's view of a package from its status (written by the package
/// reconciler with the same discovery rules as the standalone server).
pub fn skill_facts(status: &SkillPackageStatus) -> SkillFacts {
    SkillFacts {
        name: status.skill_name.clone().unwrap_or_default(),
        scripts: status
            .scripts
            .iter()
            .map(|d| ScriptFacts {
                script: d.script.clone(),
                interpreter: d.interpreter.as_deref().and_then(Interpreter::from_name),
                env: d.env.clone(),
                timeout_secs: d.timeout_seconds.min(MAX_TIMEOUT_SECS),
                unavailable: d.unavailable.clone(),
            })
            .collect(),
        egress: status.egress.clone(),
    }
}

/// Whether a SkillJob may run, through the same fence as a local run.
pub fn admit(spec: &SkillJobSpec, binding: Option<&SkillBinding>, package: Option<&SkillPackage>) -> Result<Admission, AdmitRefusal> {
    let binding = binding.ok_or_else(|| AdmitRefusal::BindingNotFound(spec.binding.clone()))?;
    let bstatus = binding.status.clone().unwrap_or_default();
    if !is_true(&bstatus.conditions, "Ready") {
        return Err(AdmitRefusal::BindingNotReady(spec.binding.clone()));
    }
    let package = package.ok_or_else(|| AdmitRefusal::PackageNotFound(binding.spec.package.clone()))?;
    let pstatus = package.status.clone().unwrap_or_default();
    ready_skill(&binding.spec.package, &pstatus).map_err(AdmitRefusal::PackageNotReady)?;
    let profile = package.spec.runtime.as_ref().ok_or_else(|| AdmitRefusal::NoRuntime(binding.spec.package.clone()))?;
    let request = Request { script: &spec.script, args: &spec.args, timeout_secs: spec.timeout_seconds.map(u64::from) };
    let decision = fence::decide(&skill_facts(&pstatus), &BindingGrant(binding), &profile.fence_profile(), &request)?;
    let env = decision
        .granted_env
        .iter()
        .filter_map(|name| binding.spec.env.iter().find(|g| &g.name == name))
        .map(|g| (g.name.clone(), g.secret_key_ref.name.clone(), g.secret_key_ref.key.clone()))
        .collect();
    let digest = pstatus.digest.clone().unwrap_or_default();
    let mut source = package.spec.source.oci.clone();
    source.reference = pinned_reference(&source.reference, &digest);
    let (image, delivery) = delivery(package)?;
    // The fence grants the network only to a skill that proposes some and a
    // binding that says egress: true; what it may reach is the profile's.
    let egress_allowed =
        if decision.egress_granted { super::egress::texts(&super::egress::binding_egress(binding, package).effective) } else { Vec::new() };
    Ok(Admission {
        egress_allowed,
        egress_proposed: pstatus.egress.clone(),
        skill: decision.skill.clone(),
        source,
        digest,
        image,
        delivery,
        interpreter_path: profile.interpreter_path.clone().unwrap_or_else(|| default_interpreter_path(profile.interpreter).to_string()),
        script: decision.script.to_string(),
        args: decision.args.clone(),
        env,
        timeout_secs: decision.timeout_secs,
        cpu: profile.resources.cpu.clone(),
        memory: profile.resources.memory.clone(),
        ephemeral_storage: profile.resources.ephemeral_storage.clone(),
        egress: decision.egress_granted,
        warm: binding.spec.warm.clone().map(|w| (w, binding.metadata.uid.clone().unwrap_or_default())),
    })
}

/// The phase a Job's status means (exit details come from the pod).
pub fn job_phase(job: &Job) -> SkillJobPhase {
    let Some(status) = &job.status else { return SkillJobPhase::Pending };
    for c in status.conditions.iter().flatten() {
        if c.status != "True" {
            continue;
        }
        match (c.type_.as_str(), c.reason.as_deref()) {
            ("Complete", _) => return SkillJobPhase::Succeeded,
            ("Failed", Some("DeadlineExceeded")) => return SkillJobPhase::TimedOut,
            ("Failed", _) => return SkillJobPhase::Failed,
            _ => {}
        }
    }
    if status.active.unwrap_or(0) > 0 {
        SkillJobPhase::Running
    } else {
        SkillJobPhase::Pending
    }
}

/// Whether a phase is final.
pub fn is_final(phase: SkillJobPhase) -> bool {
    !matches!(phase, SkillJobPhase::Pending | SkillJobPhase::Running)
}

/// `registry/repo:tag` or `registry/repo@sha256:…` pinned to `digest`
/// (a port in the registry host is not a tag).
pub fn pinned_reference(reference: &str, digest: &str) -> String {
    let name = reference.split('@').next().unwrap_or(reference);
    let repo = match name.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => name,
    };
    format!("{repo}@{digest}")
}

/// The conditions preparation owns.
pub const PREPARATION_CONDITIONS: [&str; 3] = ["Preparing", "Prepared", "PreparationFailed"];

/// The mode a prepared package uses: the profile's, else the controller's;
/// `auto` is image volumes where supported. Image volumes asked for where
/// they are not supported are refused (`Err` says why), never quietly
/// replaced: the admin chose them.
pub fn image_mode(profile: Option<PrepareMode>, flag: PrepareMode, image_volumes: &Result<(), String>) -> Result<ImageMode, String> {
    match (profile.unwrap_or(flag), image_volumes) {
        (PrepareMode::Composed, _) => Ok(ImageMode::Composed),
        (PrepareMode::ImageVolume, Ok(())) | (PrepareMode::Auto, Ok(())) => Ok(ImageMode::ImageVolume),
        (PrepareMode::Auto, Err(_)) => Ok(ImageMode::Composed),
        (PrepareMode::ImageVolume, Err(why)) => Err(why.clone()),
    }
}

/// `--image-volumes`: whether runs may mount prepared images as volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ImageVolumes {
    /// Decide from the API server's version and the nodes' runtimes.
    Auto,
    /// The admin says they work (a gate turned on by hand, a runtime we do not know).
    On,
    Off,
}

/// Whether image volumes can be used, from the API server's version and
/// the nodes' container runtimes (`containerd://2.1.0`, `cri-o://1.31.0`;
/// `Err` when they could not be read). Image volumes are beta since 1.33
/// but on by default only since 1.35; containerd supports them from 2.1,
/// CRI-O from 1.31. Every node must: a pod may land on any of them.
pub fn image_volume_support(flag: ImageVolumes, server: Option<(u32, u32)>, runtimes: Result<&[String], String>) -> Result<(), String> {
    match flag {
        ImageVolumes::On => return Ok(()),
        ImageVolumes::Off => return Err("--image-volumes=off".into()),
        ImageVolumes::Auto => {}
    }
    match server {
        None => return Err("the API server's version is unknown".into()),
        Some(v) if v >= (1, 35) => {}
        Some((major, minor)) if (major, minor) >= (1, 33) => {
            return Err(format!(
            "the API server is {major}.{minor}, where the ImageVolume gate is off by default (pass --image-volumes=on if it is turned on)"
        ))
        }
        Some((major, minor)) => return Err(format!("the API server is {major}.{minor}; image volumes need 1.33 or later")),
    }
    let runtimes = runtimes.map_err(|why| {
        format!("the nodes' runtimes are unknown ({why}); grant the controller `list` on nodes or pass --image-volumes=on")
    })?;
    if runtimes.is_empty() {
        return Err("no nodes to check".into());
    }
    for r in runtimes {
        let (name, version) = r.split_once("://").unwrap_or((r.as_str(), ""));
        let v: Vec<u32> = version.trim_start_matches('v').split(['.', '-', '+']).take(2).filter_map(|p| p.parse().ok()).collect();
        let at_least = |major: u32, minor: u32| v.len() == 2 && (v[0], v[1]) >= (major, minor);
        let ok = match name {
            "containerd" => at_least(2, 1),
            "cri-o" => at_least(1, 31),
            _ => false,
        };
        if !ok {
            return Err(format!("a node runs {r}, which does not mount image volumes (containerd 2.1 or CRI-O 1.31 do)"));
        }
    }
    Ok(())
}

/// Sets Preparing, Prepared and PreparationFailed from a step's
/// [`Progress`](super::prepare::Progress), and Ready with them: called only
/// for a package whose profile allows runs, which is ready exactly when its
/// image is prepared for the current profile (a failed or pending
/// preparation holds it back, whatever image it had before).
pub fn apply_preparation(status: &mut SkillPackageStatus, progress: &super::prepare::Progress, generation: Option<i64>) {
    use super::prepare::Progress;
    let runnable = status.scripts.iter().filter(|s| s.allowed).count();
    let image = status.image.clone().unwrap_or_default();
    let c = &mut status.conditions;
    match progress {
        Progress::Prepared { message } => {
            set_condition(c, "Preparing", false, "Prepared", "nothing to do", generation);
            set_condition(c, "Prepared", true, "Prepared", message.clone(), generation);
            set_condition(c, "PreparationFailed", false, "Prepared", "the image is prepared", generation);
            let how = match status.image_mode {
                Some(ImageMode::ImageVolume) => format!("with the image volume {image}"),
                _ => format!("from {image}"),
            };
            set_condition(c, "Ready", true, "Ready", format!("{runnable} script(s) may run {how}"), generation);
        }
        Progress::Preparing { reason, message } => {
            set_condition(c, "Preparing", true, reason, message.clone(), generation);
            set_condition(c, "Prepared", false, "Preparing", "the image is being prepared", generation);
            set_condition(c, "PreparationFailed", false, "Preparing", "the image is being prepared", generation);
            set_condition(c, "Ready", false, "Preparing", format!("waiting for the run image: {message}"), generation);
        }
        Progress::Failed { reason, message } => {
            set_condition(c, "Preparing", false, "Failed", "the preparation failed", generation);
            set_condition(c, "Prepared", false, reason, "the preparation failed", generation);
            set_condition(c, "PreparationFailed", true, reason, message.clone(), generation);
            let kept = if image.is_empty() { String::new() } else { format!(" (the last good image, {image}, is kept)") };
            let first = message.lines().next().unwrap_or_default();
            set_condition(
                c,
                "Ready",
                false,
                "PreparationFailed",
                format!("the run image could not be prepared: {first}{kept}"),
                generation,
            );
        }
    }
}

/// How a SkillJob of `package` gets the package, and the image it starts
/// from. A prepared package runs only from an image prepared for its
/// current profile (the Prepared condition of this generation, the key it
/// was made for equal to the current one) holding exactly the pinned
/// package; anything else waits.
pub fn delivery(package: &SkillPackage) -> Result<(String, PackageDelivery), AdmitRefusal> {
    let name = package.metadata.name.clone().unwrap_or_default();
    let status = package.status.clone().unwrap_or_default();
    let profile = package.spec.runtime.as_ref().ok_or_else(|| AdmitRefusal::NoRuntime(name.clone()))?;
    if !package.wants_preparation() {
        let image = profile.image.clone().ok_or_else(|| AdmitRefusal::NoRunImage(name.clone()))?;
        return Ok((image, PackageDelivery::Fetched));
    }
    let prepared_now = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Prepared" && c.status == "True" && c.observed_generation == package.metadata.generation);
    let prep = status.preparation.clone().unwrap_or_default();
    let current = prepared_now
        && prep.key.is_some()
        && prep.prepared_key == prep.key
        && prep.package_digest.is_some()
        && prep.package_digest == status.digest;
    let not_prepared = || AdmitRefusal::NotPrepared(name.clone());
    let image = status.image.clone().filter(|_| current).ok_or_else(not_prepared)?;
    let env: Vec<(String, String)> =
        super::prepare::env_pairs(&prep.env).into_iter().filter(|(k, v)| PREPARED_ENV.iter().any(|(n, val)| n == k && val == v)).collect();
    match status.image_mode {
        Some(ImageMode::Composed) => Ok((image, PackageDelivery::InImage { env: env.into_iter().map(|(k, _)| k).collect() })),
        Some(ImageMode::ImageVolume) => {
            let base = status.base_image.clone().ok_or_else(not_prepared)?;
            Ok((base, PackageDelivery::ImageVolume { reference: image, deps: !env.is_empty(), env }))
        }
        _ => Err(not_prepared()),
    }
}

/// The namespace label Pod Security admission reads.
pub const PSS_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// Whether a namespace enforces the restricted profile.
pub fn namespace_is_restricted(labels: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    labels.and_then(|l| l.get(PSS_ENFORCE_LABEL)).is_some_and(|v| v == "restricted")
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;

/// How long a SkillJob that names inputs waits for them to be staged.
pub const INPUTS_WAIT_SECS: i64 = 600;

/// Why the staged inputs are not exactly the ones the SkillJob names (path,
/// size and digest), or `None` when they are. The Job starts only on `None`,
/// so a run never sees a file its SkillJob did not name, nor misses one.
pub fn inputs_mismatch(wanted: &[crate::api::job::InputFile], staged: &[crate::artifacts::SetFile]) -> Option<String> {
    let mut problems = Vec::new();
    for w in wanted {
        match staged.iter().find(|s| s.path == w.path) {
            None => problems.push(format!("{} is not staged", w.path)),
            Some(s) if s.digest != w.digest || s.size != w.size => {
                problems.push(format!("{} differs (staged {} bytes {}, named {} bytes {})", w.path, s.size, s.digest, w.size, w.digest))
            }
            Some(_) => {}
        }
    }
    for s in staged.iter().filter(|s| !wanted.iter().any(|w| w.path == s.path)) {
        problems.push(format!("{} is staged but not named in spec.inputs", s.path));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// How a container of the run's pod ended, as its status says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerEnd {
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// The kubelet's reason (`OOMKilled`, `Error`, `Completed`, ...).
    pub reason: Option<String>,
    /// The container's termination message (its last error line).
    pub message: Option<String>,
}

/// What the controller knows about a finished run.
#[derive(Debug, Clone, Default)]
pub struct RunFacts {
    /// The Job's Failed condition reason, when it failed (`DeadlineExceeded`, `PodFailurePolicy`, ...).
    pub job_failed: Option<String>,
    /// The launcher's `result.json`, when it was uploaded.
    pub launch: Option<crate::api::outcome::LaunchResult>,
    /// Whether the outputs manifest was stored.
    pub outputs_stored: bool,
    pub fetch: Option<ContainerEnd>,
    pub run: Option<ContainerEnd>,
    pub upload: Option<ContainerEnd>,
}

/// The SkillJob's final phase, with a condition reason and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub phase: SkillJobPhase,
    pub reason: &'static str,
    pub message: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

/// The last non-empty line of a termination message (helpers write their
/// error there; kubelet keeps at most 4 KiB).
fn last_line(message: &Option<String>) -> Option<String> {
    message.as_deref().and_then(|m| m.lines().rev().find(|l| !l.trim().is_empty())).map(|l| l.trim().chars().take(500).collect())
}

/// Decide how a finished run ended. The launcher's result is the truth
/// about the script ([`crate::api::outcome::RunOutcome::end`]); the Job's
/// deadline and the helper containers explain runs the result cannot.
pub fn run_verdict(f: &RunFacts) -> Verdict {
    use crate::api::outcome::RunEnd;
    let (exit_code, signal) = match (&f.launch, &f.run) {
        (Some(l), _) if l.error.is_none() => (l.outcome.exit_code, l.outcome.signal),
        (_, Some(r)) => (Some(r.exit_code), r.signal),
        _ => (None, None),
    };
    let v = |phase, reason, message: String| Verdict { phase, reason, message, exit_code, signal };
    // Time is time, whoever stopped the run for it.
    if f.job_failed.as_deref() == Some("DeadlineExceeded") {
        return v(SkillJobPhase::TimedOut, "DeadlineExceeded", "the Job's deadline passed and its pod was stopped".into());
    }
    if let Some(fetch) = f.fetch.as_ref().filter(|c| c.exit_code != 0) {
        let why = last_line(&fetch.message).unwrap_or_else(|| format!("exit {}", fetch.exit_code));
        return v(SkillJobPhase::Failed, "FetchFailed", format!("the run's files could not be fetched into the pod: {why}"));
    }
    if let Some(launch) = &f.launch {
        if let Some(error) = &launch.error {
            return v(SkillJobPhase::Failed, "StartFailed", error.clone());
        }
        let stored = |v: Verdict| {
            if f.outputs_stored {
                return v;
            }
            let why = f.upload.as_ref().and_then(|u| last_line(&u.message)).unwrap_or_else(|| "no outputs manifest was stored".into());
            Verdict {
                phase: SkillJobPhase::Failed,
                reason: "OutputsNotStored",
                message: format!("{}, but its outputs were not stored: {why}", v.message),
                ..v
            }
        };
        return match launch.outcome.end() {
            RunEnd::Succeeded => stored(v(SkillJobPhase::Succeeded, "Succeeded", launch.outcome.describe())),
            RunEnd::Failed => stored(v(SkillJobPhase::Failed, "Failed", launch.outcome.describe())),
            RunEnd::TimedOut => stored(v(SkillJobPhase::TimedOut, "TimedOut", launch.outcome.describe())),
            RunEnd::LimitExceeded(_) => stored(v(SkillJobPhase::Failed, "LimitExceeded", launch.outcome.describe())),
            RunEnd::Cancelled => v(SkillJobPhase::Cancelled, "Cancelled", launch.outcome.describe()),
        };
    }
    // No result: the pod says what it can.
    if let Some(run) = &f.run {
        if run.reason.as_deref() == Some("OOMKilled") {
            return v(SkillJobPhase::Failed, "LimitExceeded", "the run passed its memory limit and was killed (OOMKilled)".into());
        }
        let why = f.upload.as_ref().and_then(|u| last_line(&u.message)).unwrap_or_else(|| "no result was stored".into());
        return v(SkillJobPhase::Failed, "OutputsNotStored", format!("the run container exited {}, but {why}", run.exit_code));
    }
    v(SkillJobPhase::Failed, "NotStarted", "the run ended before its script started (see the pod's events)".into())
}
