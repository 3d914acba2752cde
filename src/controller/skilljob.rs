//! SkillJob reconciler: admit through the fence, then own a
//! ServiceAccount (no RBAC), a token Secret, a NetworkPolicy and exactly one
//! Job, and report the Job's progress. A Job is never updated in place and
//! never created twice: its name derives from the SkillJob's UID, so a
//! restarted controller finds the one it made.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{finalizer, Event as Finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::builders::job::{build_job, job_name, pod_selector_labels, EnvGrant, JobParams, RunResources};
use super::builders::network_policy::{build_network_policy, build_service_account, NetPolParams, Peer};
use super::context::{apply_status, Context, Error, Result, MANAGER};
use super::decide::{admit, is_final, job_phase, namespace_is_restricted, Admission, PSS_ENFORCE_LABEL};
use crate::api::conditions::set_condition;
use crate::api::job::{SkillJob, SkillJobPhase, SkillJobStatus};

/// Stops the pod and cleans artifacts before a SkillJob goes.
pub const FINALIZER: &str = "skill-operator.dev/skilljob-cleanup";
/// The per-namespace ServiceAccount runs use (no RBAC bound to it).
pub const RUN_SERVICE_ACCOUNT: &str = "skill-operator-run";
/// The artifact endpoint's port on the operator pods.
pub const ARTIFACT_PORT: i32 = 8443;

pub async fn reconcile(job: Arc<SkillJob>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    let ns = job.namespace().ok_or(Error::Missing("namespace"))?;
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

/// Writes the status unless it is what the object already says: most
/// reconciles (a watch event, a periodic requeue) change nothing, and an
/// unchanged apply still costs the API server a full server-side apply.
async fn patch_status(ctx: &Context, job: &SkillJob, status: &SkillJobStatus) -> Result<()> {
    if job.status.as_ref() == Some(status) {
        return Ok(());
    }
    let ns = job.namespace().ok_or(Error::Missing("namespace"))?;
    let api: Api<SkillJob> = Api::namespaced(ctx.client.clone(), &ns);
    apply_status(&api, &job.name_any(), status).await
}

fn set_phase(status: &mut SkillJobStatus, phase: SkillJobPhase, reason: &str, message: impl Into<String>, generation: Option<i64>) {
    let message = message.into();
    status.phase = Some(phase);
    status.message = Some(message.clone());
    let done = is_final(phase);
    set_condition(&mut status.conditions, "Complete", done, reason, message, generation);
}

async fn apply(sj: &SkillJob, ctx: &Context) -> Result<Action> {
    let ns = sj.namespace().ok_or(Error::Missing("namespace"))?;
    let uid = sj.uid().ok_or(Error::Missing("uid"))?;
    let generation = sj.metadata.generation;
    let mut status = sj.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    if status.phase.is_some_and(is_final) {
        return Ok(Action::await_change());
    }
    let name = job_name(&uid);
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    // Before this controller recorded a Job, a cache miss is enough to try
    // creating it (a Job that exists after all answers 409, handled below).
    // After, only the API server may say it is gone.
    let existing =
        if status.job_name.is_none() { ctx.lookups.cached_job(&ns, &name) } else { ctx.lookups.job(&ctx.client, &ns, &name).await? };

    if existing.is_none() {
        if status.job_name.is_some() {
            // We created it before and it is gone while not finished: never re-run.
            set_phase(
                &mut status,
                SkillJobPhase::Failed,
                "JobDeleted",
                "the Job was deleted before the run finished; it was not re-run (create a new SkillJob)",
                generation,
            );
            patch_status(ctx, sj, &status).await?;
            publish(ctx, sj, EventType::Warning, "JobDeleted", "the Job disappeared before the run finished").await;
            return Ok(Action::await_change());
        }
        // Admission through the fence.
        let binding = ctx.lookups.binding(&ctx.client, &ns, &sj.spec.binding).await?;
        let package = match &binding {
            Some(b) => ctx.lookups.package(&ctx.client, &b.spec.package).await?,
            None => None,
        };
        let admission = match admit(&sj.spec, binding.as_ref(), package.as_ref()) {
            Ok(a) => a,
            Err(refusal) => {
                let (reason, message) = (refusal.reason(), refusal.to_string());
                if refusal.is_transient() {
                    set_phase(&mut status, SkillJobPhase::Pending, reason, message, generation);
                    patch_status(ctx, sj, &status).await?;
                    return Ok(Action::requeue(Duration::from_secs(15)));
                }
                set_phase(&mut status, SkillJobPhase::Failed, reason, message.clone(), generation);
                patch_status(ctx, sj, &status).await?;
                publish(ctx, sj, EventType::Warning, reason, &message).await;
                return Ok(Action::await_change());
            }
        };
        status.skill = Some(admission.skill.clone());
        // Named inputs must be staged, exactly, before the Job may start.
        if !sj.spec.inputs.is_empty() {
            let staged = ctx.artifacts.staged_inputs(&ns, &uid).await.map_err(Error::Artifacts)?;
            if let Some(why) = super::decide::inputs_mismatch(&sj.spec.inputs, &staged) {
                let waited = age_secs(sj.metadata.creation_timestamp.as_ref()).unwrap_or(0);
                if waited > super::decide::INPUTS_WAIT_SECS {
                    let message = format!("the inputs were not staged within {} s: {why}", super::decide::INPUTS_WAIT_SECS);
                    set_phase(&mut status, SkillJobPhase::Failed, "InputsNotStaged", message.clone(), generation);
                    patch_status(ctx, sj, &status).await?;
                    publish(ctx, sj, EventType::Warning, "InputsNotStaged", &message).await;
                    return Ok(Action::await_change());
                }
                set_phase(
                    &mut status,
                    SkillJobPhase::Pending,
                    "AwaitingInputs",
                    format!("waiting for the inputs to be staged: {why}"),
                    generation,
                );
                patch_status(ctx, sj, &status).await?;
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
        }
        check_namespace(ctx, &ns, &mut status, generation).await?;
        // The package the pod fetches: exactly the pinned digest, staged for
        // this job, while the children are made (independent round trips).
        let stage = async {
            if let Some(package) = &package {
                let mut source = package.spec.source.oci.clone();
                source.reference = super::decide::pinned_reference(&source.reference, &admission.digest);
                let fetched = ctx.resolver.fetch(&source).await?;
                ctx.artifacts.stage_package(&ns, &uid, fetched.archive).await.map_err(Error::Artifacts)?;
            }
            Ok::<(), Error>(())
        };
        tokio::try_join!(ensure_children(ctx, sj, &ns, &uid, &admission), stage)?;
        let params = job_params(ctx, sj, &ns, &uid, &admission);
        if let Err(err) = params.validate() {
            set_phase(&mut status, SkillJobPhase::Failed, "InvalidJob", format!("the Job cannot be built: {err}"), generation);
            patch_status(ctx, sj, &status).await?;
            return Ok(Action::await_change());
        }
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
        return Ok(Action::requeue(Duration::from_secs(10)));
    }

    // The Job exists: keep the NetworkPolicy in place (recreated if deleted) and report.
    let job = existing.unwrap_or_default();
    if sj.status.as_ref().is_none_or(|s| s.job_name.is_none()) {
        // The Job's watch event can overtake our own status write: this
        // SkillJob copy predates it. Writing from it would erase what that
        // write said, so wait for the copy to catch up, unless the Job is
        // old enough that no write of ours is in flight (a controller that
        // stopped between creating the Job and recording it).
        let age = age_secs(job.metadata.creation_timestamp.as_ref()).unwrap_or(i64::MAX);
        if age < 10 {
            return Ok(Action::requeue(Duration::from_secs(2)));
        }
        if status.skill.is_none() {
            status.skill = ctx.lookups.binding(&ctx.client, &ns, &sj.spec.binding).await?.and_then(|b| b.status).and_then(|s| s.skill_name);
        }
        check_namespace(ctx, &ns, &mut status, generation).await?;
    }
    status.job_name = Some(name.clone());
    if !ctx.lookups.has_network_policy(&ns, &name) {
        if let Some(policy) = policy_for(ctx, sj, &ns, &uid, job.metadata.annotations.as_ref()) {
            let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &ns);
            create_policy(&policies, &policy).await?;
        }
    }
    let phase = job_phase(&job);
    if status.started_at.is_none() {
        status.started_at = job.status.as_ref().and_then(|s| s.start_time.clone());
    }
    // Only a finished run has an exit to read from its pod.
    if !matches!(phase, SkillJobPhase::Pending | SkillJobPhase::Running) {
        let (exit_code, signal) = run_container_exit(ctx, &ns, &uid).await?;
        status.exit_code = exit_code.or(status.exit_code);
        status.signal = signal.or(status.signal);
    }
    match phase {
        // A Pending SkillJob whose Job exists keeps its message ("Job … created"):
        // rewriting it to say the same thing in other words cost a status write per run.
        SkillJobPhase::Pending
            if status.phase == Some(SkillJobPhase::Pending) && sj.status.as_ref().is_some_and(|s| s.job_name.is_some()) =>
        {
            patch_status(ctx, sj, &status).await?;
            Ok(Action::requeue(Duration::from_secs(10)))
        }
        SkillJobPhase::Pending | SkillJobPhase::Running => {
            set_phase(
                &mut status,
                phase,
                if phase == SkillJobPhase::Running { "Running" } else { "Pending" },
                format!("Job {name} is {}", if phase == SkillJobPhase::Running { "running" } else { "starting" }),
                generation,
            );
            patch_status(ctx, sj, &status).await?;
            Ok(Action::requeue(Duration::from_secs(10)))
        }
        SkillJobPhase::TimedOut => {
            // The deadline passed: the pod must be gone before the files are trusted.
            if pods_alive(ctx, &ns, &uid).await? {
                let now = Timestamp::now();
                let since = job
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|c| c.iter().find(|c| c.type_ == "Failed"))
                    .and_then(|c| c.last_transition_time.clone());
                let stuck = since.is_some_and(|t| now.duration_since(t.0).as_secs() > 120);
                if stuck {
                    set_phase(
                        &mut status,
                        SkillJobPhase::Locked,
                        "StopNotConfirmed",
                        "the deadline passed but the pod did not stop; its files are withheld until an operator checks the node",
                        generation,
                    );
                    patch_status(ctx, sj, &status).await?;
                    publish(ctx, sj, EventType::Warning, "StopNotConfirmed", "pod still alive 120 s after the deadline").await;
                    return Ok(Action::requeue(Duration::from_secs(60)));
                }
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
            status.finished_at = Some(crate::api::conditions::now());
            set_phase(&mut status, SkillJobPhase::TimedOut, "DeadlineExceeded", "the run passed its deadline and was stopped", generation);
            patch_status(ctx, sj, &status).await?;
            Ok(Action::await_change())
        }
        final_phase => {
            record_outputs(ctx, &ns, &uid, &mut status).await;
            status.finished_at =
                job.status.as_ref().and_then(|s| s.completion_time.clone()).or_else(|| Some(crate::api::conditions::now()));
            let message = match (final_phase, status.exit_code) {
                (SkillJobPhase::Succeeded, _) => "the script exited 0".to_string(),
                (_, Some(code)) => format!("the script exited {code}"),
                _ => "the run failed before the script exited (see the Job's events)".to_string(),
            };
            set_phase(
                &mut status,
                final_phase,
                if final_phase == SkillJobPhase::Succeeded { "Succeeded" } else { "Failed" },
                message,
                generation,
            );
            patch_status(ctx, sj, &status).await?;
            Ok(Action::await_change())
        }
    }
}

/// Fill stdout/stderr references and output files from what the upload
/// sidecar stored. A missing or unreadable manifest leaves them empty and
/// says so in the message, never fails the reconcile.
async fn record_outputs(ctx: &Context, ns: &str, uid: &str, status: &mut SkillJobStatus) {
    use crate::api::job::{OutputFile, StreamRef};
    match ctx.artifacts.outputs(ns, uid).await {
        Ok(Some(manifest)) => {
            let result = |name: &str| manifest.files.iter().find(|f| f.path == format!("result/{name}"));
            // The launcher's result.json has what the script wrote (bytes, truncation, exit).
            let launch = match ctx.artifacts.output_file(ns, uid, "result/result.json").await {
                Ok(bytes) => serde_json::from_slice::<crate::api::outcome::LaunchResult>(&bytes).ok(),
                Err(_) => None,
            };
            if let Some(l) = &launch {
                status.exit_code = l.outcome.exit_code.or(status.exit_code);
                status.signal = l.outcome.signal.or(status.signal);
            }
            if let Some(f) = result("stdout") {
                let (size, truncated) = launch.as_ref().map_or((f.size, false), |l| (l.outcome.stdout_bytes, l.outcome.stdout_truncated));
                status.stdout = Some(StreamRef { digest: f.digest.clone(), size, truncated });
            }
            if let Some(f) = result("stderr") {
                let (size, truncated) = launch.as_ref().map_or((f.size, false), |l| (l.outcome.stderr_bytes, l.outcome.stderr_truncated));
                status.stderr = Some(StreamRef { digest: f.digest.clone(), size, truncated });
            }
            status.outputs = manifest
                .files
                .iter()
                .filter_map(|f| {
                    f.path.strip_prefix("work/").map(|p| OutputFile { path: p.to_string(), size: f.size, digest: f.digest.clone() })
                })
                .collect();
        }
        Ok(None) => {}
        Err(err) => tracing::warn!(%err, ns, uid, "could not read the run's outputs"),
    }
}

/// A namespace that does not enforce `restricted` gets the label (when the
/// operator may add it) or a visible condition.
async fn check_namespace(ctx: &Context, ns: &str, status: &mut SkillJobStatus, generation: Option<i64>) -> Result<()> {
    let enforced = |status: &mut SkillJobStatus| {
        set_condition(
            &mut status.conditions,
            "NamespaceRestricted",
            true,
            "Enforced",
            "the namespace enforces Pod Security `restricted`",
            generation,
        );
    };
    if ctx.lookups.namespace_known_restricted(ns) {
        enforced(status);
        return Ok(());
    }
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let Some(namespace) = namespaces.get_opt(ns).await? else { return Ok(()) };
    if namespace_is_restricted(namespace.metadata.labels.as_ref()) {
        ctx.lookups.remember_restricted(ns);
        enforced(status);
        return Ok(());
    }
    if ctx.config.label_namespaces {
        let patch = json!({ "metadata": { "labels": { PSS_ENFORCE_LABEL: "restricted" } } });
        namespaces.patch(ns, &PatchParams::default(), &Patch::Merge(patch)).await?;
        set_condition(
            &mut status.conditions,
            "NamespaceRestricted",
            true,
            "Labelled",
            "labelled the namespace pod-security.kubernetes.io/enforce=restricted",
            generation,
        );
    } else {
        set_condition(
            &mut status.conditions,
            "NamespaceRestricted",
            false,
            "NotEnforced",
            "the namespace does not enforce Pod Security `restricted` (label it pod-security.kubernetes.io/enforce=restricted); runs still use restricted pods",
            generation,
        );
    }
    Ok(())
}

fn owner(sj: &SkillJob) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
    sj.controller_owner_ref(&()).unwrap_or_default()
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn token_secret_name(uid: &str) -> String {
    format!("{}-token", job_name(uid))
}

/// ServiceAccount (no RBAC), token Secret and NetworkPolicy, created or applied idempotently.
async fn ensure_children(ctx: &Context, sj: &SkillJob, ns: &str, uid: &str, admission: &Admission) -> Result<()> {
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
    if let Some(policy) = policy_for(ctx, sj, ns, uid, None) {
        let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        create_policy(&policies, &policy).await?;
    }
    let _ = admission;
    Ok(())
}

/// Seconds since `created`, by this machine's clock.
fn age_secs(created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Option<i64> {
    created.map(|t| Timestamp::now().duration_since(t.0).as_secs())
}

/// A run's NetworkPolicy never changes (its SkillJob is immutable), so it
/// is created, not applied: a create costs the API server less than a
/// server-side apply, and one that exists already answers 409.
async fn create_policy(policies: &Api<NetworkPolicy>, policy: &NetworkPolicy) -> Result<()> {
    match policies.create(&PostParams::default(), policy).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn policy_for(ctx: &Context, sj: &SkillJob, ns: &str, uid: &str, _annotations: Option<&BTreeMap<String, String>>) -> Option<NetworkPolicy> {
    let params = NetPolParams {
        skilljob_name: sj.name_any(),
        namespace: ns.to_string(),
        skilljob_uid: uid.to_string(),
        owner: owner(sj),
        labels: labels(),
        artifact: Peer::in_namespace(&ctx.config.operator_namespace, ctx.config.operator_pod_labels.clone(), ARTIFACT_PORT),
        egress_hosts: Vec::new(),
        egress_proxy: None,
        dns: None,
    };
    params.validate().ok()?;
    Some(build_network_policy(&params))
}

fn job_params(ctx: &Context, sj: &SkillJob, ns: &str, uid: &str, a: &Admission) -> JobParams {
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
        egress_proxy: None,
        allow_dns: false,
        host_aliases: ctx.config.host_aliases.clone(),
        image_pull_secrets: Vec::new(),
    }
}

/// The `run` container's exit code and signal, from the Job's pod.
async fn run_container_exit(ctx: &Context, ns: &str, uid: &str) -> Result<(Option<i32>, Option<i32>)> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = pod_selector_labels(uid).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    for pod in pods.list(&ListParams::default().labels(&selector)).await? {
        let statuses = pod.status.and_then(|s| s.container_statuses).unwrap_or_default();
        if let Some(terminated) =
            statuses.iter().find(|c| c.name == "run").and_then(|c| c.state.as_ref()).and_then(|s| s.terminated.as_ref())
        {
            return Ok((Some(terminated.exit_code), terminated.signal));
        }
    }
    Ok((None, None))
}

async fn pods_alive(ctx: &Context, ns: &str, uid: &str) -> Result<bool> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = pod_selector_labels(uid).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .iter()
        .any(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"))))
}

/// Deletion: stop the run (delete the Job and its pods), confirm the stop,
/// delete the job's artifacts, then let the SkillJob go.
async fn cleanup(sj: &SkillJob, ctx: &Context) -> Result<Action> {
    let ns = sj.namespace().ok_or(Error::Missing("namespace"))?;
    let uid = sj.uid().ok_or(Error::Missing("uid"))?;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let dp = DeleteParams { propagation_policy: Some(PropagationPolicy::Foreground), ..Default::default() };
    match jobs.delete(&job_name(&uid), &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    if pods_alive(ctx, &ns, &uid).await? {
        let mut status = sj.status.clone().unwrap_or_default();
        if status.phase.is_none_or(|p| !is_final(p)) {
            set_phase(
                &mut status,
                SkillJobPhase::Cancelled,
                "Cancelling",
                "cancelled: waiting for the pod to stop",
                sj.metadata.generation,
            );
            patch_status(ctx, sj, &status).await?;
        }
        return Err(Error::InUse("the run's pod has not stopped yet".into()));
    }
    // The pod is gone: its inputs and outputs go with the SkillJob.
    ctx.artifacts.delete(&ns, &uid).await.map_err(Error::Artifacts)?;
    Ok(Action::await_change())
}

async fn publish(ctx: &Context, sj: &SkillJob, type_: EventType, reason: &str, note: &str) {
    let event =
        Event { type_, reason: reason.into(), note: Some(note.chars().take(1000).collect()), action: "Reconcile".into(), secondary: None };
    if let Err(err) = ctx.recorder.publish(&event, &sj.object_ref(&())).await {
        tracing::debug!(%err, "could not publish an event");
    }
}
