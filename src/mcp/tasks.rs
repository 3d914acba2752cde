//! MCP Tasks (SEP-2663, `io.modelcontextprotocol/tasks`) over a
//! [`Tasks`] backend: a confirmed `skill_run` answers a client that
//! declared the extension with a task at once, and `tasks/get` answers
//! with exactly the result the call would have returned. Offered only when
//! the execution has a tasks backend (the gateway's); the standalone
//! server runs every call to its end.

use rmcp::model::{CreateTaskResult, DetailedTask, GetTaskResult, JsonObject, Task, TaskPayload, TaskStatus};
use rmcp::ErrorData as McpError;
use serde_json::json;

use crate::core::limits::TASK_POLL_INTERVAL;
use crate::jobs::JobError;

use super::error::{codes, ToolError};
use super::executor::{Caller, TaskState, TaskView, Tasks};
use super::state::{Action, ServerState};

/// The tasks backend, when this server has one.
pub fn backend(state: &ServerState) -> Option<&dyn Tasks> {
    state.execution.as_ref().and_then(|e| e.tasks.as_deref())
}

fn task_of(view: &TaskView) -> Task {
    let status = match view.state {
        TaskState::Working => TaskStatus::Working,
        TaskState::Completed => TaskStatus::Completed,
        TaskState::Cancelled => TaskStatus::Cancelled,
        TaskState::Failed => TaskStatus::Failed,
    };
    // No TTL: the task lives as long as its job is retained.
    let task = Task::new(view.id.clone(), status, view.created_at.clone(), view.updated_at.clone())
        .with_poll_interval_ms(TASK_POLL_INTERVAL.as_millis() as u64);
    match &view.message {
        Some(message) => task.with_status_message(message.clone()),
        None => task,
    }
}

/// What a confirmed `skill_run` answers a task client.
pub fn created(view: &TaskView) -> CreateTaskResult {
    CreateTaskResult::new(task_of(view))
}

fn object<T: serde::Serialize>(value: &T) -> JsonObject {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => JsonObject::new(),
    }
}

/// A backend error as the JSON-RPC error of a `tasks/*` request. A task
/// that is missing and one of another principal get the same answer.
fn rpc_error(err: ToolError, id: &str) -> McpError {
    if err.code == JobError::NotFound(String::new()).code() {
        return McpError::invalid_params(format!("unknown task: {id}"), None);
    }
    let data = Some(json!({ "code": err.code }));
    match err.code {
        codes::FORBIDDEN | codes::UNAUTHORIZED => McpError::invalid_request(err.message, data),
        _ => McpError::internal_error(err.message, data),
    }
}

fn no_tasks<M: rmcp::model::ConstString>() -> McpError {
    McpError::method_not_found::<M>()
}

/// `tasks/get`: the task's state; once completed, the `CallToolResult`
/// `skill_run` returns for the same run.
pub async fn get(state: &ServerState, caller: &Caller, id: &str) -> Result<GetTaskResult, McpError> {
    let tasks = backend(state).ok_or_else(no_tasks::<rmcp::model::GetTaskMethod>)?;
    state.authorize(caller, Action::ReadJobs).await.map_err(|e| rpc_error(e, id))?;
    let view = tasks.status(caller, id).await.map_err(|e| rpc_error(e, id))?;
    let failed = |message: String| TaskPayload::Failed { error: object(&McpError::internal_error(message, None)) };
    let payload = match (view.state, &view.report) {
        (TaskState::Working, _) => TaskPayload::Working,
        (TaskState::Cancelled, _) => TaskPayload::Cancelled,
        (TaskState::Completed, Some(report)) => {
            TaskPayload::Completed { result: object(&super::shape(super::run::result_json(report.clone()))) }
        }
        (TaskState::Completed, None) => {
            failed(format!("task {id} completed but its result could not be read; read it with skill_job_status"))
        }
        (TaskState::Failed, _) => {
            failed(view.message.clone().unwrap_or_else(|| format!("task {id} failed; read it with skill_job_status")))
        }
    };
    Ok(GetTaskResult::new(DetailedTask::new(task_of(&view), payload)))
}

/// `tasks/cancel`: ask the run to stop; the next `tasks/get` shows the outcome.
pub async fn cancel(state: &ServerState, caller: &Caller, id: &str) -> Result<(), McpError> {
    let tasks = backend(state).ok_or_else(no_tasks::<rmcp::model::CancelTaskMethod>)?;
    state.authorize(caller, Action::DeleteJobs).await.map_err(|e| rpc_error(e, id))?;
    tasks.cancel(caller, id).await.map_err(|e| rpc_error(e, id))
}
