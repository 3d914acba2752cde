//! SkillSource reconciler: resolve the source to a commit, cut it into one
//! package per skill ([`crate::source::snapshot`]), push each as the same
//! OCI artifact `package push` makes, and keep one SkillPackage per skill
//! pinned to its digest.
//!
//! Nothing upgrades silently. A SkillPackage's source is immutable, so new
//! content is always a new SkillPackage; bindings name packages, so they
//! stay on what they have until someone points them elsewhere. A package
//! the source no longer has is deleted only when no binding uses it; a
//! bound one stays and the source's status says it is superseded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use super::context::{apply_status, Context, Error, FetchedPackage, Result, SourceTarget};
use crate::api::conditions::set_condition;
use crate::api::package::{OciSource, PackageSource, SkillPackage, SkillPackageSpec};
use crate::api::source::{
    AvailableUpdate, FollowedPlugin, SkillSource, SkillSourceStatus, SourcedSkill, UpdatePolicy, APPROVE_ANNOTATION, REFRESH_ANNOTATION,
    SOURCE_LABEL, SOURCE_SKILL_ANNOTATION,
};
use crate::core::limits::SOURCE_ZIP_BYTES;
use crate::oci::publish::{ANNOTATION_PATH, ANNOTATION_REVISION, ANNOTATION_SOURCE};
use crate::source::git::{Access, GitRef};
use crate::source::snapshot::{self, Origin, Snapshot};

/// How often `Check` and `Auto` look for a newer commit by default.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(3600);
/// A fetch that failed on the network is tried again after this.
const RETRY_AFTER: Duration = Duration::from_secs(60);
/// Skills pushed and their SkillPackages created at once.
const PUBLISH_CONCURRENCY: usize = 8;
/// The user sent with a Secret's token when it names none (GitHub's and
/// most forges' convention for tokens).
const TOKEN_USER: &str = "x-access-token";

/// What a reconcile does next: the decision alone, from the object and the
/// time, so it is tested without an API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Fetch and publish what the source holds.
    Publish,
    /// Fetch and report a newer commit (`status.available`), publishing nothing.
    Check,
    /// Nothing until then (`None`: until the object changes).
    Wait(Option<Duration>),
}

/// The next step for `src` at `now` (seconds since the epoch).
pub fn next_step(src: &SkillSource, now: i64) -> Step {
    let status = src.status.clone().unwrap_or_default();
    let annotations = src.annotations();
    let refresh = annotations.get(REFRESH_ANNOTATION).filter(|v| status.refreshed.as_ref() != Some(*v));
    let policy = src.spec.update_policy;
    if status.commit.is_none() || status.observed_generation != src.metadata.generation {
        return Step::Publish;
    }
    if policy == UpdatePolicy::Check {
        if approved_commit(src).is_some() {
            return Step::Publish;
        }
        if refresh.is_some() {
            return Step::Check;
        }
    } else if refresh.is_some() {
        return Step::Publish;
    }
    if policy == UpdatePolicy::Manual {
        return Step::Wait(None);
    }
    let interval = check_interval(src);
    let last = status.checked_at.as_deref().and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok()).map_or(0, |t| t.as_second());
    let due = last.saturating_add(interval.as_secs() as i64);
    if now >= due {
        return if policy == UpdatePolicy::Check { Step::Check } else { Step::Publish };
    }
    Step::Wait(Some(Duration::from_secs((due - now) as u64)))
}

/// The commit a `Check` source's approval names, when it is the one
/// `status.available` reports.
fn approved_commit(src: &SkillSource) -> Option<&str> {
    if src.spec.update_policy != UpdatePolicy::Check {
        return None;
    }
    let available = src.status.as_ref()?.available.as_ref()?;
    (src.annotations().get(APPROVE_ANNOTATION) == Some(&available.commit)).then_some(available.commit.as_str())
}

pub async fn reconcile(src: Arc<SkillSource>, ctx: Arc<Context>) -> Result<Action> {
    // A standby replica keeps its caches warm and writes nothing.
    if let Some(later) = ctx.leadership.wait_turn().await {
        return Ok(later);
    }
    let started = Instant::now();
    let result = apply(&src, &ctx).await;
    ctx.metrics.reconciled("SkillSource", started.elapsed());
    result
}

async fn apply(src: &SkillSource, ctx: &Context) -> Result<Action> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let step = next_step(src, now.as_second());
    let publish = match step {
        Step::Wait(None) => return Ok(Action::await_change()),
        Step::Wait(Some(after)) => return Ok(Action::requeue(after)),
        Step::Publish => true,
        Step::Check => false,
    };
    let old = src.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.observed_generation = src.metadata.generation;
    status.refreshed = src.annotations().get(REFRESH_ANNOTATION).cloned().or(old.refreshed.clone());
    status.checked_at = Some(crate::api::conditions::now().0.to_string());
    let generation = src.metadata.generation;
    let next = match fetch(src, ctx).await {
        Err(failure) => {
            set_condition(&mut status.conditions, "Ready", old.commit.is_some(), &failure.reason, failure.message.clone(), generation);
            set_condition(&mut status.conditions, "Fetched", false, &failure.reason, failure.message, generation);
            if failure.transient {
                Some(RETRY_AFTER)
            } else {
                None
            }
        }
        Ok(snap) => {
            let message = format!("{} skills at {}", snap.skills.len(), short(&snap.commit));
            set_condition(&mut status.conditions, "Fetched", true, "Fetched", message, generation);
            if publish {
                let started = Instant::now();
                publish_snapshot(src, ctx, &snap, &mut status).await?;
                tracing::info!(source = %src.name_any(), skills = status.skill_count, took_ms = started.elapsed().as_millis() as u64, "source published");
            } else {
                report_update(&snap, &mut status);
            }
            interval_of(src)
        }
    };
    if src.status.as_ref() != Some(&status) {
        let api: Api<SkillSource> = Api::all(ctx.client.clone());
        apply_status(&api, &src.name_any(), &status).await?;
    }
    Ok(match next {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// How often `Check` and `Auto` look for a newer commit.
fn check_interval(src: &SkillSource) -> Duration {
    src.spec.check_interval_seconds.map_or(DEFAULT_CHECK_INTERVAL, |s| Duration::from_secs(s.into()))
}

/// When to look again after a fetch: never by the clock under `Manual`.
fn interval_of(src: &SkillSource) -> Option<Duration> {
    (src.spec.update_policy != UpdatePolicy::Manual).then(|| check_interval(src))
}

fn short(commit: &str) -> &str {
    let hex = commit.strip_prefix("sha256:").unwrap_or(commit);
    hex.get(..12).unwrap_or(hex)
}

/// Why a fetch failed, as a condition says it.
struct Failure {
    reason: String,
    message: String,
    transient: bool,
}

impl Failure {
    fn new(reason: &str, message: impl Into<String>, transient: bool) -> Failure {
        Failure { reason: reason.into(), message: message.into(), transient }
    }
}

async fn fetch(src: &SkillSource, ctx: &Context) -> std::result::Result<Snapshot, Failure> {
    let origin = origin(src, ctx).await?;
    let origin = match (origin, approved_commit(src)) {
        // An approval publishes exactly what was reviewed, even when the
        // branch has moved on since the check reported it.
        (Origin::Git { source, access, follow_hosts }, Some(commit)) => {
            Origin::Git { source: GitRef { reference: Some(commit.to_string()), ..source }, access, follow_hosts }
        }
        (other, _) => other,
    };
    let started = Instant::now();
    let name = src.name_any();
    let snap = tokio::task::spawn_blocking(move || {
        let snap = snapshot::take(&origin);
        if let Ok(s) = &snap {
            tracing::info!(source = %name, commit = %s.commit, skills = s.skills.len(), took_ms = started.elapsed().as_millis() as u64, "source fetched and cut");
        }
        snap
    })
        .await
        .map_err(|e| Failure::new("FetchFailed", format!("the fetch task failed: {e}"), true))?;
    snap.map_err(|e| Failure::new(if e.is_transient() { "FetchFailed" } else { "Refused" }, e.to_string(), e.is_transient()))
}

async fn origin(src: &SkillSource, ctx: &Context) -> std::result::Result<Origin, Failure> {
    if let Some(git) = &src.spec.git {
        let path = git
            .path
            .as_deref()
            .map(crate::core::paths::RelPath::parse)
            .transpose()
            .map_err(|why| Failure::new("InvalidSpec", format!("spec.git.path: {why}"), false))?;
        let ssh = crate::source::ssh::is_ssh(&git.url);
        let (basic, ssh) = match &git.secret_ref {
            Some(name) if ssh => (None, Some(ssh_key(ctx, name).await?)),
            Some(name) => (Some(token(ctx, name).await?), None),
            None => (None, None),
        };
        let access = Access { local: false, insecure_http: git.insecure, basic, ssh };
        let source = GitRef { url: git.url.clone(), reference: git.reference.clone(), path };
        return Ok(Origin::Git { source, access, follow_hosts: git.follow_hosts.clone() });
    }
    let Some(zip) = &src.spec.zip else {
        return Err(Failure::new("InvalidSpec", "give spec.git or spec.zip", false));
    };
    let bytes = download(&zip.url, zip.insecure).await?;
    let got = format!("sha256:{:x}", Sha256::digest(&bytes));
    if got != zip.digest {
        return Err(Failure::new(
            "DigestMismatch",
            format!(
                "{} has digest {got}, not the pinned {}; check the URL, or pin the new digest if the change is expected",
                zip.url, zip.digest
            ),
            false,
        ));
    }
    Ok(Origin::Zip { bytes, digest: got, path: zip.path.clone() })
}

/// A Secret of the operator's namespace as text values (empty ones left
/// out); `wants` names its keys for the message when it is missing.
async fn secret_text(ctx: &Context, name: &str, wants: &str) -> std::result::Result<BTreeMap<String, String>, Failure> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.config.operator_namespace);
    let ns = &ctx.config.operator_namespace;
    let secret = api.get_opt(name).await.map_err(|e| Failure::new("SecretUnreadable", format!("Secret {ns}/{name}: {e}"), true))?;
    let secret =
        secret.ok_or_else(|| Failure::new("SecretMissing", format!("Secret {ns}/{name} does not exist; create it with {wants}"), false))?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| String::from_utf8(v.0).ok().filter(|t| !t.trim().is_empty()).map(|t| (k, t)))
        .collect())
}

/// The Secret's token (and user) for a private repository over HTTPS.
async fn token(ctx: &Context, name: &str) -> std::result::Result<(String, String), Failure> {
    let mut data = secret_text(ctx, name, "a `token` key").await?;
    let ns = &ctx.config.operator_namespace;
    let token =
        data.remove("token").ok_or_else(|| Failure::new("SecretMissing", format!("Secret {ns}/{name} has no `token` key"), false))?;
    Ok((data.remove("username").map_or_else(|| TOKEN_USER.into(), |u| u.trim().to_string()), token.trim().to_string()))
}

/// The Secret's SSH client key (`ssh-privatekey`, the key a
/// `kubernetes.io/ssh-auth` Secret uses) and the host keys it pins
/// (`known_hosts`): an SSH source never trusts a key it learns.
async fn ssh_key(ctx: &Context, name: &str) -> std::result::Result<crate::source::ssh::SshKey, Failure> {
    let mut data = secret_text(ctx, name, "`ssh-privatekey` and `known_hosts` keys").await?;
    let ns = &ctx.config.operator_namespace;
    let private_key = data
        .remove("ssh-privatekey")
        .ok_or_else(|| Failure::new("SecretMissing", format!("Secret {ns}/{name} has no `ssh-privatekey` key"), false))?;
    let known_hosts = data.remove("known_hosts").ok_or_else(|| {
        Failure::new(
            "SecretMissing",
            format!(
                "Secret {ns}/{name} has no `known_hosts` key: pin the server's host key (a line of `ssh-keyscan` output you have verified)"
            ),
            false,
        )
    })?;
    Ok(crate::source::ssh::SshKey { private_key, known_hosts })
}

/// The ZIP's bytes, at most [`SOURCE_ZIP_BYTES`].
async fn download(url: &str, insecure: bool) -> std::result::Result<Vec<u8>, Failure> {
    match url.split_once("://").map(|(s, _)| s) {
        Some("https") => {}
        Some("http") if insecure => {}
        _ => return Err(Failure::new("InvalidSpec", format!("spec.zip.url {url:?}: give an https:// URL"), false)),
    }
    let client = crate::tls::reqwest_builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(300))
        .redirect(reqwest::redirect::Policy::limited(5))
        .build()
        .map_err(|e| Failure::new("FetchFailed", crate::download::describe(&e), true))?;
    crate::download::capped(&client, url, SOURCE_ZIP_BYTES).await.map_err(|e| match e {
        crate::download::DownloadError::TooLarge(cap) => {
            Failure::new("Refused", format!("{url} is larger than {cap} bytes, the ZIP source cap"), false)
        }
        other => Failure::new("FetchFailed", format!("{url}: {other}"), other.is_transient()),
    })
}

/// `status.available` for a newer commit; cleared when there is none.
fn report_update(snap: &Snapshot, status: &mut SkillSourceStatus) {
    if status.commit.as_deref() == Some(snap.commit.as_str()) {
        status.available = None;
        return;
    }
    let (added, removed, changed) = snapshot::diff(
        status.skills.iter().map(|s| (s.name.as_str(), s.content.as_str())),
        snap.skills.iter().map(|s| (s.name.as_str(), s.content.as_str())),
    );
    status.available = Some(AvailableUpdate { commit: snap.commit.clone(), added, removed, changed });
}

/// Push every skill, create its SkillPackage, delete what is superseded
/// and unbound, and describe the result in `status`.
async fn publish_snapshot(src: &SkillSource, ctx: &Context, snap: &Snapshot, status: &mut SkillSourceStatus) -> Result<()> {
    let generation = src.metadata.generation;
    let Some(target) = ctx.sources.as_deref() else {
        let message =
            "the controller has no package repository for sources: start it with --source-repository HOST/REPO (the chart sets it)";
        set_condition(&mut status.conditions, "Ready", false, "NoRepository", message, generation);
        return Ok(());
    };
    let source = src.name_any();
    let packages: Api<SkillPackage> = Api::all(ctx.client.clone());
    let previous: BTreeMap<&str, &SourcedSkill> = status_skills(src);
    let mut skills = Vec::with_capacity(snap.skills.len());
    let mut problems = snap.problems.clone();
    let mut problem_count = snap.problem_count;
    let registry = crate::oci::Registry::new(target.options.clone()).map_err(|e| Error::Resolve(push_error(&target.repository, e)))?;
    // Each skill is its own registry round trips and API writes: several at
    // once, in order (the status lists them sorted by name).
    let results: Vec<_> = futures::stream::iter(0..snap.skills.len())
        .map(|i| {
            let (skill, registry, packages, previous, source) = (&snap.skills[i], &registry, &packages, &previous, &source);
            async move {
                let package = match previous.get(skill.name.as_str()) {
                    // Same files as the package it already has: keep it.
                    Some(old) if old.content == skill.content => (*old).clone(),
                    _ => match push(registry, target, source, skill, &snap.commit).await {
                        Ok(digest) => {
                            // The package reconciler resolves what was just
                            // pushed from memory, not by pulling it back.
                            let oci = package_source(target, source, skill, &digest);
                            ctx.resolver.seed(&oci, FetchedPackage { digest: digest.clone(), archive: skill.archive.clone() });
                            SourcedSkill {
                                name: skill.name.clone(),
                                path: skill.path.clone(),
                                package: package_name(source, &skill.name, &digest),
                                digest,
                                content: skill.content.clone(),
                            }
                        }
                        Err(e) => return Ok(Err(format!("{}: not pushed: {e:#}", skill.path))),
                    },
                };
                ensure_package(packages, src, target, snap, skill, &package).await?;
                Ok::<_, Error>(Ok(package))
            }
        })
        .buffered(PUBLISH_CONCURRENCY)
        .collect()
        .await;
    for result in results {
        match result? {
            Ok(package) => skills.push(package),
            Err(problem) => {
                problems.push(problem);
                problem_count += 1;
            }
        }
    }
    let superseded = prune(ctx, &packages, &source, &skills).await?;
    problem_count += superseded.len();
    problems.extend(superseded);
    problems.truncate(crate::core::limits::SOURCE_PROBLEMS_LISTED);
    status.commit = Some(snap.commit.clone());
    status.short_commit = Some(short(&snap.commit).to_string());
    status.skill_count = skills.len() as u32;
    status.skills = skills;
    status.problem_count = problem_count as u32;
    status.problems = problems;
    status.available = None;
    status.followed = snap
        .followed
        .iter()
        .map(|f| FollowedPlugin { plugin: f.plugin.clone(), url: f.url.clone(), path: f.path.clone(), commit: f.commit.clone() })
        .collect();
    let message = format!("{} SkillPackages at {}", status.skill_count, short(&snap.commit));
    set_condition(&mut status.conditions, "Ready", true, "Published", message, generation);
    Ok(())
}

fn status_skills(src: &SkillSource) -> BTreeMap<&str, &SourcedSkill> {
    src.status.as_ref().map(|s| s.skills.iter().map(|k| (k.name.as_str(), k)).collect()).unwrap_or_default()
}

fn push_error(repository: &str, source: crate::oci::OciError) -> super::context::ResolveError {
    super::context::ResolveError::Pull { reference: repository.to_string(), source }
}

async fn push(
    registry: &crate::oci::Registry,
    target: &SourceTarget,
    source: &str,
    skill: &snapshot::PackagedSkill,
    commit: &str,
) -> Result<String, crate::oci::OciError> {
    let reference = format!("{}:{}", skill_repository(target, source, skill), short(commit));
    // The config was made from this very archive by the snapshot. A skill
    // whose files changed is new content: no HEAD for blobs it cannot
    // have (sending one it has keeps one copy).
    registry.push_checked(&reference, &skill.archive, &skill.config, BTreeMap::new(), crate::oci::Upload::Always).await
}

/// Where a source's skill is pulled from, pinned to its manifest digest:
/// the SkillPackage's source, and the key its pushed archive is seeded under.
fn package_source(target: &SourceTarget, source: &str, skill: &snapshot::PackagedSkill, digest: &str) -> OciSource {
    let reference = format!("{}@{digest}", skill_repository(target, source, skill));
    OciSource { reference, pull_secret: None, insecure: target.insecure() }
}

/// A source's skill's own repository under the source target.
fn skill_repository(target: &SourceTarget, source: &str, skill: &snapshot::PackagedSkill) -> String {
    format!("{}/{source}/{}", target.repository.trim_end_matches('/'), slug(&skill.name))
}

/// Creates the SkillPackage for `sourced` (one that exists is left as it is).
async fn ensure_package(
    api: &Api<SkillPackage>,
    src: &SkillSource,
    target: &SourceTarget,
    snap: &Snapshot,
    skill: &snapshot::PackagedSkill,
    sourced: &SourcedSkill,
) -> Result<()> {
    let mut pkg = SkillPackage::new(
        &sourced.package,
        SkillPackageSpec {
            source: PackageSource { oci: package_source(target, &src.name_any(), skill, &sourced.digest) },
            runtime: src.spec.runtime.clone(),
        },
    );
    let meta = &mut pkg.metadata;
    meta.labels = Some([(SOURCE_LABEL.to_string(), src.name_any())].into());
    // A followed plugin's skill names its own repository and commit.
    let (origin, revision) = match &skill.from {
        Some((url, commit)) => (Some(url.clone()), commit.clone()),
        None => {
            (src.spec.git.as_ref().map(|g| g.url.clone()).or_else(|| src.spec.zip.as_ref().map(|z| z.url.clone())), snap.commit.clone())
        }
    };
    let mut annotations = BTreeMap::from([
        (SOURCE_SKILL_ANNOTATION.to_string(), skill.name.clone()),
        (ANNOTATION_REVISION.to_string(), revision),
        (ANNOTATION_PATH.to_string(), skill.path.clone()),
    ]);
    if let Some(url) = origin {
        annotations.insert(ANNOTATION_SOURCE.to_string(), url);
    }
    meta.annotations = Some(annotations);
    // Deleting the source deletes its packages, each only once unbound
    // (the package's own finalizer holds it while a binding uses it).
    meta.owner_references = Some(vec![OwnerReference {
        api_version: SkillSource::api_version(&()).into(),
        kind: SkillSource::kind(&()).into(),
        name: src.name_any(),
        uid: src.uid().ok_or(Error::Missing("metadata.uid"))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    match api.create(&PostParams::default(), &pkg).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes this source's packages that are not in `current` and that no
/// binding uses; returns a problem line for each bound one left in place.
async fn prune(ctx: &Context, api: &Api<SkillPackage>, source: &str, current: &[SourcedSkill]) -> Result<Vec<String>> {
    let keep: std::collections::HashSet<&str> = current.iter().map(|s| s.package.as_str()).collect();
    let ours = api.list(&ListParams::default().labels(&format!("{SOURCE_LABEL}={source}"))).await?;
    let mut bound = Vec::new();
    for pkg in ours.items.iter().filter(|p| !keep.contains(p.name_any().as_str())) {
        let name = pkg.name_any();
        let users = ctx.lookups.bindings_of_package(&name);
        if users.is_empty() {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        } else {
            let skill = pkg.annotations().get(SOURCE_SKILL_ANNOTATION).cloned().unwrap_or_default();
            let now = current.iter().find(|s| s.name == skill).map_or("nothing (the skill is gone)".to_string(), |s| s.package.clone());
            bound.push(format!("{name}: superseded but still bound ({} bindings); the source now has {now}", users.len()));
        }
    }
    Ok(bound)
}

/// A skill's served name as one DNS label-ish segment (`docs/pdf` is `docs-pdf`).
fn slug(name: &str) -> String {
    let mut out: String = name.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').to_string()
}

/// `<source>-<skill>-<digest12>`, cut to fit a name (253), always ending
/// in the digest so two versions never share one.
pub fn package_name(source: &str, skill: &str, digest: &str) -> String {
    let tail = short(digest);
    let head = format!("{source}-{}", slug(skill));
    let room = 253 - tail.len() - 1;
    let head = head.get(..room.min(head.len())).unwrap_or(&head).trim_end_matches('-');
    format!("{head}-{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::source::{GitSource, SkillSourceSpec};

    fn source(policy: UpdatePolicy, status: Option<SkillSourceStatus>, annotations: &[(&str, &str)]) -> SkillSource {
        let mut s = SkillSource::new(
            "s",
            SkillSourceSpec {
                git: Some(GitSource {
                    url: "https://h/r".into(),
                    reference: None,
                    path: None,
                    secret_ref: None,
                    insecure: false,
                    follow_hosts: Vec::new(),
                }),
                zip: None,
                update_policy: policy,
                check_interval_seconds: Some(600),
                runtime: None,
            },
        );
        s.metadata.generation = Some(2);
        s.metadata.annotations = Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        s.status = status;
        s
    }

    fn fetched(at: &str) -> SkillSourceStatus {
        SkillSourceStatus {
            observed_generation: Some(2),
            commit: Some("a".repeat(40)),
            checked_at: Some(at.into()),
            refreshed: Some("1".into()),
            ..Default::default()
        }
    }

    const T0: &str = "2026-12-03T10:00:00Z";
    fn at(offset: i64) -> i64 {
        T0.parse::<k8s_openapi::jiff::Timestamp>().unwrap().as_second() + offset
    }

    #[test]
    fn a_new_or_edited_source_is_published_whatever_its_policy() {
        for policy in [UpdatePolicy::Manual, UpdatePolicy::Check, UpdatePolicy::Auto] {
            assert_eq!(next_step(&source(policy, None, &[]), at(0)), Step::Publish);
            let mut edited = fetched(T0);
            edited.observed_generation = Some(1);
            assert_eq!(next_step(&source(policy, Some(edited), &[]), at(0)), Step::Publish);
        }
    }

    #[test]
    fn manual_waits_for_a_new_refresh_value() {
        let s = source(UpdatePolicy::Manual, Some(fetched(T0)), &[(REFRESH_ANNOTATION, "1")]);
        assert_eq!(next_step(&s, at(1_000_000)), Step::Wait(None), "the refresh already acted on, and no clock");
        let s = source(UpdatePolicy::Manual, Some(fetched(T0)), &[(REFRESH_ANNOTATION, "2")]);
        assert_eq!(next_step(&s, at(0)), Step::Publish);
    }

    #[test]
    fn check_only_reports_until_the_reported_commit_is_approved() {
        let s = source(UpdatePolicy::Check, Some(fetched(T0)), &[]);
        assert_eq!(next_step(&s, at(599)), Step::Wait(Some(Duration::from_secs(1))), "one second before the interval ends");
        assert_eq!(next_step(&s, at(600)), Step::Check, "at its edge");
        let refreshed = source(UpdatePolicy::Check, Some(fetched(T0)), &[(REFRESH_ANNOTATION, "2")]);
        assert_eq!(next_step(&refreshed, at(0)), Step::Check, "a refresh under Check only checks");
        let mut reported = fetched(T0);
        reported.available = Some(AvailableUpdate { commit: "b".repeat(40), ..Default::default() });
        let wrong = source(UpdatePolicy::Check, Some(reported.clone()), &[(APPROVE_ANNOTATION, &"c".repeat(40))]);
        assert_eq!(next_step(&wrong, at(0)), Step::Wait(Some(Duration::from_secs(600))), "approving another commit approves nothing");
        let approved = source(UpdatePolicy::Check, Some(reported), &[(APPROVE_ANNOTATION, &"b".repeat(40))]);
        assert_eq!(next_step(&approved, at(0)), Step::Publish);
    }

    #[test]
    fn auto_publishes_on_its_interval() {
        let s = source(UpdatePolicy::Auto, Some(fetched(T0)), &[]);
        assert_eq!(next_step(&s, at(10)), Step::Wait(Some(Duration::from_secs(590))));
        assert_eq!(next_step(&s, at(600)), Step::Publish);
    }

    #[test]
    fn package_names_are_valid_and_end_in_the_digest() {
        let digest = format!("sha256:{}", "0123456789ab".repeat(5));
        assert_eq!(package_name("team", "document-skills/xlsx", &digest), "team-document-skills-xlsx-0123456789ab");
        assert_eq!(package_name("team", "Weird_Name.v2", &digest), "team-weird-name-v2-0123456789ab");
        let long = package_name(&"s".repeat(200), &"k".repeat(128), &digest);
        assert!(long.len() <= 253 && long.ends_with("-0123456789ab"), "{long}");
    }
}
