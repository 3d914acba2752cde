//! The console's JSON API. Each handler is the MCP tool of the same name
//! behind the same checks: the gate in front of every namespaced route
//! (a verified token, `get skillbindings` there), then the namespace's
//! authorizer for the action the tool is ([`Action::of_tool`]), then the
//! tool function itself on the namespace's current snapshot. So a person
//! in the console can do exactly what their token could do over MCP,
//! and a run goes through `skill_run`'s preview-and-confirm gate.
//!
//! Answers are the tools' JSON; refusals are
//! `{"error":{"code":…,"message":…}}` with the HTTP status the code
//! means (401, 403, 404, 409, 503, else 400).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::limits::{NAMESPACES_LISTED_MAX, NAMESPACE_REVIEWS_IN_FLIGHT, STREAM_SHOWN_BYTES};
use super::Console;
use crate::gateway::auth::AuthError;
use crate::gateway::file_url::route_path;
use crate::gateway::namespaces::Namespace;
use crate::gateway::shared::{charge_call, json_error, limited, served_or_refusal};
use crate::jobs::JobState;
use crate::mcp::error::{codes, ToolError};
use crate::mcp::executor::Caller;
use crate::mcp::run::{self, CallContext, JobIdInput, JobListInput, JobReadInput, RunReply, SkillRunInput};
use crate::mcp::state::Action;
use crate::mcp::tools::{self, FileResult, SkillFileInput, SkillListInput, SkillLoadInput};

/// The HTTP status a tool error's code means.
pub fn status_of(code: &str) -> StatusCode {
    match code {
        codes::UNAUTHORIZED => StatusCode::UNAUTHORIZED,
        codes::FORBIDDEN | codes::RUNS_REFUSED => StatusCode::FORBIDDEN,
        codes::BACKEND => StatusCode::SERVICE_UNAVAILABLE,
        codes::BUSY | "job-cap-reached" => StatusCode::TOO_MANY_REQUESTS,
        codes::INTERNAL => StatusCode::INTERNAL_SERVER_ERROR,
        codes::NO_EXECUTION | "unknown-skill" | "job-not-found" | "job-no-such-file" | "skill-not-bound" | "not-found" => {
            StatusCode::NOT_FOUND
        }
        "job-not-run-yet" | "job-still-running" | "job-uploads-closed" | "job-withheld" | "job-vanished" | "job-already-ran" => {
            StatusCode::CONFLICT
        }
        _ => StatusCode::BAD_REQUEST,
    }
}

/// A tool error as an answer; its detail (a refused run's preview) rides along.
pub fn refusal(err: ToolError) -> Response {
    let mut body = json!({ "error": { "code": err.code, "message": err.message } });
    if let (Some(Value::Object(extra)), Value::Object(map)) = (err.detail, &mut body) {
        map.extend(extra);
    }
    (status_of(err.code), axum::Json(body)).into_response()
}

fn answer<T: serde::Serialize>(outcome: Result<T, ToolError>) -> Response {
    match outcome {
        Ok(value) => axum::Json(value).into_response(),
        Err(err) => refusal(err),
    }
}

/// `/ui/…` paths that are not a route.
pub async fn not_found() -> Response {
    json_error(StatusCode::NOT_FOUND, "not-found", "no such console path; the console is at /ui/".into())
}

/// `GET /ui/api/config`: what the login page shows before any token
/// (the issuers a person can get a token from). Open, like the RFC 9728
/// metadata it mirrors.
pub async fn config(State(console): State<Console>) -> Response {
    let config = console.auth.config();
    axum::Json(json!({
        "authorizationServers": config.authorization_servers,
        "anonymous": config.allow_anonymous,
        "version": env!("CARGO_PKG_VERSION"),
    }))
    .into_response()
}

/// The caller of a route outside the namespaced gate (its call charged to
/// the gateway-wide budget: these routes name no namespace), or the refusal.
async fn authenticated(console: &Console, headers: &HeaderMap) -> Result<Caller, Response> {
    let caller = console.auth.authenticate(headers.get(header::AUTHORIZATION)).await.map_err(|err| {
        if let AuthError::Unavailable(detail) = &err {
            tracing::warn!(%detail, "cannot check a console request's token; answering 503");
        }
        err.into_response("")
    })?;
    charge_call(&console.limits, &caller).map_err(limited)?;
    Ok(caller)
}

/// `GET /ui/api/me`: who the token is (the page's login check).
pub async fn me(State(console): State<Console>, headers: HeaderMap) -> Response {
    match authenticated(&console, &headers).await {
        Ok(caller) => axum::Json(json!({ "user": caller.principal, "groups": caller.groups })).into_response(),
        Err(response) => response,
    }
}

/// `GET /ui/api/namespaces`: the namespaces with bindings that the caller
/// may `get skillbindings` in, each asked by SubjectAccessReview (the
/// answers are cached like the gate's). An API server that cannot answer
/// for one of them makes the whole list 503: a list silently missing
/// namespaces would read as "you have no access there".
pub async fn namespaces(State(console): State<Console>, headers: HeaderMap) -> Response {
    let caller = match authenticated(&console, &headers).await {
        Ok(caller) => caller,
        Err(response) => return response,
    };
    if !console.ready.is_ready() {
        return json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not-ready",
            "the gateway is still reading the cluster's bindings; retry in a moment".into(),
        );
    }
    let bound = console.directory.bound_namespaces();
    let truncated = bound.len() > NAMESPACES_LISTED_MAX;
    let auth = &console.auth;
    let caller_ref = &caller;
    let decisions: Vec<(String, Result<(), AuthError>)> = futures::stream::iter(bound.into_iter().take(NAMESPACES_LISTED_MAX))
        .map(|ns| async move {
            let decision = auth.authorize_action(caller_ref, &ns, Action::ReadSkills).await;
            (ns, decision)
        })
        .buffered(NAMESPACE_REVIEWS_IN_FLIGHT)
        .collect()
        .await;
    let mut visible = Vec::new();
    for (ns, decision) in decisions {
        match decision {
            Ok(()) => visible.push(ns),
            Err(AuthError::Forbidden { .. }) => {}
            Err(err) => {
                tracing::warn!(namespace = %ns, error = %err, "cannot decide a console namespace; answering 503");
                return err.into_response("");
            }
        }
    }
    axum::Json(json!({ "user": caller.principal, "namespaces": visible, "truncated": truncated, "listedMax": NAMESPACES_LISTED_MAX }))
        .into_response()
}

/// The namespace behind the gate, once the caller's `calls` budget there
/// has a token for the request (the same buckets as their MCP calls) and
/// the action is authorized for them.
pub(super) async fn authorized(console: &Console, namespace: &str, caller: &Caller, action: Action) -> Result<Arc<Namespace>, Response> {
    let ns = served_or_refusal(&console.namespaces, &console.ready, namespace).await?;
    charge_call(&ns.state.rate_limits, caller).map_err(limited)?;
    ns.state.authorize(caller, action).await.map_err(refusal)?;
    Ok(ns)
}

fn context(caller: Caller) -> CallContext {
    CallContext { caller, ..CallContext::default() }
}

/// `GET /ui/api/ns/{namespace}/skills`: `skill_list`.
pub async fn skills(State(console): State<Console>, Path(namespace): Path<String>, Extension(caller): Extension<Caller>) -> Response {
    let ns = match authorized(&console, &namespace, &caller, Action::of_tool("skill_list")).await {
        Ok(ns) => ns,
        Err(response) => return response,
    };
    let snap = ns.state.snapshot();
    answer(tools::skill_list(&ns.state, &snap, SkillListInput::default()))
}

/// `GET /ui/api/ns/{namespace}/skills/{skill}`: `skill_load` (instructions, files, scripts).
pub async fn skill(
    State(console): State<Console>,
    Path((namespace, skill)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let ns = match authorized(&console, &namespace, &caller, Action::of_tool("skill_load")).await {
        Ok(ns) => ns,
        Err(response) => return response,
    };
    let snap = ns.state.snapshot();
    // It reads SKILL.md from disk.
    let loaded = tokio::task::spawn_blocking(move || tools::skill_load(&snap, SkillLoadInput { name: skill })).await;
    answer(loaded.map_err(ToolError::from).and_then(|r| r))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    pub path: String,
}

/// `GET /ui/api/ns/{namespace}/skills/{skill}/file?path=…`: `skill_file` of one path.
pub async fn skill_file(
    State(console): State<Console>,
    Path((namespace, skill)): Path<(String, String)>,
    Query(query): Query<FileQuery>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let ns = match authorized(&console, &namespace, &caller, Action::of_tool("skill_file")).await {
        Ok(ns) => ns,
        Err(response) => return response,
    };
    let snap = ns.state.snapshot();
    let read = tokio::task::spawn_blocking(move || tools::skill_file(&snap, SkillFileInput { skill, paths: vec![query.path] })).await;
    match read.map_err(ToolError::from).and_then(|r| r) {
        Ok(mut out) => match out.results.pop() {
            Some(FileResult::Ok(file)) => axum::Json(file).into_response(),
            Some(FileResult::Err(err)) => {
                let status = if err.error.code == "not-found" { StatusCode::NOT_FOUND } else { StatusCode::BAD_REQUEST };
                (status, axum::Json(json!({ "error": err.error }))).into_response()
            }
            None => refusal(ToolError::internal("skill_file answered no result for one path")),
        },
        Err(err) => refusal(err),
    }
}

/// `GET /ui/api/ns/{namespace}/jobs`: `skill_job_list` (the caller's jobs, newest first).
pub async fn jobs(State(console): State<Console>, Path(namespace): Path<String>, Extension(caller): Extension<Caller>) -> Response {
    let ns = match authorized(&console, &namespace, &caller, Action::of_tool("skill_job_list")).await {
        Ok(ns) => ns,
        Err(response) => return response,
    };
    answer(run::job_list(&ns.state, JobListInput::default(), &context(caller)).await)
}

/// `GET /ui/api/ns/{namespace}/jobs/{job}`: `skill_job_status`, and once
/// the run is over the first [`STREAM_SHOWN_BYTES`] of stdout and stderr
/// (`skill_job_read`) and each output's file route URL.
pub async fn job(
    State(console): State<Console>,
    Path((namespace, job)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let ns = match authorized(&console, &namespace, &caller, Action::of_tool("skill_job_status")).await {
        Ok(ns) => ns,
        Err(response) => return response,
    };
    let cx = context(caller);
    let status = match run::job_status(&ns.state, JobIdInput { job: job.clone() }, &cx).await {
        Ok(status) => status,
        Err(err) => return refusal(err),
    };
    let over = !matches!(status.record.state, JobState::Created | JobState::Running);
    let mut streams = serde_json::Map::new();
    for stream in ["stdout", "stderr"] {
        let read = if over {
            let input =
                JobReadInput { job: job.clone(), path: None, stream: Some(stream.into()), offset: 0, limit: Some(STREAM_SHOWN_BYTES) };
            match run::job_read(&ns.state, input, &cx).await {
                Ok(chunk) => serde_json::to_value(chunk).unwrap_or(Value::Null),
                Err(err) => json!({ "error": { "code": err.code, "message": err.message } }),
            }
        } else {
            Value::Null
        };
        streams.insert(stream.into(), read);
    }
    let downloads: Vec<Value> = status
        .outputs
        .iter()
        .flat_map(|listing| &listing.files)
        .map(|f| json!({ "path": f.path, "url": route_path(&namespace, &job, &f.path) }))
        .collect();
    axum::Json(json!({ "job": status, "streams": streams, "downloads": downloads })).into_response()
}

/// `POST /ui/api/ns/{namespace}/run`: `skill_run`, body as its arguments.
/// Without `confirm` nothing runs: the answer is the preview and a token
/// bound to this exact call, this caller and this namespace; the page
/// shows the preview and, when the person confirms, repeats the call with
/// the token. A confirmed run is started as a task (the SkillJob goes on
/// whatever the page does) and answered at once with its job id.
pub async fn run(
    State(console): State<Console>,
    Path(namespace): Path<String>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let ns = match authorized(&console, &namespace, &caller, Action::of_tool("skill_run")).await {
        Ok(ns) => ns,
        Err(response) => return response,
    };
    let json_body = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/json"));
    if !json_body {
        return refusal(ToolError::new(codes::INVALID_ARGUMENTS, "send the run as JSON (Content-Type: application/json)"));
    }
    let input: SkillRunInput = match serde_json::from_slice(&body) {
        Ok(input) => input,
        Err(err) => return refusal(ToolError::new(codes::INVALID_ARGUMENTS, format!("invalid arguments: {err}"))),
    };
    let snap = ns.state.snapshot();
    // A backend without tasks answers when the run ends; if the page goes
    // away first, the run is treated as the MCP call whose client left.
    let cancel = tokio_util::sync::CancellationToken::new();
    let _left = cancel.clone().drop_guard();
    let cx = CallContext { caller, cancel, tasks: true, ..CallContext::default() };
    match run::skill_run(&ns.state, &snap, input, &cx).await {
        Ok(RunReply::Json(value)) => axum::Json(value).into_response(),
        Ok(RunReply::Task(view)) => (StatusCode::ACCEPTED, axum::Json(json!({ "status": "started", "job": view.id }))).into_response(),
        // Only an MCP client that can be asked gets a question; the console cannot.
        Ok(RunReply::InputRequired(_)) => refusal(ToolError::internal("the run asked a question the console cannot show")),
        // The console's runs count against the same per-principal bucket as MCP runs.
        Ok(RunReply::Limited(limited)) => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, limited.retry_after_secs().to_string())],
            axum::Json(json!({ "error": { "code": "rate-limited", "message": limited.to_string() } })),
        )
            .into_response(),
        Err(err) => refusal(err),
    }
}
