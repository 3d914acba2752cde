//! SkillPackage reconciler: resolve the source to a digest, unpack and
//! check the package with the same discovery rules as the standalone
//! server, report what it holds, prepare its run image when the profile
//! asks ([`super::prepare`]), and refuse deletion while a binding uses it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::ResourceExt;

use super::context::{apply_status, Context, Error, ResolveError, Result};
use super::decide::{apply_preparation, dependency_plan_status, package_status, resolve_retry_after, PackageFacts, REQUIREMENT_FILES};
use crate::api::binding::SkillBinding;
use crate::api::conditions::is_true;
use crate::api::package::SkillPackage;
use crate::core::discovery::{discover, Limits};

/// Keeps a package while bindings use it.
pub const FINALIZER: &str = "skill-operator.dev/package-in-use";

pub async fn reconcile(pkg: Arc<SkillPackage>, ctx: Arc<Context>) -> Result<Action> {
    // A standby replica keeps its caches warm and writes nothing.
    if let Some(later) = ctx.leadership.wait_turn().await {
        return Ok(later);
    }
    let started = Instant::now();
    let api: Api<SkillPackage> = Api::all(ctx.client.clone());
    let result = finalizer(&api, FINALIZER, pkg, |event| async {
        match event {
            Finalizer::Apply(pkg) => apply(&pkg, &ctx).await,
            Finalizer::Cleanup(pkg) => cleanup(&pkg, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics.reconciled("SkillPackage", started.elapsed());
    result
}

async fn apply(pkg: &SkillPackage, ctx: &Context) -> Result<Action> {
    // The egress proxy's CiliumNetworkPolicy follows every package's allowed
    // hosts (only with --egress-cilium-fqdn-policy; a no-op when unchanged).
    let cilium_retry = super::cilium::sync(ctx, None).await.unwrap_or(Duration::MAX);
    let generation = pkg.metadata.generation;
    let already = pkg.status.as_ref().is_some_and(|s| s.observed_generation == generation && s.digest.is_some());
    let prepare = pkg.wants_preparation();
    if already && !prepare {
        // Pinned and checked for this generation: nothing to fetch again.
        return Ok(Action::requeue(Duration::from_secs(600).min(cilium_retry)));
    }
    let (mut status, mut next) = if already {
        // Resolved for this generation; only the preparation moves on.
        (pkg.status.clone().unwrap_or_default(), Duration::from_secs(600))
    } else {
        let facts = resolve(pkg, ctx).await;
        let status = package_status(pkg, facts.as_ref());
        let next = match &facts {
            Ok(_) => Duration::from_secs(600),
            // A registry that is down may come back (sooner the younger the
            // outage); a package that is wrong as it is will not change
            // until someone edits it (which wakes us).
            Err(e) if e.is_transient() => resolve_retry_after(retrying_for(&status)),
            Err(_) => Duration::from_secs(600),
        };
        (status, next)
    };
    if prepare && is_true(&status.conditions, "Validated") && profile_ready(&status) {
        let (progress, after) = super::prepare::step(pkg, &mut status, ctx).await?;
        apply_preparation(&mut status, &progress, generation);
        next = next.min(after);
    }
    if pkg.status.as_ref() != Some(&status) {
        let api: Api<SkillPackage> = Api::all(ctx.client.clone());
        apply_status(&api, &pkg.name_any(), &status).await?;
    }
    Ok(Action::requeue(next.min(cilium_retry)))
}

/// How long the package has not been Ready (its `Ready` condition's last
/// flip): the age of the outage it is retrying through.
fn retrying_for(status: &crate::api::package::SkillPackageStatus) -> Duration {
    status.conditions.iter().find(|c| c.type_ == "Ready").map_or(Duration::ZERO, |c| crate::api::conditions::age(&c.last_transition_time))
}

/// Whether the profile itself allows runs: Ready, or held back only by the
/// preparation ([`apply_preparation`] is the one that says so).
fn profile_ready(status: &crate::api::package::SkillPackageStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && (c.status == "True" || c.reason == "Preparing" || c.reason == "PreparationFailed"))
}

/// Fetch (pinning a tag to its digest; a digest in the reference must match),
/// unpack into a private temp dir and run discovery on it.
async fn resolve(pkg: &SkillPackage, ctx: &Context) -> Result<PackageFacts, ResolveError> {
    let source = &pkg.spec.source.oci;
    let fetched = ctx.resolver.fetch(source).await?;
    if let Some((_, pinned)) = source.reference.split_once('@') {
        if pinned != fetched.digest {
            return Err(ResolveError::PinMismatch { pinned: pinned.to_string(), got: fetched.digest });
        }
    }
    let expected = pkg.status.as_ref().and_then(|s| s.digest.clone());
    if let Some(previous) = expected {
        if previous != fetched.digest && pkg.status.as_ref().and_then(|s| s.observed_generation) == pkg.metadata.generation {
            return Err(ResolveError::Moved { previous, got: fetched.digest });
        }
    }
    let digest = fetched.digest.clone();
    let source_skill = pkg.annotations().get(crate::api::source::SOURCE_SKILL_ANNOTATION).cloned();
    tokio::task::spawn_blocking(move || {
        let dir = tempfile::tempdir()?;
        let unpacked = dir.path().join("unpacked");
        crate::core::package::unpack(&fetched.archive, &unpacked)?;
        // A package has no directory of its own: its SKILL.md names it. The
        // name must be one the server can serve (the same rule as a directory
        // name), and discovery then runs on a directory of that name.
        let name = match &source_skill {
            Some(served) => source_leaf(served).map_err(ResolveError::NotServable)?,
            None => skill_name(&unpacked).map_err(ResolveError::NotServable)?,
        };
        let root = dir.path().join(&name);
        std::fs::rename(&unpacked, &root)?;
        let requirement_files = REQUIREMENT_FILES.iter().filter(|f| root.join(f).is_file()).map(|f| f.to_string()).collect();
        // Read, never installed: the plan only hashes what is declared.
        let dependencies = dependency_plan_status(crate::image::deps::plan(&root));
        let catalog = discover(&[root], Limits::default());
        Ok(PackageFacts { digest, catalog, requirement_files, dependencies })
    })
    .await
    .map_err(|e| ResolveError::Task(e.to_string()))?
}

/// The name a SkillSource's package is served under: the last segment of
/// the name its path gave (`document-skills/xlsx` is `xlsx`), whatever its
/// SKILL.md says.
fn source_leaf(served: &str) -> Result<String, String> {
    let leaf = crate::core::spec::leaf_name(served);
    crate::core::spec::servable_name(leaf).map_err(|why| format!("the source's skill name {served:?} cannot be served: it {why}"))?;
    Ok(leaf.to_string())
}

/// The skill name a package's SKILL.md gives, checked as a servable name.
pub(crate) fn skill_name(root: &std::path::Path) -> Result<String, String> {
    use crate::core::{catalog::read_capped, frontmatter, limits::SKILL_MD_READ_CAP, spec::servable_name};
    let (bytes, truncated) = read_capped(&root.join("SKILL.md"), SKILL_MD_READ_CAP)
        .map_err(|e| format!("the package has no readable SKILL.md at its root: {e}"))?;
    let text = frontmatter::decode(&bytes, truncated).map_err(|e| e.to_string())?;
    let md = frontmatter::parse(text).map_err(|e| e.to_string())?;
    let name = md.frontmatter.get("name").and_then(|v| v.as_str()).ok_or("SKILL.md has no `name`: a package is named by it")?;
    servable_name(name).map_err(|why| format!("SKILL.md `name` {name:?} cannot be served: it {why}"))?;
    Ok(name.to_string())
}

/// Deletion is refused (the finalizer stays) while a binding uses the package.
async fn cleanup(pkg: &SkillPackage, ctx: &Context) -> Result<Action> {
    let bindings: Api<SkillBinding> = Api::all(ctx.client.clone());
    let users: Vec<String> = bindings
        .list(&ListParams::default())
        .await?
        .into_iter()
        .filter(|b| b.spec.package == pkg.name_any())
        .map(|b| format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any()))
        .collect();
    if users.is_empty() {
        // Its hosts leave the proxy's CiliumNetworkPolicy now: nothing
        // reconciles a package once it is gone.
        super::cilium::sync(ctx, Some(&pkg.name_any())).await;
        return Ok(Action::await_change());
    }
    let message = format!("deletion waits: bound by {}; delete those SkillBindings first", users.join(", "));
    let api: Api<SkillPackage> = Api::all(ctx.client.clone());
    let mut status = pkg.status.clone().unwrap_or_default();
    crate::api::conditions::set_condition(
        &mut status.conditions,
        "DeletionBlocked",
        true,
        "InUse",
        message.clone(),
        pkg.metadata.generation,
    );
    apply_status(&api, &pkg.name_any(), &status).await?;
    // An error keeps the finalizer; error_policy requeues.
    Err(Error::InUse(message))
}
