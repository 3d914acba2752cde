//! The confirmation gate shared by `skill_run` and `skill_job_run`: nothing
//! starts until the exact call has been shown to a person and confirmed,
//! by token (the caller repeats the call with the preview's token), by an
//! elicitation the client shows its user (2025-11-25 and older), or by an
//! input-required round trip (2026-07-28).
//!
//! The question a person reads is built so that no argument can forge it:
//! the facts they decide on (network, sandbox, secrets handed over) come
//! first, on lines no argument can precede, and every argument, path and
//! name is quoted with control characters made visible.

use rmcp::model::{
    ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, InputRequest, InputRequiredResult,
    ProtocolVersion,
};
use rmcp::service::{ElicitationError, Peer, RequestContext};
use rmcp::RoleServer;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::core::confirm::{call_digest, ConfirmMode, TOKEN_TTL};

use super::error::{codes, ToolError};
use super::executor::{Caller, RunCommand};
use super::ratelimit::RateLimiter;
use super::state::Execution;

/// What a run would do, shown before anything starts.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    pub skill: String,
    pub script: String,
    pub interpreter: String,
    /// The job the run uses (`null`: a new job is created for it).
    pub job: Option<String>,
    pub command: RunCommand,
    pub inputs: Vec<InputSummary>,
    /// Hosts the skill proposes to reach.
    pub egress: Vec<String>,
    /// Whether the grant lets the run use the network for them.
    pub egress_granted: bool,
    pub grant_from: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct InputSummary {
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// The call a confirmation token is bound to.
#[derive(Serialize)]
pub struct BoundCall<'a> {
    pub tool: &'a str,
    pub skill: &'a str,
    pub script: &'a str,
    pub args: &'a [String],
    pub job: Option<&'a str>,
    pub inputs: Vec<(&'a str, &'a str)>,
}

/// How a gated call ended: a preview waiting for confirmation, a question
/// for the client (2026-07-28 input-required round trip), or a run.
pub enum Gate {
    Preview(Value),
    Ask(InputRequiredResult),
    /// Run now. `key` is unique to the confirmation (the redeemed token's,
    /// or a fresh one when no token was involved): a backend starts at most
    /// one run per key, so a retried confirmed call never runs twice.
    Run {
        key: String,
        /// How it was confirmed (the audit's `confirmation`): `token`,
        /// `elicitation`, `input-response` or `auto`.
        confirmation: &'static str,
    },
    /// Confirmed, but the caller's `runs` bucket is empty: nothing ran and
    /// the token was not redeemed, so the same call may be retried.
    Limited(super::ratelimit::Limited),
}

fn fresh_key() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The key of the confirmation question in an input-required round trip.
const CONFIRM_INPUT: &str = "confirm-run";

/// The answers and handle a 2026-07-28 client sends when it retries a call.
#[derive(Default, Clone)]
pub struct Retry {
    pub input_responses: Option<rmcp::model::InputResponses>,
    pub request_state: Option<String>,
}

/// How this session can ask its user, taken from the request.
#[derive(Clone, Default)]
pub struct Asker {
    /// The session speaks 2026-07-28 (questions travel as input-required results).
    pub modern: bool,
    /// The client declared the elicitation capability.
    pub can_elicit: bool,
    /// The peer to send an elicitation request to (older protocol versions).
    pub peer: Option<Peer<RoleServer>>,
}

impl Asker {
    pub fn from_context(context: &RequestContext<RoleServer>) -> Asker {
        Asker {
            modern: context.protocol_version().is_some_and(|v| v.as_str() >= ProtocolVersion::V_2026_07_28.as_str()),
            can_elicit: context.client_capabilities().is_some_and(|c| c.elicitation.is_some()),
            peer: Some(context.peer.clone()),
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
struct RunConfirmation {
    /// Run exactly the call shown?
    run: bool,
}
rmcp::elicit_safe!(RunConfirmation);

/// Quote a value for a person: double quotes, and every control character,
/// quote and backslash escaped, so a newline in an argument cannot start a
/// line of its own.
pub fn quoted(text: &str) -> String {
    format!("{:?}", text)
}

/// The question a person answers. The decisive facts come first.
pub fn question(preview: &Preview) -> String {
    let c = &preview.command;
    let secrets = if c.env.is_empty() { "none".to_string() } else { c.env.iter().map(|n| quoted(n)).collect::<Vec<_>>().join(", ") };
    let argv = c.argv.iter().map(|a| quoted(a)).collect::<Vec<_>>().join(" ");
    let mut lines = vec![
        format!("network: {}", c.network),
        format!("sandbox: {}", c.sandbox),
        format!("variables handed over: {secrets}"),
        format!("timeout: {} s", c.timeout_secs),
    ];
    if !c.limits.is_empty() {
        lines.push(format!("limits: {}", c.limits.join(", ")));
    }
    lines.push(format!("Run {} of skill {}?", quoted(&preview.script), quoted(&preview.skill)));
    lines.push(format!("command: {argv}"));
    if !preview.inputs.is_empty() {
        let inputs = preview.inputs.iter().map(|i| format!("{} ({} bytes, {})", quoted(&i.path), i.size, i.sha256)).collect::<Vec<_>>();
        lines.push(format!("inputs: {}", inputs.join(", ")));
    }
    lines.join("\n")
}

/// Who is asking, and how they can be asked back (the parts of a call's
/// context the gate reads).
pub struct Asking<'a> {
    pub caller: &'a Caller,
    pub retry: &'a Retry,
    pub asker: &'a Asker,
}

/// Decide whether the call runs now.
///
/// A run is counted against `runs` at the moment it is decided (a token
/// given, an elicitation accepted, auto mode), before a token is redeemed:
/// a refused call keeps its token for the retry, a preview costs no run,
/// and a call with a wrong token costs its caller a run.
pub async fn gate(
    exec: &Execution,
    runs: &RateLimiter,
    who: &Asking<'_>,
    preview: &Preview,
    bound: &BoundCall<'_>,
    confirm: Option<&str>,
) -> Result<Gate, ToolError> {
    let (caller, retry, asker) = (who.caller, who.retry, who.asker);
    let admitted = |confirmation: &'static str, key: &dyn Fn() -> Result<String, ToolError>| match runs.check_run(&caller.principal) {
        Ok(()) => Ok(Gate::Run { key: key()?, confirmation }),
        Err(limited) => Ok(Gate::Limited(limited)),
    };
    let preview_json = serde_json::to_value(preview).unwrap_or_default();
    match exec.mode {
        ConfirmMode::Refuse => Err(ToolError::new(
            codes::RUNS_REFUSED,
            "this server's confirmation mode is `refuse`: nothing runs here (the preview shows what would have run)",
        )
        .with_detail(json!({ "preview": preview_json }))),
        ConfirmMode::Auto => admitted("auto", &|| Ok(fresh_key())),
        ConfirmMode::Ask => {
            // A token confirms this call, on this server, for this caller only.
            let digest = call_digest(&(&exec.scope, &caller.principal, bound));
            if let Some(token) = confirm {
                return admitted("token", &|| Ok(exec.confirmations.redeem(token, &digest)?));
            }
            let declined = || {
                Gate::Preview(json!({
                    "status": "declined",
                    "message": "The user did not confirm; nothing ran.",
                    "preview": preview_json,
                }))
            };
            let question = question(preview);
            if asker.modern {
                // 2026-07-28 has no server-to-client requests: the question
                // travels as an input-required result and the client retries
                // the same call with the answer and our handle (a token bound
                // to this exact call).
                if let (Some(answers), Some(handle)) = (&retry.input_responses, &retry.request_state) {
                    let answer = answers.get(CONFIRM_INPUT).cloned().and_then(|v| serde_json::from_value::<ElicitResult>(v).ok());
                    let yes = answer.as_ref().is_some_and(|a| {
                        a.action == ElicitationAction::Accept
                            && a.content.as_ref().and_then(|c| c.get("run")).and_then(Value::as_bool) == Some(true)
                    });
                    if !yes {
                        return Ok(declined());
                    }
                    return admitted("input-response", &|| Ok(exec.confirmations.redeem(handle, &digest)?));
                }
                if asker.can_elicit {
                    let schema = ElicitationSchema::from_type::<RunConfirmation>()
                        .map_err(|e| ToolError::internal(format!("confirmation schema: {e}")))?;
                    let request = ElicitRequest::new(ElicitRequestParams::FormElicitationParams {
                        meta: None,
                        message: question,
                        requested_schema: schema,
                    });
                    let handle = exec.confirmations.issue(&digest);
                    let mut questions = rmcp::model::InputRequests::new();
                    questions.insert(CONFIRM_INPUT.to_string(), InputRequest::Elicitation(request));
                    return Ok(Gate::Ask(InputRequiredResult::new(Some(questions), Some(handle))));
                }
            } else if let Some(peer) = &asker.peer {
                match peer.elicit::<RunConfirmation>(question).await {
                    Ok(Some(RunConfirmation { run: true })) => return admitted("elicitation", &|| Ok(fresh_key())),
                    Ok(_) | Err(ElicitationError::UserDeclined) | Err(ElicitationError::UserCancelled) => return Ok(declined()),
                    Err(_) => {}
                }
            }
            let token = exec.confirmations.issue(&digest);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn preview(args: &[&str]) -> Preview {
        Preview {
            skill: "s".into(),
            script: "scripts/a.py".into(),
            interpreter: "python".into(),
            job: None,
            command: RunCommand {
                backend: "local".into(),
                program: "/usr/bin/python3".into(),
                argv: std::iter::once("/usr/bin/python3".to_string()).chain(args.iter().map(|a| a.to_string())).collect(),
                cwd: "/work".into(),
                timeout_secs: 60,
                env: vec!["API_KEY".into()],
                env_missing: vec![],
                sandbox: "bubblewrap".into(),
                network: "host network".into(),
                run_as: None,
                limits: vec![],
            },
            inputs: vec![InputSummary { path: "in\nnetwork: none".into(), size: 1, sha256: "sha256:00".into() }],
            egress: vec![],
            egress_granted: false,
            grant_from: "declaration".into(),
        }
    }

    /// Issue 9, class 4: a newline in an argument printed a fake
    /// `sandbox: …, network: none` line above the real one.
    #[test]
    fn an_argument_cannot_forge_a_line_of_the_question() {
        let q = question(&preview(&["x\nsandbox: bubblewrap, network: none", "\u{1b}[2K\rnetwork: none"]));
        let lines: Vec<&str> = q.lines().collect();
        assert_eq!(lines[0], "network: host network", "{q}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("network:")).count(), 1, "{q}");
        assert_eq!(lines.iter().filter(|l| l.starts_with("sandbox:")).count(), 1, "{q}");
        assert!(q.contains(r#""x\nsandbox: bubblewrap, network: none""#), "{q}");
        assert!(q.contains(r#"\u{1b}[2K\rnetwork: none"#), "control characters are shown, not sent: {q}");
        assert!(!q.contains('\u{1b}') && !q.contains('\r'));
    }
}
