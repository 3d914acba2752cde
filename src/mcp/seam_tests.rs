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

/// A task: its owner, the job it runs in, the confirmed plan and inputs,
/// and what `status` shows.
struct FakeTask {
    owner: String,
    job: String,
    plan: RunPlan,
    confirmed: Vec<(String, String)>,
    state: TaskState,
    message: Option<String>,
    report: Option<RunReport>,
}

#[derive(Default)]
struct FakeJobs {
    jobs: HashMap<String, FakeJob>,
    runs: Vec<FakeRun>,
    tasks: HashMap<String, FakeTask>,
    /// The task ids `cancel` was called for, after the ownership check.
    cancels: Vec<String>,
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
        let backend_id = Some(format!("uid-{}", record.id));
        g.runs.push((plan.script.to_string(), plan.args.clone(), confirmed));
        let outputs = OutputListing { files: vec![], skipped: vec![], total_bytes: 0, truncated: false };
        Ok(RunReport {
            record,
            stdout: plan.script.as_str().as_bytes().to_vec(),
            stderr: vec![],
            outputs,
            command: command(plan),
            note: None,
            backend_id,
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
        Ok(Chunk { size: data.len() as u64, data, offset, eof: true, download: None })
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

impl FakeExecutor {
    /// The task's run ends: the same result a synchronous run of its plan gives.
    fn complete(&self, id: &str) {
        let (job, plan, confirmed) = {
            let g = self.0.lock().unwrap();
            let t = &g.tasks[id];
            (t.job.clone(), t.plan.clone(), t.confirmed.clone())
        };
        let report = self.finish(&job, &plan, confirmed).unwrap();
        let mut g = self.0.lock().unwrap();
        let t = g.tasks.get_mut(id).unwrap();
        (t.state, t.report) = (TaskState::Completed, Some(report));
    }

    fn set(&self, id: &str, state: TaskState, message: &str) {
        let mut g = self.0.lock().unwrap();
        let t = g.tasks.get_mut(id).unwrap();
        (t.state, t.message) = (state, Some(message.to_string()));
    }

    fn owned_task(&self, caller: &Caller, id: &str) -> Result<TaskView, ToolError> {
        let g = self.0.lock().unwrap();
        match g.tasks.get(id) {
            Some(t) if t.owner == caller.principal => Ok(TaskView {
                id: id.to_string(),
                state: t.state,
                message: t.message.clone(),
                report: t.report.clone(),
                created_at: "2026-01-01T00:00:00Z".into(),
                updated_at: "2026-01-01T00:00:01Z".into(),
            }),
            _ => Err(JobError::NotFound(id.into()).into()),
        }
    }
}

#[async_trait::async_trait]
impl Tasks for FakeExecutor {
    async fn submit(&self, caller: &Caller, plan: RunPlan, inputs: Vec<(String, Vec<u8>)>, key: &str) -> Result<TaskView, ToolError> {
        let record = self.create(caller, &plan.skill).await?;
        let mut confirmed = vec![];
        for (p, b) in inputs {
            confirmed.push((p.clone(), crate::core::package::digest(&b)));
            self.upload(caller, &record.id, &p, 0, b).await?;
        }
        let id = format!("task-{key}");
        let task = FakeTask {
            owner: caller.principal.clone(),
            job: record.id,
            plan,
            confirmed,
            state: TaskState::Working,
            message: Some("accepted".into()),
            report: None,
        };
        self.0.lock().unwrap().tasks.insert(id.clone(), task);
        self.owned_task(caller, &id)
    }
    async fn status(&self, caller: &Caller, id: &str) -> Result<TaskView, ToolError> {
        self.owned_task(caller, id)
    }
    async fn cancel(&self, caller: &Caller, id: &str) -> Result<(), ToolError> {
        self.owned_task(caller, id)?;
        self.0.lock().unwrap().cancels.push(id.to_string());
        self.set(id, TaskState::Cancelled, "cancelled by the caller");
        Ok(())
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
        RunReply::Task(t) => panic!("no task expected: {t:?}"),
        RunReply::Limited(l) => panic!("not rate limited: {l}"),
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

/// What could not be staged is refused at the preview, before a token
/// exists for it: more inline inputs than a job holds (one over the cap,
/// and the cap itself passes), one path twice, a file where another input
/// needs a directory.
#[tokio::test]
async fn a_preview_refuses_inline_inputs_that_could_not_all_be_staged() {
    let (_t, fake, state) = server(ConfirmMode::Ask);
    let snap = state.snapshot();
    let max = fake.limits().files;
    let with = |inputs: Vec<Value>| -> run::SkillRunInput {
        serde_json::from_value(serde_json::json!({"skill": "tool", "script": "scripts/a.py", "inputs": inputs})).unwrap()
    };
    let many = |n: usize| (0..n).map(|i| serde_json::json!({"path": format!("d/{i}.txt"), "content": ""})).collect::<Vec<_>>();
    let over = run::skill_run(&state, &snap, with(many(max + 1)), &cx("alice")).await.unwrap_err();
    assert_eq!(over.code, "job-too-many-files", "{}", over.message);
    assert!(over.message.contains(&format!("{}", max + 1)) && over.message.contains(&max.to_string()), "{}", over.message);
    let at = json(run::skill_run(&state, &snap, with(many(max)), &cx("alice")).await.unwrap());
    assert_eq!(at["status"], "confirmation-required", "the cap itself is allowed");
    let twice = vec![serde_json::json!({"path": "a.txt", "content": "1"}), serde_json::json!({"path": "a.txt", "content": "2"})];
    assert!(run::skill_run(&state, &snap, with(twice), &cx("alice")).await.unwrap_err().message.contains("given twice"));
    let nested = vec![serde_json::json!({"path": "a", "content": "1"}), serde_json::json!({"path": "a/b.txt", "content": "2"})];
    let err = run::skill_run(&state, &snap, with(nested), &cx("alice")).await.unwrap_err();
    assert!(err.message.contains("a/b.txt") && err.message.contains("another input file"), "{}", err.message);
    assert!(fake.0.lock().unwrap().runs.is_empty() && fake.0.lock().unwrap().jobs.is_empty(), "nothing was run or made");
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

#[tokio::test]
async fn a_swap_leaves_calls_in_flight_on_their_snapshot_and_wakes_only_on_change() {
    let (t, _fake, state) = server(ConfirmMode::Auto);
    let mut changes = state.snapshots.subscribe();
    let held = state.snapshot();
    let rescan = || Snapshot::scan(&[t.path().to_path_buf()], Grants::resolve(&|_| None, None), [Interpreter::Python].into());
    // The same tree again: no swap, nobody woken.
    assert!(!state.snapshots.replace(rescan()));
    assert!(!changes.has_changed().unwrap());
    // A new skill: swapped, subscribers woken once; the held snapshot is untouched.
    let other = t.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("SKILL.md"), "---\nname: other\ndescription: d\n---\nbody\n").unwrap();
    assert!(state.snapshots.replace(rescan()));
    assert!(changes.has_changed().unwrap());
    changes.borrow_and_update();
    assert_eq!(held.catalog.names(), vec!["tool"]);
    assert_eq!(state.snapshot().catalog.names(), vec!["other", "tool"]);
    assert!(!changes.has_changed().unwrap());
}

#[test]
fn tools_only_when_bound_hides_every_tool_until_a_skill_is_served() {
    let empty = tempfile::tempdir().unwrap();
    let scan =
        |root: &std::path::Path| Snapshot::scan(&[root.to_path_buf()], Grants::resolve(&|_| None, None), [Interpreter::Python].into());
    let fake = Arc::new(FakeExecutor::default());
    let state = ServerState::new(scan(empty.path())).with_execution(Execution::new(fake, ConfirmMode::Auto)).tools_only_when_bound();
    assert!(super::offered_tools(&state).is_empty());
    assert!(super::instructions(&state).contains("none is bound yet"));
    let (t, _f, _s) = server(ConfirmMode::Auto);
    assert!(state.snapshots.replace(scan(t.path())));
    assert_eq!(super::offered_tools(&state).len(), super::tool_definitions().len());
    assert!(super::instructions(&state).contains("skill_list"));
    // The standalone server always offers its tools, even over an empty root.
    let standalone = ServerState::new(scan(empty.path()));
    assert!(!super::offered_tools(&standalone).is_empty());
}

// ---------- MCP Tasks ----------

fn scan(root: &std::path::Path) -> Snapshot {
    Snapshot::scan(&[root.to_path_buf()], Grants::resolve(&|_| None, None), [Interpreter::Python].into())
}

/// A server whose execution runs `skill_run` as tasks through the fake.
fn task_server(mode: ConfirmMode) -> (tempfile::TempDir, Arc<FakeExecutor>, ServerState) {
    let (t, fake, mut state) = server(mode);
    let exec = state.execution.take().unwrap().with_tasks(fake.clone());
    (t, fake, state.with_execution(exec))
}

fn task_cx(principal: &str) -> CallContext {
    CallContext { tasks: true, ..cx(principal) }
}

/// The `CallToolResult` a reply becomes on the wire, as JSON.
fn wire(reply: Result<RunReply, ToolError>) -> Value {
    match super::run_reply(reply).expect("not a protocol error") {
        rmcp::model::CallToolResponse::Complete(r) => serde_json::to_value(r).unwrap(),
        other => panic!("a tool result expected: {other:?}"),
    }
}

/// Preview the call, then confirm it with the preview's token.
async fn confirmed(state: &ServerState, cx: &CallContext) -> Result<RunReply, ToolError> {
    let snap = state.snapshot();
    let preview = json(run::skill_run(state, &snap, run_input(None, &["x"]), cx).await.unwrap());
    assert_eq!(preview["status"], "confirmation-required");
    let token = preview["token"].as_str().unwrap().to_string();
    run::skill_run(state, &snap, run_input(Some(&token), &["x"]), cx).await
}

fn task_id(reply: RunReply) -> String {
    match reply {
        RunReply::Task(view) => {
            let t = super::tasks::created(&view);
            assert_eq!(t.task.status, rmcp::model::TaskStatus::Working);
            assert!(t.task.poll_interval_ms.is_some_and(|ms| ms > 0));
            t.task.task_id
        }
        other => panic!("a task expected: {other:?}"),
    }
}

#[tokio::test]
async fn a_task_client_gets_a_task_only_after_the_confirmation() {
    let (_t, fake, state) = task_server(ConfirmMode::Ask);
    let snap = state.snapshot();
    // The first call is the preview, for a task client too: nothing is submitted.
    let preview = json(run::skill_run(&state, &snap, run_input(None, &["x"]), &task_cx("alice")).await.unwrap());
    assert_eq!(preview["status"], "confirmation-required");
    assert!(fake.0.lock().unwrap().tasks.is_empty() && fake.0.lock().unwrap().jobs.is_empty(), "a preview submits nothing");
    // A wrong token is refused before any task exists.
    let forged = run::skill_run(&state, &snap, run_input(Some("forged"), &["x"]), &task_cx("alice")).await.unwrap_err();
    assert!(!forged.code.is_empty());
    assert!(fake.0.lock().unwrap().tasks.is_empty());
    // Confirmed: a task at once, its run not carried out by the call.
    let token = preview["token"].as_str().unwrap().to_string();
    let id = task_id(run::skill_run(&state, &snap, run_input(Some(&token), &["x"]), &task_cx("alice")).await.unwrap());
    let g = fake.0.lock().unwrap();
    assert!(g.runs.is_empty(), "the call returned before the run");
    assert_eq!(g.tasks[&id].confirmed, vec![("in.txt".to_string(), crate::core::package::digest(b"hello"))]);
    assert_eq!(g.tasks[&id].plan.args, vec!["x".to_string()]);
}

#[tokio::test]
async fn without_the_client_capability_or_a_tasks_backend_the_call_runs_to_its_end() {
    // A client that did not declare tasks, on a server with a tasks backend.
    let (_t, fake, state) = task_server(ConfirmMode::Ask);
    let done = json(confirmed(&state, &cx("alice")).await.unwrap());
    assert_eq!(done["status"], "completed");
    assert!(fake.0.lock().unwrap().tasks.is_empty());
    // A task client on a server without one (the standalone server's case).
    let (_t2, fake2, plain) = server(ConfirmMode::Ask);
    let done = json(confirmed(&plain, &task_cx("alice")).await.unwrap());
    assert_eq!(done["status"], "completed");
    assert_eq!(fake2.0.lock().unwrap().runs.len(), 1);
}

#[tokio::test]
async fn a_completed_task_carries_the_result_the_call_would_have_returned() {
    // The same call on two fresh servers: synchronous on one, as a task on the other.
    let (_t1, _f1, sync) = task_server(ConfirmMode::Ask);
    let expected = wire(confirmed(&sync, &cx("alice")).await);
    let (_t2, fake, tasks) = task_server(ConfirmMode::Ask);
    let id = task_id(confirmed(&tasks, &task_cx("alice")).await.unwrap());
    let alice = Caller::named("alice");
    let working = super::tasks::get(&tasks, &alice, &id).await.unwrap();
    assert_eq!(working.task.payload, rmcp::model::TaskPayload::Working);
    assert_eq!(working.task.task.status_message.as_deref(), Some("accepted"));
    fake.complete(&id);
    let done = super::tasks::get(&tasks, &alice, &id).await.unwrap();
    let rmcp::model::TaskPayload::Completed { result } = done.task.payload else { panic!("completed expected: {done:?}") };
    assert_eq!(serde_json::to_string(&Value::Object(result)).unwrap(), serde_json::to_string(&expected).unwrap());
    assert_eq!(expected["structuredContent"]["stdout"], "scripts/a.py", "the compared result is a real run's");
}

#[tokio::test]
async fn failed_and_cancelled_tasks_say_so() {
    let (_t, fake, state) = task_server(ConfirmMode::Auto);
    let alice = Caller::named("alice");
    let id = task_id(run::skill_run(&state, &state.snapshot(), run_input(None, &[]), &task_cx("alice")).await.unwrap());
    fake.set(&id, TaskState::Failed, "the pod did not confirm it stopped");
    let failed = super::tasks::get(&state, &alice, &id).await.unwrap();
    let rmcp::model::TaskPayload::Failed { error } = failed.task.payload else { panic!("failed expected: {failed:?}") };
    assert_eq!(error["message"], "the pod did not confirm it stopped");
    assert_eq!(failed.task.task.status, rmcp::model::TaskStatus::Failed);
    // Cancel calls through to the backend; the next get shows it.
    fake.set(&id, TaskState::Working, "running");
    super::tasks::cancel(&state, &alice, &id).await.unwrap();
    assert_eq!(fake.0.lock().unwrap().cancels, vec![id.clone()]);
    let cancelled = super::tasks::get(&state, &alice, &id).await.unwrap();
    assert_eq!(cancelled.task.payload, rmcp::model::TaskPayload::Cancelled);
}

#[tokio::test]
async fn another_principals_task_is_as_unknown_as_a_made_up_one() {
    let (_t, fake, state) = task_server(ConfirmMode::Auto);
    let id = task_id(run::skill_run(&state, &state.snapshot(), run_input(None, &[]), &task_cx("alice")).await.unwrap());
    let mallory = Caller::named("mallory");
    let unknown = |id: &str| rmcp::ErrorData::invalid_params(format!("unknown task: {id}"), None);
    assert_eq!(super::tasks::get(&state, &mallory, &id).await.unwrap_err(), unknown(&id));
    assert_eq!(super::tasks::get(&state, &mallory, "task-made-up").await.unwrap_err(), unknown("task-made-up"));
    assert_eq!(super::tasks::cancel(&state, &mallory, &id).await.unwrap_err(), unknown(&id));
    assert!(fake.0.lock().unwrap().cancels.is_empty(), "mallory's cancel never reached alice's task");
    assert!(super::tasks::get(&state, &Caller::named("alice"), &id).await.is_ok());
}

/// Allows everything but one action.
struct Deny(super::state::Action);

#[async_trait::async_trait]
impl super::state::Authorize for Deny {
    async fn authorize(&self, _caller: &Caller, action: super::state::Action) -> Result<(), ToolError> {
        if action == self.0 {
            return Err(ToolError::new(super::error::codes::FORBIDDEN, format!("{action:?} is not allowed")));
        }
        Ok(())
    }
}

#[tokio::test]
async fn tasks_get_needs_read_jobs_and_tasks_cancel_needs_delete_jobs() {
    use super::state::Action;
    let (t, fake, state) = task_server(ConfirmMode::Auto);
    let id = task_id(run::skill_run(&state, &state.snapshot(), run_input(None, &[]), &task_cx("alice")).await.unwrap());
    let alice = Caller::named("alice");
    // The same backend, behind an authorizer that refuses one action.
    let with = |action| {
        let exec = Execution::new(fake.clone(), ConfirmMode::Auto).with_tasks(fake.clone());
        ServerState::new(scan(t.path())).with_execution(exec).with_authorizer(Arc::new(Deny(action)))
    };
    let no_read = with(Action::ReadJobs);
    let err = super::tasks::get(&no_read, &alice, &id).await.unwrap_err();
    assert_eq!((err.code, err.data), (rmcp::model::ErrorCode::INVALID_REQUEST, Some(serde_json::json!({"code": "forbidden"}))));
    assert!(super::tasks::cancel(&no_read, &alice, &id).await.is_ok(), "cancel is not a read");
    let no_delete = with(Action::DeleteJobs);
    fake.set(&id, TaskState::Working, "running");
    fake.0.lock().unwrap().cancels.clear();
    assert_eq!(super::tasks::cancel(&no_delete, &alice, &id).await.unwrap_err().code, rmcp::model::ErrorCode::INVALID_REQUEST);
    assert!(fake.0.lock().unwrap().cancels.is_empty(), "a refused cancel never reaches the backend");
    assert!(super::tasks::get(&no_delete, &alice, &id).await.is_ok());
}

#[test]
fn the_tasks_extension_is_advertised_only_with_a_tasks_backend() {
    let (t, _f, plain) = server(ConfirmMode::Ask);
    assert!(!super::capabilities(&plain).supports_tasks());
    let reader = ServerState::new(scan(t.path()));
    assert!(!super::capabilities(&reader).supports_tasks());
    let (_t2, _f2, tasks) = task_server(ConfirmMode::Ask);
    let caps = super::capabilities(&tasks);
    assert!(caps.supports_tasks());
    assert!(caps.skills().is_some() && caps.tools.is_some(), "the other capabilities stay");
}

#[tokio::test]
async fn a_retried_job_run_reaches_the_executor_only_with_its_token() {
    // Signed tokens (the gateway's) are not remembered: a retry of the
    // confirmed call redeems again and reaches the executor, which attaches
    // to the run that call started; a call without the token is refused.
    let (t, fake, _) = server(ConfirmMode::Ask);
    let signed =
        Arc::new(crate::core::confirm::SignedConfirmations::new(b"seam-test-key-of-32-bytes-or-more!", crate::core::confirm::TOKEN_TTL));
    let exec = Execution::new(fake.clone(), ConfirmMode::Ask).with_confirmations(signed, "team");
    let state = ServerState::new(scan(t.path())).with_execution(exec);
    let snap = state.snapshot();
    let job = run::job_create(&state, &snap, serde_json::from_value(serde_json::json!({"skill": "tool"})).unwrap(), &cx("alice"))
        .await
        .unwrap()
        .id;
    let call = |confirm: Option<String>| {
        serde_json::from_value::<run::JobRunInput>(serde_json::json!({"job": job, "script": "scripts/a.py", "confirm": confirm})).unwrap()
    };
    let preview = json(run::job_run(&state, &snap, call(None), &cx("alice")).await.unwrap());
    let token = preview["token"].as_str().unwrap().to_string();
    json(run::job_run(&state, &snap, call(Some(token.clone())), &cx("alice")).await.unwrap());
    json(run::job_run(&state, &snap, call(Some(token)), &cx("alice")).await.unwrap());
    assert_eq!(fake.0.lock().unwrap().runs.len(), 2, "the retry reached the executor");
    let refused = run::job_run(&state, &snap, call(None), &cx("alice")).await.unwrap_err();
    assert_eq!(refused.code, "job-already-ran", "{refused:?}");
    // Another call (other args) with that token is not the confirmed one.
    let other = serde_json::from_value::<run::JobRunInput>(
        serde_json::json!({"job": job, "script": "scripts/a.py", "args": ["x"], "confirm": preview["token"]}),
    )
    .unwrap();
    assert_eq!(run::job_run(&state, &snap, other, &cx("alice")).await.unwrap_err().code, "call-changed");
    assert_eq!(fake.0.lock().unwrap().runs.len(), 2);
}

/// Previews are calls, not runs; a confirmed call over the runs limit runs
/// nothing, keeps its token for the retry, and leaves another principal's runs alone.
#[tokio::test]
async fn the_runs_limit_counts_confirmed_runs_only_and_keeps_the_token() {
    use super::ratelimit::{Limit, RateLimits};
    let (_t, fake, state) = server(ConfirmMode::Ask);
    let state = state.with_rate_limits(RateLimits { runs_per_minute: 1, burst_runs: 1, ..RateLimits::default() });
    let snap = state.snapshot();
    let preview = || async { json(run::skill_run(&state, &snap, run_input(None, &["x"]), &cx("alice")).await.unwrap()) };
    for _ in 0..20 {
        assert_eq!(preview().await["status"], "confirmation-required", "a preview costs no run");
    }
    json(confirmed(&state, &cx("alice")).await.unwrap());
    assert_eq!(fake.0.lock().unwrap().runs.len(), 1);
    let token = preview().await["token"].as_str().unwrap().to_string();
    let jobs_before = fake.0.lock().unwrap().jobs.len();
    match run::skill_run(&state, &snap, run_input(Some(&token), &["x"]), &cx("alice")).await.unwrap() {
        RunReply::Limited(limited) => {
            assert_eq!(limited.limit(), Limit::Runs);
            assert!(limited.retry_after_secs() >= 1);
        }
        other => panic!("rate limited expected: {other:?}"),
    }
    assert_eq!(fake.0.lock().unwrap().runs.len(), 1, "nothing ran");
    assert_eq!(fake.0.lock().unwrap().jobs.len(), jobs_before, "no job was created");
    // Another principal's runs are untouched.
    json(confirmed(&state, &cx("bob")).await.unwrap());
    assert_eq!(fake.0.lock().unwrap().runs.len(), 2);
    // The refused token was not redeemed: with a run to spend (here: the
    // limit lifted, which the token store does not see), it still works.
    let state = state.with_rate_limits(RateLimits::default());
    let done = json(run::skill_run(&state, &snap, run_input(Some(&token), &["x"]), &cx("alice")).await.unwrap());
    assert_eq!(done["status"], "completed", "{done}");
}

/// The trail of one run: the preview, the confirmed start, the verdict with
/// the backend's id, files in and out; arguments and inputs by digest only.
#[tokio::test]
async fn a_run_leaves_preview_start_and_verdict_in_the_audit_trail_by_digest() {
    use crate::audit::{digest_json, Audit, SharedBuffer, Sink};
    let (_t, _fake, state) = server(ConfirmMode::Ask);
    let buffer = SharedBuffer::default();
    let state = state.with_audit(Audit::new("serve", vec![Sink::buffer(buffer.clone())]));
    let snap = state.snapshot();
    let secret = "s3cr3t-argument";
    let preview = json(run::skill_run(&state, &snap, run_input(None, &[secret]), &cx("alice")).await.unwrap());
    let token = preview["token"].as_str().unwrap().to_string();
    let done = json(run::skill_run(&state, &snap, run_input(Some(&token), &[secret]), &cx("alice")).await.unwrap());
    let job = done["job"].as_str().unwrap().to_string();
    let read = serde_json::from_value::<run::JobReadInput>(serde_json::json!({"job": job, "stream": "stdout"})).unwrap();
    run::job_read(&state, read, &cx("alice")).await.unwrap();

    let records = buffer.records();
    let events: Vec<(&str, &str)> = records.iter().map(|r| (r["event"].as_str().unwrap(), r["outcome"].as_str().unwrap())).collect();
    assert_eq!(
        events,
        [("run.preview", "confirmation-required"), ("run.start", "ok"), ("run.verdict", "ok"), ("file.download", "ok")],
        "{records:#?}"
    );
    let args = digest_json(&[secret]);
    for r in &records[..3] {
        assert_eq!(r["principal"]["name"], "alice");
        assert_eq!(
            (r["tool"].as_str(), r["skill"].as_str(), r["script"].as_str()),
            (Some("skill_run"), Some("tool"), Some("scripts/a.py"))
        );
        assert_eq!(r["argsDigest"], args.as_str());
    }
    let input = &records[0]["inputs"][0];
    assert_eq!((input["path"].as_str(), input["size"].as_u64()), (Some("in.txt"), Some(5)));
    assert_eq!(input["sha256"].as_str(), Some(crate::core::package::digest(b"hello").as_str()));
    assert_eq!(records[1]["confirmation"], "token");
    assert_eq!(records[2]["job"], job.as_str());
    assert_eq!(records[2]["skilljobUid"], format!("uid-{job}"), "the backend's id of the run");
    assert_eq!(records[2]["state"], "succeeded");
    assert_eq!(records[3]["job"], job.as_str());
    let text = serde_json::to_string(&records).unwrap();
    assert!(!text.contains(secret) && !text.contains("hello"), "values never reach the trail: {text}");

    // A refused run leaves a record saying why, and no start.
    let refused =
        serde_json::from_value::<run::SkillRunInput>(serde_json::json!({"skill": "tool", "script": "scripts/../../etc/passwd"})).unwrap();
    assert!(run::skill_run(&state, &snap, refused, &cx("mallory")).await.is_err());
    assert_eq!(buffer.records().len(), records.len(), "a call the fence refused is the tool.call record's (written by the dispatcher)");
}

/// Over the runs limit: a `run.start` record that says so, with the retry-after.
#[tokio::test]
async fn a_rate_limited_start_is_recorded_with_its_retry_after() {
    use super::ratelimit::RateLimits;
    use crate::audit::{Audit, SharedBuffer, Sink};
    let (_t, _fake, state) = server(ConfirmMode::Ask);
    let buffer = SharedBuffer::default();
    let state = state
        .with_rate_limits(RateLimits { runs_per_minute: 1, burst_runs: 1, ..RateLimits::default() })
        .with_audit(Audit::new("serve", vec![Sink::buffer(buffer.clone())]));
    json(confirmed(&state, &cx("alice")).await.unwrap());
    assert!(matches!(confirmed(&state, &cx("alice")).await.unwrap(), RunReply::Limited(_)));
    let starts: Vec<serde_json::Value> = buffer.records().into_iter().filter(|r| r["event"] == "run.start").collect();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0]["outcome"], "ok");
    assert_eq!(starts[1]["outcome"], "rate-limited");
    assert_eq!(starts[1]["code"], "rate-limited");
    assert!(starts[1]["retryAfterSeconds"].as_u64().unwrap() >= 1, "{}", starts[1]);
}

/// `skill_search` scope `catalog` on a server with a catalog of two entries.
mod catalog_search {
    use super::*;
    use crate::catalog::cluster::tests::catalog;
    use crate::catalog::cluster::{config_map, encode};
    use crate::catalog::live::LiveCatalog;
    use crate::mcp::error::codes;
    use crate::mcp::search::{skill_search, Scope, SkillSearchInput};
    use crate::mcp::state::Action;

    fn live() -> Arc<LiveCatalog> {
        let live = LiveCatalog::from_snapshot().unwrap();
        let c = catalog(&["xlsx", "pdf"], |i| ["Edit Excel spreadsheets.", "Fill PDF forms."][i].into());
        live.apply(Some(&config_map("ops", &c, encode(&c).unwrap(), Some("1".into()))));
        Arc::new(live)
    }

    fn input(query: &str, scope: Scope, limit: Option<usize>) -> SkillSearchInput {
        SkillSearchInput { query: query.into(), category: None, limit, scope }
    }

    async fn search(state: &ServerState, query: &str, scope: Scope, limit: Option<usize>) -> Result<Value, ToolError> {
        let out = skill_search(state, &state.snapshot(), &Caller::named("alice"), input(query, scope, limit)).await?;
        Ok(serde_json::to_value(out).unwrap())
    }

    #[tokio::test]
    async fn an_allowed_caller_finds_catalog_entries_with_what_installing_takes() {
        let t = tempfile::tempdir().unwrap();
        let state = ServerState::new(scan(t.path())).with_catalog(live()).with_authorizer(Arc::new(Deny(Action::Run)));
        let out = search(&state, "spreadsheets", Scope::Catalog, None).await.unwrap();
        assert_eq!(out["total"], 1);
        let hit = &out["results"][0];
        assert_eq!(hit["id"], "acme/skills/xlsx");
        assert_eq!(hit["name"], "xlsx");
        assert_eq!(hit["description"], "Edit Excel spreadsheets.");
        assert_eq!((&hit["author"], &hit["category"]), (&Value::from("Acme"), &Value::from("office")));
        assert_eq!(hit["repository"], "https://github.com/acme/skills");
        assert_eq!(hit["commit"], crate::catalog::cluster::tests::COMMIT);
        assert_eq!(hit["path"], "skills/xlsx");
        assert_eq!(hit["install"], "skill-operator catalog install acme/skills/xlsx --cluster | kubectl apply -f -");
        assert_eq!(out["catalog"]["origin"], "ConfigMap ops/skill-operator-catalog");
        assert_eq!(out["catalog"]["entries"], 2);
        // The default scope is still the bound skills, without catalog fields.
        let bound = search(&state, "spreadsheets", Scope::Bound, None).await.unwrap();
        assert_eq!(bound["total"], 0, "nothing is bound here");
        assert!(bound.get("catalog").is_none());
    }

    #[tokio::test]
    async fn a_caller_who_may_not_create_skillpackages_is_refused_by_name() {
        let t = tempfile::tempdir().unwrap();
        let state = ServerState::new(scan(t.path())).with_catalog(live()).with_authorizer(Arc::new(Deny(Action::SearchCatalog)));
        let err = search(&state, "spreadsheets", Scope::Catalog, None).await.unwrap_err();
        assert_eq!(err.code, codes::FORBIDDEN);
        assert!(err.message.contains("SearchCatalog"), "{}", err.message);
        // Refused before its arguments are looked at.
        assert_eq!(search(&state, "", Scope::Catalog, Some(0)).await.unwrap_err().code, codes::FORBIDDEN);
        assert!(search(&state, "spreadsheets", Scope::Bound, None).await.is_ok(), "the bound scope does not need it");
    }

    #[tokio::test]
    async fn both_scopes_have_the_same_caps() {
        use crate::core::limits::{SEARCH_QUERY_MAX_CHARS, SEARCH_RESULTS_MAX};
        let t = tempfile::tempdir().unwrap();
        let state = ServerState::new(scan(t.path())).with_catalog(live());
        for scope in [Scope::Bound, Scope::Catalog] {
            assert!(search(&state, "pdf", scope, Some(SEARCH_RESULTS_MAX)).await.is_ok());
            for bad in [0, SEARCH_RESULTS_MAX + 1] {
                assert_eq!(search(&state, "pdf", scope, Some(bad)).await.unwrap_err().code, codes::INVALID_ARGUMENTS, "{scope:?}");
            }
            let over = "a".repeat(SEARCH_QUERY_MAX_CHARS + 1);
            let err = search(&state, &over, scope, None).await.unwrap_err();
            assert!(err.message.contains(&format!("at most {SEARCH_QUERY_MAX_CHARS}")), "{scope:?}: {}", err.message);
        }
        let limited = search(&state, "acme", Scope::Catalog, Some(1)).await.unwrap();
        assert_eq!(
            (limited["results"].as_array().unwrap().len(), &limited["total"]),
            (1, &Value::from(2)),
            "total counts what the limit cut"
        );
    }

    #[tokio::test]
    async fn a_server_without_a_catalog_points_at_the_command_line() {
        let t = tempfile::tempdir().unwrap();
        let state = ServerState::new(scan(t.path()));
        let err = search(&state, "pdf", Scope::Catalog, None).await.unwrap_err();
        assert_eq!(err.code, codes::NO_CATALOG);
        assert!(err.message.contains("skill-operator catalog search"), "{}", err.message);
    }

    #[test]
    fn install_commands_quote_ids_that_are_not_plain() {
        use crate::mcp::search::install_command;
        assert_eq!(install_command("a/b/c-d_1.x"), "skill-operator catalog install a/b/c-d_1.x --cluster | kubectl apply -f -");
        assert_eq!(install_command("o/r/it's"), "skill-operator catalog install 'o/r/it'\\''s' --cluster | kubectl apply -f -");
        assert_eq!(install_command("o/r/日本"), "skill-operator catalog install 'o/r/日本' --cluster | kubectl apply -f -");
    }
}
