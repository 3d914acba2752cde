//! A run: the SkillJob written (or found again), its inputs staged, the
//! wait for the controller's verdict, and the result read back.

use std::collections::BTreeMap;

use futures::StreamExt;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use serde_json::json;

use super::error::{is_status, ExecError, Result};
use super::names::{owner_label, ANNOTATION_SKILL, CREATED_BY, LABEL_CREATED_BY, LABEL_OWNER};
use super::record::{self, is_finished};
use super::{KubeExecutor, OnDisconnect};
use crate::api::job::{InputFile, SkillJob, SkillJobSpec};
use crate::api::outcome::{LaunchResult, RunOutcome};
use crate::artifacts::operator::ArtifactStore;
use crate::controller::decide::{inputs_mismatch, is_final};
use crate::controller::skilljob::{CANCEL_ANNOTATION, FINALIZER, INPUTS_STAGED_ANNOTATION};
use crate::core::fence::RunPlan;
use crate::core::limits::STREAM_CAP;
use crate::jobs::{JobError, JobState, OutputListing};
use crate::mcp::executor::{Caller, ProgressUpdate, RunControl, RunReport};

impl KubeExecutor {
    /// The SkillJob spec of `plan` over inputs named by digest.
    pub(super) fn spec_for(&self, plan: &RunPlan, inputs: Vec<InputFile>) -> Result<SkillJobSpec> {
        let binding = self
            .bindings
            .binding_of(&plan.skill)
            .ok_or_else(|| ExecError::NotBound { skill: plan.skill.clone(), namespace: self.options.namespace.clone() })?;
        Ok(SkillJobSpec {
            binding,
            script: plan.script.to_string(),
            args: plan.args.clone(),
            inputs,
            timeout_seconds: Some(plan.timeout_secs.clamp(1, crate::core::limits::MAX_TIMEOUT_SECS) as u32),
        })
    }

    pub(super) fn new_skilljob(&self, caller: &Caller, name: &str, skill: &str, spec: SkillJobSpec) -> SkillJob {
        let mut sj = SkillJob::new(name, spec);
        sj.metadata = ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(self.options.namespace.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_CREATED_BY.to_string(), CREATED_BY.to_string()),
                (LABEL_OWNER.to_string(), owner_label(&caller.principal)),
            ])),
            annotations: Some(BTreeMap::from([(ANNOTATION_SKILL.to_string(), skill.to_string())])),
            // Made with the controller's finalizer, so the controller need
            // not add it: one API write fewer per run.
            finalizers: Some(vec![FINALIZER.to_string()]),
            ..Default::default()
        };
        sj.seal_owner(&self.options.owner_seal, &caller.principal, k8s_openapi::jiff::Timestamp::now().as_second());
        // The calling request's trace goes on with the run (the controller parents its spans on it).
        if let Some(traceparent) = crate::telemetry::current_traceparent() {
            sj.annotations_mut().insert(crate::telemetry::TRACEPARENT_ANNOTATION.to_string(), traceparent);
        }
        sj
    }

    /// The caller's SkillJob `name`, or `None` (missing, or someone else's).
    pub(super) async fn owned_skilljob(&self, caller: &Caller, name: &str) -> Result<Option<SkillJob>> {
        let found = self.jobs.get_opt(name).await.map_err(ExecError::kube(format!("read SkillJob {name}")))?;
        // One being deleted is gone for its caller (its name stays taken for its token's life).
        Ok(found.filter(|sj| self.owner_of(sj) == Some(caller.principal.as_str()) && sj.metadata.deletion_timestamp.is_none()))
    }

    /// Refuse when the namespace already holds the most jobs it may keep
    /// (SkillJobs of anyone, and drafts), naming the oldest finished
    /// SkillJobs to delete. NB: the count is a list, not a lock: calls racing
    /// on other replicas at 99 may each pass, so the cap can be passed by
    /// the number of creates in flight at that moment, and the next create
    /// is refused.
    pub(super) async fn check_cap(&self) -> Result<()> {
        let max = self.options.limits.retained;
        let list = self.jobs.list(&Default::default()).await.map_err(ExecError::kube("list the namespace's SkillJobs"))?;
        let (_, drafts) = self.drafts.list().await?;
        // Deleted ones held only for their token's life are not kept jobs.
        let held = list.items.iter().filter(|sj| sj.metadata.deletion_timestamp.is_none()).count() + drafts;
        if held < max {
            return Ok(());
        }
        let mut finished: Vec<&SkillJob> = list.items.iter().filter(|sj| is_finished(sj)).collect();
        finished.sort_by_key(|sj| (sj.metadata.creation_timestamp.as_ref().map(|t| t.0), sj.name_any()));
        let oldest = finished.iter().take(super::limits::CAP_NAMES_SHOWN).map(|sj| sj.name_any()).collect();
        Err(ExecError::CapReached { namespace: self.options.namespace.clone(), held, max, oldest })
    }

    /// Write the SkillJob `name` for this call, or attach to the one an
    /// earlier attempt of the same call wrote; its inputs staged either way.
    pub(super) async fn submit_named(&self, caller: &Caller, plan: &RunPlan, inputs: &[(String, Vec<u8>)], name: &str) -> Result<SkillJob> {
        let named: Vec<InputFile> = inputs
            .iter()
            .map(|(path, bytes)| InputFile { path: path.clone(), digest: crate::core::package::digest(bytes), size: bytes.len() as u64 })
            .collect();
        let spec = self.spec_for(plan, named)?;
        // A retry finds its SkillJob before the cap is counted: it is one of them.
        let sj = match self.jobs.get_opt(name).await.map_err(ExecError::kube(format!("read SkillJob {name}")))? {
            Some(existing) => self.attach(caller, existing, &spec)?,
            None => {
                self.check_cap().await?;
                let wanted = self.new_skilljob(caller, name, &plan.skill, spec.clone());
                match self.jobs.create(&PostParams::default(), &wanted).await {
                    Ok(created) => {
                        self.wrote(name, true);
                        created
                    }
                    // Another replica carried the same retry out first.
                    Err(e) if is_status(&e, 409) => {
                        let existing = self.jobs.get(name).await.map_err(ExecError::kube(format!("read SkillJob {name}")))?;
                        self.attach(caller, existing, &spec)?
                    }
                    Err(e) => return Err(ExecError::Kube { what: format!("create SkillJob {name}"), source: e }),
                }
            }
        };
        if !inputs.is_empty() {
            self.stage_inline(&sj, inputs).await?;
        }
        tracing::info!(namespace = %self.options.namespace, skilljob = %name, principal = %caller.principal, "run submitted");
        Ok(sj)
    }

    /// An existing SkillJob is this call's run only if it is the caller's
    /// and asks for exactly this run.
    fn attach(&self, caller: &Caller, existing: SkillJob, spec: &SkillJobSpec) -> Result<SkillJob> {
        if existing.metadata.deletion_timestamp.is_some() && self.owner_of(&existing) == Some(caller.principal.as_str()) {
            // Deleted and held until its token expires (the controller keeps
            // a sealed name taken): this call's token already ran it once.
            return Err(ExecError::TokenUsed { name: existing.name_any() });
        }
        if self.owner_of(&existing) == Some(caller.principal.as_str()) && existing.spec == *spec {
            tracing::info!(skilljob = %existing.name_any(), "a retried call attaches to its SkillJob");
            Ok(existing)
        } else {
            Err(ExecError::NameTaken { name: existing.name_any() })
        }
    }

    /// Stage inline inputs under the SkillJob's UID (unless an earlier
    /// attempt did, or the run is past needing them), then wake the controller.
    async fn stage_inline(&self, sj: &SkillJob, inputs: &[(String, Vec<u8>)]) -> Result<()> {
        let (ns, name) = (&self.options.namespace, sj.name_any());
        let uid = sj.uid().ok_or_else(|| ExecError::Vanished { name: name.clone() })?;
        if sj.status.as_ref().and_then(|s| s.job_name.as_ref()).is_some() || sj.status.as_ref().and_then(|s| s.phase).is_some_and(is_final)
        {
            return Ok(());
        }
        let staged = self.artifacts.staged_inputs(ns, &uid).await?;
        if inputs_mismatch(&sj.spec.inputs, &staged).is_some() {
            for (path, bytes) in inputs {
                self.artifacts.stage_input(ns, &uid, path, bytes.clone()).await?;
            }
        }
        self.mark_staged(sj).await
    }

    /// Tell the controller the inputs are staged (it waits for them, and
    /// this annotation wakes it at once instead of at its next poll).
    pub(super) async fn mark_staged(&self, sj: &SkillJob) -> Result<()> {
        let digests: Vec<&str> = sj.spec.inputs.iter().map(|i| i.digest.as_str()).collect();
        let set = crate::core::package::digest(digests.join(",").as_bytes());
        let patch = json!({ "metadata": { "annotations": { INPUTS_STAGED_ANNOTATION: set } } });
        self.jobs
            .patch(&sj.name_any(), &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(ExecError::kube(format!("mark SkillJob {}'s inputs staged", sj.name_any())))?;
        Ok(())
    }

    /// Ask the controller to stop the run (its pod is deleted, the phase
    /// becomes Cancelled). The value names who asked.
    pub(super) async fn cancel_skilljob(&self, caller: &Caller, name: &str) -> Result<()> {
        let patch = json!({ "metadata": { "annotations": { CANCEL_ANNOTATION: caller.principal } } });
        self.jobs
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(ExecError::kube(format!("cancel SkillJob {name}")))?;
        Ok(())
    }

    /// Wait for the run's verdict (watching the SkillJob), reporting
    /// progress, and read the result back. The caller going away first is
    /// the [`OnDisconnect`] policy's.
    pub(super) async fn settle(&self, caller: &Caller, sj: SkillJob, plan: &RunPlan, control: &RunControl) -> Result<RunReport> {
        let name = sj.name_any();
        let started = tokio::time::Instant::now();
        let report = |sj: &SkillJob, interval_hit: bool| {
            if let Some(sink) = &control.progress {
                let message = sj.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_else(|| "waiting for the controller".into());
                let message = if interval_hit { format!("still {}: {message}", record::phase_name(sj).to_lowercase()) } else { message };
                sink(ProgressUpdate { phase: record::phase_name(sj), elapsed_secs: started.elapsed().as_secs(), message });
            }
        };
        let mut current = sj;
        if is_finished(&current) {
            return self.report(&current, plan).await;
        }
        report(&current, false);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = watcher(self.jobs.clone(), config).default_backoff().boxed();
        let interval = self.options.progress_interval;
        let heartbeat = tokio::time::sleep(interval);
        tokio::pin!(heartbeat);
        loop {
            tokio::select! {
                biased;
                _ = control.cancel.cancelled() => return self.disconnected(caller, &current).await,
                event = events.next() => match event {
                    Some(Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) => {
                        let changed = obj.status.as_ref().map(|s| (s.phase, s.message.clone()))
                            != current.status.as_ref().map(|s| (s.phase, s.message.clone()));
                        current = obj;
                        if is_finished(&current) {
                            break;
                        }
                        if changed {
                            report(&current, false);
                            heartbeat.as_mut().reset(tokio::time::Instant::now() + interval);
                        }
                    }
                    Some(Ok(watcher::Event::Delete(_))) => return Err(ExecError::Vanished { name }),
                    Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                    Some(Err(err)) => tracing::warn!(skilljob = %name, %err, "watching the SkillJob failed; retrying"),
                    None => return Err(ExecError::Vanished { name }),
                },
                _ = &mut heartbeat => {
                    report(&current, true);
                    heartbeat.as_mut().reset(tokio::time::Instant::now() + interval);
                }
            }
        }
        self.report(&current, plan).await
    }

    async fn disconnected(&self, caller: &Caller, sj: &SkillJob) -> Result<RunReport> {
        let name = sj.name_any();
        match self.options.on_disconnect {
            OnDisconnect::Keep => {
                tracing::info!(skilljob = %name, "the caller went away; the run is kept (on-disconnect keep)");
                Err(ExecError::Kept { name })
            }
            OnDisconnect::Cancel => {
                tracing::info!(skilljob = %name, "the caller went away; cancelling the run");
                self.cancel_skilljob(caller, &name).await?;
                let outcome = RunOutcome { cancelled: true, ..record::outcome_of(sj, None) };
                let mut rec = record::job_record(sj, &outcome);
                rec.state = JobState::Cancelled;
                let note = format!("the caller went away; SkillJob {name} was cancelled (the controller stops its pod)");
                if let Some(run) = rec.run.as_mut() {
                    run.note = Some(note.clone());
                }
                Ok(RunReport {
                    record: rec,
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                    outputs: OutputListing { files: Vec::new(), skipped: Vec::new(), total_bytes: 0, truncated: false },
                    command: self.command_of(sj),
                    note: Some(note),
                    backend_id: sj.uid(),
                })
            }
        }
    }

    /// The command a SkillJob ran, for a report without the plan.
    pub(super) fn command_of(&self, sj: &SkillJob) -> crate::mcp::executor::RunCommand {
        let mut argv = vec![sj.spec.script.clone()];
        argv.extend(sj.spec.args.iter().cloned());
        crate::mcp::executor::RunCommand {
            backend: "kubernetes".into(),
            program: sj.status.as_ref().and_then(|s| s.skill.clone()).unwrap_or_default(),
            argv,
            cwd: "/work".into(),
            timeout_secs: sj.spec.timeout_seconds.map_or(crate::core::limits::DEFAULT_TIMEOUT_SECS, u64::from),
            env: Vec::new(),
            env_missing: Vec::new(),
            sandbox: "pod".into(),
            network: String::new(),
            run_as: Some(crate::controller::builders::job::DEFAULT_RUN_AS as u32),
            limits: Vec::new(),
        }
    }

    /// The launcher's result and the output listing of a finished run.
    pub(super) async fn results(&self, sj: &SkillJob) -> Result<(RunOutcome, OutputListing)> {
        let (ns, name) = (&self.options.namespace, sj.name_any());
        if sj.status.as_ref().and_then(|s| s.phase) == Some(crate::api::job::SkillJobPhase::Locked) {
            return Ok((record::outcome_of(sj, None), record::listing_from_status(sj)));
        }
        let uid = sj.uid().ok_or_else(|| ExecError::Vanished { name: name.clone() })?;
        let launched = match self.artifacts.output_file_opt(ns, &uid, "result/result.json").await? {
            Some(bytes) => serde_json::from_slice::<LaunchResult>(&bytes).ok().map(|l| l.outcome),
            None => None,
        };
        let mut listing = match self.artifacts.outputs(ns, &uid).await? {
            Some(manifest) => record::listing_from_manifest(sj, &manifest),
            None => record::listing_from_status(sj),
        };
        // Over one MCP call's worth: name the file route, which moves it whole.
        for f in listing.files.iter_mut().filter(|f| f.size > self.options.limits.upload_chunk) {
            f.download = Some(self.file_route(&name, &f.path));
        }
        Ok((record::outcome_of(sj, launched.as_ref()), listing))
    }

    /// A captured stream, at most [`STREAM_CAP`] bytes (the rest flagged).
    pub(super) async fn stream(&self, sj: &SkillJob, which: &str) -> Result<Option<Vec<u8>>> {
        let uid = sj.uid().ok_or_else(|| ExecError::Vanished { name: sj.name_any() })?;
        self.artifacts.output_file_opt(&self.options.namespace, &uid, &format!("result/{which}")).await.map_err(Into::into)
    }

    /// The RunReport of a finished SkillJob, as `serve` returns it.
    pub(super) async fn report(&self, sj: &SkillJob, plan: &RunPlan) -> Result<RunReport> {
        let (mut outcome, outputs) = self.results(sj).await?;
        let locked = sj.status.as_ref().and_then(|s| s.phase) == Some(crate::api::job::SkillJobPhase::Locked);
        let (mut stdout, mut stderr) = if locked {
            (Vec::new(), Vec::new())
        } else {
            (self.stream(sj, "stdout").await?.unwrap_or_default(), self.stream(sj, "stderr").await?.unwrap_or_default())
        };
        for (bytes, truncated) in [(&mut stdout, &mut outcome.stdout_truncated), (&mut stderr, &mut outcome.stderr_truncated)] {
            if bytes.len() as u64 > STREAM_CAP {
                bytes.truncate(STREAM_CAP as usize);
                *truncated = true;
            }
        }
        let rec = record::job_record(sj, &outcome);
        let note = rec.run.as_ref().and_then(|r| r.note.clone());
        if rec.state == JobState::Running {
            return Err(JobError::StillRunning { id: rec.id }.into());
        }
        Ok(RunReport { record: rec, stdout, stderr, outputs, command: self.command(plan), note, backend_id: sj.uid() })
    }
}
