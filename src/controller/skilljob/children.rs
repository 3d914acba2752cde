//! The run's children: a ServiceAccount per namespace (no RBAC), and per
//! run a token Secret, a NetworkPolicy and the Job. Made idempotently, and
//! deleted once the result is recorded.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Resource, ResourceExt};

use super::RUN_SERVICE_ACCOUNT;
use crate::api::job::SkillJob;
use crate::controller::builders::job::{job_name, pod_selector_labels, EnvGrant, JobParams, RunResources};
use crate::controller::builders::network_policy::{build_network_policy, build_service_account, NetPolParams, Peer};
use crate::controller::context::{Context, Result, MANAGER};
use crate::controller::decide::Admission;

pub(super) fn owner(sj: &SkillJob) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    sj.controller_owner_ref(&()).unwrap_or_default()
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

pub(super) fn token_secret_name(uid: &str) -> String {
    format!("{}-token", job_name(uid))
}

/// ServiceAccount (no RBAC), token Secret and NetworkPolicy, created or
/// applied idempotently. `egress` is the run's effective allowlist.
pub(super) async fn ensure(ctx: &Context, sj: &SkillJob, ns: &str, uid: &str, egress: &[String]) -> Result<()> {
    if !ctx.lookups.service_account_applied(ns) {
        let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), ns);
        let sa = build_service_account(RUN_SERVICE_ACCOUNT, ns, &labels());
        accounts.patch(RUN_SERVICE_ACCOUNT, &PatchParams::apply(MANAGER).force(), &Patch::Apply(sa)).await?;
        ctx.lookups.remember_service_account(ns);
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let token = crate::core::token::job_token(&ctx.config.token_key, ns, uid);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(token_secret_name(uid)),
            namespace: Some(ns.to_string()),
            owner_references: Some(vec![owner(sj)]),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([("token".to_string(), token)])),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    ensure_policy(ctx, sj, ns, uid, egress).await
}

/// A run's NetworkPolicy never changes (its SkillJob is immutable), so it
/// is created, not applied: a create costs the API server less than a
/// server-side apply, and one that exists already answers 409.
pub(super) async fn ensure_policy(ctx: &Context, sj: &SkillJob, ns: &str, uid: &str, egress: &[String]) -> Result<()> {
    // A policy that cannot be built is an error, never a run without one.
    let policy = policy_for(ctx, sj, ns, uid, egress)?;
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
    match policies.create(&PostParams::default(), &policy).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Egress to the artifact endpoint always; to the proxy pods only when the
/// run may reach some host. Never DNS.
fn policy_for(ctx: &Context, sj: &SkillJob, ns: &str, uid: &str, egress: &[String]) -> Result<NetworkPolicy> {
    let params = NetPolParams {
        skilljob_name: sj.name_any(),
        namespace: ns.to_string(),
        skilljob_uid: uid.to_string(),
        owner: owner(sj),
        labels: labels(),
        artifact: Peer::in_namespace(
            &ctx.config.operator_namespace,
            ctx.config.operator_pod_labels.clone(),
            i32::from(ctx.config.artifact_port),
        ),
        egress_hosts: egress.iter().map(|e| policy_host(e)).collect(),
        egress_proxy: ctx
            .config
            .egress_proxy
            .as_ref()
            .filter(|_| !egress.is_empty())
            .map(|p| Peer::in_namespace(&p.namespace, p.pod_labels.clone(), i32::from(p.pod_port))),
        dns: None,
    };
    params.validate()?;
    Ok(build_network_policy(&params))
}

/// An allowlist entry as the policy's annotation shows it: `host:port`
/// (the first port; the annotation is for people, the proxy holds the list),
/// IP entries without brackets.
fn policy_host(entry: &str) -> String {
    let (host, ports) = entry.rsplit_once(':').unwrap_or((entry, ""));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match ports.split(',').next().filter(|p| !p.is_empty()) {
        Some(port) if !host.contains(':') => format!("{host}:{port}"),
        _ => host.to_string(),
    }
}

/// The proxy variables' value for a run allowed `egress`: the proxy URL
/// with the job's credential, or `None` (no network).
pub(super) fn proxy_url(ctx: &Context, ns: &str, uid: &str, egress: &[String]) -> Option<String> {
    let proxy = ctx.config.egress_proxy.as_ref().filter(|_| !egress.is_empty())?;
    Some(crate::egress::proxy_url(&proxy.address, &ctx.config.token_key, &crate::egress::JobId::new(ns, uid)))
}

pub(super) fn job_params(ctx: &Context, sj: &SkillJob, ns: &str, uid: &str, a: &Admission) -> JobParams {
    JobParams {
        skilljob_name: sj.name_any(),
        namespace: ns.to_string(),
        skilljob_uid: uid.to_string(),
        owner: owner(sj),
        run_image: a.image.clone(),
        operator_image: ctx.config.operator_image.clone(),
        interpreter: a.interpreter_path.clone(),
        script: a.script.clone(),
        args: a.args.clone(),
        env: a.env.iter().map(|(n, s, k)| EnvGrant::from((n.clone(), s.clone(), k.clone()))).collect(),
        timeout_secs: a.timeout_secs as u32,
        resources: RunResources { cpu: a.cpu.clone(), memory: a.memory.clone(), ephemeral_storage: a.ephemeral_storage.clone() },
        artifact_endpoint: ctx.config.artifact_endpoint.clone(),
        token_secret: token_secret_name(uid),
        service_account: RUN_SERVICE_ACCOUNT.into(),
        run_as_user: 65532,
        run_as_group: 65532,
        labels: labels(),
        egress_proxy: proxy_url(ctx, ns, uid, &a.egress_allowed),
        allow_dns: false,
        host_aliases: ctx.config.host_aliases.clone(),
        image_pull_secrets: Vec::new(),
        delivery: a.delivery.clone(),
    }
}

fn selector(uid: &str) -> String {
    pod_selector_labels(uid).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// The run's pods (there is one; a Job that was retried would have more).
pub(super) async fn pods(ctx: &Context, ns: &str, uid: &str) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    Ok(pods.list(&ListParams::default().labels(&selector(uid))).await?.items)
}

pub(super) fn alive(pods: &[Pod]) -> bool {
    pods.iter().any(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed")))
}

pub(super) async fn pods_alive(ctx: &Context, ns: &str, uid: &str) -> Result<bool> {
    Ok(alive(&pods(ctx, ns, uid).await?))
}

/// Delete the run's Job (its pod goes with it); NotFound is done.
pub(super) async fn delete_job(ctx: &Context, ns: &str, uid: &str) -> Result<()> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    // Background: the Job goes now and the garbage collector takes the pod,
    // which the kubelet stops (SIGTERM to the launcher, which kills the script).
    let dp = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
    ignore_missing(jobs.delete(&job_name(uid), &dp).await.map(|_| ()))
}

/// Everything of a finished run but the SkillJob: Job (with its pod),
/// token Secret, NetworkPolicy. The SkillJob keeps the result and outputs.
pub(super) async fn delete_all(ctx: &Context, ns: &str, uid: &str) -> Result<()> {
    let name = job_name(uid);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
    let dp = DeleteParams::default();
    tokio::try_join!(
        delete_job(ctx, ns, uid),
        async { ignore_missing(secrets.delete(&token_secret_name(uid), &dp).await.map(|_| ())) },
        async { ignore_missing(policies.delete(&name, &dp).await.map(|_| ())) },
    )?;
    Ok(())
}

/// A finished SkillJob whose Job or NetworkPolicy is still in the caches:
/// delete what is left (a delete after the result was recorded failed, or
/// a watch event raced it). Nothing is asked of the API server otherwise.
pub(super) async fn delete_leftovers(ctx: &Context, ns: &str, uid: &str) -> Result<()> {
    let name = job_name(uid);
    if ctx.lookups.cached_job(ns, &name).is_some() || ctx.lookups.has_network_policy(ns, &name) {
        delete_all(ctx, ns, uid).await?;
    }
    Ok(())
}

fn ignore_missing(r: std::result::Result<(), kube::Error>) -> Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
