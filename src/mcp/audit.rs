//! The MCP surface's audit records: what a tool call, a run's gate, a run's
//! end and a file moving into or out of a job look like in the trail
//! ([`crate::audit`] writes them). Shared by `serve` and the gateway, so
//! both write the same shape.

use rmcp::model::CallToolResponse;
use rmcp::ErrorData as McpError;
use serde_json::Value;

use crate::audit::{digest_json, Event, FileRef, Outcome, Record};
use crate::core::fence::RunPlan;

use super::error::{codes, ToolError};
use super::executor::{Caller, RunReport};
use super::gate::{Gate, InputSummary};
use super::ratelimit::RATE_LIMITED;
use super::state::ServerState;

/// Error codes that mean something broke rather than a rule said no.
fn is_failure(code: &str) -> bool {
    matches!(code, codes::INTERNAL | codes::BACKEND | codes::BUSY)
}

/// How a call's response reads in the trail: outcome, code, reason, retry-after.
fn classify(response: &Result<CallToolResponse, McpError>) -> (Outcome, Option<String>, Option<String>, Option<u64>) {
    match response {
        Err(err) if err.code == RATE_LIMITED => {
            let retry = err.data.as_ref().and_then(|d| d.get("retryAfterSeconds")).and_then(Value::as_u64);
            (Outcome::RateLimited, Some("rate-limited".into()), Some(err.message.to_string()), retry)
        }
        Err(err) => (Outcome::Refused, Some(format!("jsonrpc:{}", err.code.0)), Some(err.message.to_string()), None),
        Ok(CallToolResponse::InputRequired(_)) => (Outcome::ConfirmationRequired, None, None, None),
        Ok(CallToolResponse::Task(_)) => (Outcome::Ok, None, None, None),
        Ok(CallToolResponse::Complete(result)) => {
            let body = result.structured_content.as_ref();
            if result.is_error == Some(true) {
                let error = body.and_then(|b| b.get("error"));
                let code = error.and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or(codes::INTERNAL);
                let message = error.and_then(|e| e.get("message")).and_then(Value::as_str).map(str::to_string);
                let outcome = if is_failure(code) { Outcome::Failed } else { Outcome::Refused };
                return (outcome, Some(code.to_string()), message, None);
            }
            match body.and_then(|b| b.get("status")).and_then(Value::as_str) {
                Some("confirmation-required") => (Outcome::ConfirmationRequired, None, None, None),
                Some("declined") => (Outcome::Declined, None, None, None),
                _ => (Outcome::Ok, None, None, None),
            }
        }
        // A response kind added after this was written.
        Ok(_) => (Outcome::Ok, None, None, None),
    }
}

/// The `tool.call` record of one call, written once it has been answered.
pub fn tool_call(
    state: &ServerState,
    caller: &Caller,
    tool: &str,
    args: Option<&serde_json::Map<String, Value>>,
    response: &Result<CallToolResponse, McpError>,
) {
    if !state.audit.enabled() {
        return;
    }
    let (outcome, code, reason, retry) = classify(response);
    let mut record = Record::new(Event::ToolCall, outcome).caller(caller).tool(tool);
    if let Some(args) = args {
        record = record.args_digest(digest_json(args));
        let field = |name: &str| args.get(name).and_then(Value::as_str).map(str::to_string);
        record.skill = field("skill");
        record.script = field("script");
        record.job = field("job");
    }
    record.code = code;
    record.reason = reason;
    record.retry_after_seconds = retry;
    state.audit.record(record);
}

fn run_record(event: Event, outcome: Outcome, caller: &Caller, plan: &RunPlan, job: Option<&str>) -> Record {
    let mut record =
        Record::new(event, outcome).caller(caller).skill(&plan.skill).script(plan.script.as_str()).args_digest(digest_json(&plan.args));
    record.job = job.map(str::to_string);
    record
}

/// What the gate decided: a preview shown (`run.preview`), or a run let through (`run.start`).
pub fn gated(
    state: &ServerState,
    tool: &'static str,
    caller: &Caller,
    plan: &RunPlan,
    job: Option<&str>,
    inputs: &[InputSummary],
    gate: &Gate,
) {
    if !state.audit.enabled() {
        return;
    }
    let record = match gate {
        Gate::Preview(value) => {
            let outcome = match value.get("status").and_then(Value::as_str) {
                Some("declined") => Outcome::Declined,
                _ => Outcome::ConfirmationRequired,
            };
            run_record(Event::RunPreview, outcome, caller, plan, job)
        }
        Gate::Ask(_) => run_record(Event::RunPreview, Outcome::ConfirmationRequired, caller, plan, job),
        Gate::Limited(limited) => run_record(Event::RunStart, Outcome::RateLimited, caller, plan, job)
            .code("rate-limited")
            .reason(limited.to_string())
            .retry_after(limited.retry_after_secs()),
        Gate::Run { confirmation, .. } => run_record(Event::RunStart, Outcome::Ok, caller, plan, job).confirmation(confirmation),
    };
    let files = inputs.iter().map(|i| FileRef { path: i.path.clone(), size: Some(i.size), sha256: Some(i.sha256.clone()) });
    state.audit.record(record.tool(tool).inputs(files.collect()));
}

/// How a run that started ended (`run.verdict`): its state and exit, or the backend's error.
pub fn verdict(state: &ServerState, tool: &'static str, caller: &Caller, plan: &RunPlan, report: &Result<RunReport, ToolError>) {
    if !state.audit.enabled() {
        return;
    }
    let record = match report {
        Ok(report) => {
            let run = report.record.run.as_ref();
            let mut r = run_record(Event::RunVerdict, Outcome::Ok, caller, plan, Some(&report.record.id))
                .state(report.record.state.to_string())
                .exit_code(run.and_then(|r| r.outcome.exit_code))
                .duration_ms(run.map_or(0, |r| r.outcome.duration_ms));
            r.skilljob_uid.clone_from(&report.backend_id);
            r
        }
        Err(err) => {
            let outcome = if is_failure(err.code) { Outcome::Failed } else { Outcome::Refused };
            run_record(Event::RunVerdict, outcome, caller, plan, None).code(err.code).reason(err.message.clone())
        }
    };
    state.audit.record(record.tool(tool));
}

/// A file into a job (`file.upload`) or out of it (`file.download`).
pub fn file(state: &ServerState, event: Event, caller: &Caller, job: &str, file: FileRef) {
    if state.audit.enabled() {
        state.audit.record(Record::new(event, Outcome::Ok).caller(caller).job(job).file(file));
    }
}
