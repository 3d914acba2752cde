//! The run tools: `skill_run` (one call: preview, confirm, run in an
//! implicit job) and the job tools for the multi-step flow (create, upload,
//! run, status, read, delete, list).
//!
//! Every run goes through the same steps whatever the backend: the fence
//! decides whether the call may run and how ([`crate::core::fence::decide`],
//! through the snapshot's policy); nothing starts until the exact call is
//! confirmed ([`super::gate`]); the [`Executor`] carries the plan out and
//! keeps inputs, outputs and streams.

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tracing::Instrument as _;

use crate::api::outcome::RunOutcome;
use crate::audit::{Event, FileRef};
use crate::core::fence::{Request, RunPlan};
use crate::core::limits::{
    bytes_text, count_text, JOBS_RETAINED, JOB_READ_CHUNK, JOB_UPLOAD_CHUNK, MAX_ARGS, MAX_ARG_BYTES, MAX_FILES, MAX_FILE_BYTES,
    MAX_TOTAL_BYTES,
};
use crate::core::paths::RelPath;
use crate::jobs::{Chunk, FileInfo, JobRecord, JobState, OutputListing, ReadTarget};

use super::audit;
use super::error::{codes, ToolError};
use super::executor::{Caller, Executor, JobStatus, ProgressSink, RunCommand, RunControl, RunReport};
use super::gate::{gate, Asker, BoundCall, Gate, InputSummary, Preview, Retry};
use super::snapshot::Snapshot;
use super::state::{Execution, ServerState};

fn execution(state: &ServerState) -> Result<&Execution, ToolError> {
    state
        .execution
        .as_ref()
        .ok_or_else(|| ToolError::new(codes::NO_EXECUTION, "this server does not run scripts (no execution backend configured)"))
}

/// What a gated run tool answers: JSON (a preview or a result), or a question
/// the client must answer before the call can go on.
#[derive(Debug)]
pub enum RunReply {
    Json(Value),
    InputRequired(rmcp::model::InputRequiredResult),
    /// The confirmed run goes on as an MCP task ([`super::tasks`] answers for it).
    Task(Box<super::executor::TaskView>),
    /// Refused by the caller's `runs` bucket; nothing ran.
    Limited(super::ratelimit::Limited),
}

/// Everything a run tool gets from the request besides its arguments.
#[derive(Clone, Default)]
pub struct CallContext {
    pub caller: Caller,
    pub retry: Retry,
    pub asker: Asker,
    pub progress: Option<ProgressSink>,
    /// Cancelled when the request is (a cancel notification, a closed stream).
    pub cancel: tokio_util::sync::CancellationToken,
    /// The client declared the tasks extension (SEP-2663) for this request.
    pub tasks: bool,
}

impl CallContext {
    fn asking(&self) -> super::gate::Asking<'_> {
        super::gate::Asking { caller: &self.caller, retry: &self.retry, asker: &self.asker }
    }

    fn control(&self, key: String) -> RunControl {
        RunControl { key, progress: self.progress.clone(), cancel: self.cancel.clone() }
    }
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
            .map_err(|e| ToolError::new(codes::BAD_BASE64, format!("input {}: not valid base64: {e}", input.path))),
        Some(other) => Err(ToolError::new(codes::BAD_ENCODING, format!("input {}: encoding {other:?}; use utf-8 or base64", input.path))),
    }
}

// ---------- result ----------

/// A finished run, as `skill_run` and `skill_job_run` return it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    /// Always `completed`: the script ran (whatever its exit).
    pub status: &'static str,
    pub job: String,
    /// Job state after the run: succeeded, failed, timed-out, limit-exceeded or cancelled.
    pub state: String,
    #[serde(flatten)]
    pub outcome: RunOutcome,
    pub stdout: String,
    pub stderr: String,
    pub outputs: OutputListing,
    pub command: RunCommand,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl RunResult {
    fn from_report(report: RunReport) -> RunResult {
        let outcome = report.record.run.as_ref().map(|r| r.outcome.clone()).unwrap_or_default();
        RunResult {
            status: "completed",
            job: report.record.id.clone(),
            state: report.record.state.to_string(),
            outcome,
            stdout: String::from_utf8_lossy(&report.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&report.stderr).into_owned(),
            outputs: report.outputs,
            command: report.command,
            note: report.note,
        }
    }
}

/// A finished run as `skill_run` returns it (and `tasks/get` once its task completed).
pub fn result_json(report: RunReport) -> Result<Value, ToolError> {
    to_json(RunResult::from_report(report))
}

fn plan_for(snap: &Snapshot, skill: &str, script: &str, args: &[String]) -> Result<RunPlan, ToolError> {
    Ok(snap.plan(skill, &Request { script, args, timeout_secs: None })?)
}

async fn build_preview(
    executor: &dyn Executor,
    snap: &Snapshot,
    plan: &RunPlan,
    job: Option<&str>,
    inputs: Vec<InputSummary>,
) -> Result<Preview, ToolError> {
    let command = executor.describe(plan, job).await?;
    Ok(Preview {
        skill: plan.skill.clone(),
        script: plan.script.to_string(),
        interpreter: plan.interpreter.to_string(),
        job: job.map(str::to_string),
        command,
        inputs,
        egress: plan.egress.clone(),
        egress_granted: plan.egress_granted,
        grant_from: snap.policy.source_label(),
    })
}

fn to_json<T: Serialize>(value: T) -> Result<Value, ToolError> {
    serde_json::to_value(value).map_err(|e| ToolError::internal(format!("could not encode the result: {e}")))
}

// ---------- skill_run ----------

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillRunInput {
    /// The skill's served name.
    pub skill: String,
    /// A script the skill declares, e.g. `scripts/stats.py`.
    pub script: String,
    /// Arguments, passed as they are (no shell); see the tool's description for the caps.
    #[serde(default)]
    pub args: Vec<String>,
    /// Small input files placed in the job's work directory (use the job tools for larger ones).
    #[serde(default)]
    pub inputs: Vec<InlineInput>,
    /// The token from the preview, to run exactly the previewed call.
    #[serde(default)]
    pub confirm: Option<String>,
}

pub async fn skill_run(state: &ServerState, snap: &Snapshot, input: SkillRunInput, cx: &CallContext) -> Result<RunReply, ToolError> {
    let exec = execution(state)?;
    let plan = plan_for(snap, &input.skill, &input.script, &input.args)?;
    let mut decoded = Vec::with_capacity(input.inputs.len());
    let mut total = 0u64;
    for inline in &input.inputs {
        RelPath::parse(&inline.path).map_err(|e| ToolError::new(codes::BAD_PATH, format!("input {}: {e}", inline.path)))?;
        let bytes = decode_input(inline)?;
        total += bytes.len() as u64;
        decoded.push((inline.path.clone(), crate::core::package::digest(&bytes), bytes));
    }
    let limits = exec.executor.limits();
    // Whatever could not be staged is refused here, before a token exists for it.
    limits
        .check_input_set(decoded.iter().map(|(p, _, b)| (p.as_str(), b.len() as u64)))
        .map_err(|e| ToolError::new(e.code(), e.to_string()))?;
    let chunk = limits.upload_chunk;
    if total > chunk {
        return Err(ToolError::new(
            codes::INPUTS_TOO_LARGE,
            format!(
                "inline inputs total {total} bytes; at most {chunk} per call: create a job and upload larger files with skill_job_upload"
            ),
        ));
    }
    let summaries = decoded.iter().map(|(p, d, b)| InputSummary { path: p.clone(), size: b.len() as u64, sha256: d.clone() }).collect();
    let preview = build_preview(exec.executor.as_ref(), snap, &plan, None, summaries).await?;
    let bound = BoundCall {
        tool: "skill_run",
        skill: &plan.skill,
        script: plan.script.as_str(),
        args: &plan.args,
        job: None,
        inputs: decoded.iter().map(|(p, d, _)| (p.as_str(), d.as_str())).collect(),
    };
    let gated = gate(exec, &state.rate_limits.current(), &cx.asking(), &preview, &bound, input.confirm.as_deref()).await?;
    let facts = audit::RunFacts::of(state, "skill_run", &plan);
    audit::gated(state, facts.as_ref(), &cx.caller, None, &preview.inputs, &gated);
    match gated {
        Gate::Preview(value) => Ok(RunReply::Json(value)),
        Gate::Ask(question) => Ok(RunReply::InputRequired(question)),
        Gate::Limited(limited) => Ok(RunReply::Limited(limited)),
        Gate::Run { key, .. } => {
            let inputs = decoded.into_iter().map(|(p, _, b)| (p, b)).collect();
            // Only after the gate: a task client confirms exactly as any other.
            // Its verdict is the controller's record (the task ends after this call).
            if let (true, Some(tasks)) = (cx.tasks, exec.tasks.as_ref()) {
                let view = tasks.submit(&cx.caller, plan, inputs, &key).await?;
                return Ok(RunReply::Task(Box::new(view)));
            }
            let span = tracing::info_span!(target: "skill_operator::run", "run", skill = %plan.skill, script = %plan.script.as_str());
            let report = exec.executor.run_new(&cx.caller, plan, inputs, cx.control(key)).instrument(span).await;
            audit::verdict(state, facts.as_ref(), &cx.caller, &report);
            Ok(RunReply::Json(result_json(report?)?))
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

pub async fn job_create(state: &ServerState, snap: &Snapshot, input: JobCreateInput, cx: &CallContext) -> Result<JobRecord, ToolError> {
    let exec = execution(state)?;
    if snap.catalog.get(&input.skill).is_none() {
        return Err(crate::core::fence::Refusal::unknown_skill(&input.skill, snap.catalog.names()).into());
    }
    exec.executor.create(&cx.caller, &input.skill).await
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobUploadInput {
    pub job: String,
    /// Path inside the job's work directory.
    pub path: String,
    /// Base64 of one chunk of the file's bytes (see the tool's description for the cap).
    pub content: String,
    /// 0 (default) creates or replaces the file; the file's current size appends.
    #[serde(default)]
    pub offset: u64,
}

pub async fn job_upload(state: &ServerState, input: JobUploadInput, cx: &CallContext) -> Result<FileInfo, ToolError> {
    let exec = execution(state)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(input.content.as_bytes())
        .map_err(|e| ToolError::new(codes::BAD_BASE64, format!("content is not valid base64: {e}")))?;
    let info = exec.executor.upload(&cx.caller, &input.job, &input.path, input.offset, bytes).await?;
    let file = FileRef { path: info.path.clone(), size: Some(info.size), sha256: Some(info.sha256.clone()) };
    audit::file(state, Event::FileUpload, &cx.caller, &input.job, file);
    Ok(info)
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

pub async fn job_run(state: &ServerState, snap: &Snapshot, input: JobRunInput, cx: &CallContext) -> Result<RunReply, ToolError> {
    let exec = execution(state)?;
    let record = exec.executor.get(&cx.caller, &input.job).await?;
    // A job that has started runs again only as a retry of its confirmed
    // call (the same token, checked by the gate below): the gateway's
    // executor then attaches to the SkillJob that call started, and a store
    // that remembers tokens refuses the reuse. Without a token it already ran.
    if record.state != JobState::Created && input.confirm.is_none() {
        return Err(crate::jobs::JobError::AlreadyRan { id: record.id, state: record.state }.into());
    }
    let plan = plan_for(snap, &record.skill, &input.script, &input.args)?;
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
    let preview = build_preview(exec.executor.as_ref(), snap, &plan, Some(&record.id), inputs).await?;
    let gated = gate(exec, &state.rate_limits.current(), &cx.asking(), &preview, &bound, input.confirm.as_deref()).await?;
    let facts = audit::RunFacts::of(state, "skill_job_run", &plan);
    audit::gated(state, facts.as_ref(), &cx.caller, Some(&record.id), &preview.inputs, &gated);
    match gated {
        Gate::Preview(value) => Ok(RunReply::Json(value)),
        Gate::Ask(question) => Ok(RunReply::InputRequired(question)),
        Gate::Limited(limited) => Ok(RunReply::Limited(limited)),
        Gate::Run { key, .. } => {
            // The inputs the person confirmed, checked again when the run starts.
            let confirmed = record.inputs.iter().map(|f| (f.path.clone(), f.sha256.clone())).collect();
            let span = tracing::info_span!(target: "skill_operator::run", "run", skill = %plan.skill, script = %plan.script.as_str(), job = %record.id);
            let report = exec.executor.run(&cx.caller, &record.id, plan, confirmed, cx.control(key)).instrument(span).await;
            audit::verdict(state, facts.as_ref(), &cx.caller, &report);
            Ok(RunReply::Json(result_json(report?)?))
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobIdInput {
    pub job: String,
}

pub async fn job_status(state: &ServerState, input: JobIdInput, cx: &CallContext) -> Result<JobStatus, ToolError> {
    execution(state)?.executor.status(&cx.caller, &input.job).await
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
    /// Bytes to read (at most, and by default, the read chunk in the tool's description).
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
    /// Where the whole file can be downloaded in one authenticated GET
    /// (the gateway, for files over one call's worth).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub download: Option<String>,
}

impl JobChunk {
    pub fn new(job: String, target: String, chunk: Chunk) -> JobChunk {
        let returned = chunk.data.len() as u64;
        let (encoding, content) = match String::from_utf8(chunk.data) {
            Ok(text) if !text.contains('\0') => ("utf-8", text),
            Ok(text) => ("base64", base64::engine::general_purpose::STANDARD.encode(text.as_bytes())),
            Err(err) => ("base64", base64::engine::general_purpose::STANDARD.encode(err.as_bytes())),
        };
        JobChunk {
            job,
            target,
            encoding,
            content,
            offset: chunk.offset,
            returned,
            size: chunk.size,
            eof: chunk.eof,
            download: chunk.download,
        }
    }
}

pub async fn job_read(state: &ServerState, input: JobReadInput, cx: &CallContext) -> Result<JobChunk, ToolError> {
    let exec = execution(state)?;
    let (target, label) = match (input.path, input.stream.as_deref()) {
        (Some(path), None) => (ReadTarget::File(path.clone()), path),
        (None, Some("stdout")) => (ReadTarget::Stdout, "stdout".to_string()),
        (None, Some("stderr")) => (ReadTarget::Stderr, "stderr".to_string()),
        (None, Some(other)) => return Err(ToolError::new(codes::BAD_STREAM, format!("stream {other:?}: use stdout or stderr"))),
        (Some(_), Some(_)) => return Err(ToolError::new(codes::BAD_TARGET, "give either `path` or `stream`, not both")),
        (None, None) => return Err(ToolError::new(codes::BAD_TARGET, "give `path` (a file in the job) or `stream` (stdout or stderr)")),
    };
    let limit = input.limit.unwrap_or(exec.executor.limits().read_chunk);
    let chunk = exec.executor.read(&cx.caller, &input.job, target, input.offset, limit).await?;
    // One record per chunk read: which bytes of which file left, not their content.
    let file = FileRef { path: format!("{label}@{}+{}", chunk.offset, chunk.data.len()), size: Some(chunk.size), sha256: None };
    audit::file(state, Event::FileDownload, &cx.caller, &input.job, file);
    Ok(JobChunk::new(input.job, label, chunk))
}

pub async fn job_delete(state: &ServerState, input: JobIdInput, cx: &CallContext) -> Result<Value, ToolError> {
    execution(state)?.executor.delete(&cx.caller, &input.job).await?;
    Ok(json!({ "job": input.job, "deleted": true }))
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobListInput {
    /// Only jobs of this skill.
    #[serde(default)]
    pub skill: Option<String>,
}

pub async fn job_list(state: &ServerState, input: JobListInput, cx: &CallContext) -> Result<Value, ToolError> {
    let exec = execution(state)?;
    let jobs: Vec<JobRecord> =
        exec.executor.list(&cx.caller).await?.into_iter().filter(|j| input.skill.as_ref().is_none_or(|s| &j.skill == s)).collect();
    Ok(json!({ "jobs": jobs, "retainedMax": exec.executor.limits().retained }))
}

// ---------- definitions ----------

/// The run tools. Annotations are honest: a script's effects are unknown,
/// so running is destructive, not idempotent and open-world. Every figure
/// in a description comes from [`crate::core::limits`].
pub fn definitions() -> Vec<rmcp::model::Tool> {
    use rmcp::handler::server::common::schema_for_type;
    use rmcp::model::{Tool, ToolAnnotations};
    let ann = |title: &str, read_only: bool, destructive: bool, idempotent: bool, open_world: bool| {
        ToolAnnotations::with_title(title).read_only(read_only).destructive(destructive).idempotent(idempotent).open_world(open_world)
    };
    vec![
        Tool::new_with_raw(
            "skill_run",
            Some(format!(
                "Run a script a skill declares, in a new job (small input files, at most {} in total, may be sent inline). Arguments are passed as they are, with no shell: at most {MAX_ARGS}, {} in total. The first call starts nothing: it returns a preview of exactly what would run and a confirmation token; repeat the same call with `confirm` set to the token to run it once. Returns exit code, stdout, stderr (at most {} each) and the output files.",
                bytes_text(JOB_UPLOAD_CHUNK),
                bytes_text(MAX_ARG_BYTES as u64),
                bytes_text(crate::core::limits::STREAM_CAP),
            ).into()),
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
            Some(format!(
                "Upload an input file to a job that has not run yet: base64 of at most {} per call; larger files (up to {}) in several calls, each appending at the file's current size (`offset`). {} and {} files per job.",
                bytes_text(JOB_UPLOAD_CHUNK),
                bytes_text(MAX_FILE_BYTES),
                bytes_text(MAX_TOTAL_BYTES),
                count_text(MAX_FILES),
            ).into()),
            schema_for_type::<JobUploadInput>(),
        )
        .with_annotations(ann("Upload a job input", false, true, true, false)),
        Tool::new_with_raw(
            "skill_job_run",
            Some("Run one declared script of the job's skill in the job's work directory, with a JSON array of arguments. Same confirmation as skill_run; the inputs the preview showed are exactly the ones the script sees. A second run needs a new job.".into()),
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
            Some(format!(
                "Read a job's output file or its stdout/stderr in chunks of at most {} (offset/limit). Text comes back as UTF-8, anything else as base64.",
                bytes_text(JOB_READ_CHUNK)
            ).into()),
            schema_for_type::<JobReadInput>(),
        )
        .with_annotations(ann("Read job output", true, false, true, false)),
        Tool::new_with_raw(
            "skill_job_delete",
            Some(format!("Delete a job that is not running, with its files. At most {JOBS_RETAINED} jobs are kept; delete finished ones to make room.").into()),
            schema_for_type::<JobIdInput>(),
        )
        .with_annotations(ann("Delete a job", false, true, true, false)),
        Tool::new_with_raw(
            "skill_job_list",
            Some("List your retained jobs, newest first (optionally of one skill).".into()),
            schema_for_type::<JobListInput>(),
        )
        .with_annotations(ann("List jobs", true, false, true, false)),
    ]
}
