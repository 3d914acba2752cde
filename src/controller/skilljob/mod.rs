//! SkillJob reconciler, in three steps a reader finds by name:
//!
//! - [`admit`]: the fence (the same [`crate::core::fence::decide`] a local
//!   run goes through), the staged inputs and the namespace's Pod Security;
//! - [`start`]: the package staged, the namespace's children made once
//!   (ServiceAccount with no RBAC, the two run NetworkPolicies) and exactly
//!   one Job created, its pod's credential a projected token (no Secret);
//! - [`observe`]: the Job's progress reported, and once the run has ended
//!   (its stored result announced by the endpoint, see [`stored`], or its
//!   run container's end reported, or the Job's end), the result read back
//!   (the launcher's `result.json`, the pod's container states), the
//!   verdict recorded ([`super::decide::run_verdict`]) and the run's Job
//!   (with its pod) deleted: the SkillJob keeps the result and the outputs.
//!
//! A Job is never updated in place and never created twice: its name
//! derives from the SkillJob's UID, so a restarted controller finds the one
//! it made. Deleting a SkillJob (or setting [`CANCEL_ANNOTATION`]) stops the
//! run: the Job goes, the kubelet's SIGTERM makes the launcher kill the
//! script's process group at once, and only once no pod is left are the
//! job's artifacts deleted and the finalizer removed. Waiting for that is a
//! requeue, not a failure.

mod admit;
mod children;
pub mod hints;
mod observe;
mod start;
pub mod start_guard;
mod stored;

pub use children::{ensure_namespace, repair_run_policies};
pub use stored::follow as follow_stored;

use crate::api::outcome::PodTimes;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument as _;

use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::{Resource, ResourceExt};

use super::builders::job::job_name;
use super::context::{apply_status_at, Context, Error, Result};
use super::decide::is_final;
use crate::api::conditions::set_condition;
use crate::api::job::{SkillJob, SkillJobPhase, SkillJobStatus};

/// Stops the pod and cleans artifacts before a SkillJob goes.
pub const FINALIZER: &str = "skill-operator.dev/skilljob-cleanup";
pub use crate::artifacts::RUN_SERVICE_ACCOUNT;
/// Set (to any value) to cancel a run without deleting its SkillJob: its
/// pod is stopped and the phase becomes Cancelled (MCP `tasks/cancel`).
pub const CANCEL_ANNOTATION: &str = "skill-operator.dev/cancel";
/// Set by whoever stages a SkillJob's inputs (the gateway), so the
/// controller hears of it at once instead of at its next poll.
pub const INPUTS_STAGED_ANNOTATION: &str = "skill-operator.dev/inputs-staged";
pub use crate::api::job::{OWNER_SEAL_ANNOTATION, REQUESTED_BY_ANNOTATION};

/// How often a Pending or Running SkillJob is looked at without an event.
const POLL: Duration = Duration::from_secs(10);
/// How long a SkillJob waits for its inputs between wake-ups (the
/// [`INPUTS_STAGED_ANNOTATION`] wakes it earlier).
const INPUTS_POLL: Duration = Duration::from_secs(30);
/// How often a stopping pod is checked.
const STOPPING_POLL: Duration = Duration::from_secs(2);
/// How often a run waiting for the registry or the artifact endpoint tries again.
const COMPONENT_RETRY: Duration = Duration::from_secs(5);

pub async fn reconcile(job: Arc<SkillJob>, ctx: Arc<Context>) -> Result<Action> {
    // A standby replica keeps its caches warm and writes nothing.
    if let Some(later) = ctx.leadership.wait_turn().await {
        return Ok(later);
    }
    let span = tracing::info_span!(
        target: "skill_operator::controller",
        "reconcile SkillJob",
        namespace = job.namespace().unwrap_or_default(),
        name = %job.name_any(),
    );
    // A run's reconciles belong to the trace of the request that created it, until it ends.
    let running = !job.status.as_ref().and_then(|s| s.phase).is_some_and(is_final);
    if let (true, Some(traceparent)) = (running, job.annotations().get(crate::telemetry::TRACEPARENT_ANNOTATION)) {
        crate::telemetry::set_parent(&span, traceparent);
    }
    reconcile_traced(job, ctx).instrument(span).await
}

async fn reconcile_traced(job: Arc<SkillJob>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let ns = job.namespace().ok_or(Error::Missing("namespace"))?;
    // Deletion waits for the pod to stop, as a requeue: only then does the
    // finalizer's cleanup run (and its Ok removes the finalizer).
    if job.meta().deletion_timestamp.is_some() && job.finalizers().iter().any(|f| f == FINALIZER) {
        if let Some(action) = stop_run(&job, &ctx, "cancelled: the SkillJob was deleted").await? {
            ctx.metrics.reconciled("SkillJob", started.elapsed());
            return Ok(action);
        }
        if let Some(wait) = name_held_for(&job, &ctx) {
            // Nothing runs and its files go now; only the name stays taken.
            release_artifacts(&job, &ctx).await?;
            ctx.metrics.reconciled("SkillJob", started.elapsed());
            return Ok(Action::requeue(wait));
        }
    }
    if let (Some(uid), Some(version)) = (job.uid(), job.resource_version()) {
        ctx.start_guard.seen(ctx.leadership.term(), &uid, &version, run_started(&job));
    }
    let api: Api<SkillJob> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, job, |event| async {
        match event {
            Finalizer::Apply(j) => apply(&j, &ctx).await,
            Finalizer::Cleanup(j) => cleanup(&j, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics.reconciled("SkillJob", started.elapsed());
    result
}

async fn apply(sj: &SkillJob, ctx: &Context) -> Result<Action> {
    let ns = sj.namespace().ok_or(Error::Missing("namespace"))?;
    let uid = sj.uid().ok_or(Error::Missing("uid"))?;
    let mut status = sj.status.clone().unwrap_or_default();
    status.observed_generation = sj.metadata.generation;
    // A cancel whose pod is still stopping reads Cancelled but is not
    // Complete yet: it must come back here until the pod is gone.
    let stopping = status.conditions.iter().any(|c| c.type_ == "Complete" && c.status == "False" && c.reason == "Cancelling");
    if status.phase.is_some_and(is_final) && !stopping {
        // The result is recorded; what is left of the run goes (again, if a
        // delete after the recording failed or raced a watch event).
        children::delete_leftovers(ctx, &ns, &uid, status.warm_pod.as_deref()).await?;
        return Ok(Action::await_change());
    }
    if sj.annotations().contains_key(CANCEL_ANNOTATION) {
        return match stop_run(sj, ctx, "cancelled on request").await? {
            Some(action) => Ok(action),
            None => observe::cancelled(sj, ctx, status).await,
        };
    }
    if let Some(pod) = status.warm_pod.clone() {
        let step = observe::observe_warm(sj, ctx, &ns, &uid, &pod, status).await;
        return match step {
            Err(err) => match outage(&err) {
                Some((reason, message)) => wait_for_component(sj, ctx, reason, message).await,
                None => Err(err),
            },
            done => done,
        };
    }
    let name = job_name(&uid);
    // Before this controller recorded a Job, a cache miss is enough to try
    // creating it (a Job that exists after all answers 409). After, only
    // the API server may say it is gone.
    let existing =
        if status.job_name.is_none() { ctx.lookups.cached_job(&ns, &name) } else { ctx.lookups.job(&ctx.client, &ns, &name).await? };
    let step = match existing {
        Some(job) => observe::observe(sj, ctx, &ns, &uid, job, status).await,
        None if status.job_name.is_some() => observe::job_deleted(sj, ctx, status).await,
        None => match admit::admit(sj, ctx, &ns, &uid, &mut status).await {
            Ok(admit::Admitted::Start(admission)) => start::start(sj, ctx, &ns, &uid, &admission, status).await,
            Ok(admit::Admitted::Wait(action)) => Ok(action),
            Err(err) => Err(err),
        },
    };
    match step {
        Err(err) => match outage(&err) {
            Some((reason, message)) => wait_for_component(sj, ctx, reason, message).await,
            None => Err(err),
        },
        done => done,
    }
}

/// A component the run needs is down (unreachable, or failing with a
/// 5xx): the registry that holds its package or prepared image, or the
/// artifact endpoint that stages its files and keeps its outputs.
fn outage(err: &Error) -> Option<(&'static str, String)> {
    match err {
        Error::Resolve(e) if e.is_transient() => {
            Some(("RegistryUnavailable", format!("the registry holding the package cannot be reached: {e}")))
        }
        Error::Prepare(e) if e.is_transient() => {
            Some(("RegistryUnavailable", format!("the registry holding the prepared image cannot be reached: {e}")))
        }
        Error::Artifacts(e) if e.is_outage() => {
            Some(("ArtifactEndpointUnavailable", format!("the artifact endpoint cannot be reached: {e}")))
        }
        _ => None,
    }
}

/// The run waits for the component, and says so: its phase stays (a
/// Running run is not taken back to Pending), its message names what is
/// down, and no verdict is given until the component answers again, so a
/// run whose outputs cannot be read yet is never recorded without them.
async fn wait_for_component(sj: &SkillJob, ctx: &Context, reason: &str, message: String) -> Result<Action> {
    tracing::warn!(namespace = sj.namespace().unwrap_or_default(), skilljob = %sj.name_any(), %message, "the run waits for a component");
    let mut status = sj.status.clone().unwrap_or_default();
    status.observed_generation = sj.metadata.generation;
    let phase = status.phase.unwrap_or(SkillJobPhase::Pending);
    let message = format!("{message}; the run waits and is tried again every {} s", COMPONENT_RETRY.as_secs());
    set_phase(&mut status, phase, reason, message, sj.metadata.generation);
    patch_status(ctx, sj, &status).await?;
    Ok(Action::requeue(COMPONENT_RETRY))
}

/// Stop the run's pod (delete its Job). `Some(action)` while a pod is still
/// stopping (the status says Cancelled: "waiting for the pod to stop");
/// `None` once nothing runs.
async fn stop_run(sj: &SkillJob, ctx: &Context, why: &str) -> Result<Option<Action>> {
    let ns = sj.namespace().ok_or(Error::Missing("namespace"))?;
    let uid = sj.uid().ok_or(Error::Missing("uid"))?;
    children::delete_job(ctx, &ns, &uid).await?;
    if let Some(pod) = sj.status.as_ref().and_then(|s| s.warm_pod.as_deref()) {
        children::delete_warm_pod(ctx, &ns, pod).await?;
    }
    if !children::pods_alive(ctx, &ns, &uid).await? {
        return Ok(None);
    }
    let mut status = sj.status.clone().unwrap_or_default();
    if status.phase.is_none_or(|p| !is_final(p)) {
        set_phase(
            &mut status,
            SkillJobPhase::Cancelled,
            "Cancelling",
            format!("{why}; waiting for the pod to stop"),
            sj.metadata.generation,
        );
        // Not final yet: the stop is being confirmed.
        set_condition(&mut status.conditions, "Complete", false, "Cancelling", "waiting for the pod to stop", sj.metadata.generation);
        patch_status(ctx, sj, &status).await?;
    }
    tracing::info!(namespace = %ns, skilljob = %sj.name_any(), "waiting for the run's pod to stop");
    Ok(Some(Action::requeue(STOPPING_POLL)))
}

/// How much longer a deleted SkillJob's name stays taken: one the gateway
/// sealed was made under a confirmation token, and that token names this
/// SkillJob for as long as it is good ([`crate::core::confirm::TOKEN_TTL`]
/// from the sealing, at the latest). Were the name free before, the same
/// token would make the same SkillJob again and run its call twice. The
/// finalizer stays until then (the pod is gone and the files deleted at
/// once); a namespace being deleted takes no new SkillJob, so nothing is held there.
fn name_held_for(sj: &SkillJob, ctx: &Context) -> Option<Duration> {
    let (_, sealed_at) = sj.proven_owner(&crate::core::owner::OwnerSeal::new(&ctx.config.token_key)).ok()?;
    let free_at = sealed_at.saturating_add(crate::core::confirm::TOKEN_TTL.as_secs() as i64);
    let left = free_at.saturating_sub(Timestamp::now().as_second());
    if left <= 0 || ctx.lookups.namespace_terminating(&sj.namespace()?) {
        return None;
    }
    Some(Duration::from_secs(left as u64 + 1))
}

/// The deleted SkillJobs of a namespace being deleted, whose names
/// [`name_held_for`] keeps: what that namespace's deletion must wake. Fed
/// from the same watch that fills the lookups' namespace cache, after the
/// cache has the deletion, so the reconcile it wakes sees it.
pub fn held_in(
    namespace: &kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>,
    skilljobs: &kube::runtime::reflector::Store<SkillJob>,
) -> Vec<kube::runtime::reflector::ObjectRef<SkillJob>> {
    if namespace.metadata.deletion_timestamp.is_none() {
        return Vec::new();
    }
    let name = namespace.name_any();
    skilljobs
        .state()
        .iter()
        .filter(|sj| sj.metadata.deletion_timestamp.is_some() && sj.namespace().as_deref() == Some(name.as_str()))
        .map(|sj| kube::runtime::reflector::ObjectRef::from_obj(sj.as_ref()))
        .collect()
}

/// The job's inputs and outputs (and its warm pod's claim) deleted.
async fn release_artifacts(sj: &SkillJob, ctx: &Context) -> Result<()> {
    let ns = sj.namespace().ok_or(Error::Missing("namespace"))?;
    let uid = sj.uid().ok_or(Error::Missing("uid"))?;
    ctx.artifacts.delete(&ns, &uid).await?;
    if let Some(warm) = sj.status.as_ref().and_then(|s| s.warm_pod.as_deref()).and_then(crate::controller::builders::warm::warm_uid_of) {
        ctx.artifacts.delete(&ns, &warm).await?;
    }
    Ok(())
}

/// Deletion: once no pod runs, the job's inputs and outputs go with the SkillJob.
async fn cleanup(sj: &SkillJob, ctx: &Context) -> Result<Action> {
    let ns = sj.namespace().ok_or(Error::Missing("namespace"))?;
    let uid = sj.uid().ok_or(Error::Missing("uid"))?;
    if stop_run(sj, ctx, "cancelled: the SkillJob was deleted").await?.is_some() {
        // A pod came back between the check and now: the finalizer must stay.
        return Err(Error::InUse("the run's pod has not stopped yet".into()));
    }
    release_artifacts(sj, ctx).await?;
    if let Some(warm) = sj.status.as_ref().and_then(|s| s.warm_pod.as_deref()).and_then(crate::controller::builders::warm::warm_uid_of) {
        ctx.artifacts.delete(&ns, &warm).await?;
    }
    ctx.warm.set_handed(&ns, &uid, false);
    ctx.start_guard.forget(ctx.leadership.term(), &uid);
    Ok(Action::await_change())
}

/// Hands a claimed run to its warm pod through the artifact endpoint.
async fn deliver_claim(ctx: &Context, ns: &str, pod: &str, claim: &crate::artifacts::Claim) -> Result<()> {
    let warm = crate::controller::builders::warm::warm_uid_of(pod).ok_or(Error::Missing("a warm pod name"))?;
    match ctx.artifacts.claim(ns, &warm, claim).await {
        Ok(()) => {}
        // Handed over before (by a controller that read another admission
        // since): the pod runs that claim, which names this run.
        Err(err) if err.is_already_claimed() => {
            tracing::warn!(ns, pod, %err, "the warm pod holds an earlier claim; it runs that one");
        }
        Err(err) => return Err(err.into()),
    }
    ctx.warm.set_handed(ns, &claim.skilljob_uid, true);
    Ok(())
}

/// Writes the status unless it is what the object already says, and only
/// over the copy it was derived from ([`Error::Stale`] otherwise): most
/// reconciles (a watch event, a periodic requeue) change nothing, and an
/// unchanged apply still costs the API server a full server-side apply.
async fn patch_status(ctx: &Context, job: &SkillJob, status: &SkillJobStatus) -> Result<()> {
    patch_status_timed(ctx, job, status, None).await
}

/// [`patch_status`], with the times the pod reported for the run's trace.
async fn patch_status_timed(ctx: &Context, job: &SkillJob, status: &SkillJobStatus, pod: Option<&PodTimes>) -> Result<()> {
    if job.status.as_ref() == Some(status) {
        return Ok(());
    }
    let ns = job.namespace().ok_or(Error::Missing("namespace"))?;
    let version = job.resource_version().ok_or(Error::Missing("resourceVersion"))?;
    let uid = job.uid().ok_or(Error::Missing("uid"))?;
    let api: Api<SkillJob> = Api::namespaced(ctx.client.clone(), &ns);
    // Guarded by the version the status was derived from: a phase never goes back.
    // Until the cache shows this write, its copies of the run are not believed.
    let term = ctx.leadership.term();
    ctx.start_guard.writing(term, &uid);
    let written = apply_status_at(&api, &job.name_any(), &version, status).await?;
    ctx.start_guard.wrote(term, &uid, written);
    // Counted on the write that makes the phase final, so once per SkillJob
    // (a restarted controller reads the final phase back and writes nothing).
    let was_final = job.status.as_ref().and_then(|s| s.phase).is_some_and(is_final);
    if let Some(phase) = status.phase.filter(|p| is_final(*p) && !was_final) {
        let age = job.metadata.creation_timestamp.as_ref().map(crate::api::conditions::age);
        ctx.metrics.skilljob_finished(phase, age);
        if ctx.audit.enabled() {
            ctx.audit.record(verdict_record(job, &ns, status, phase, age, &crate::core::owner::OwnerSeal::new(&ctx.config.token_key)));
        }
        if let Some(traceparent) = job.annotations().get(crate::telemetry::TRACEPARENT_ANNOTATION) {
            crate::telemetry::record_run(traceparent, job, status, phase, pod);
        }
    }
    Ok(())
}

/// A SkillJob's `run.verdict` audit record, whoever started it (the
/// gateway's own record of a synchronous run says what its caller was told).
fn verdict_record(
    job: &SkillJob,
    ns: &str,
    status: &SkillJobStatus,
    phase: SkillJobPhase,
    age: Option<std::time::Duration>,
    seal: &crate::core::owner::OwnerSeal,
) -> crate::audit::Record {
    use crate::audit::{digest_json, Event, FileRef, Outcome, Record};
    // A run that never started ended at admission: a rule (the fence, the
    // binding, the package, its inputs) said no. One that started finished,
    // whatever its exit.
    let started = status.job_name.is_some() || status.warm_pod.is_some();
    let outcome = if started || phase != SkillJobPhase::Failed { Outcome::Ok } else { Outcome::Refused };
    let mut record = Record::new(Event::RunVerdict, outcome)
        .namespace(ns)
        .job(job.name_any())
        .script(&job.spec.script)
        .args_digest(digest_json(&job.spec.args))
        .state(format!("{phase:?}"))
        .exit_code(status.exit_code)
        .inputs(
            job.spec.inputs.iter().map(|i| FileRef { path: i.path.clone(), size: Some(i.size), sha256: Some(i.digest.clone()) }).collect(),
        );
    record.skilljob_uid = job.metadata.uid.clone();
    record.skill = status.skill.clone().or_else(|| Some(job.spec.binding.clone()));
    record.duration_ms = age.map(|a| a.as_millis() as u64);
    record.reason = status.message.clone();
    if outcome == Outcome::Refused {
        record.code = status.conditions.iter().find(|c| c.type_ == "Complete").map(|c| c.reason.clone());
    }
    // Named only when the gateway's seal proves it: anyone who may create
    // SkillJobs can write the annotation.
    match job.proven_owner(seal) {
        Ok((who, _)) => record = record.principal_name(who),
        Err(why) => {
            if let Some(claimed) = job.annotations().get(REQUESTED_BY_ANNOTATION) {
                tracing::warn!(namespace = ns, skilljob = %job.name_any(), %claimed, %why, "a SkillJob claims a requester it cannot prove; its verdict names none");
            }
        }
    }
    record
}

/// Whether the copy says the run started (a Job or a warm pod recorded, or
/// a verdict): it never goes back ([`start_guard`]).
fn run_started(sj: &SkillJob) -> bool {
    sj.status.as_ref().is_some_and(|s| s.job_name.is_some() || s.warm_pod.is_some() || s.phase.is_some_and(is_final))
}

fn set_phase(status: &mut SkillJobStatus, phase: SkillJobPhase, reason: &str, message: impl Into<String>, generation: Option<i64>) {
    let message = message.into();
    status.phase = Some(phase);
    status.message = Some(message.clone());
    set_condition(&mut status.conditions, "Complete", is_final(phase), reason, message, generation);
}

/// Seconds since `created`, by this machine's clock.
fn age_secs(created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<i64> {
    created.map(|t| Timestamp::now().duration_since(t.0).as_secs())
}

async fn publish(ctx: &Context, sj: &SkillJob, type_: EventType, reason: &str, note: &str) {
    let event =
        Event { type_, reason: reason.into(), note: Some(note.chars().take(1000).collect()), action: "Reconcile".into(), secondary: None };
    if let Err(err) = ctx.recorder.publish(&event, &sj.object_ref(&())).await {
        tracing::debug!(%err, "could not publish an event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::job::SkillJobSpec;
    use crate::core::owner::{OwnerClaim, OwnerSeal};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn job(principal: &str, sealed: bool) -> SkillJob {
        let spec = SkillJobSpec { binding: "b".into(), script: "scripts/s.py".into(), args: vec![], inputs: vec![], timeout_seconds: None };
        let mut sj = SkillJob::new("skj-1", spec);
        sj.metadata.namespace = Some("team".into());
        let now = Timestamp::now();
        sj.metadata.creation_timestamp = Some(Time(now));
        sj.annotations_mut().insert(REQUESTED_BY_ANNOTATION.into(), principal.into());
        if sealed {
            let claim = OwnerClaim { namespace: "team", name: "skj-1", principal, spec_digest: &sj.spec_digest() };
            sj.annotations_mut().insert(OWNER_SEAL_ANNOTATION.into(), OwnerSeal::new(b"key").seal(&claim, now.as_second()));
        }
        sj
    }

    fn record(sj: &SkillJob, status: &SkillJobStatus, phase: SkillJobPhase) -> serde_json::Value {
        serde_json::to_value(verdict_record(sj, "team", status, phase, None, &OwnerSeal::new(b"key"))).unwrap()
    }

    /// The attack: an agent allowed to create SkillJobs writes one naming
    /// another principal. Its verdict names nobody; the gateway's names its caller.
    #[test]
    fn the_verdict_names_only_a_requester_the_gateways_seal_proves() {
        let ran = SkillJobStatus { job_name: Some("skilljob-1".into()), ..Default::default() };
        let sealed = record(&job("system:serviceaccount:team:alice", true), &ran, SkillJobPhase::Succeeded);
        assert_eq!(sealed["principal"]["name"], "system:serviceaccount:team:alice");
        let forged = record(&job("system:serviceaccount:team:alice", false), &ran, SkillJobPhase::Succeeded);
        assert!(forged.get("principal").is_none(), "{forged}");
        // A seal of another principal's does not carry over to a changed annotation.
        let mut moved = job("system:serviceaccount:team:mallory", true);
        moved.annotations_mut().insert(REQUESTED_BY_ANNOTATION.into(), "system:serviceaccount:team:alice".into());
        assert!(record(&moved, &ran, SkillJobPhase::Succeeded).get("principal").is_none());
    }

    /// A run the fence (or any admission rule) refused never started: its
    /// verdict is `refused` with the refusal's reason, not `ok`.
    #[test]
    fn a_verdict_of_a_run_refused_at_admission_says_refused() {
        let sj = job("system:serviceaccount:team:alice", true);
        let mut refused = SkillJobStatus::default();
        set_phase(&mut refused, SkillJobPhase::Failed, "ScriptNotDeclared", "scripts/x.py is not a script the skill declares", None);
        let r = record(&sj, &refused, SkillJobPhase::Failed);
        assert_eq!((r["outcome"].as_str(), r["code"].as_str()), (Some("refused"), Some("ScriptNotDeclared")), "{r}");
        // A run that started and failed finished: ok, whatever its exit.
        let ran = SkillJobStatus { job_name: Some("skilljob-1".into()), ..refused.clone() };
        assert_eq!(record(&sj, &ran, SkillJobPhase::Failed)["outcome"], "ok");
        let warm = SkillJobStatus { warm_pod: Some("warm-1".into()), ..refused };
        assert_eq!(record(&sj, &warm, SkillJobPhase::Failed)["outcome"], "ok");
    }
}
