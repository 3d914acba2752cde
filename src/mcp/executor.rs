//! The seam between the MCP tools and whatever carries runs out: an
//! [`Executor`]. The standalone server's is a local job store plus a
//! sandboxed process runner (`runner::local`); the gateway's writes
//! SkillJobs and reads their results back (`gateway`). The tools do the
//! parts that must not differ between the two (the fence, the confirmation
//! gate, argument and input checks, result shapes) and call the executor for
//! the rest. Tests use a fake one to prove the tools without processes.

use std::collections::BTreeMap;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;

use crate::core::confirm::ConfirmMode;
use crate::core::fence::RunPlan;
use crate::jobs::{Chunk, FileInfo, JobLimits, JobRecord, OutputListing, ReadTarget};

use super::error::ToolError;

/// Who is calling: jobs belong to the principal that created them, and no
/// other principal can list, read, run or delete them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Caller {
    /// A stable id of the authenticated principal (`local` over stdio; the
    /// user name a TokenReview returned in the gateway).
    pub principal: String,
    /// The principal's UID, when the authenticator knows one.
    pub uid: Option<String>,
    /// The principal's groups (what a SubjectAccessReview is asked about).
    pub groups: Vec<String>,
    /// The authenticator's extra attributes, passed on to authorization.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl Caller {
    /// The only caller of a stdio server: the process that started it.
    pub fn local() -> Caller {
        Caller::named("local")
    }

    /// A caller known by name only (a bearer token's label, a test).
    pub fn named(principal: impl Into<String>) -> Caller {
        Caller { principal: principal.into(), ..Caller::default() }
    }
}

/// The exact command a run would execute, as the preview shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCommand {
    /// Where it runs: `local` or `kubernetes`.
    pub backend: String,
    pub program: String,
    pub argv: Vec<String>,
    pub cwd: String,
    pub timeout_secs: u64,
    /// Variable names handed over (never values).
    pub env: Vec<String>,
    /// Granted variables the backend cannot supply: not handed over.
    pub env_missing: Vec<String>,
    /// How the run is isolated (`bubblewrap`, `off`, `pod`).
    pub sandbox: String,
    /// What the run can reach on the network, in words.
    pub network: String,
    /// The uid the script runs as.
    pub run_as: Option<u32>,
    /// Run-wide limits (memory, processes, disk), in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
}

/// Isolation settings shown by `skill_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SandboxSummary {
    /// `required`, `auto`, `off` or `pod`.
    pub mode: String,
    /// Whether runs are isolated.
    pub active: bool,
    /// Why it is (not) active.
    pub detail: String,
}

/// Execution settings shown by `skill_list`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionSummary {
    /// `local` or `kubernetes`.
    pub backend: String,
    pub sandbox: SandboxSummary,
    /// `ask`, `auto` or `refuse`.
    pub confirm: ConfirmMode,
    /// Where jobs are kept (local backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<String>,
}

/// What a finished run returns (besides the stdout and stderr text).
#[derive(Debug, Clone)]
pub struct RunReport {
    pub record: JobRecord,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub outputs: OutputListing,
    pub command: RunCommand,
    pub note: Option<String>,
    /// The backend's own id of the run, for the audit trail: the SkillJob's
    /// UID in the gateway; `None` for a local run (the job id says it all).
    pub backend_id: Option<String>,
}

/// A job's state, inputs, run result and outputs.
#[derive(Debug, Clone, Serialize)]
pub struct JobStatus {
    #[serde(flatten)]
    pub record: JobRecord,
    /// Files in the work directory after the run (absent before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs: Option<OutputListing>,
}

/// Progress of a long run, for clients that asked for it.
pub type ProgressSink = Arc<dyn Fn(ProgressUpdate) + Send + Sync>;

/// One progress report: the run is in `phase`, `elapsed_secs` since it was accepted.
#[derive(Debug, Clone)]
pub struct ProgressUpdate {
    pub phase: String,
    pub elapsed_secs: u64,
    pub message: String,
}

/// What a run gets besides its plan: the confirmation's key, where to
/// report progress, and the signal that the caller went away.
#[derive(Clone, Default)]
pub struct RunControl {
    /// Unique to the confirmation that allowed the run ([`super::gate::Gate::Run`]).
    /// A backend that can create a run at most once per key (the gateway
    /// names the SkillJob after it) makes a retried call find the first run
    /// instead of starting a second.
    pub key: String,
    pub progress: Option<ProgressSink>,
    /// Cancelled when the caller is gone (a cancel notification, or its
    /// request stream closed). What that means is the backend's policy.
    pub cancel: tokio_util::sync::CancellationToken,
}

/// What carries runs out. Every method is bound to the caller: a job of
/// another principal is reported missing, never shown.
#[async_trait::async_trait]
pub trait Executor: Send + Sync {
    /// How runs are carried out here, for `skill_list`.
    fn summary(&self, mode: ConfirmMode) -> ExecutionSummary;
    /// The job bounds the tools quote and check.
    fn limits(&self) -> JobLimits;
    /// The command a plan would run (for `job`, or for a job not yet created).
    async fn describe(&self, plan: &RunPlan, job: Option<&str>) -> Result<RunCommand, ToolError>;
    async fn create(&self, caller: &Caller, skill: &str) -> Result<JobRecord, ToolError>;
    async fn upload(&self, caller: &Caller, job: &str, path: &str, offset: u64, bytes: Vec<u8>) -> Result<FileInfo, ToolError>;
    async fn get(&self, caller: &Caller, job: &str) -> Result<JobRecord, ToolError>;
    /// `skill_run`: a new job holding exactly `inputs` (path, bytes), then
    /// the run. Takes the run slot before anything is created: a busy
    /// backend says so and leaves no job behind.
    async fn run_new(
        &self,
        caller: &Caller,
        plan: RunPlan,
        inputs: Vec<(String, Vec<u8>)>,
        control: RunControl,
    ) -> Result<RunReport, ToolError>;
    /// `skill_job_run`: run the plan in an existing job, whose inputs must be
    /// exactly `inputs` (path, digest) at the moment it starts (what runs is
    /// what was confirmed; uploads close at that moment). Takes the run slot
    /// and holds it until the run is settled.
    async fn run(
        &self,
        caller: &Caller,
        job: &str,
        plan: RunPlan,
        inputs: Vec<(String, String)>,
        control: RunControl,
    ) -> Result<RunReport, ToolError>;
    async fn status(&self, caller: &Caller, job: &str) -> Result<JobStatus, ToolError>;
    async fn read(&self, caller: &Caller, job: &str, target: ReadTarget, offset: u64, limit: u64) -> Result<Chunk, ToolError>;
    async fn delete(&self, caller: &Caller, job: &str) -> Result<(), ToolError>;
    /// The caller's jobs, newest first.
    async fn list(&self, caller: &Caller) -> Result<Vec<JobRecord>, ToolError>;
}

/// A task's state in the MCP Tasks sense (SEP-2663).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Accepted, starting or running (or a cancel still stopping it).
    Working,
    /// The run ended with a result (whatever the script's exit code).
    Completed,
    /// Cancelled, and the run has stopped.
    Cancelled,
    /// No result can be shown (the message says why).
    Failed,
}

/// A run carried out as an MCP task, as `tasks/get` shows it.
#[derive(Debug, Clone)]
pub struct TaskView {
    /// The task id the client polls with.
    pub id: String,
    pub state: TaskState,
    /// The backend's sentence about the run.
    pub message: Option<String>,
    /// The run's result, once it is `Completed`.
    pub report: Option<RunReport>,
    /// RFC 3339 timestamps.
    pub created_at: String,
    pub updated_at: String,
}

/// A backend that can run `skill_run` as an MCP task: the run is created
/// and the call answers at once; the client polls for the result. Bound to
/// the caller like [`Executor`]: another principal's task is reported
/// missing (`job-not-found`), never shown.
#[async_trait::async_trait]
pub trait Tasks: Send + Sync {
    /// Start the run of a confirmed plan in a new job holding exactly
    /// `inputs`; `key` is the confirmation's ([`RunControl::key`]): a
    /// retried call finds the first task instead of starting a second.
    async fn submit(&self, caller: &Caller, plan: RunPlan, inputs: Vec<(String, Vec<u8>)>, key: &str) -> Result<TaskView, ToolError>;
    async fn status(&self, caller: &Caller, id: &str) -> Result<TaskView, ToolError>;
    /// Ask the run to stop; cancelling a finished task changes nothing.
    async fn cancel(&self, caller: &Caller, id: &str) -> Result<(), ToolError>;
}
