//! MCP Tasks hooks (`io.modelcontextprotocol/tasks`): a task is a SkillJob.
//! Its id is the SkillJob's name, derived from the confirmation key
//! ([`super::names::run_name`]: unguessable without the key, bound to the
//! namespace and the caller), and its state is the SkillJob's, so any
//! replica answers `tasks/get` and a gateway restart loses no task.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use super::error::{ExecError, Result};
use super::names::{is_job_id, run_name};
use super::record::{self, is_finished};
use super::KubeExecutor;
use crate::api::job::SkillJob;
use crate::api::job::SkillJobPhase;
use crate::core::fence::RunPlan;
use crate::jobs::JobError;
use crate::mcp::error::ToolError;
use crate::mcp::executor::{self as seam, Caller, RunReport, TaskView, Tasks};

/// A task's state in the MCP sense.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Accepted, starting or running (or a cancel still stopping its pod).
    Working,
    /// The run ended with a result (whatever the script's exit code).
    Completed,
    /// Cancelled, and its pod has stopped.
    Cancelled,
    /// No result can be shown: the pod's stop was not confirmed (Locked).
    Failed,
}

/// What `tasks/get` answers.
#[derive(Debug, Clone)]
pub struct TaskStatus {
    pub state: TaskState,
    /// The controller's sentence about the run.
    pub message: Option<String>,
    /// The run's result, once it is `Completed` or `Cancelled`.
    pub report: Option<RunReport>,
    /// When the SkillJob was written, and when its run last moved (RFC 3339).
    pub created_at: String,
    pub updated_at: String,
}

/// The SkillJob's creation time, and the latest of its start, end and
/// condition changes.
fn times(sj: &SkillJob) -> (String, String) {
    let created = sj.metadata.creation_timestamp.as_ref().map(|t| t.0).unwrap_or_else(k8s_openapi::jiff::Timestamp::now);
    let status = sj.status.as_ref();
    let moved = status
        .into_iter()
        .flat_map(|s| s.started_at.iter().chain(s.finished_at.iter()).chain(s.conditions.iter().map(|c| &c.last_transition_time)))
        .map(|t: &Time| t.0)
        .max()
        .map_or(created, |t| t.max(created));
    (created.to_string(), moved.to_string())
}

impl KubeExecutor {
    /// Write the run's SkillJob (cap, idempotency and staging as
    /// `skill_run`) and return its name, the task id, at once.
    pub async fn submit(&self, caller: &Caller, plan: &RunPlan, inputs: &[(String, Vec<u8>)], key: &str) -> Result<String> {
        let name = run_name(&self.options.namespace, &caller.principal, key);
        let sj = self.submit_named(caller, plan, inputs, &name).await?;
        Ok(sj.name_any())
    }

    async fn task(&self, caller: &Caller, name: &str) -> Result<crate::api::job::SkillJob> {
        if !is_job_id(name) {
            return Err(JobError::NotFound(name.to_string()).into());
        }
        self.owned_skilljob(caller, name).await?.ok_or_else(|| JobError::NotFound(name.to_string()).into())
    }

    /// The task's state, read from its SkillJob.
    pub async fn task_status(&self, caller: &Caller, name: &str) -> Result<TaskStatus> {
        let sj = self.task(caller, name).await?;
        let message = sj.status.as_ref().and_then(|s| s.message.clone());
        let (created_at, updated_at) = times(&sj);
        if !is_finished(&sj) {
            return Ok(TaskStatus { state: TaskState::Working, message, report: None, created_at, updated_at });
        }
        let phase = sj.status.as_ref().and_then(|s| s.phase);
        if phase == Some(SkillJobPhase::Locked) {
            return Ok(TaskStatus { state: TaskState::Failed, message, report: None, created_at, updated_at });
        }
        let (outcome, outputs) = self.results(&sj).await?;
        let mut stdout = self.stream(&sj, "stdout").await?.unwrap_or_default();
        let mut stderr = self.stream(&sj, "stderr").await?.unwrap_or_default();
        let mut outcome = outcome;
        for (bytes, truncated) in [(&mut stdout, &mut outcome.stdout_truncated), (&mut stderr, &mut outcome.stderr_truncated)] {
            if bytes.len() as u64 > crate::core::limits::STREAM_CAP {
                bytes.truncate(crate::core::limits::STREAM_CAP as usize);
                *truncated = true;
            }
        }
        let rec = record::job_record(&sj, &outcome);
        let note = rec.run.as_ref().and_then(|r| r.note.clone());
        let report = RunReport { record: rec, stdout, stderr, outputs, command: self.command_of(&sj), note, backend_id: sj.uid() };
        let state = if phase == Some(SkillJobPhase::Cancelled) { TaskState::Cancelled } else { TaskState::Completed };
        Ok(TaskStatus { state, message, report: Some(report), created_at, updated_at })
    }

    /// Cancel the task's run (the controller deletes its pod; the phase
    /// becomes Cancelled). Cancelling a finished task changes nothing.
    pub async fn task_cancel(&self, caller: &Caller, name: &str) -> Result<()> {
        let sj = self.task(caller, name).await?;
        if is_finished(&sj) {
            return Ok(());
        }
        self.cancel_skilljob(caller, name).await.map_err(|e| match e {
            ExecError::Kube { source, .. } if super::error::is_status(&source, 404) => JobError::NotFound(name.to_string()).into(),
            other => other,
        })
    }
}

/// The MCP seam's view of a task: the same states, the report only once
/// the run completed (a cancelled task carries no result in MCP).
fn view(id: String, status: TaskStatus) -> TaskView {
    let state = match status.state {
        TaskState::Working => seam::TaskState::Working,
        TaskState::Completed => seam::TaskState::Completed,
        TaskState::Cancelled => seam::TaskState::Cancelled,
        TaskState::Failed => seam::TaskState::Failed,
    };
    let report = if status.state == TaskState::Completed { status.report } else { None };
    TaskView { id, state, message: status.message, report, created_at: status.created_at, updated_at: status.updated_at }
}

#[async_trait::async_trait]
impl Tasks for KubeExecutor {
    async fn submit(&self, caller: &Caller, plan: RunPlan, inputs: Vec<(String, Vec<u8>)>, key: &str) -> Result<TaskView, ToolError> {
        let name = run_name(&self.options.namespace, &caller.principal, key);
        let sj = self.submit_named(caller, &plan, &inputs, &name).await?;
        let (created_at, updated_at) = times(&sj);
        let message = sj.status.as_ref().and_then(|s| s.message.clone());
        Ok(TaskView { id: sj.name_any(), state: seam::TaskState::Working, message, report: None, created_at, updated_at })
    }

    async fn status(&self, caller: &Caller, id: &str) -> Result<TaskView, ToolError> {
        Ok(view(id.to_string(), self.task_status(caller, id).await?))
    }

    async fn cancel(&self, caller: &Caller, id: &str) -> Result<(), ToolError> {
        Ok(self.task_cancel(caller, id).await?)
    }
}
