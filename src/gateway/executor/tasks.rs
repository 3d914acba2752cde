//! MCP Tasks hooks (`io.modelcontextprotocol/tasks`): a task is a SkillJob.
//! Its id is the SkillJob's name, derived from the confirmation key
//! ([`super::names::run_name`]: unguessable without the key, bound to the
//! namespace and the caller), and its state is the SkillJob's, so any
//! replica answers `tasks/get` and a gateway restart loses no task.

use kube::ResourceExt;

use super::error::{ExecError, Result};
use super::names::{is_job_id, run_name};
use super::record::{self, is_finished};
use super::KubeExecutor;
use crate::api::job::SkillJobPhase;
use crate::core::fence::RunPlan;
use crate::jobs::JobError;
use crate::mcp::executor::{Caller, RunReport};

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
        if !is_finished(&sj) {
            return Ok(TaskStatus { state: TaskState::Working, message, report: None });
        }
        let phase = sj.status.as_ref().and_then(|s| s.phase);
        if phase == Some(SkillJobPhase::Locked) {
            return Ok(TaskStatus { state: TaskState::Failed, message, report: None });
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
        let report = RunReport { record: rec, stdout, stderr, outputs, command: self.command_of(&sj), note };
        let state = if phase == Some(SkillJobPhase::Cancelled) { TaskState::Cancelled } else { TaskState::Completed };
        Ok(TaskStatus { state, message, report: Some(report) })
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
