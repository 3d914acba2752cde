//! Step 2: stage the pinned package (or check the prepared image holds it),
//! make sure the namespace's children are there and create the Job.

use std::time::Duration;

use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::{children, patch_status, publish, set_phase, POLL};
use crate::api::job::{JobEgress, SkillJob, SkillJobPhase, SkillJobStatus};
use crate::controller::builders::job::PackageDelivery;
use crate::controller::builders::job::{build_job, job_name};
use crate::controller::context::{Context, Error, Result};
use crate::controller::decide::Admission;
use crate::controller::staged;
use k8s_openapi::api::batch::v1::Job;

/// How soon a reconcile that found its view older than the API server's
/// looks again (by then the watch has usually caught up).
const STALE_VIEW_RETRY: Duration = Duration::from_secs(1);

pub(super) async fn start(
    sj: &SkillJob,
    ctx: &Context,
    ns: &str,
    uid: &str,
    admission: &Admission,
    mut status: SkillJobStatus,
) -> Result<Action> {
    let generation = sj.metadata.generation;
    let name = job_name(uid);
    // From here on the API server's copy: its version guards the status write.
    let Some(current) = unstarted_copy(sj, ctx, ns).await? else { return Ok(Action::requeue(STALE_VIEW_RETRY)) };
    let sj = &current;
    let egress = &admission.egress_allowed;
    if !egress.is_empty() && ctx.config.egress_proxy.is_none() {
        // NetworkPolicy cannot name hosts: without the proxy there is
        // nothing to enforce the allowlist with, so no network rather than all.
        let why = format!(
            "the binding allows egress to {} but the controller has no egress proxy (--egress-proxy): refusing to run rather than to open the network",
            egress.join(", ")
        );
        set_phase(&mut status, SkillJobPhase::Failed, "NoEgressProxy", why.clone(), generation);
        patch_status(ctx, sj, &status).await?;
        publish(ctx, sj, EventType::Warning, "NoEgressProxy", &why).await;
        return Ok(Action::await_change());
    }
    if !egress.is_empty() || !admission.egress_proposed.is_empty() {
        status.egress = Some(JobEgress { proposed: admission.egress_proposed.clone(), allowed: egress.clone(), pod_ip: None, seal: None });
    }
    // A warm pod of the binding's pool, when it keeps one and one waits:
    // no package to stage, no Job, no pod to start.
    let proxy = children::proxy_url(ctx, ns, uid, egress);
    if let Some(taken) = crate::controller::warm::claim::claim(ctx, sj, ns, uid, admission, proxy.is_some()).await? {
        return claimed(sj, ctx, ns, uid, admission, taken, proxy, status).await;
    }
    // The package the pod fetches: exactly the pinned digest, staged once
    // for the namespace (see `staged`), while the children are made
    // (independent round trips). The gate is held until the Job exists, so
    // the sweep of staged packages sees the Job before it looks for
    // copies no Job names. A prepared package is in its image (or image
    // volume), pinned by digest: nothing is staged, and the image must say
    // it holds this package.
    let _staging = ctx.staged.gate().await;
    let stage = async {
        match &admission.delivery {
            PackageDelivery::Fetched => staged::ensure(ctx, ns, &admission.digest, &admission.source).await?,
            PackageDelivery::InImage { .. } => check_prepared(ctx, &admission.image, &admission.digest).await?,
            PackageDelivery::ImageVolume { reference, .. } => check_prepared(ctx, reference, &admission.digest).await?,
        }
        Ok::<(), Error>(())
    };
    match tokio::try_join!(children::ensure_namespace(ctx, ns), stage) {
        Ok(_) => {}
        Err(Error::Prepare(why)) if !why.is_transient() => {
            set_phase(&mut status, SkillJobPhase::Failed, "WrongImage", format!("the prepared image is refused: {why}"), generation);
            patch_status(ctx, sj, &status).await?;
            publish(ctx, sj, EventType::Warning, "WrongImage", &why.to_string()).await;
            return Ok(Action::await_change());
        }
        // A registry that is down may come back: the error policy tries again.
        Err(e) => return Err(e),
    }
    let params = children::job_params(ctx, sj, ns, uid, admission);
    if let Err(err) = params.validate() {
        set_phase(&mut status, SkillJobPhase::Failed, "InvalidJob", format!("the Job cannot be built: {err}"), generation);
        patch_status(ctx, sj, &status).await?;
        return Ok(Action::await_change());
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    match jobs.create(&PostParams::default(), &build_job(&params)).await {
        // No Event: the status says it, and an Event per run was an API
        // write per run that nobody acts on.
        Ok(_) => {
            ctx.metrics.jobs_created.inc();
        }
        // It exists, and the API server's copy of the SkillJob (read above)
        // does not name it: an earlier controller made it and stopped before
        // recording it. Record it now (the write is guarded by the version
        // that copy had).
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    status.job_name = Some(name.clone());
    let (enforced, reason, message) = ctx.network_policy_condition();
    crate::api::conditions::set_condition_status(&mut status.conditions, "NetworkPolicyEnforced", enforced, reason, message, generation);
    set_phase(&mut status, SkillJobPhase::Pending, "JobCreated", format!("Job {name} created"), generation);
    patch_status(ctx, sj, &status).await?;
    Ok(Action::requeue(POLL))
}

/// The run has its warm pod: recorded, and handed over. Should the
/// hand-over fail, the next look at the run hands it over again (a claim is
/// written once: the same claim again is a no-op at the endpoint).
///
/// A run granted egress has its pod's address sealed into its status
/// first, and only once that is written is the claim (with the proxy URL)
/// handed over: the proxy serves the run from the status, so the script
/// never starts before its grant exists. Any other run's status write and
/// hand-over go together.
#[allow(clippy::too_many_arguments)]
async fn claimed(
    sj: &SkillJob,
    ctx: &Context,
    ns: &str,
    uid: &str,
    admission: &Admission,
    taken: crate::controller::warm::claim::Claimed,
    proxy: Option<String>,
    mut status: SkillJobStatus,
) -> Result<Action> {
    let generation = sj.metadata.generation;
    let pod = &taken.pod;
    let name = pod.name_any();
    let egress = proxy.is_some();
    let claim = crate::controller::warm::claim::claim_of(sj, uid, admission, proxy, taken.env);
    status.warm_pod = Some(name.clone());
    let (enforced, reason, message) = ctx.network_policy_condition();
    crate::api::conditions::set_condition_status(&mut status.conditions, "NetworkPolicyEnforced", enforced, reason, message, generation);
    set_phase(&mut status, SkillJobPhase::Running, "WarmPodClaimed", format!("warm pod {name} claimed"), generation);
    if egress {
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
        if let (Some(record), Some(ip)) = (status.egress.as_mut(), ip) {
            record.seal =
                Some(crate::egress::cluster::seal(&ctx.config.token_key, &crate::egress::JobId::new(ns, uid), &ip, &record.allowed));
            record.pod_ip = Some(ip);
        }
        patch_status(ctx, sj, &status).await?;
        super::deliver_claim(ctx, ns, &name, &claim).await?;
        return Ok(Action::requeue(POLL));
    }
    let (handed, written) = tokio::join!(super::deliver_claim(ctx, ns, &name, &claim), patch_status(ctx, sj, &status));
    written?;
    handed?;
    Ok(Action::requeue(POLL))
}

/// A Job is created only from a copy of the SkillJob that says none was
/// made. The cached copy can be behind the API server (after a restart or
/// a lost watch) and predate the status that recorded the run's Job, or
/// its verdict: the Job is deleted once the verdict is recorded, so
/// creating it from that copy would succeed and run the script a second
/// time. The cached copy is used when the [`super::start_guard`] vouches
/// for it; else the API server's own copy decides: `None` when it has
/// started, else that copy (newer than the cached one when, say, the
/// gateway annotated it meanwhile).
async fn unstarted_copy(sj: &SkillJob, ctx: &Context, ns: &str) -> Result<Option<SkillJob>> {
    if let (Some(uid), Some(version)) = (sj.uid(), sj.resource_version()) {
        let (selector, term) = (ctx.config.selector.as_deref(), ctx.leadership.term());
        if ctx.start_guard.vouches(&ctx.client, selector, term, &uid, &version).await? {
            return Ok(Some(sj.clone()));
        }
    }
    let fresh = Api::<SkillJob>::namespaced(ctx.client.clone(), ns).get(&sj.name_any()).await?;
    // Another SkillJob of the same name (this one deleted meanwhile) is not this run.
    let same = fresh.uid() == sj.uid();
    Ok((same && !super::run_started(&fresh)).then_some(fresh))
}

/// The prepared image's manifest must name the pinned package (one registry
/// GET per image per controller process; the kubelet checks every layer's
/// digest when it pulls by digest).
async fn check_prepared(ctx: &Context, image: &str, digest: &str) -> Result<()> {
    ctx.images.check_package(image, digest).await.map_err(|e| Error::Prepare(Box::new(e)))
}
