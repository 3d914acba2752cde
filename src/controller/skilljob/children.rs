//! The run's children: per namespace a ServiceAccount (no RBAC) and the two
//! run NetworkPolicies, made once; per run only the Job. Made idempotently;
//! the Job is deleted once the result is recorded.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PropagationPolicy};
use kube::{Resource, ResourceExt};

use super::RUN_SERVICE_ACCOUNT;
use crate::api::job::SkillJob;
use crate::controller::builders::job::{job_name, pod_selector_labels, EnvGrant, JobParams, PackageDelivery, RunResources};
use crate::controller::builders::network_policy::ANNOTATION_POLICY_DIGEST;
use crate::controller::builders::network_policy::{build_network_policies, build_service_account, NetPolParams, Peer};
use crate::controller::builders::{RUNS_EGRESS_POLICY, RUNS_POLICY};
use crate::controller::context::{Context, Result, MANAGER};
use crate::controller::decide::Admission;

pub(super) fn owner(sj: &SkillJob) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    sj.controller_owner_ref(&()).unwrap_or_default()
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

/// The namespace's ServiceAccount (no RBAC) and run policies, before its
/// first run and whenever they are not what they should be.
pub async fn ensure_namespace(ctx: &Context, ns: &str) -> Result<()> {
    if !ctx.lookups.service_account_applied(ns) {
        let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), ns);
        let sa = build_service_account(RUN_SERVICE_ACCOUNT, ns, &labels());
        accounts.patch(RUN_SERVICE_ACCOUNT, &PatchParams::apply(MANAGER).force(), &Patch::Apply(sa)).await?;
        ctx.lookups.remember_service_account(ns);
    }
    ensure_run_policies(ctx, ns).await
}

/// The namespace's run policies as they should be, each carrying the digest
/// of the whole set.
fn run_policies(ctx: &Context, ns: &str) -> Result<(Vec<NetworkPolicy>, String)> {
    let params = NetPolParams {
        namespace: ns.to_string(),
        labels: labels(),
        artifact: Peer::in_namespace(
            &ctx.config.operator_namespace,
            ctx.config.operator_pod_labels.clone(),
            i32::from(ctx.config.artifact_port),
        ),
        egress_proxy: ctx
            .config
            .egress_proxy
            .as_ref()
            .map(|p| Peer::in_namespace(&p.namespace, p.pod_labels.clone(), i32::from(p.pod_port))),
        dns: None,
    };
    // A policy that cannot be built is an error, never a run without one.
    params.validate()?;
    let policies = build_network_policies(&params);
    let digest = policies.first().and_then(|p| p.annotations().get(ANNOTATION_POLICY_DIGEST)).cloned().unwrap_or_default();
    Ok((policies, digest))
}

/// Applies the namespace's run policies unless the cache (or this
/// controller's own recent write) says they are current. A run's Job is
/// created only after this has returned Ok. An egress policy that should
/// not be there any more (the proxy was turned off) is deleted.
pub(super) async fn ensure_run_policies(ctx: &Context, ns: &str) -> Result<()> {
    // Checked before anything is built: this runs on every look at a run.
    if ctx.lookups.run_policies_applied(ns) {
        return Ok(());
    }
    let (policies, digest) = run_policies(ctx, ns)?;
    let current = |name: &str| {
        ctx.lookups
            .cached_network_policy(ns, name)
            .is_some_and(|p| p.metadata.deletion_timestamp.is_none() && p.annotations().get(ANNOTATION_POLICY_DIGEST) == Some(&digest))
    };
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
    for policy in &policies {
        let name = policy.name_any();
        if !current(&name) {
            api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(policy)).await?;
        }
    }
    let wanted_egress = policies.iter().any(|p| p.name_any() == RUNS_EGRESS_POLICY);
    if !wanted_egress && ctx.lookups.cached_network_policy(ns, RUNS_EGRESS_POLICY).is_some() {
        ignore_missing(api.delete(RUNS_EGRESS_POLICY, &DeleteParams::default()).await.map(|_| ()))?;
    }
    ctx.lookups.remember_run_policies(ns);
    Ok(())
}

/// A watch event for one of the namespace's run policies (changed or
/// deleted by someone): put it back at once, not at the namespace's next
/// run, since pods of running runs are selected by it. The leader alone writes.
pub async fn repair_run_policies(ctx: &Context, policy: &NetworkPolicy) {
    let (Some(ns), name) = (policy.namespace(), policy.name_any()) else { return };
    if (name != RUNS_POLICY && name != RUNS_EGRESS_POLICY) || !ctx.leadership.is_leading() {
        return;
    }
    ctx.lookups.forget_run_policies(&ns);
    if let Err(err) = ensure_run_policies(ctx, &ns).await {
        tracing::warn!(namespace = %ns, %err, "the namespace's run policies could not be put back; the next run there tries again");
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
        operator_pull_policy: ctx.config.operator_image_pull_policy.clone(),
        interpreter: a.interpreter_path.clone(),
        script: a.script.clone(),
        args: a.args.clone(),
        env: a.env.iter().map(|(n, s, k)| EnvGrant::from((n.clone(), s.clone(), k.clone()))).collect(),
        timeout_secs: a.timeout_secs as u32,
        resources: RunResources { cpu: a.cpu.clone(), memory: a.memory.clone(), ephemeral_storage: a.ephemeral_storage.clone() },
        artifact_endpoint: ctx.config.artifact_endpoint.clone(),
        service_account: RUN_SERVICE_ACCOUNT.into(),
        run_as_user: 65532,
        run_as_group: 65532,
        labels: labels(),
        egress_proxy: proxy_url(ctx, ns, uid, &a.egress_allowed),
        allow_dns: false,
        host_aliases: ctx.config.host_aliases.clone(),
        image_pull_secrets: Vec::new(),
        delivery: a.delivery.clone(),
        staged_package: (a.delivery == PackageDelivery::Fetched).then(|| a.digest.clone()),
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

/// A finished SkillJob whose Job is still in the cache: delete it (a delete
/// after the result was recorded failed, or a watch event raced it).
/// Nothing is asked of the API server otherwise.
pub(super) async fn delete_leftovers(ctx: &Context, ns: &str, uid: &str, warm_pod: Option<&str>) -> Result<()> {
    if ctx.lookups.cached_job(ns, &job_name(uid)).is_some() {
        delete_job(ctx, ns, uid).await?;
    }
    if let Some(pod) = warm_pod.filter(|p| ctx.lookups.cached_pod(ns, p).is_some()) {
        delete_warm_pod(ctx, ns, pod).await?;
    }
    Ok(())
}

/// Delete a claimed warm pod (its run is over, or stopped); NotFound is done.
pub(super) async fn delete_warm_pod(ctx: &Context, ns: &str, pod: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    ignore_missing(pods.delete(pod, &DeleteParams::default()).await.map(|_| ()))
}

fn ignore_missing(r: std::result::Result<(), kube::Error>) -> Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
