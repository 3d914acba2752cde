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

/// What a call's record says of the request, read before the call takes
/// its arguments (a digest and three names, not a copy of the arguments).
pub struct CallFacts {
    tool: String,
    args_digest: Option<String>,
    skill: Option<String>,
    script: Option<String>,
    job: Option<String>,
}

impl CallFacts {
    pub fn of(tool: &str, args: Option<&serde_json::Map<String, Value>>) -> CallFacts {
        let field = |name: &str| args.and_then(|a| a.get(name)).and_then(Value::as_str).map(str::to_string);
        CallFacts {
            tool: tool.to_string(),
            args_digest: args.map(digest_json),
            skill: field("skill"),
            script: field("script"),
            job: field("job"),
        }
    }
}

/// The `tool.call` record of one call, written once it has been answered.
pub fn tool_call(state: &ServerState, caller: &Caller, facts: CallFacts, response: &Result<CallToolResponse, McpError>) {
    let (outcome, code, reason, retry) = classify(response);
    let mut record = Record::new(Event::ToolCall, outcome).caller(caller).tool(facts.tool);
    record.args_digest = facts.args_digest;
    record.skill = facts.skill;
    record.script = facts.script;
    record.job = facts.job;
    record.code = code;
    record.reason = reason;
    record.retry_after_seconds = retry;
    state.audit.record(record);
}

/// What every record of one run says of it: the tool, skill, script and
/// the digest of its arguments, taken once before the plan moves on to the
/// backend (`None`: this server writes no records).
pub struct RunFacts {
    tool: &'static str,
    skill: String,
    script: String,
    args_digest: String,
}

impl RunFacts {
    pub fn of(state: &ServerState, tool: &'static str, plan: &RunPlan) -> Option<RunFacts> {
        state.audit.enabled().then(|| RunFacts {
            tool,
            skill: plan.skill.clone(),
            script: plan.script.as_str().to_string(),
            args_digest: digest_json(&plan.args),
        })
    }

    fn record(&self, event: Event, outcome: Outcome, caller: &Caller, job: Option<&str>) -> Record {
        let mut record = Record::new(event, outcome)
            .caller(caller)
            .tool(self.tool)
            .skill(&self.skill)
            .script(&self.script)
            .args_digest(self.args_digest.clone());
        record.job = job.map(str::to_string);
        record
    }
}

/// What the gate decided: a preview shown (`run.preview`), or a run let through (`run.start`).
pub fn gated(state: &ServerState, facts: Option<&RunFacts>, caller: &Caller, job: Option<&str>, inputs: &[InputSummary], gate: &Gate) {
    let Some(facts) = facts else { return };
    let record = match gate {
        Gate::Preview(value) => {
            let outcome = match value.get("status").and_then(Value::as_str) {
                Some("declined") => Outcome::Declined,
                _ => Outcome::ConfirmationRequired,
            };
            facts.record(Event::RunPreview, outcome, caller, job)
        }
        Gate::Ask(_) => facts.record(Event::RunPreview, Outcome::ConfirmationRequired, caller, job),
        Gate::Limited(limited) => facts
            .record(Event::RunStart, Outcome::RateLimited, caller, job)
            .code("rate-limited")
            .reason(limited.to_string())
            .retry_after(limited.retry_after_secs()),
        Gate::Run { confirmation, .. } => facts.record(Event::RunStart, Outcome::Ok, caller, job).confirmation(confirmation),
    };
    let files = inputs.iter().map(|i| FileRef { path: i.path.clone(), size: Some(i.size), sha256: Some(i.sha256.clone()) });
    state.audit.record(record.inputs(files.collect()));
}

/// How a run that started ended (`run.verdict`): its state and exit, or the backend's error.
pub fn verdict(state: &ServerState, facts: Option<&RunFacts>, caller: &Caller, report: &Result<RunReport, ToolError>) {
    let Some(facts) = facts else { return };
    let record = match report {
        Ok(report) => {
            let run = report.record.run.as_ref();
            let mut r = facts
                .record(Event::RunVerdict, Outcome::Ok, caller, Some(&report.record.id))
                .state(report.record.state.to_string())
                .exit_code(run.and_then(|r| r.outcome.exit_code))
                .duration_ms(run.map_or(0, |r| r.outcome.duration_ms));
            r.skilljob_uid.clone_from(&report.backend_id);
            r
        }
        Err(err) => {
            let outcome = if is_failure(err.code) { Outcome::Failed } else { Outcome::Refused };
            facts.record(Event::RunVerdict, outcome, caller, None).code(err.code).reason(err.message.clone())
        }
    };
    state.audit.record(record);
}

/// A file into a job (`file.upload`) or out of it (`file.download`).
pub fn file(state: &ServerState, event: Event, caller: &Caller, job: &str, file: FileRef) {
    if state.audit.enabled() {
        state.audit.record(Record::new(event, Outcome::Ok).caller(caller).job(job).file(file));
    }
}
