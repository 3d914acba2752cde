//! Step 2: stage the pinned package, make the children and create the Job.

use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{children, patch_status, publish, set_phase, POLL};
use crate::api::job::{SkillJob, SkillJobPhase, SkillJobStatus};
use crate::controller::builders::job::{build_job, job_name};
use crate::controller::context::{Context, Error, Result};
use crate::controller::decide::Admission;
use k8s_openapi::api::batch::v1::Job;

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
    // The package the pod fetches: exactly the pinned digest, staged for
    // this job, while the children are made (independent round trips).
    let stage = async {
        let fetched = ctx.resolver.fetch(&admission.source).await?;
        ctx.artifacts.stage_package(ns, uid, fetched.archive).await?;
        Ok::<(), Error>(())
    };
    tokio::try_join!(children::ensure(ctx, sj, ns, uid), stage)?;
    let params = children::job_params(ctx, sj, ns, uid, admission);
    if let Err(err) = params.validate() {
        set_phase(&mut status, SkillJobPhase::Failed, "InvalidJob", format!("the Job cannot be built: {err}"), generation);
        patch_status(ctx, sj, &status).await?;
        return Ok(Action::await_change());
    }
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    match jobs.create(&PostParams::default(), &build_job(&params)).await {
        Ok(_) => {
            ctx.metrics.jobs_created.inc();
            publish(ctx, sj, EventType::Normal, "JobCreated", &format!("created Job {name}")).await;
        }
        // A concurrent reconcile (or a restarted controller) made it first.
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    status.job_name = Some(name.clone());
    set_phase(&mut status, SkillJobPhase::Pending, "JobCreated", format!("Job {name} created"), generation);
    patch_status(ctx, sj, &status).await?;
    Ok(Action::requeue(POLL))
}
