//! Step 3: report the Job's progress; once it has ended, read the result
//! back, record the verdict and delete the run's children.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{admit, age_secs, children, patch_status, patch_status_timed, publish, set_phase, POLL, STOPPING_POLL};
use crate::api::job::{OutputFile, SkillJob, SkillJobPhase, SkillJobStatus, StreamRef};
use crate::api::outcome::LaunchResult;
use crate::controller::builders::job::{job_name, CONTAINER_FETCH, CONTAINER_RUN, CONTAINER_UPLOAD};
use crate::controller::context::{Context, Result};
use crate::controller::decide::{is_final, job_phase, run_verdict, ContainerEnd, RunFacts};

/// How long a pod may outlive its Job's deadline before the run is Locked.
const STOP_CONFIRM_SECS: i64 = 120;
/// How soon a run whose script has ended is looked at again for its outputs.
const UPLOAD_POLL: std::time::Duration = std::time::Duration::from_millis(250);

pub(super) async fn observe(sj: &SkillJob, ctx: &Context, ns: &str, uid: &str, job: Job, mut status: SkillJobStatus) -> Result<Action> {
    let generation = sj.metadata.generation;
    let name = job_name(uid);
    if sj.status.as_ref().is_none_or(|s| s.job_name.is_none()) {
        // The Job's watch event can overtake our own status write: this
        // SkillJob copy predates it. Writing from it would erase what that
        // write said, so wait for the copy to catch up, unless the Job is
        // old enough that no write of ours is in flight (a controller that
        // stopped between creating the Job and recording it).
        let age = age_secs(job.metadata.creation_timestamp.as_ref()).unwrap_or(i64::MAX);
        if age < 10 {
            return Ok(Action::requeue(std::time::Duration::from_secs(2)));
        }
        if status.skill.is_none() {
            status.skill = ctx.lookups.binding(&ctx.client, ns, &sj.spec.binding).await?.and_then(|b| b.status).and_then(|s| s.skill_name);
        }
        admit::check_namespace(ctx, ns, &mut status, generation).await?;
    }
    status.job_name = Some(name.clone());
    // Cached: a write only when the namespace's policies are missing or stale.
    children::ensure_run_policies(ctx, ns).await?;
    if status.started_at.is_none() {
        status.started_at = job.status.as_ref().and_then(|s| s.start_time.clone());
    }
    let phase = job_phase(&job);
    if !is_final(phase) {
        if let Some(pod) = ended_run_pod(ctx, ns, &job) {
            if let Some(action) = ended_early(sj, ctx, ns, uid, Some(&pod), status.clone()).await? {
                return Ok(action);
            }
        } else if ctx.stored.take(ns, uid) {
            // The endpoint announced the stored result before the kubelet
            // reported the run container's end.
            let pod = one_pod(ctx, ns, &job);
            if let Some(action) = ended_early(sj, ctx, ns, uid, pod.as_ref(), status.clone()).await? {
                return Ok(action);
            }
        }
    }
    match phase {
        // A Pending SkillJob whose Job exists keeps its message ("Job … created"):
        // rewriting it to say the same thing in other words cost a status write per run.
        SkillJobPhase::Pending
            if status.phase == Some(SkillJobPhase::Pending) && sj.status.as_ref().is_some_and(|s| s.job_name.is_some()) =>
        {
            record_pod_address(ctx, ns, uid, &mut status).await?;
            patch_status(ctx, sj, &status).await?;
            Ok(Action::requeue(POLL))
        }
        SkillJobPhase::Pending | SkillJobPhase::Running => {
            record_pod_address(ctx, ns, uid, &mut status).await?;
            let running = phase == SkillJobPhase::Running;
            let (reason, doing) = if running { ("Running", "running") } else { ("Pending", "starting") };
            set_phase(&mut status, phase, reason, format!("Job {name} is {doing}"), generation);
            patch_status(ctx, sj, &status).await?;
            Ok(Action::requeue(POLL))
        }
        _ => finished(sj, ctx, ns, uid, &job, status).await,
    }
}

/// The Job has ended: the verdict, once no pod runs any more.
async fn finished(sj: &SkillJob, ctx: &Context, ns: &str, uid: &str, job: &Job, mut status: SkillJobStatus) -> Result<Action> {
    let generation = sj.metadata.generation;
    let pods = children::pods(ctx, ns, uid).await?;
    if children::alive(&pods) {
        // The Job failed (its deadline) while the pod still stops: the files
        // are trusted only once it has stopped.
        let since = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Failed"))
            .and_then(|c| c.last_transition_time.as_ref());
        if age_secs(since).is_some_and(|age| age > STOP_CONFIRM_SECS) {
            set_phase(
                &mut status,
                SkillJobPhase::Locked,
                "StopNotConfirmed",
                format!(
                    "the run ended but its pod did not stop within {STOP_CONFIRM_SECS} s; its files are withheld until an operator checks the node"
                ),
                generation,
            );
            patch_status(ctx, sj, &status).await?;
            publish(ctx, sj, EventType::Warning, "StopNotConfirmed", "pod still alive 120 s after the Job ended").await;
            return Ok(Action::requeue(std::time::Duration::from_secs(60)));
        }
        return Ok(Action::requeue(STOPPING_POLL));
    }
    let mut facts = pod_facts(pods.first());
    facts.job_failed = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Failed" && c.status == "True"))
        .map(|c| c.reason.clone().unwrap_or_default());
    record_outputs(ctx, sj, ns, uid, &mut status, &mut facts).await?;
    let finished_at = job.status.as_ref().and_then(|s| s.completion_time.clone());
    record_verdict(sj, ctx, ns, uid, status, &facts, finished_at).await
}

/// A run on a claimed warm pod: handed over (again, after a restart), then
/// decided as a Job's run is once it has ended: its stored result announced
/// or its run container's end reported; a pod gone or ended without
/// outputs is the run's failure.
pub(super) async fn observe_warm(
    sj: &SkillJob,
    ctx: &Context,
    ns: &str,
    uid: &str,
    pod_name: &str,
    mut status: SkillJobStatus,
) -> Result<Action> {
    let generation = sj.metadata.generation;
    let pod = match ctx.lookups.cached_pod(ns, pod_name) {
        Some(pod) => Some(pod),
        None => kube::Api::<Pod>::namespaced(ctx.client.clone(), ns).get_opt(pod_name).await?,
    };
    let Some(pod) = pod else {
        // Gone: its outputs may still be stored (the upload came first).
        let mut facts = RunFacts::default();
        record_outputs(ctx, sj, ns, uid, &mut status, &mut facts).await?;
        if !facts.outputs_stored {
            set_phase(
                &mut status,
                SkillJobPhase::Failed,
                "WarmPodLost",
                format!("the warm pod {pod_name} went away before the run's outputs were stored"),
                generation,
            );
            patch_status(ctx, sj, &status).await?;
            return Ok(Action::await_change());
        }
        if facts.launch.is_none() {
            facts.job_failed = Some("WarmPodLost".into());
        }
        return record_verdict(sj, ctx, ns, uid, status, &facts, None).await;
    };
    if !ctx.warm.handed(ns, uid) {
        if let Some(admission) = rehand(sj, ctx, ns, uid).await? {
            use crate::controller::warm::claim::{claim_of, env_again};
            let proxy = children::proxy_url(ctx, ns, uid, &admission.egress_allowed);
            // Sealed anew (another key of the sealer's): should the last
            // controller have handed it over, the endpoint keeps that one (409).
            let env = env_again(ctx, ns, pod_name, uid, &admission).await?;
            super::deliver_claim(ctx, ns, pod_name, &claim_of(sj, uid, &admission, proxy, env)).await?;
        }
    }
    if status.started_at.is_none() {
        status.started_at = pod.status.as_ref().and_then(|s| s.start_time.clone());
    }
    // Sealed at the claim; a claim whose status write failed is sealed here.
    record_pod_address(ctx, ns, uid, &mut status).await?;
    // Every look reads the stored outputs, announced or not: a warm pod
    // whose sidecar refused its claim stored a result while its launcher
    // still waits, so no container end would ever say the run is over.
    ctx.stored.take(ns, uid);
    if let Some(action) = ended_early(sj, ctx, ns, uid, Some(&pod), status.clone()).await? {
        return Ok(action);
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded") | Some("Failed")) {
        let mut facts = pod_facts(Some(&pod));
        facts.job_failed = pod.status.as_ref().and_then(|s| s.reason.clone()).or(Some("WarmPodFailed".into()));
        record_outputs(ctx, sj, ns, uid, &mut status, &mut facts).await?;
        return record_verdict(sj, ctx, ns, uid, status, &facts, None).await;
    }
    patch_status(ctx, sj, &status).await?;
    Ok(Action::requeue(POLL))
}

/// The run's admission again, to hand its claim over once more (a new
/// controller does not know whether the last one did). `None`: it no
/// longer passes (its binding went): the pod is left to its deadline.
async fn rehand(sj: &SkillJob, ctx: &Context, ns: &str, uid: &str) -> Result<Option<crate::controller::decide::Admission>> {
    let binding = ctx.lookups.binding(&ctx.client, ns, &sj.spec.binding).await?;
    let package = match &binding {
        Some(b) => ctx.lookups.package(&ctx.client, &b.spec.package).await?,
        None => None,
    };
    let admitted = crate::controller::decide::admit(&sj.spec, binding.as_ref(), package.as_ref());
    if admitted.is_err() {
        tracing::warn!(ns, uid, "a claimed run no longer passes admission; its claim is not handed over again");
    }
    Ok(admitted.ok())
}

/// The Job's one pod, from the pod cache. Two pods for one run (a retry
/// nobody asked for): none, and the Job's own end decides.
fn one_pod(ctx: &Context, ns: &str, job: &Job) -> Option<Pod> {
    let job_uid = job.metadata.uid.as_deref()?;
    let pods = ctx.lookups.cached_pods_of_job(ns, job_uid)?;
    let [pod] = pods.as_slice() else { return None };
    Some(pod.clone())
}

/// The Job's one pod, once its run container has ended (its container
/// state is terminal: the pod restarts nothing).
fn ended_run_pod(ctx: &Context, ns: &str, job: &Job) -> Option<Pod> {
    one_pod(ctx, ns, job).filter(|pod| run_terminated(pod).is_some())
}

/// The run has ended (its container's end reported, or its result stored
/// and announced) and the upload sidecar has stored the outputs: the
/// verdict is recorded now instead of after the kubelet has stopped the
/// sidecar, reported the pod done and the Job controller the Job complete
/// (about 2 s on a real node). Safe because nothing of the script outlives
/// the result: the launcher, its container's PID 1, kills whatever is left
/// in the PID namespace before writing it; the outputs are stored as one
/// set by the sidecar, the only holder of the job's credential besides
/// fetch; and a result that says the run was cancelled is never uploaded.
/// A script that writes a result of its own ends its run early with an
/// outcome it could have had by exiting: deleting the Job stops it.
/// `None` while the outputs are not stored yet, or stored without the
/// launcher's result: the Job's own end (or the upload a moment later) decides.
async fn ended_early(
    sj: &SkillJob,
    ctx: &Context,
    ns: &str,
    uid: &str,
    pod: Option<&Pod>,
    mut status: SkillJobStatus,
) -> Result<Option<Action>> {
    let mut facts = pod_facts(pod);
    record_outputs(ctx, sj, ns, uid, &mut status, &mut facts).await?;
    let ended = pod.and_then(run_terminated);
    if !facts.outputs_stored {
        // The sidecar uploads within a moment of the run's end; its pod
        // event may not come (it stays up until stopped), so look again soon.
        return Ok(ended.is_some().then(|| Action::requeue(UPLOAD_POLL)));
    }
    if ended.is_none() && facts.launch.is_none() {
        return Ok(None);
    }
    let finished_at = ended.and_then(|t| t.finished_at.clone());
    record_verdict(sj, ctx, ns, uid, status, &facts, finished_at).await.map(Some)
}

/// The run container's terminated state, once the kubelet reports one.
fn run_terminated(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStateTerminated> {
    pod.status.as_ref()?.container_statuses.iter().flatten().find(|c| c.name == CONTAINER_RUN)?.state.as_ref()?.terminated.as_ref()
}

/// The verdict from what the run left, recorded; then the run's children go.
async fn record_verdict(
    sj: &SkillJob,
    ctx: &Context,
    ns: &str,
    uid: &str,
    mut status: SkillJobStatus,
    facts: &RunFacts,
    finished_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) -> Result<Action> {
    let generation = sj.metadata.generation;
    let verdict = run_verdict(facts);
    status.exit_code = verdict.exit_code;
    status.signal = verdict.signal;
    status.finished_at = finished_at.or_else(|| Some(crate::api::conditions::now()));
    let mut message = verdict.message;
    if matches!(verdict.phase, SkillJobPhase::Failed | SkillJobPhase::TimedOut) {
        let (allowed, proposed) = status.egress.as_ref().map(|e| (e.allowed.as_slice(), e.proposed.as_slice())).unwrap_or_default();
        if let Some(note) = crate::controller::egress::failure_note(allowed, proposed) {
            message = format!("{message}; {note}");
        }
    }
    set_phase(&mut status, verdict.phase, verdict.reason, message, generation);
    patch_status_timed(ctx, sj, &status, facts.launch.as_ref().and_then(|l| l.times.as_ref())).await?;
    ctx.stored.take(ns, uid);
    // The result is recorded: the Job and its pod have done their work (and
    // count against quotas).
    match status.warm_pod.as_deref() {
        Some(pod) => {
            children::delete_warm_pod(ctx, ns, pod).await?;
            // The pod's claim: nothing else was ever stored under its uid.
            if let Some(warm) = crate::controller::builders::warm::warm_uid_of(pod) {
                if let Err(err) = ctx.artifacts.delete(ns, &warm).await {
                    tracing::debug!(%err, ns, pod, "the warm pod's claim was not deleted; the endpoint's sweep of finished jobs will");
                }
            }
            ctx.warm.set_handed(ns, uid, false);
        }
        None => children::delete_job(ctx, ns, uid).await?,
    }
    Ok(Action::await_change())
}

/// A run with egress: once its one pod has an address, record it with the
/// controller's seal, so the proxy accepts the job's credential from that
/// address alone. Two live pods carrying the run's labels (someone made a
/// look-alike) record nothing: the proxy then serves neither.
async fn record_pod_address(ctx: &Context, ns: &str, uid: &str, status: &mut SkillJobStatus) -> Result<()> {
    let Some(egress) = status.egress.as_mut().filter(|e| !e.allowed.is_empty() && e.pod_ip.is_none()) else { return Ok(()) };
    let pods = children::pods(ctx, ns, uid).await?;
    let live: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed")))
        .collect();
    if live.len() > 1 {
        tracing::warn!(
            namespace = ns,
            uid,
            pods = live.len(),
            "more than one live pod carries this run's labels; no address recorded for the egress proxy"
        );
        return Ok(());
    }
    let Some(ip) = live.first().and_then(|p| p.status.as_ref()?.pod_ip.clone()) else { return Ok(()) };
    let job = crate::egress::JobId::new(ns, uid);
    egress.seal = Some(crate::egress::cluster::seal(&ctx.config.token_key, &job, &ip, &egress.allowed));
    egress.pod_ip = Some(ip);
    Ok(())
}

/// A run stopped on request (the cancel annotation), its pod gone.
pub(super) async fn cancelled(sj: &SkillJob, ctx: &Context, mut status: SkillJobStatus) -> Result<Action> {
    status.finished_at = Some(crate::api::conditions::now());
    set_phase(&mut status, SkillJobPhase::Cancelled, "Cancelled", "the run was cancelled and its pod stopped", sj.metadata.generation);
    // Its Job was deleted to stop it (`stop_run`): nothing of the run is left.
    patch_status(ctx, sj, &status).await?;
    Ok(Action::await_change())
}

/// We created the Job and it is gone while the run was not finished.
pub(super) async fn job_deleted(sj: &SkillJob, ctx: &Context, mut status: SkillJobStatus) -> Result<Action> {
    set_phase(
        &mut status,
        SkillJobPhase::Failed,
        "JobDeleted",
        "the Job was deleted before the run finished; it was not re-run (create a new SkillJob)",
        sj.metadata.generation,
    );
    patch_status(ctx, sj, &status).await?;
    publish(ctx, sj, EventType::Warning, "JobDeleted", "the Job disappeared before the run finished").await;
    Ok(Action::await_change())
}

/// How each container of the run's pod ended.
fn pod_facts(pod: Option<&Pod>) -> RunFacts {
    let Some(status) = pod.and_then(|p| p.status.as_ref()) else { return RunFacts::default() };
    let end = |name: &str| {
        status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten())
            .find(|c| c.name == name)
            .and_then(|c| {
                c.state.as_ref().and_then(|s| s.terminated.as_ref()).or(c.last_state.as_ref().and_then(|s| s.terminated.as_ref()))
            })
            .map(|t| ContainerEnd { exit_code: t.exit_code, signal: t.signal, reason: t.reason.clone(), message: t.message.clone() })
    };
    RunFacts { fetch: end(CONTAINER_FETCH), run: end(CONTAINER_RUN), upload: end(CONTAINER_UPLOAD), ..RunFacts::default() }
}

/// Fill stdout/stderr references and output files from what the upload
/// sidecar stored, and the launcher's result into `facts`. A missing or
/// refused manifest leaves them empty (the verdict says so). An endpoint
/// that is down is an error: what it stored cannot be known, so no verdict
/// may be given yet. An input the script left unchanged is not an output.
async fn record_outputs(
    ctx: &Context,
    sj: &SkillJob,
    ns: &str,
    uid: &str,
    status: &mut SkillJobStatus,
    facts: &mut RunFacts,
) -> Result<()> {
    let manifest = match ctx.artifacts.outputs(ns, uid).await {
        Ok(Some(manifest)) => manifest,
        Ok(None) => return Ok(()),
        Err(err) if err.is_outage() => return Err(err.into()),
        Err(err) => {
            tracing::warn!(%err, ns, uid, "could not read the run's outputs");
            return Ok(());
        }
    };
    facts.outputs_stored = true;
    let result = |name: &str| manifest.files.iter().find(|f| f.path == format!("result/{name}"));
    // The launcher's result.json has what the script wrote (bytes, truncation, exit).
    if result("result.json").is_some() {
        match ctx.artifacts.output_file(ns, uid, "result/result.json").await {
            Ok(bytes) => facts.launch = serde_json::from_slice::<LaunchResult>(&bytes).ok(),
            Err(err) if err.is_outage() => return Err(err.into()),
            Err(err) => tracing::warn!(%err, ns, uid, "could not read the run's result.json"),
        }
    }
    let outcome = facts.launch.as_ref().map(|l| &l.outcome);
    if let Some(f) = result("stdout") {
        let (size, truncated) = outcome.map_or((f.size, false), |o| (o.stdout_bytes, o.stdout_truncated));
        status.stdout = Some(StreamRef { digest: f.digest.clone(), size, truncated });
    }
    if let Some(f) = result("stderr") {
        let (size, truncated) = outcome.map_or((f.size, false), |o| (o.stderr_bytes, o.stderr_truncated));
        status.stderr = Some(StreamRef { digest: f.digest.clone(), size, truncated });
    }
    status.outputs = manifest
        .files
        .iter()
        .filter_map(|f| f.path.strip_prefix("work/").map(|p| (p, f)))
        .filter(|(p, f)| !sj.spec.inputs.iter().any(|i| i.path == *p && i.digest == f.digest && i.size == f.size))
        .map(|(p, f)| OutputFile { path: p.to_string(), size: f.size, digest: f.digest.clone() })
        .collect();
    Ok(())
}
