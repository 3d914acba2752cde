//! The dependency build Job: started once per build identity, watched, and
//! read back. See the parent module for the flow.
//!
//! Order of creation, and why: the Job first (owned by the SkillPackage, so
//! it goes with the package), then its NetworkPolicy, then its token Secret
//! (both owned by the Job, so they go with it). The pod mounts the Secret,
//! so it cannot start before the Secret exists, which is after the policy:
//! the build pod never runs without its policy. While the build is
//! underway every look re-creates a missing policy or Secret (409 is fine),
//! so a controller stopped between two creates leaves nothing half made.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Resource, ResourceExt};

use super::plan::{Build, Wanted};
use super::{compose, outputs, PrepareError, Progress, StepError, BUILD_POLL, BUILD_SERVICE_ACCOUNT};
use crate::api::job::SkillJobPhase;
use crate::api::package::{SkillPackage, SkillPackageStatus};
use crate::controller::builders::build_job::{
    build_build_job, build_labels, build_network_policy, build_resources, BuildNetPolParams, BuildParams, IndexAddress, CONTAINER_BUILD,
    LABEL_BUILD,
};
use crate::controller::builders::network_policy::{build_service_account, Peer};
use crate::controller::context::{Context, MANAGER};
use crate::controller::decide::job_phase;
use crate::core::limits::BUILD_TIMEOUT_SECS;

/// The token Secret of a build.
pub fn token_secret_name(build: &str) -> String {
    format!("{build}-token")
}

/// Moves a build on by one step: start it, say it is underway, or read it
/// back and compose.
pub(crate) async fn advance(
    pkg: &SkillPackage,
    status: &mut SkillPackageStatus,
    want: &Wanted,
    b: &Build,
    ctx: &Context,
) -> Result<(Progress, Duration), StepError> {
    let ns = ctx.config.prepare.build_namespace.clone();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let prep = status.preparation.get_or_insert_with(Default::default);
    prep.build_job = Some(format!("{ns}/{}", b.name));
    let Some(job) = jobs.get_opt(&b.name).await? else {
        // A build that finished while this controller was away, and whose
        // Job has since gone (its TTL), left its files: use them.
        if prep.pinned_base.is_some() && ctx.artifacts.outputs(&ns, &b.uid).await?.is_some() {
            let collected =
                outputs::collect(ctx.artifacts.as_ref(), &ns, &b.uid, &b.lock_digest, ctx.config.prepare.spool_dir.as_deref()).await?;
            let done = compose::compose(pkg, status, want, Some(collected), ctx).await?;
            finish(ctx, &ns, b).await;
            return Ok(done);
        }
        start(pkg, status, want, b, ctx).await?;
        let message = format!("started the build Job {ns}/{} ({})", b.name, indexes_text(b));
        return Ok((Progress::Preparing { reason: "BuildStarted", message }, BUILD_POLL));
    };
    check_ours(&job, pkg, b)?;
    // The build ran on this base: the image is composed on exactly it.
    let pinned = build_image(&job).ok_or_else(|| PrepareError::Busy(format!("the build Job {ns}/{} has no build container", b.name)))?;
    status.preparation.get_or_insert_with(Default::default).pinned_base = Some(pinned);
    match job_phase(&job) {
        SkillJobPhase::Succeeded => {
            let collected =
                outputs::collect(ctx.artifacts.as_ref(), &ns, &b.uid, &b.lock_digest, ctx.config.prepare.spool_dir.as_deref()).await?;
            if collected.skipped_links > 0 {
                tracing::info!(build = %b.name, links = collected.skipped_links, "symlinks of the dependency tree were not carried");
            }
            let done = compose::compose(pkg, status, want, Some(collected), ctx).await?;
            finish(ctx, &ns, b).await;
            Ok(done)
        }
        SkillJobPhase::Failed | SkillJobPhase::TimedOut | SkillJobPhase::Cancelled | SkillJobPhase::Locked => {
            let condition = failed_condition(&job);
            Err(outputs::failure(ctx.artifacts.as_ref(), &ns, &b.uid, &b.name, condition).await.into())
        }
        SkillJobPhase::Pending | SkillJobPhase::Running => {
            ensure_children(ctx, &ns, pkg, b, &job).await?;
            let message = format!("the build Job {ns}/{} installs the dependencies ({})", b.name, indexes_text(b));
            Ok((Progress::Preparing { reason: "Building", message }, BUILD_POLL))
        }
    }
}

fn indexes_text(b: &Build) -> String {
    let mut parts = Vec::new();
    if let Some(u) = &b.pip_index_url {
        parts.push(format!("pip from {u}"));
    }
    if let Some(u) = &b.npm_registry {
        parts.push(format!("npm from {u}"));
    }
    parts.join(", ")
}

/// A Job under the build's name that this package did not make is not ours to read.
fn check_ours(job: &Job, pkg: &SkillPackage, b: &Build) -> Result<(), PrepareError> {
    let owned = job.owner_references().iter().any(|o| o.kind == "SkillPackage" && Some(&o.uid) == pkg.metadata.uid.as_ref());
    let labelled = job.labels().get(LABEL_BUILD) == Some(&b.name);
    if owned && labelled {
        Ok(())
    } else {
        Err(PrepareError::Busy(format!(
            "a Job {} exists that this SkillPackage did not make; delete it or change the prepare annotation",
            b.name
        )))
    }
}

fn build_image(job: &Job) -> Option<String> {
    job.spec.as_ref()?.template.spec.as_ref()?.containers.iter().find(|c| c.name == CONTAINER_BUILD)?.image.clone()
}

fn failed_condition(job: &Job) -> Option<(String, String)> {
    job.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Failed" && c.status == "True")
        .map(|c| (c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}

/// Pins the base, stages the package for the build, and creates the Job
/// and its children.
async fn start(pkg: &SkillPackage, status: &mut SkillPackageStatus, want: &Wanted, b: &Build, ctx: &Context) -> Result<(), StepError> {
    let ns = ctx.config.prepare.build_namespace.clone();
    let pinned = ctx.images.pin(&want.base).await?;
    status.preparation.get_or_insert_with(Default::default).pinned_base = Some(pinned.clone());
    // Checked against the pinned digest before the build sees it.
    let archive = super::fetch_verified(ctx, pkg, &want.package_digest).await?;
    ctx.artifacts.stage_package(&ns, &b.uid, archive).await?;
    let key = format!("build/{ns}");
    if !ctx.lookups.service_account_applied(&key) {
        let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &ns);
        let sa = build_service_account(BUILD_SERVICE_ACCOUNT, &ns, &BTreeMap::new());
        accounts.patch(BUILD_SERVICE_ACCOUNT, &PatchParams::apply(MANAGER).force(), &Patch::Apply(sa)).await?;
        ctx.lookups.remember_service_account(&key);
    }
    let (aliases, _) = index_hosts(b).await?;
    let mut host_aliases = ctx.config.host_aliases.clone();
    host_aliases.extend(aliases);
    let params = BuildParams {
        package: pkg.name_any(),
        name: b.name.clone(),
        build_uid: b.uid.clone(),
        namespace: ns.clone(),
        owner: pkg.controller_owner_ref(&()).unwrap_or_default(),
        base_image: pinned,
        operator_image: ctx.config.operator_image.clone(),
        operator_pull_policy: ctx.config.operator_image_pull_policy.clone(),
        artifact_endpoint: ctx.config.artifact_endpoint.clone(),
        token_secret: token_secret_name(&b.name),
        service_account: BUILD_SERVICE_ACCOUNT.into(),
        run_as_user: crate::controller::builders::job::DEFAULT_RUN_AS,
        run_as_group: crate::controller::builders::job::DEFAULT_RUN_AS,
        timeout_secs: BUILD_TIMEOUT_SECS as u32,
        resources: build_resources(),
        pip_index_url: b.pip_index_url.clone(),
        npm_registry: b.npm_registry.clone(),
        host_aliases,
        image_pull_secrets: Vec::new(),
    };
    params.validate()?;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let job = match jobs.create(&PostParams::default(), &build_build_job(&params)).await {
        Ok(job) => {
            tracing::info!(package = %pkg.name_any(), build = %b.name, "build Job created");
            job
        }
        // A concurrent or restarted controller made it first.
        Err(kube::Error::Api(s)) if s.code == 409 => jobs.get(&b.name).await?,
        Err(e) => return Err(e.into()),
    };
    ensure_children(ctx, &ns, pkg, b, &job).await
}

/// The build's NetworkPolicy, then its token Secret (see the module docs).
async fn ensure_children(ctx: &Context, ns: &str, pkg: &SkillPackage, b: &Build, job: &Job) -> Result<(), StepError> {
    let owner = OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: b.name.clone(),
        uid: job.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(false),
    };
    let (_, indexes) = index_hosts(b).await?;
    let policy = BuildNetPolParams {
        name: b.name.clone(),
        namespace: ns.to_string(),
        package: pkg.name_any(),
        owner: owner.clone(),
        artifact: Peer::in_namespace(
            &ctx.config.operator_namespace,
            ctx.config.operator_pod_labels.clone(),
            i32::from(ctx.config.artifact_port),
        ),
        indexes,
    };
    policy.validate()?;
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
    create_once(&policies, &build_network_policy(&policy)).await?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(token_secret_name(&b.name)),
            namespace: Some(ns.to_string()),
            labels: Some(build_labels(&b.name, &pkg.name_any())),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([("token".to_string(), crate::core::token::job_token(&ctx.config.token_key, ns, &b.uid))])),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    create_once(&secrets, &secret).await
}

async fn create_once<K>(api: &Api<K>, object: &K) -> Result<(), StepError>
where
    K: Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The indexes' hosts entries (names resolved here: the pod has no DNS)
/// and their addresses for the NetworkPolicy.
async fn index_hosts(b: &Build) -> Result<(BTreeMap<String, String>, Vec<IndexAddress>), PrepareError> {
    let mut aliases = BTreeMap::new();
    let mut addresses = Vec::new();
    for url in [&b.pip_index_url, &b.npm_registry].into_iter().flatten() {
        let (host, port) = host_port(url).map_err(|detail| PrepareError::IndexHost { host: url.clone(), detail })?;
        let ip = match host.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => {
                let found = tokio::net::lookup_host((host.as_str(), port))
                    .await
                    .map_err(|e| PrepareError::IndexHost { host: host.clone(), detail: e.to_string() })?
                    .next()
                    .ok_or_else(|| PrepareError::IndexHost { host: host.clone(), detail: "no address".into() })?;
                aliases.insert(host.clone(), found.ip().to_string());
                found.ip()
            }
        };
        let a = IndexAddress { ip, port };
        if !addresses.contains(&a) {
            addresses.push(a);
        }
    }
    Ok((aliases, addresses))
}

/// Host (brackets stripped) and port (or the scheme's) of an index URL.
pub fn host_port(url: &str) -> Result<(String, u16), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let host = uri.host().ok_or_else(|| format!("{url:?} has no host"))?.trim_matches(['[', ']']).to_string();
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(p), _) => p,
        (None, Some("https")) => 443,
        (None, Some("http")) => 80,
        _ => return Err(format!("{url:?}: use an http(s) URL")),
    };
    Ok((host, port))
}

/// After a successful compose: the Job goes (its pod, Secret and
/// NetworkPolicy with it) and so do the build's files. Failures here only
/// leave garbage the TTL and the next build remove; they are logged.
async fn finish(ctx: &Context, ns: &str, b: &Build) {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let dp = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
    match jobs.delete(&b.name, &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::warn!(build = %b.name, error = %e, "could not delete the finished build Job"),
    }
    if let Err(e) = ctx.artifacts.delete(ns, &b.uid).await {
        tracing::warn!(build = %b.name, error = %e, "could not delete the build's files");
    }
}
