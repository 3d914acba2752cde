//! The executor seam without processes: a fake [`Executor`] that keeps jobs
//! in memory proves that the tools do their part (fence, preview,
//! confirmation, inputs bound to the token, result shapes, ownership) the
//! same way whatever carries the run out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::error::ToolError;
use super::executor::*;
use super::gate::Asker;
use super::run::{self, CallContext, RunReply};
use super::snapshot::Snapshot;
use super::state::{Execution, ServerState};
use crate::api::outcome::RunOutcome;
use crate::core::confirm::ConfirmMode;
use crate::core::declaration::Interpreter;
use crate::core::fence::RunPlan;
use crate::core::grants::Grants;
use crate::jobs::{Chunk, FileInfo, JobError, JobLimits, JobRecord, JobState, OutputListing, ReadTarget, RunRecord};

/// A job and its input files (path, bytes).
type FakeJob = (JobRecord, Vec<(String, Vec<u8>)>);
/// A run: script, args, the (path, digest) inputs it was confirmed with.
type FakeRun = (String, Vec<String>, Vec<(String, String)>);

#[derive(Default)]
struct FakeJobs {
    jobs: HashMap<String, FakeJob>,
    runs: Vec<FakeRun>,
}

/// Runs "succeed" at once with the script path as stdout.
#[derive(Default)]
struct FakeExecutor(Mutex<FakeJobs>);

fn command(plan: &RunPlan) -> RunCommand {
    RunCommand {
        backend: "fake".into(),
        program: plan.interpreter.program().into(),
        argv: std::iter::once(plan.script.to_string()).chain(plan.args.iter().cloned()).collect(),
        cwd: "/work".into(),
        timeout_secs: plan.timeout_secs,
        env: plan.granted_env.clone(),
        env_missing: vec![],
        sandbox: "fake".into(),
        network: "none".into(),
        run_as: None,
        limits: vec![],
    }
}

impl FakeExecutor {
    fn finish(&self, id: &str, plan: &RunPlan, confirmed: Vec<(String, String)>) -> Result<RunReport, ToolError> {
        let mut g = self.0.lock().unwrap();
        let (record, files) = g.jobs.get_mut(id).ok_or_else(|| JobError::NotFound(id.into()))?;
        let now: Vec<(String, String)> = files.iter().map(|(p, b)| (p.clone(), crate::core::package::digest(b))).collect();
        if now != confirmed {
            return Err(JobError::InputsChanged { id: id.into(), detail: "fake".into() }.into());
        }
        let outcome = RunOutcome { exit_code: Some(0), stdout_bytes: plan.script.as_str().len() as u64, ..Default::default() };
        record.state = JobState::after(&outcome);
        record.run = Some(RunRecord {
            script: plan.script.to_string(),
            args: plan.args.clone(),
            started_at_ms: 1,
            finished_at_ms: Some(2),
            outcome,
            note: None,
        });
        let record = record.clone();
        g.runs.push((plan.script.to_string(), plan.args.clone(), confirmed));
        let outputs = OutputListing { files: vec![], skipped: vec![], total_bytes: 0, truncated: false };
        Ok(RunReport {
            record,
            stdout: plan.script.as_str().as_bytes().to_vec(),
            stderr: vec![],
            outputs,
            command: command(plan),
            note: None,
        })
    }

    fn owned(&self, caller: &Caller, job: &str) -> Result<JobRecord, ToolError> {
        let g = self.0.lock().unwrap();
        match g.jobs.get(job) {
            Some((r, _)) if r.owner == caller.principal => Ok(r.clone()),
            _ => Err(JobError::NotFound(job.into()).into()),
        }
    }
}

#[async_trait::async_trait]
impl Executor for FakeExecutor {
    fn summary(&self, mode: ConfirmMode) -> ExecutionSummary {
        ExecutionSummary {
            backend: "fake".into(),
            sandbox: SandboxSummary { mode: "fake".into(), active: true, detail: "in memory".into() },
            confirm: mode,
            data_dir: None,
        }
    }
    fn limits(&self) -> JobLimits {
        JobLimits::default()
    }
    async fn describe(&self, plan: &RunPlan, _job: Option<&str>) -> Result<RunCommand, ToolError> {
        Ok(command(plan))
    }
    async fn create(&self, caller: &Caller, skill: &str) -> Result<JobRecord, ToolError> {
        let mut g = self.0.lock().unwrap();
        let id = format!("{:032x}", g.jobs.len() + 1);
        let record = JobRecord {
            id: id.clone(),
            skill: skill.into(),
            owner: caller.principal.clone(),
            created_at_ms: 0,
            state: JobState::Created,
            inputs: vec![],
            run: None,
        };
        g.jobs.insert(id, (record.clone(), vec![]));
        Ok(record)
    }
    async fn upload(&self, caller: &Caller, job: &str, path: &str, _offset: u64, bytes: Vec<u8>) -> Result<FileInfo, ToolError> {
        self.owned(caller, job)?;
        let mut g = self.0.lock().unwrap();
        let (record, files) = g.jobs.get_mut(job).unwrap();
        let info = FileInfo { path: path.into(), size: bytes.len() as u64, sha256: crate::core::package::digest(&bytes) };
        files.retain(|(p, _)| p != path);
        files.push((path.into(), bytes));
        record.inputs.retain(|f| f.path != path);
        record.inputs.push(info.clone());
        Ok(info)
    }
    async fn get(&self, caller: &Caller, job: &str) -> Result<JobRecord, ToolError> {
        self.owned(caller, job)
    }
    async fn run_new(&self, caller: &Caller, plan: RunPlan, inputs: Vec<(String, Vec<u8>)>, _: RunControl) -> Result<RunReport, ToolError> {
        let record = self.create(caller, &plan.skill).await?;
        let mut confirmed = vec![];
        for (p, b) in inputs {
            confirmed.push((p.clone(), crate::core::package::digest(&b)));
            self.upload(caller, &record.id, &p, 0, b).await?;
        }
        self.finish(&record.id, &plan, confirmed)
    }
    async fn run(
        &self,
        caller: &Caller,
        job: &str,
        plan: RunPlan,
        inputs: Vec<(String, String)>,
        _: RunControl,
    ) -> Result<RunReport, ToolError> {
        self.owned(caller, job)?;
        self.finish(job, &plan, inputs)
    }
    async fn status(&self, caller: &Caller, job: &str) -> Result<JobStatus, ToolError> {
        Ok(JobStatus { record: self.owned(caller, job)?, outputs: None })
    }
    async fn read(&self, caller: &Caller, job: &str, target: ReadTarget, offset: u64, _limit: u64) -> Result<Chunk, ToolError> {
        let record = self.owned(caller, job)?;
        let data = match target {
            ReadTarget::Stdout => record.run.map(|r| r.script.into_bytes()).unwrap_or_default(),
            _ => vec![],
        };
        Ok(Chunk { size: data.len() as u64, data, offset, eof: true })
    }
    async fn delete(&self, caller: &Caller, job: &str) -> Result<(), ToolError> {
        self.owned(caller, job)?;
        self.0.lock().unwrap().jobs.remove(job);
        Ok(())
    }
    async fn list(&self, caller: &Caller) -> Result<Vec<JobRecord>, ToolError> {
        Ok(self.0.lock().unwrap().jobs.values().map(|(r, _)| r.clone()).filter(|r| r.owner == caller.principal).collect())
    }
}

fn server(mode: ConfirmMode) -> (tempfile::TempDir, Arc<FakeExecutor>, ServerState) {
    let t = tempfile::tempdir().unwrap();
    let s = t.path().join("tool");
    std::fs::create_dir_all(s.join("scripts")).unwrap();
    std::fs::write(
        s.join("SKILL.md"),
        "---\nname: tool\ndescription: d\nmcp-host:\n  version: 1\n  run:\n    - script: scripts/a.py\n      interpreter: python\n---\nbody\n",
    )
    .unwrap();
    std::fs::write(s.join("scripts/a.py"), "print(1)").unwrap();
    let snapshot = Snapshot::scan(&[t.path().to_path_buf()], Grants::resolve(&|_| None, None), [Interpreter::Python].into());
    let fake = Arc::new(FakeExecutor::default());
    let state = ServerState::new(snapshot).with_execution(Execution::new(fake.clone(), mode));
    (t, fake, state)
}

fn cx(principal: &str) -> CallContext {
    CallContext { caller: Caller::named(principal), asker: Asker::default(), ..CallContext::default() }
}

fn json(reply: RunReply) -> Value {
    match reply {
        RunReply::Json(v) => v,
        RunReply::InputRequired(_) => panic!("no question expected"),
    }
}

fn run_input(confirm: Option<&str>, args: &[&str]) -> run::SkillRunInput {
    serde_json::from_value(serde_json::json!({
        "skill": "tool", "script": "scripts/a.py", "args": args,
        "inputs": [{"path": "in.txt", "content": "hello"}], "confirm": confirm,
    }))
    .unwrap()
}

#[tokio::test]
async fn preview_confirm_run_status_read_through_the_seam() {
    let (_t, fake, state) = server(ConfirmMode::Ask);
    let snap = state.snapshot();
    // The first call starts nothing: a preview from the executor's description, and a token.
    let preview = json(run::skill_run(&state, &snap, run_input(None, &["x"]), &cx("alice")).await.unwrap());
    assert_eq!(preview["status"], "confirmation-required");
    assert_eq!(preview["preview"]["command"]["backend"], "fake");
    assert_eq!(preview["preview"]["inputs"][0]["path"], "in.txt");
    assert!(fake.0.lock().unwrap().runs.is_empty(), "a preview runs nothing");
    let token = preview["token"].as_str().unwrap().to_string();
    // The token confirms exactly that call: other arguments are refused.
    let changed = run::skill_run(&state, &snap, run_input(Some(&token), &["y"]), &cx("alice")).await.unwrap_err();
    assert_eq!(changed.code, "call-changed");
    let done = json(run::skill_run(&state, &snap, run_input(Some(&token), &["x"]), &cx("alice")).await.unwrap());
    assert_eq!(
        (done["status"].as_str(), done["state"].as_str(), done["exitCode"].as_i64()),
        (Some("completed"), Some("succeeded"), Some(0))
    );
    assert_eq!(done["stdout"], "scripts/a.py");
    let runs = fake.0.lock().unwrap().runs.clone();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].2, vec![("in.txt".to_string(), crate::core::package::digest(b"hello"))], "the confirmed inputs reach the executor");
    // Reused token: refused.
    let again = run::skill_run(&state, &snap, run_input(Some(&token), &["x"]), &cx("alice")).await.unwrap_err();
    assert_eq!(again.code, "token-reused");
    // Status and read through the seam.
    let job = done["job"].as_str().unwrap().to_string();
    let status = run::job_status(&state, serde_json::from_value(serde_json::json!({"job": job})).unwrap(), &cx("alice")).await.unwrap();
    assert_eq!(status.record.state, JobState::Succeeded);
    let chunk = run::job_read(&state, serde_json::from_value(serde_json::json!({"job": job, "stream": "stdout"})).unwrap(), &cx("alice"))
        .await
        .unwrap();
    assert_eq!((chunk.content.as_str(), chunk.eof), ("scripts/a.py", true));
}

#[tokio::test]
async fn the_fence_runs_before_the_executor_sees_anything() {
    let (_t, fake, state) = server(ConfirmMode::Auto);
    let snap = state.snapshot();
    let bad: run::SkillRunInput =
        serde_json::from_value(serde_json::json!({"skill": "tool", "script": "scripts/../../etc/passwd"})).unwrap();
    assert_eq!(run::skill_run(&state, &snap, bad, &cx("alice")).await.unwrap_err().code, "bad-path");
    let undeclared: run::SkillRunInput = serde_json::from_value(serde_json::json!({"skill": "tool", "script": "SKILL.md"})).unwrap();
    assert_eq!(run::skill_run(&state, &snap, undeclared, &cx("alice")).await.unwrap_err().code, "not-declared");
    assert!(fake.0.lock().unwrap().jobs.is_empty() && fake.0.lock().unwrap().runs.is_empty());
}

#[tokio::test]
async fn an_upload_after_the_preview_starts_nothing() {
    let (_t, fake, state) = server(ConfirmMode::Ask);
    let snap = state.snapshot();
    let job = run::job_create(&state, &snap, serde_json::from_value(serde_json::json!({"skill": "tool"})).unwrap(), &cx("alice"))
        .await
        .unwrap()
        .id;
    let up = |content: &str| serde_json::from_value(serde_json::json!({"job": job, "path": "in.txt", "content": content})).unwrap();
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    run::job_upload(&state, up(&b64("first")), &cx("alice")).await.unwrap();
    let call = |confirm: Option<String>| {
        serde_json::from_value::<run::JobRunInput>(serde_json::json!({"job": job, "script": "scripts/a.py", "confirm": confirm})).unwrap()
    };
    let preview = json(run::job_run(&state, &snap, call(None), &cx("alice")).await.unwrap());
    let token = preview["token"].as_str().unwrap().to_string();
    // The input changes after the person saw it: the token no longer matches the call.
    run::job_upload(&state, up(&b64("second")), &cx("alice")).await.unwrap();
    let refused = run::job_run(&state, &snap, call(Some(token)), &cx("alice")).await.unwrap_err();
    assert_eq!(refused.code, "call-changed");
    assert!(fake.0.lock().unwrap().runs.is_empty());
}

#[tokio::test]
async fn another_principal_sees_no_job() {
    let (_t, _fake, state) = server(ConfirmMode::Auto);
    let snap = state.snapshot();
    let done = json(run::skill_run(&state, &snap, run_input(None, &[]), &cx("alice")).await.unwrap());
    let job = done["job"].as_str().unwrap().to_string();
    let id = || serde_json::from_value::<run::JobIdInput>(serde_json::json!({"job": job})).unwrap();
    assert_eq!(run::job_status(&state, id(), &cx("mallory")).await.unwrap_err().code, "job-not-found");
    assert_eq!(run::job_delete(&state, id(), &cx("mallory")).await.unwrap_err().code, "job-not-found");
    let listed = run::job_list(&state, Default::default(), &cx("mallory")).await.unwrap();
    assert_eq!(listed["jobs"].as_array().unwrap().len(), 0);
    assert!(run::job_status(&state, id(), &cx("alice")).await.is_ok());
}
