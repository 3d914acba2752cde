//! The run tools: `skill_run` (one call: preview, confirm, run in an
//! implicit job) and the job tools for the multi-step flow (create, upload,
//! run, status, read, delete, list).
//!
//! Every run goes through the same steps: the core's fence decides whether
//! the call may run and how ([`crate::core::fence::plan`]); nothing starts
//! until the exact call is confirmed ([`crate::core::confirm`]); the runner
//! carries out the plan; the job store keeps inputs, outputs and streams.

use std::sync::Arc;
use std::time::Instant;

use base64::Engine;
use rmcp::service::{ElicitationError, RequestContext};
use rmcp::RoleServer;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use rmcp::model::{
    ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, InputRequest, InputRequiredResult,
    ProtocolVersion,
};

use crate::core::confirm::{call_digest, ConfirmMode, Confirmations, TOKEN_TTL};
use crate::core::fence::{self, RunPlan};
use crate::core::jobs::{FileInfo, JobError, JobRecord, JobStore, OutputListing, ReadTarget, RunFinish};
use crate::runner::local::{Command, LocalRunner, RunError, SandboxStatus};

use super::state::ServerState;
use super::tools::ToolError;

/// What executes runs: the backend, the job store, the confirmation gate.
pub struct Execution {
    pub runner: LocalRunner,
    pub jobs: JobStore,
    pub confirmations: Confirmations,
    pub mode: ConfirmMode,
    pub data_dir: std::path::PathBuf,
}

/// Execution settings shown by `skill_list`.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionSummary {
    pub sandbox: SandboxStatus,
    /// `ask`, `auto` or `refuse`.
    pub confirm: ConfirmMode,
    pub data_dir: String,
}

impl Execution {
    pub fn summary(&self) -> ExecutionSummary {
        ExecutionSummary { sandbox: self.runner.sandbox_status(), confirm: self.mode, data_dir: self.data_dir.display().to_string() }
    }
}

impl From<JobError> for ToolError {
    fn from(err: JobError) -> Self {
        ToolError::new(err.code(), err.to_string())
    }
}

impl From<fence::Refusal> for ToolError {
    fn from(err: fence::Refusal) -> Self {
        ToolError::new(err.code(), err.to_string())
    }
}

impl From<RunError> for ToolError {
    fn from(err: RunError) -> Self {
        let code = match &err {
            RunError::Busy(_) => "busy",
            RunError::SandboxRequired(_) => "sandbox-required",
            RunError::NoInterpreter { .. } => "no-interpreter",
            RunError::Prepare { .. } => "prepare-failed",
            RunError::Exec(_) => "exec-failed",
        };
        ToolError::new(code, err.to_string())
    }
}

fn execution(state: &ServerState) -> Result<&Arc<Execution>, ToolError> {
    state
        .execution
        .as_ref()
        .ok_or_else(|| ToolError::new("no-execution", "this server does not run scripts (no execution backend configured)"))
}

// ---------- inputs ----------

/// An input file sent inline with `skill_run`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InlineInput {
    /// Path inside the job's work directory, e.g. `data/input.csv`.
    pub path: String,
    /// The file's content: UTF-8 text, or base64 when `encoding` is `base64`.
    pub content: String,
    /// `utf-8` (default) or `base64`.
    #[serde(default)]
    pub encoding: Option<String>,
}

fn decode_input(input: &InlineInput) -> Result<Vec<u8>, ToolError> {
    match input.encoding.as_deref() {
        None | Some("utf-8") | Some("text") => Ok(input.content.clone().into_bytes()),
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(input.content.as_bytes())
            .map_err(|e| ToolError::new("bad-base64", format!("input {}: not valid base64: {e}", input.path))),
        Some(other) => Err(ToolError::new("bad-encoding", format!("input {}: encoding {other:?}; use utf-8 or base64", input.path))),
    }
}

// ---------- preview / result shapes ----------

/// What a run would do, shown before anything starts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    pub skill: String,
    pub script: String,
    pub interpreter: String,
    /// The job the run uses (`null`: a new job is created for it).
    pub job: Option<String>,
    pub command: Command,
    pub inputs: Vec<InputSummary>,
    /// Hosts the skill declares it reaches.
    pub egress: Vec<String>,
    pub grant_from: String,
}

#[derive(Debug, Serialize)]
pub struct InputSummary {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// The call a confirmation token is bound to.
#[derive(Serialize)]
struct BoundCall<'a> {
    tool: &'a str,
    skill: &'a str,
    script: &'a str,
    args: &'a [String],
    job: Option<&'a str>,
    inputs: Vec<(&'a str, &'a str)>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    /// Always `completed`: the script ran (whatever its exit).
    pub status: &'static str,
    pub job: String,
    /// Job state after the run: succeeded, failed or timed-out.
    pub state: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout: String,
    pub stderr: String,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub outputs: OutputListing,
    pub command: Command,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// How a gated call ended: a preview waiting for confirmation, a question
/// for the client (2026-07-28 input-required round trip), or a run.
pub enum Gate {
    Preview(Value),
    Ask(InputRequiredResult),
    Run,
}

/// What a run tool answers: JSON (a preview or a result), or a question the
/// client must answer before the call can go on.
pub enum RunReply {
    Json(Value),
    InputRequired(InputRequiredResult),
}

/// The key of the confirmation question in an input-required round trip.
const CONFIRM_INPUT: &str = "confirm-run";

/// The answers and handle a 2026-07-28 client sends when it retries a call.
#[derive(Default, Clone)]
pub struct Retry {
    pub input_responses: Option<rmcp::model::InputResponses>,
    pub request_state: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
struct RunConfirmation {
    /// Run exactly the call shown?
    run: bool,
}
rmcp::elicit_safe!(RunConfirmation);

/// Confirmation step shared by `skill_run` and `skill_job_run`.
async fn gate(
    exec: &Execution,
    preview: &Preview,
    bound: &BoundCall<'_>,
    confirm: Option<&str>,
    retry: &Retry,
    context: &RequestContext<RoleServer>,
) -> Result<Gate, ToolError> {
    let preview_json = serde_json::to_value(preview).unwrap_or_default();
    match exec.mode {
        ConfirmMode::Refuse => Err(ToolError::new(
            "runs-refused",
            "this server's confirmation mode is `refuse`: nothing runs here (the preview shows what would have run)",
        )
        .with_detail(json!({ "preview": preview_json }))),
        ConfirmMode::Auto => Ok(Gate::Run),
        ConfirmMode::Ask => {
            let digest = call_digest(bound);
            if let Some(token) = confirm {
                exec.confirmations.redeem(token, &digest, Instant::now()).map_err(|e| ToolError::new(e.code(), e.to_string()))?;
                return Ok(Gate::Run);
            }
            // A client that can ask its user is asked; otherwise a token comes back.
            let declined = || {
                Gate::Preview(json!({
                    "status": "declined",
                    "message": "The user did not confirm; nothing ran.",
                    "preview": preview_json,
                }))
            };
            let question = format!(
                "Run {} of skill `{}`?\n{}\nsandbox: {}, network: {}, timeout {} s, variables: {}",
                preview.script,
                preview.skill,
                preview.command.argv.join(" "),
                preview.command.sandbox,
                preview.command.network,
                preview.command.timeout_secs,
                if preview.command.env.is_empty() { "none".into() } else { preview.command.env.join(", ") }
            );
            let modern = context.protocol_version().is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str());
            if modern {
                // 2026-07-28 has no server-to-client requests: the question
                // travels as an input-required result and the client retries
                // the same call with the answer and our handle (a token bound
                // to this exact call).
                let can_ask = context.client_capabilities().is_some_and(|c| c.elicitation.is_some());
                if let (Some(answers), Some(handle)) = (&retry.input_responses, &retry.request_state) {
                    let answer = answers.get(CONFIRM_INPUT).cloned().and_then(|v| serde_json::from_value::<ElicitResult>(v).ok());
                    let yes = answer.as_ref().is_some_and(|a| {
                        a.action == ElicitationAction::Accept
                            && a.content.as_ref().and_then(|c| c.get("run")).and_then(Value::as_bool) == Some(true)
                    });
                    if !yes {
                        return Ok(declined());
                    }
                    exec.confirmations.redeem(handle, &digest, Instant::now()).map_err(|e| ToolError::new(e.code(), e.to_string()))?;
                    return Ok(Gate::Run);
                }
                if can_ask {
                    let schema = ElicitationSchema::from_type::<RunConfirmation>()
                        .map_err(|e| ToolError::new("internal", format!("confirmation schema: {e}")))?;
                    let request = ElicitRequest::new(ElicitRequestParams::FormElicitationParams {
                        meta: None,
                        message: question,
                        requested_schema: schema,
                    });
                    let handle = exec.confirmations.issue(&digest, Instant::now());
                    let mut questions = rmcp::model::InputRequests::new();
                    questions.insert(CONFIRM_INPUT.to_string(), InputRequest::Elicitation(request));
                    return Ok(Gate::Ask(InputRequiredResult::new(Some(questions), Some(handle))));
                }
            } else {
                match context.peer.elicit::<RunConfirmation>(question).await {
                    Ok(Some(RunConfirmation { run: true })) => return Ok(Gate::Run),
                    Ok(_) | Err(ElicitationError::UserDeclined) | Err(ElicitationError::UserCancelled) => return Ok(declined()),
                    Err(_) => {}
                }
            }
            let token = exec.confirmations.issue(&digest, Instant::now());
            Ok(Gate::Preview(json!({
                "status": "confirmation-required",
                "message": "Nothing ran. Show the preview to the user; to run exactly this call, repeat it with the same arguments and `confirm` set to the token.",
                "token": token,
                "expiresInSecs": TOKEN_TTL.as_secs(),
                "preview": preview_json,
            })))
        }
    }
}

fn plan_for(state: &ServerState, skill: &str, script: &str, args: &[String]) -> Result<RunPlan, ToolError> {
    Ok(fence::plan(&state.catalog, &state.grants, &state.interpreters, skill, script, args)?)
}

fn lookup(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn build_preview(
    exec: &Execution,
    state: &ServerState,
    plan: &RunPlan,
    job: Option<&str>,
    inputs: Vec<InputSummary>,
) -> Result<Preview, ToolError> {
    // Where the work directory will be: the job's, or a placeholder for a job not yet created.
    let work = match job {
        Some(id) => exec.jobs.work_dir(id)?,
        None => exec.data_dir.join("jobs").join("<new job>").join("work"),
    };
    let egress = state.grants.egress_allowed(&plan.skill, plan.script.as_str());
    let (_, command, _) = exec.runner.command(plan, &work, egress, &lookup)?;
    Ok(Preview {
        skill: plan.skill.clone(),
        script: plan.script.to_string(),
        interpreter: plan.interpreter.to_string(),
        job: job.map(str::to_string),
        command,
        inputs,
        egress: plan.egress.clone(),
        grant_from: state.grants.source.label(),
    })
}

/// Run a plan in an existing job (state `created`), holding the run slot
/// the caller took before it created anything.
async fn run_in_job(
    state: &ServerState,
    exec: &Execution,
    plan: &RunPlan,
    job: &str,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<RunResult, ToolError> {
    // Re-check the script as it is now (the resolved check) right before it starts.
    crate::core::paths::resolve_inside(&plan.skill_dir, &plan.script)
        .map_err(|e| ToolError::new("unavailable", format!("{} cannot run: {e}", plan.script)))?;
    let work = exec.jobs.begin_run(job, plan.script.as_str(), &plan.args)?;
    let egress = state.grants.egress_allowed(&plan.skill, plan.script.as_str());
    let prepared = exec.runner.command(plan, &work, egress, &lookup);
    let (spec, command) = match prepared {
        Ok((spec, command, _)) => (spec, command),
        Err(err) => {
            exec.jobs.finish_run(job, RunFinish { note: Some(format!("could not start: {err}")), ..Default::default() }, b"", b"")?;
            return Err(err.into());
        }
    };
    let outcome = exec.runner.run(spec, &work, permit).await;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(err) => {
            exec.jobs.finish_run(job, RunFinish { note: Some(format!("could not start: {err}")), ..Default::default() }, b"", b"")?;
            return Err(err.into());
        }
    };
    let mut note = None;
    if outcome.hard_deadline_hit {
        note = Some("the process did not settle before the hard deadline; its output may be incomplete".to_string());
    } else if outcome.exit_code != Some(0) && !plan.egress.is_empty() && command.network.starts_with("none") {
        note = Some(format!(
            "this run had no network (sandboxed, egress not granted); a failure reaching {} looks like a connection error from inside",
            plan.egress.join(", ")
        ));
    }
    let finish = RunFinish {
        exit_code: outcome.exit_code,
        signal: outcome.signal,
        timed_out: outcome.timed_out,
        stdout_bytes: outcome.stdout_bytes,
        stderr_bytes: outcome.stderr_bytes,
        stdout_truncated: outcome.stdout_truncated,
        stderr_truncated: outcome.stderr_truncated,
        note: note.clone(),
    };
    let record = exec.jobs.finish_run(job, finish, &outcome.stdout, &outcome.stderr)?;
    let outputs = exec.jobs.outputs(job)?;
    Ok(RunResult {
        status: "completed",
        job: job.to_string(),
        state: record.state.to_string(),
        exit_code: outcome.exit_code,
        signal: outcome.signal,
        timed_out: outcome.timed_out,
        duration_ms: outcome.duration.as_millis() as u64,
        stdout: String::from_utf8_lossy(&outcome.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&outcome.stderr).into_owned(),
        stdout_bytes: outcome.stdout_bytes,
        stderr_bytes: outcome.stderr_bytes,
        stdout_truncated: outcome.stdout_truncated,
        stderr_truncated: outcome.stderr_truncated,
        outputs,
        command,
        note,
    })
}

// ---------- skill_run ----------

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillRunInput {
    /// The skill's served name.
    pub skill: String,
    /// A script the skill declares, e.g. `scripts/stats.py`.
    pub script: String,
    /// Arguments, passed as they are (no shell): at most 64, 8 KiB in total.
    #[serde(default)]
    pub args: Vec<String>,
    /// Small input files placed in the job's work directory (at most 1 MiB in total; use the job tools for more).
    #[serde(default)]
    pub inputs: Vec<InlineInput>,
    /// The token from the preview, to run exactly the previewed call.
    #[serde(default)]
    pub confirm: Option<String>,
}

pub async fn skill_run(
    state: Arc<ServerState>,
    input: SkillRunInput,
    retry: Retry,
    context: RequestContext<RoleServer>,
) -> Result<RunReply, ToolError> {
    let exec = execution(&state)?.clone();
    let plan = plan_for(&state, &input.skill, &input.script, &input.args)?;
    let mut decoded = Vec::with_capacity(input.inputs.len());
    let mut total = 0u64;
    for inline in &input.inputs {
        crate::core::paths::RelPath::parse(&inline.path).map_err(|e| ToolError::new("bad-path", format!("input {}: {e}", inline.path)))?;
        let bytes = decode_input(inline)?;
        total += bytes.len() as u64;
        decoded.push((inline.path.clone(), crate::core::package::digest(&bytes), bytes));
    }
    let chunk = exec.jobs.limits().upload_chunk;
    if total > chunk {
        return Err(ToolError::new(
            "inputs-too-large",
            format!(
                "inline inputs total {total} bytes; at most {chunk} per call: create a job and upload larger files with skill_job_upload"
            ),
        ));
    }
    let summaries = decoded.iter().map(|(p, d, b)| InputSummary { path: p.clone(), size: b.len() as u64, sha256: d.clone() }).collect();
    let preview = build_preview(&exec, &state, &plan, None, summaries)?;
    let bound = BoundCall {
        tool: "skill_run",
        skill: &plan.skill,
        script: plan.script.as_str(),
        args: &plan.args,
        job: None,
        inputs: decoded.iter().map(|(p, d, _)| (p.as_str(), d.as_str())).collect(),
    };
    match gate(&exec, &preview, &bound, input.confirm.as_deref(), &retry, &context).await? {
        Gate::Preview(value) => Ok(RunReply::Json(value)),
        Gate::Ask(question) => Ok(RunReply::InputRequired(question)),
        Gate::Run => {
            // Take the run slot before creating anything: a busy server leaves no job behind.
            let permit = exec.runner.try_acquire()?;
            let job = exec.jobs.create(&plan.skill)?;
            for (path, _, bytes) in &decoded {
                if let Err(err) = exec.jobs.upload(&job.id, path, 0, bytes) {
                    let _ = exec.jobs.delete(&job.id);
                    return Err(err.into());
                }
            }
            let result = run_in_job(&state, &exec, &plan, &job.id, permit).await?;
            Ok(RunReply::Json(serde_json::to_value(result).unwrap_or_default()))
        }
    }
}

// ---------- job tools ----------

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobCreateInput {
    /// The skill the job runs a script of.
    pub skill: String,
}

pub fn job_create(state: &ServerState, input: JobCreateInput) -> Result<JobRecord, ToolError> {
    let exec = execution(state)?;
    if state.catalog.get(&input.skill).is_none() {
        return Err(ToolError::new(
            "unknown-skill",
            format!("no skill named `{}`; served skills: {}", input.skill, state.catalog.names().join(", ")),
        ));
    }
    Ok(exec.jobs.create(&input.skill)?)
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobUploadInput {
    pub job: String,
    /// Path inside the job's work directory.
    pub path: String,
    /// Base64 of at most 1 MiB of the file's bytes.
    pub content: String,
    /// 0 (default) creates or replaces the file; the file's current size appends.
    #[serde(default)]
    pub offset: u64,
}

pub fn job_upload(state: &ServerState, input: JobUploadInput) -> Result<FileInfo, ToolError> {
    let exec = execution(state)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(input.content.as_bytes())
        .map_err(|e| ToolError::new("bad-base64", format!("content is not valid base64: {e}")))?;
    Ok(exec.jobs.upload(&input.job, &input.path, input.offset, &bytes)?)
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobRunInput {
    pub job: String,
    /// A script the job's skill declares.
    pub script: String,
    /// Arguments, passed as they are (no shell).
    #[serde(default)]
    pub args: Vec<String>,
    /// The token from the preview.
    #[serde(default)]
    pub confirm: Option<String>,
}

pub async fn job_run(
    state: Arc<ServerState>,
    input: JobRunInput,
    retry: Retry,
    context: RequestContext<RoleServer>,
) -> Result<RunReply, ToolError> {
    let exec = execution(&state)?.clone();
    let record = exec.jobs.get(&input.job)?;
    if record.state != crate::core::jobs::JobState::Created {
        return Err(ToolError::new(
            "job-already-ran",
            format!("job {} already ran ({}); create a new job to run again", record.id, record.state),
        ));
    }
    let plan = plan_for(&state, &record.skill, &input.script, &input.args)?;
    let inputs: Vec<InputSummary> =
        record.inputs.iter().map(|f| InputSummary { path: f.path.clone(), size: f.size, sha256: f.sha256.clone() }).collect();
    let bound = BoundCall {
        tool: "skill_job_run",
        skill: &plan.skill,
        script: plan.script.as_str(),
        args: &plan.args,
        job: Some(&record.id),
        inputs: record.inputs.iter().map(|f| (f.path.as_str(), f.sha256.as_str())).collect(),
    };
    let preview = build_preview(&exec, &state, &plan, Some(&record.id), inputs)?;
    match gate(&exec, &preview, &bound, input.confirm.as_deref(), &retry, &context).await? {
        Gate::Preview(value) => Ok(RunReply::Json(value)),
        Gate::Ask(question) => Ok(RunReply::InputRequired(question)),
        Gate::Run => {
            let permit = exec.runner.try_acquire()?;
            Ok(RunReply::Json(serde_json::to_value(run_in_job(&state, &exec, &plan, &record.id, permit).await?).unwrap_or_default()))
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobIdInput {
    pub job: String,
}

#[derive(Debug, Serialize)]
pub struct JobStatus {
    #[serde(flatten)]
    pub record: JobRecord,
    /// Files in the work directory after the run (absent before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs: Option<OutputListing>,
}

pub fn job_status(state: &ServerState, input: JobIdInput) -> Result<JobStatus, ToolError> {
    let exec = execution(state)?;
    let record = exec.jobs.get(&input.job)?;
    let outputs = if record.state.is_finished() { Some(exec.jobs.outputs(&input.job)?) } else { None };
    Ok(JobStatus { record, outputs })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobReadInput {
    pub job: String,
    /// A file in the job's work directory; omit it and give `stream` to read stdout or stderr.
    #[serde(default)]
    pub path: Option<String>,
    /// `stdout` or `stderr`.
    #[serde(default)]
    pub stream: Option<String>,
    #[serde(default)]
    pub offset: u64,
    /// Bytes to read, at most 262144 (256 KiB; the default).
    #[serde(default)]
    pub limit: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct JobChunk {
    pub job: String,
    pub target: String,
    /// `utf-8` or `base64`.
    pub encoding: &'static str,
    pub content: String,
    pub offset: u64,
    pub returned: u64,
    pub size: u64,
    pub eof: bool,
}

pub fn job_read(state: &ServerState, input: JobReadInput) -> Result<JobChunk, ToolError> {
    let exec = execution(state)?;
    let (target, label) = match (input.path, input.stream.as_deref()) {
        (Some(path), None) => (ReadTarget::File(path.clone()), path),
        (None, Some("stdout")) => (ReadTarget::Stdout, "stdout".to_string()),
        (None, Some("stderr")) => (ReadTarget::Stderr, "stderr".to_string()),
        (None, Some(other)) => return Err(ToolError::new("bad-stream", format!("stream {other:?}: use stdout or stderr"))),
        (Some(_), Some(_)) => return Err(ToolError::new("bad-target", "give either `path` or `stream`, not both")),
        (None, None) => return Err(ToolError::new("bad-target", "give `path` (a file in the job) or `stream` (stdout or stderr)")),
    };
    let limit = input.limit.unwrap_or(exec.jobs.limits().read_chunk);
    let chunk = exec.jobs.read(&input.job, target, input.offset, limit)?;
    let returned = chunk.data.len() as u64;
    let (encoding, content) = match String::from_utf8(chunk.data) {
        Ok(text) if !text.contains('\0') => ("utf-8", text),
        Ok(text) => ("base64", base64::engine::general_purpose::STANDARD.encode(text.as_bytes())),
        Err(err) => ("base64", base64::engine::general_purpose::STANDARD.encode(err.as_bytes())),
    };
    Ok(JobChunk { job: input.job, target: label, encoding, content, offset: chunk.offset, returned, size: chunk.size, eof: chunk.eof })
}

pub fn job_delete(state: &ServerState, input: JobIdInput) -> Result<Value, ToolError> {
    let exec = execution(state)?;
    exec.jobs.delete(&input.job)?;
    Ok(json!({ "job": input.job, "deleted": true }))
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobListInput {
    /// Only jobs of this skill.
    #[serde(default)]
    pub skill: Option<String>,
}

pub fn job_list(state: &ServerState, input: JobListInput) -> Result<Value, ToolError> {
    let exec = execution(state)?;
    let jobs: Vec<JobRecord> = exec.jobs.list()?.into_iter().filter(|j| input.skill.as_ref().is_none_or(|s| &j.skill == s)).collect();
    Ok(json!({ "jobs": jobs, "retainedMax": exec.jobs.limits().retained }))
}

// ---------- definitions ----------

/// The run tools. Annotations are honest: a script's effects are unknown,
/// so running is destructive, not idempotent and open-world.
pub fn definitions() -> Vec<rmcp::model::Tool> {
    use rmcp::handler::server::common::schema_for_type;
    use rmcp::model::{Tool, ToolAnnotations};
    let ann = |title: &str, read_only: bool, destructive: bool, idempotent: bool, open_world: bool| {
        ToolAnnotations::with_title(title).read_only(read_only).destructive(destructive).idempotent(idempotent).open_world(open_world)
    };
    vec![
        Tool::new_with_raw(
            "skill_run",
            Some("Run a script a skill declares, in a new job (small input files may be sent inline). The first call starts nothing: it returns a preview of exactly what would run and a confirmation token; repeat the same call with `confirm` set to the token to run it once. Returns exit code, stdout, stderr and the output files.".into()),
            schema_for_type::<SkillRunInput>(),
        )
        .with_annotations(ann("Run a skill script", false, true, false, true)),
        Tool::new_with_raw(
            "skill_job_create",
            Some("Create a job for a skill: upload input files to it with skill_job_upload, then run one script with skill_job_run. A job runs once.".into()),
            schema_for_type::<JobCreateInput>(),
        )
        .with_annotations(ann("Create a job", false, false, false, false)),
        Tool::new_with_raw(
            "skill_job_upload",
            Some("Upload an input file to a job that has not run yet: base64 of at most 1 MiB per call; larger files (up to 32 MiB) in several calls, each appending at the file's current size (`offset`). 128 MiB and 2,000 files per job.".into()),
            schema_for_type::<JobUploadInput>(),
        )
        .with_annotations(ann("Upload a job input", false, true, true, false)),
        Tool::new_with_raw(
            "skill_job_run",
            Some("Run one declared script of the job's skill in the job's work directory, with a JSON array of arguments. Same confirmation as skill_run. A second run needs a new job.".into()),
            schema_for_type::<JobRunInput>(),
        )
        .with_annotations(ann("Run a job", false, true, false, true)),
        Tool::new_with_raw(
            "skill_job_status",
            Some("A job's state, inputs, run result and, once it has run, its output files (path, size, sha256).".into()),
            schema_for_type::<JobIdInput>(),
        )
        .with_annotations(ann("Job status", true, false, true, false)),
        Tool::new_with_raw(
            "skill_job_read",
            Some("Read a job's output file or its stdout/stderr in chunks of at most 256 KiB (offset/limit). Text comes back as UTF-8, anything else as base64.".into()),
            schema_for_type::<JobReadInput>(),
        )
        .with_annotations(ann("Read job output", true, false, true, false)),
        Tool::new_with_raw(
            "skill_job_delete",
            Some("Delete a job that is not running, with its files. At most 100 jobs are kept; delete finished ones to make room.".into()),
            schema_for_type::<JobIdInput>(),
        )
        .with_annotations(ann("Delete a job", false, true, true, false)),
        Tool::new_with_raw(
            "skill_job_list",
            Some("List the retained jobs, newest first (optionally of one skill).".into()),
            schema_for_type::<JobListInput>(),
        )
        .with_annotations(ann("List jobs", true, false, true, false)),
    ]
}
