//! The MCP surface over the skill core: tools, prompts, resources and the
//! SEP-2640 skills extension, as one `rmcp` server handler shared by the
//! stdio and HTTP transports (and later the gateway).

pub mod audit;
pub mod early;
pub mod error;
pub mod executor;
pub mod extension;
pub mod gate;
pub mod notify;
pub mod ratelimit;
pub mod run;
pub mod search;
pub mod snapshot;
pub mod state;
pub mod tasks;
pub mod tools;
pub mod uri;

#[cfg(test)]
mod seam_tests;

use std::sync::{Arc, OnceLock};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, GetPromptRequestParams, GetPromptResponse,
    GetPromptResult, GetSkillRequestParams, GetSkillResult, GetTaskParams, GetTaskResult, Implementation, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListSkillsResult, ListToolsResult, PaginatedRequestParams, Prompt, PromptMessage,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ResourceTemplate, Role,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::Serialize;
use serde_json::Value;
use tracing::Instrument as _;

use crate::core::content::read_for_client;
use crate::core::limits::{bytes_text, RESOURCE_READ_CAP};
use crate::core::paths::resolve_inside;

use error::{codes, ToolError};
use executor::Caller;
use gate::{Asker, Retry};
use run::CallContext;
use snapshot::Snapshot;
use state::ServerState;

/// Prompts and resources per list page.
const LIST_PAGE: usize = 500;

/// The MCP handler: cheap to clone, all state behind one `Arc`.
#[derive(Clone)]
pub struct SkillServer {
    state: Arc<ServerState>,
}

impl SkillServer {
    pub fn new(state: Arc<ServerState>) -> Self {
        SkillServer { state }
    }

    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }
}

/// Every tool this server offers (read tools, then run and job tools).
pub fn tool_definitions() -> &'static [Tool] {
    static TOOLS: OnceLock<Vec<Tool>> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let mut all = tools::definitions();
        all.extend(run::definitions());
        all
    })
}

/// The tools a server offers: the read tools, plus the run and job tools
/// when it runs scripts; none at all while a server that serves only bound
/// skills (the gateway) has no skill to serve.
fn offered_tools(state: &ServerState) -> Vec<Tool> {
    if state.tools_only_when_bound && state.snapshot().catalog.skills.is_empty() {
        return Vec::new();
    }
    let read = tools::definitions().len();
    let all = tool_definitions();
    if state.execution.is_some() {
        all.to_vec()
    } else {
        all[..read].to_vec()
    }
}

/// What `initialize` tells the model: how to start, or that nothing is bound yet.
fn instructions(state: &ServerState) -> String {
    if state.tools_only_when_bound && state.snapshot().catalog.skills.is_empty() {
        return "This server serves the Agent Skills bound in this namespace; none is bound yet. \
                Its tools appear (notifications/tools/list_changed) once a SkillBinding here is ready."
            .to_string();
    }
    "This server serves Agent Skills. Call skill_list to see the skills and skill_load to read one skill's \
     instructions before using it; skill_file reads the files a skill refers to."
        .to_string()
}

/// The caller of a request: what the HTTP layer put in the request's
/// extensions (an authenticated principal), or the local caller over stdio.
fn caller_of(context: &RequestContext<RoleServer>) -> Caller {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Caller>().cloned())
        .unwrap_or_else(Caller::local)
}

/// Tool arguments into their typed input; a bad shape is a tool error the caller can read.
fn parse_args<I: serde::de::DeserializeOwned>(args: Option<serde_json::Map<String, Value>>) -> Result<I, ToolError> {
    serde_json::from_value(Value::Object(args.unwrap_or_default()))
        .map_err(|err| ToolError::new(codes::INVALID_ARGUMENTS, format!("invalid arguments: {err}")))
}

/// Run a tool body that reads files off the async threads.
async fn blocking<I, O>(snap: Arc<Snapshot>, input: I, body: fn(&Snapshot, I) -> Result<O, ToolError>) -> Result<O, ToolError>
where
    I: Send + 'static,
    O: Send + 'static,
{
    tokio::task::spawn_blocking(move || body(&snap, input)).await?
}

/// A tool outcome as an MCP result: structured JSON plus the same JSON as text.
fn shape<O: Serialize>(outcome: Result<O, ToolError>) -> CallToolResult {
    match outcome {
        Ok(output) => match serde_json::to_value(&output) {
            Ok(value) => {
                let text = serde_json::to_string(&value).unwrap_or_default();
                let mut result = CallToolResult::structured(value);
                result.content = vec![ContentBlock::text(text)];
                result
            }
            Err(err) => tool_error(&ToolError::internal(format!("could not encode the result: {err}"))),
        },
        Err(err) => tool_error(&err),
    }
}

fn tool_error(err: &ToolError) -> CallToolResult {
    let mut body = serde_json::json!({"error": {"code": err.code, "message": err.message}});
    if let (Some(Value::Object(extra)), Value::Object(map)) = (&err.detail, &mut body) {
        map.extend(extra.clone());
    }
    let mut result = CallToolResult::structured_error(body);
    result.content = vec![ContentBlock::text(format!("{}: {}", err.code, err.message))];
    result
}

/// A run tool's reply as an MCP response (a question travels as
/// input-required, a rate-limit refusal as a JSON-RPC error).
fn run_reply(reply: Result<run::RunReply, ToolError>) -> Result<CallToolResponse, McpError> {
    Ok(match reply {
        Ok(run::RunReply::InputRequired(question)) => CallToolResponse::InputRequired(question),
        Ok(run::RunReply::Task(view)) => CallToolResponse::Task(tasks::created(&view)),
        Ok(run::RunReply::Json(value)) => shape(Ok::<_, ToolError>(value)).into(),
        Ok(run::RunReply::Limited(limited)) => return Err(limited.into()),
        Err(err) => tool_error(&err).into(),
    })
}

impl SkillServer {
    /// The gateway namespace this server serves (`None`: the standalone server).
    fn namespace(&self) -> Option<&str> {
        self.state.execution.as_ref().map(|e| e.scope.as_str()).filter(|s| !s.is_empty())
    }

    /// One tool call, and its audit record once it is answered.
    async fn call(&self, request: CallToolRequestParams, context: &RequestContext<RoleServer>) -> Result<CallToolResponse, McpError> {
        let caller = caller_of(context);
        let audited = self.state.audit.enabled().then(|| audit::CallFacts::of(&request.name, request.arguments.as_ref()));
        // The whole call, from the settle wait to the answer: a run's trace starts here.
        let span = tracing::info_span!(
            target: "skill_operator::mcp",
            "tools/call",
            otel.kind = "server",
            tool = %request.name,
            principal = %caller.principal,
            namespace = self.namespace(),
        );
        let response = self.dispatch(request, context, caller.clone()).instrument(span).await;
        if let Some(facts) = audited {
            audit::tool_call(&self.state, &caller, facts, &response);
        }
        response
    }

    /// Dispatch one tool call on the snapshot current when it arrived.
    async fn dispatch(
        &self,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        caller: Caller,
    ) -> Result<CallToolResponse, McpError> {
        let state = self.state.as_ref();
        // First, before the settle wait and the authorizer's reviews: a
        // refused call costs this server (and the API server) nothing. Over
        // HTTP the token was usually taken before rmcp (`early`).
        if !early::counted(context.extensions.get::<http::request::Parts>()) {
            state.rate_limits.check_call(&caller.principal)?;
        }
        let snap = state.settled().await;
        let cx = CallContext {
            caller,
            retry: Retry { input_responses: request.input_responses.clone(), request_state: request.request_state.clone() },
            asker: Asker::from_context(context),
            progress: None,
            cancel: context.ct.clone(),
            tasks: context.client_capabilities().is_some_and(|caps| caps.supports_tasks()),
        };
        let args = request.arguments;
        macro_rules! tool {
            ($body:expr) => {
                match args.map_or_else(|| parse_args(None), |a| parse_args(Some(a))) {
                    Ok(input) => shape($body(input).await),
                    Err(err) => tool_error(&err),
                }
            };
        }
        let name = request.name.as_ref();
        if let Err(err) = state.authorize(&cx.caller, state::Action::of_tool(name)).await {
            return Ok(tool_error(&err).into());
        }
        let known = offered_tools(state).iter().any(|t| t.name == name);
        if !known {
            let names: Vec<String> = offered_tools(state).iter().map(|t| t.name.to_string()).collect();
            return Err(McpError::invalid_params(format!("unknown tool `{name}`; tools: {}", names.join(", ")), None));
        }
        let result = match name {
            "skill_list" => tool!(|i| async { tools::skill_list(state, &snap, i) }),
            "skill_search" => tool!(|i| search::skill_search(state, &snap, &cx.caller, i)),
            "skill_load" => tool!(|i| blocking(snap.clone(), i, tools::skill_load)),
            "skill_file" => tool!(|i| blocking(snap.clone(), i, tools::skill_file)),
            "skill_job_create" => tool!(|i| run::job_create(state, &snap, i, &cx)),
            "skill_job_upload" => tool!(|i| run::job_upload(state, i, &cx)),
            "skill_job_status" => tool!(|i| run::job_status(state, i, &cx)),
            "skill_job_read" => tool!(|i| run::job_read(state, i, &cx)),
            "skill_job_delete" => tool!(|i| run::job_delete(state, i, &cx)),
            "skill_job_list" => tool!(|i| run::job_list(state, i, &cx)),
            "skill_run" => {
                return match parse_args(args) {
                    Ok(input) => run_reply(run::skill_run(state, &snap, input, &cx).await),
                    Err(err) => Ok(tool_error(&err).into()),
                }
            }
            "skill_job_run" => {
                return match parse_args(args) {
                    Ok(input) => run_reply(run::job_run(state, &snap, input, &cx).await),
                    Err(err) => Ok(tool_error(&err).into()),
                }
            }
            other => return Err(McpError::internal_error(format!("tool `{other}` is offered but not dispatched"), None)),
        };
        Ok(result.into())
    }
}

fn page_of<T: Clone>(items: impl Iterator<Item = T>, cursor: Option<&str>, page: usize) -> Result<(Vec<T>, Option<String>), McpError> {
    let start = match cursor {
        None => 0,
        Some(c) => c.parse::<usize>().map_err(|_| McpError::invalid_params(format!("invalid cursor {c:?}"), None))?,
    };
    let mut out: Vec<T> = items.skip(start).take(page + 1).collect();
    let next = if out.len() > page {
        out.truncate(page);
        Some((start + page).to_string())
    } else {
        None
    };
    Ok((out, next))
}

fn cursor(request: &Option<PaginatedRequestParams>) -> Option<&str> {
    request.as_ref().and_then(|r| r.cursor.as_deref())
}

/// What this server declares: the tasks extension only when its execution
/// has a tasks backend.
fn capabilities(state: &ServerState) -> ServerCapabilities {
    let builder = ServerCapabilities::builder()
        .enable_tools()
        .enable_tool_list_changed()
        .enable_prompts()
        .enable_prompts_list_changed()
        .enable_resources()
        .enable_resources_list_changed()
        .enable_skills();
    if tasks::backend(state).is_some() {
        builder.enable_tasks().build()
    } else {
        builder.build()
    }
}

impl ServerHandler for SkillServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(capabilities(&self.state))
            .with_server_info(Implementation::new("skill-operator", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions(&self.state))
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        notify::follow_legacy(self.state.clone(), context.peer);
    }

    fn accepted_subscription_filter(&self, requested: &rmcp::model::SubscriptionFilter) -> Option<rmcp::model::SubscriptionFilter> {
        Some(notify::accepted(requested))
    }

    async fn listen(&self, context: rmcp::service::SubscriptionContext) -> Result<(), McpError> {
        notify::listen(self.state.clone(), context).await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        // At DEBUG, which the exporter's filter leaves out: a listing is the
        // hottest request and part of no run, and a span per listing cost
        // it about 6% of its throughput (docs/benchmarks.md#audit-overhead).
        let span = tracing::debug_span!(target: "skill_operator::mcp", "tools/list", otel.kind = "server", namespace = self.namespace());
        async {
            self.state.settled().await;
            Ok(ListToolsResult::with_all_items(offered_tools(&self.state)))
        }
        .instrument(span)
        .await
    }

    async fn call_tool(&self, request: CallToolRequestParams, context: RequestContext<RoleServer>) -> Result<CallToolResponse, McpError> {
        self.call(request, &context).await
    }

    async fn get_task(&self, request: GetTaskParams, context: RequestContext<RoleServer>) -> Result<GetTaskResult, McpError> {
        tasks::get(&self.state, &caller_of(&context), &request.task_id).await
    }

    async fn cancel_task(&self, request: CancelTaskParams, context: RequestContext<RoleServer>) -> Result<(), McpError> {
        tasks::cancel(&self.state, &caller_of(&context), &request.task_id).await
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let snap = self.state.snapshot();
        let prompts = snap.catalog.skills.iter().map(|s| Prompt::new(s.name.clone(), Some(s.meta.description.clone()), None));
        let (items, next) = page_of(prompts, cursor(&request), LIST_PAGE)?;
        let mut result = ListPromptsResult::with_all_items(items);
        result.next_cursor = next;
        Ok(result)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let state = self.state.snapshot();
        let name = request.name.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let skill =
                state.catalog.get(&name).ok_or_else(|| format!("no skill named `{name}`; served: {}", state.catalog.names().join(", ")))?;
            let (body, _) = skill.load_body().map_err(|e| e.to_string())?;
            Ok::<_, String>((skill.meta.description.clone(), body))
        })
        .await
        .map_err(|e| McpError::internal_error(e.to_string(), None))?;
        let (description, body) = loaded.map_err(|msg| McpError::invalid_params(msg, None))?;
        Ok(GetPromptResult::new(vec![PromptMessage::new_text(Role::User, body)]).with_description(description).into())
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let snap = self.state.snapshot();
        let resources = snap.catalog.skills.iter().flat_map(|s| {
            s.files.iter().map(move |f| {
                Resource::new(uri::file_uri(&s.name, f.path.as_str()), format!("{}/{}", s.name, f.path))
                    .with_mime_type(crate::core::content::media_type(f.path.as_str()))
                    .with_size(f.size)
            })
        });
        let (items, next) = page_of(resources, cursor(&request), LIST_PAGE)?;
        let mut result = ListResourcesResult::with_all_items(items);
        result.next_cursor = next;
        Ok(result)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![ResourceTemplate::new("skill://{+skill}/{+path}", "skill-file")
            .with_description("A file of a served skill; skill_list names the skills, skill_load lists their files.")]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let snap = self.state.snapshot();
        let uri_text = request.uri.clone();
        let read = tokio::task::spawn_blocking(move || read_skill_resource(&snap, &uri_text))
            .await
            .map_err(|e| McpError::internal_error(e.to_string(), None))??;
        Ok(ReadResourceResult::new(vec![read]).into())
    }

    async fn list_skills(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListSkillsResult, McpError> {
        let state = self.state.snapshot();
        let cursor = cursor(&request).map(str::to_string);
        tokio::task::spawn_blocking(move || {
            let eligible = state.catalog.skills.iter().filter(|s| state.extension_names.contains(&s.name));
            let (page, next) = page_of(eligible, cursor.as_deref(), extension::PAGE_SIZE)?;
            let mut skills = Vec::with_capacity(page.len());
            for skill in page {
                skills.push(state.extension_entry(skill).map_err(|e| McpError::internal_error(format!("{}: {e}", skill.name), None))?);
            }
            let mut result = ListSkillsResult::with_all_items(skills).with_ttl_ms(extension::TTL_MS).with_cache_scope(state.cache_scope);
            result.next_cursor = next;
            Ok(result)
        })
        .await
        .map_err(|e| McpError::internal_error(e.to_string(), None))?
    }

    async fn get_skill(&self, request: GetSkillRequestParams, _context: RequestContext<RoleServer>) -> Result<GetSkillResult, McpError> {
        let state = self.state.snapshot();
        tokio::task::spawn_blocking(move || {
            let name = state
                .extension_names
                .iter()
                .find(|n| extension::skill_uri(n) == request.uri)
                .cloned()
                .ok_or_else(|| McpError::invalid_params(format!("no skill is served at {}", request.uri), None))?;
            let skill =
                state.catalog.get(&name).ok_or_else(|| McpError::invalid_params(format!("no skill is served at {}", request.uri), None))?;
            let entry = state.extension_entry(skill).map_err(|e| McpError::internal_error(e.to_string(), None))?;
            Ok(GetSkillResult::new(entry).with_ttl_ms(extension::TTL_MS).with_cache_scope(state.cache_scope))
        })
        .await
        .map_err(|e| McpError::internal_error(e.to_string(), None))?
    }
}

/// `resources/read`: the same checks as `skill_file` (string, index,
/// resolved), whole files up to 16 MiB.
fn read_skill_resource(state: &Snapshot, uri_text: &str) -> Result<ResourceContents, McpError> {
    let not_found = |msg: String| McpError::resource_not_found(msg, Some(serde_json::json!({ "uri": uri_text })));
    let (name, rel) = uri::parse(uri_text, &|n| state.catalog.get(n).is_some())
        .map_err(|e| McpError::invalid_params(format!("{uri_text}: {e}"), None))?;
    let skill = state.catalog.get(&name).ok_or_else(|| not_found(format!("no skill named `{name}`")))?;
    if skill.file(rel.as_str()).is_none() {
        return Err(not_found(format!("`{name}` has no file {rel}")));
    }
    let real = resolve_inside(&skill.dir, &rel).map_err(|e| not_found(format!("{uri_text}: {e}")))?;
    let content =
        read_for_client(&real, rel.as_str(), RESOURCE_READ_CAP).map_err(|e| McpError::internal_error(format!("{uri_text}: {e}"), None))?;
    if content.truncated {
        return Err(McpError::invalid_request(
            format!(
                "{uri_text} is {} bytes; resources/read serves files up to {}, use skill_file for the first {}",
                content.size,
                bytes_text(RESOURCE_READ_CAP),
                bytes_text(crate::core::limits::FILE_ENTRY_CAP)
            ),
            None,
        ));
    }
    Ok(match content.encoding {
        crate::core::content::Encoding::Utf8 => ResourceContents::text(content.content, uri_text),
        crate::core::content::Encoding::Base64 => ResourceContents::blob(content.content, uri_text),
    }
    .with_mime_type(content.media_type))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every figure a person reads in a tool description or an argument's
    /// description is one of the limits constants, rendered as the docs
    /// write it: a number typed by hand fails here.
    #[test]
    fn descriptions_name_only_the_limits() {
        let known = crate::core::limits::figures();
        let figure = |text: &str| -> Vec<String> {
            let mut out = Vec::new();
            let words: Vec<&str> = text.split(|c: char| c.is_whitespace() || "();:".contains(c)).filter(|w| !w.is_empty()).collect();
            for (i, w) in words.iter().enumerate() {
                let w = w.trim_end_matches(['.', ',']);
                if !w.chars().next().is_some_and(|c| c.is_ascii_digit()) || !w.chars().all(|c| c.is_ascii_digit() || c == ',') {
                    continue;
                }
                let unit = words.get(i + 1).map(|u| u.trim_end_matches(['.', ','])).filter(|u| ["KiB", "MiB", "bytes"].contains(u));
                out.push(match unit {
                    Some(u) => format!("{w} {u}"),
                    None => w.to_string(),
                });
            }
            out
        };
        let mut texts: Vec<String> = Vec::new();
        for tool in tool_definitions() {
            texts.push(tool.description.clone().unwrap_or_default().to_string());
            let schema = serde_json::to_value(tool.input_schema.as_ref()).unwrap();
            fn collect(v: &Value, out: &mut Vec<String>) {
                match v {
                    Value::Object(m) => {
                        if let Some(Value::String(d)) = m.get("description") {
                            out.push(d.clone());
                        }
                        m.values().for_each(|x| collect(x, out));
                    }
                    Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
                    _ => {}
                }
            }
            collect(&schema, &mut texts);
        }
        let mut typed = Vec::new();
        for text in &texts {
            for f in figure(text) {
                // 0 and 1 are not limits ("offset 0 replaces", "1 to N").
                if f != "0" && f != "1" && !known.contains(&f) {
                    typed.push(format!("{f:?} in {text:?}"));
                }
            }
        }
        assert!(typed.is_empty(), "figures not taken from core::limits: {typed:#?}");
        // And the test itself finds figures (a broken extractor would pass anything).
        assert!(texts.iter().any(|t| figure(t).contains(&"1 MiB".to_string())));
        assert_eq!(figure("at most 64, 8 KiB in total; 2,000 files"), vec!["64", "8 KiB", "2,000"]);
    }
    use crate::core::discovery::{discover, Limits};
    use crate::core::grants::Grants;

    /// Every run or job tool needs more than reading skills: a tool added to
    /// `run::definitions` without its action would be authorized as a read.
    #[test]
    fn every_run_tool_has_its_action() {
        use state::Action;
        for tool in run::definitions() {
            assert_ne!(Action::of_tool(&tool.name), Action::ReadSkills, "{}", tool.name);
        }
        for tool in tools::definitions() {
            assert_eq!(Action::of_tool(&tool.name), Action::ReadSkills, "{}", tool.name);
        }
        assert_eq!(Action::of_tool("skill_job_delete"), Action::DeleteJobs);
        assert_eq!(Action::of_tool("skill_job_read"), Action::ReadJobs);
    }

    fn state(root: &std::path::Path) -> Snapshot {
        Snapshot::new(
            discover(&[root.to_path_buf()], Limits::default()),
            Box::new(snapshot::StandalonePolicy::new(Grants::resolve(&|_| None, None), Default::default())),
        )
    }

    #[test]
    fn resources_read_through_both_path_checks() {
        let t = tempfile::tempdir().unwrap();
        let s = t.path().join("root/docs");
        std::fs::create_dir_all(s.join("refs")).unwrap();
        std::fs::write(s.join("SKILL.md"), "---\nname: docs\ndescription: d\n---\nbody\n").unwrap();
        std::fs::write(s.join("refs/a.md"), "alpha").unwrap();
        std::fs::write(t.path().join("secret.txt"), "secret").unwrap();
        let st = state(&t.path().join("root"));

        let ok = read_skill_resource(&st, "skill://docs/refs/a.md").unwrap();
        assert!(matches!(ok, ResourceContents::TextResourceContents { ref text, .. } if text == "alpha"));

        // Hostile URIs are refused before the filesystem is touched.
        for uri in [
            "skill://docs/../secret.txt",
            "skill://docs/%2e%2e/secret.txt",
            "skill://docs//etc/passwd",
            "skill://docs/refs%5ca.md",
            "file:///etc/passwd",
            "skill://docs/refs/a.md?x",
        ] {
            let err = read_skill_resource(&st, uri).unwrap_err();
            assert_eq!(err.code, rmcp::model::ErrorCode::INVALID_PARAMS, "{uri}");
        }
        // A file outside the index is not served, and a symlink planted after
        // the scan is caught by the resolved check.
        assert_eq!(read_skill_resource(&st, "skill://docs/refs/b.md").unwrap_err().code, rmcp::model::ErrorCode::RESOURCE_NOT_FOUND);
        std::fs::remove_file(s.join("refs/a.md")).unwrap();
        std::os::unix::fs::symlink(t.path().join("secret.txt"), s.join("refs/a.md")).unwrap();
        let err = read_skill_resource(&st, "skill://docs/refs/a.md").unwrap_err();
        assert_eq!(err.code, rmcp::model::ErrorCode::RESOURCE_NOT_FOUND);
        assert!(err.message.contains("leaves the skill"), "{}", err.message);
    }
}
