//! The read tools: `skill_list`, `skill_load`, `skill_file` (and `skill_search`, in [`super::search`]).
//!
//! Each tool is a pure function over [`ServerState`] returning a typed
//! output or a [`ToolError`]; the handler turns them into MCP results. The
//! tools alone reach everything a client needs (a gateway may hide prompts
//! and resources), so `skill_load` and `skill_file` cover what prompts and
//! `resources/read` offer.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::core::content::read_for_client;
use crate::core::declaration::Interpreter;
use crate::core::fence::{Refusal, ScriptStatus};
use crate::core::limits::{bytes_text, FILE_CALL_CAP, FILE_ENTRY_CAP, FILE_PATHS_PER_CALL, SEARCH_RESULTS_DEFAULT, SEARCH_RESULTS_MAX};
use crate::core::paths::{resolve_inside, RelPath};
use crate::core::problems::Problem;

use super::error::{codes, ToolError};
use super::executor::ExecutionSummary;
use super::snapshot::Snapshot;
use super::state::ServerState;

fn unknown_skill(snap: &Snapshot, name: &str) -> ToolError {
    Refusal::unknown_skill(name, snap.catalog.names()).into()
}

// ---------- skill_list ----------

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillListInput {
    /// Optional case-insensitive text to match against names and descriptions.
    #[serde(default)]
    pub query: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillListOutput {
    pub skills: Vec<SkillSummary>,
    /// Everything that kept a directory, file, script or grant row from being served.
    pub problems: Vec<Problem>,
    pub roots: Vec<RootSummary>,
    /// Where the run grant came from: `declaration`, `hosted-default`, `MCP_SKILL_RUN` or `file:<path>`.
    pub grant_from: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant_note: Option<String>,
    /// Interpreters this deployment can run.
    pub interpreters: Vec<Interpreter>,
    /// How scripts run here (absent when this server only reads skills).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution: Option<ExecutionSummary>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct RootSummary {
    /// The root: a directory of `serve`, the SkillPackage's name in the gateway.
    pub path: String,
    pub skills: usize,
    /// The gateway: the package's pinned content digest (`sha256:…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SkillSummary {
    pub name: String,
    pub description: String,
    /// The root this skill was found under (as `roots` names it).
    pub root: String,
    /// The skill's directory: on disk for `serve`, relative to its root in the gateway (`.`: the root is the skill).
    pub path: String,
    pub files: usize,
    pub bytes: u64,
    pub scripts: ScriptsSummary,
    /// Hosts the skill declares it reaches.
    pub egress: Vec<String>,
    /// Number of problems concerning this skill.
    pub problems: usize,
}

#[derive(Debug, Default, Serialize, JsonSchema)]
pub struct ScriptsSummary {
    pub declared: Vec<String>,
    pub runnable: Vec<String>,
    pub unavailable: Vec<ScriptReason>,
    /// Declared, but the admin's runtime profile does not allow them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_allowed: Vec<ScriptReason>,
    pub ungranted: Vec<ScriptReason>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ScriptReason {
    pub script: String,
    pub reason: String,
}

pub fn skill_list(state: &ServerState, snap: &Snapshot, input: SkillListInput) -> Result<SkillListOutput, ToolError> {
    let query = input.query.map(|q| q.to_lowercase()).filter(|q| !q.trim().is_empty());
    let skills = snap
        .catalog
        .skills
        .iter()
        .filter(|s| match &query {
            None => true,
            Some(q) => s.name.to_lowercase().contains(q) || s.meta.description.to_lowercase().contains(q),
        })
        .map(|skill| {
            let mut scripts = ScriptsSummary::default();
            for script in &skill.scripts {
                let path = script.decl.script.to_string();
                scripts.declared.push(path.clone());
                match snap.status(skill, script) {
                    ScriptStatus::Runnable { .. } => scripts.runnable.push(path),
                    ScriptStatus::Unavailable(reason) => scripts.unavailable.push(ScriptReason { script: path, reason }),
                    ScriptStatus::NotAllowed(reason) => scripts.not_allowed.push(ScriptReason { script: path, reason }),
                    ScriptStatus::Ungranted(reason) => scripts.ungranted.push(ScriptReason { script: path, reason }),
                }
            }
            SkillSummary {
                name: skill.name.clone(),
                description: skill.meta.description.clone(),
                root: skill.shown.root.clone(),
                path: skill.shown.dir.clone(),
                files: skill.files.len(),
                bytes: skill.bytes,
                scripts,
                egress: skill.egress.clone(),
                problems: snap.problems.iter().filter(|p| p.skill.as_deref() == Some(skill.name.as_str())).count(),
            }
        })
        .collect();
    Ok(SkillListOutput {
        skills,
        problems: snap.problems.clone(),
        roots: snap
            .catalog
            .roots
            .iter()
            .map(|r| RootSummary { path: r.shown.clone(), skills: r.skills, digest: r.digest.clone() })
            .collect(),
        grant_from: snap.policy.source_label(),
        grant_note: snap.policy.note(),
        interpreters: snap.policy.interpreters().into_iter().collect(),
        execution: state.execution.as_ref().map(|e| e.executor.summary(e.mode)),
    })
}

// ---------- skill_load ----------

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillLoadInput {
    /// The skill's served name (its directory name), as listed by skill_list.
    pub name: String,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillLoadOutput {
    pub name: String,
    pub description: String,
    /// The frontmatter as written.
    pub frontmatter: Map<String, Value>,
    /// The Markdown body after the frontmatter, verbatim.
    pub body: String,
    /// SKILL.md was larger than the read cap and the body is cut.
    pub body_truncated: bool,
    pub files: Vec<FileSummary>,
    pub scripts: Vec<ScriptDetail>,
    pub egress: Vec<String>,
    pub problems: Vec<Problem>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FileSummary {
    pub path: String,
    pub size: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ScriptDetail {
    pub script: String,
    /// The declared interpreter as written (may be outside the closed set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interpreter: Option<String>,
    /// Timeout in seconds.
    pub timeout: u64,
    /// Variables the script asks for (names only).
    pub env: Vec<String>,
    /// `runnable`, `unavailable` or `ungranted`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

pub fn skill_load(snap: &Snapshot, input: SkillLoadInput) -> Result<SkillLoadOutput, ToolError> {
    let skill = snap.catalog.get(&input.name).ok_or_else(|| unknown_skill(snap, &input.name))?;
    let (body, body_truncated) = skill.load_body().map_err(|e| ToolError::new(codes::UNREADABLE_SKILL_MD, e.to_string()))?;
    let scripts = skill
        .scripts
        .iter()
        .map(|script| {
            let status = snap.status(skill, script);
            ScriptDetail {
                script: script.decl.script.to_string(),
                interpreter: script.decl.interpreter_text.clone(),
                timeout: script.decl.timeout_secs,
                env: script.decl.env.clone(),
                status: status.label().to_string(),
                reason: status.reason().map(str::to_string),
            }
        })
        .collect();
    Ok(SkillLoadOutput {
        name: skill.name.clone(),
        description: skill.meta.description.clone(),
        frontmatter: skill.frontmatter.clone(),
        body,
        body_truncated,
        files: skill.files.iter().map(|f| FileSummary { path: f.path.to_string(), size: f.size }).collect(),
        scripts,
        egress: skill.egress.clone(),
        problems: snap.problems_of(&skill.name),
    })
}

// ---------- skill_file ----------

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillFileInput {
    /// The skill's served name.
    pub skill: String,
    /// File paths relative to the skill directory, e.g. `scripts/run.py` (one call reads a few; see the tool's description).
    #[schemars(length(min = 1, max = 8))]
    pub paths: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SkillFileOutput {
    pub skill: String,
    /// One result per requested path, in request order.
    pub results: Vec<FileResult>,
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum FileResult {
    Ok(FileOk),
    Err(FileErr),
}

#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileOk {
    pub path: String,
    /// Always true.
    pub ok: bool,
    /// `utf-8` or `base64`.
    pub encoding: String,
    pub media_type: String,
    /// The file's real size in bytes.
    pub size: u64,
    /// Bytes returned (before base64).
    pub returned: u64,
    /// The file is larger than the per-file cap and was cut.
    pub truncated: bool,
    pub content: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FileErr {
    pub path: String,
    /// Always false.
    pub ok: bool,
    pub error: ErrorBody,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ErrorBody {
    pub code: String,
    pub message: String,
}

fn file_err(path: &str, code: &str, message: impl Into<String>) -> FileResult {
    FileResult::Err(FileErr { path: path.to_string(), ok: false, error: ErrorBody { code: code.into(), message: message.into() } })
}

pub fn skill_file(snap: &Snapshot, input: SkillFileInput) -> Result<SkillFileOutput, ToolError> {
    if input.paths.is_empty() {
        return Err(ToolError::new(codes::NO_PATHS, format!("give 1 to {FILE_PATHS_PER_CALL} paths in `paths`")));
    }
    if input.paths.len() > FILE_PATHS_PER_CALL {
        return Err(ToolError::new(
            codes::TOO_MANY_PATHS,
            format!("{} paths given; at most {FILE_PATHS_PER_CALL} per call, split the request", input.paths.len()),
        ));
    }
    let skill = snap.catalog.get(&input.skill).ok_or_else(|| unknown_skill(snap, &input.skill))?;

    // Check every path (string, index, resolved) and size the call before reading anything.
    let mut planned: Vec<Result<(std::path::PathBuf, u64), FileResult>> = Vec::with_capacity(input.paths.len());
    let mut call_bytes = 0u64;
    for raw in &input.paths {
        let checked = RelPath::parse(raw).map_err(|e| file_err(raw, "bad-path", e.to_string())).and_then(|rel| {
            if skill.file(rel.as_str()).is_none() {
                return Err(file_err(raw, "not-found", format!("`{}` has no file {rel} (skill_load lists its files)", skill.name)));
            }
            let real = resolve_inside(&skill.dir, &rel).map_err(|e| file_err(raw, "unreadable", e.to_string()))?;
            let size = std::fs::metadata(&real).map_err(|e| file_err(raw, "unreadable", e.to_string()))?.len();
            Ok((real, size))
        });
        if let Ok((_, size)) = &checked {
            call_bytes += (*size).min(FILE_ENTRY_CAP);
        }
        planned.push(checked);
    }
    if call_bytes > FILE_CALL_CAP {
        return Err(ToolError::new(
            codes::CALL_TOO_LARGE,
            format!(
                "these files would return {call_bytes} bytes; at most {FILE_CALL_CAP} ({}) per call, ask for fewer paths per call",
                bytes_text(FILE_CALL_CAP)
            ),
        ));
    }
    let results = input
        .paths
        .iter()
        .zip(planned)
        .map(|(raw, plan)| match plan {
            Err(result) => result,
            Ok((real, _)) => match read_for_client(&real, raw, FILE_ENTRY_CAP) {
                Ok(c) => FileResult::Ok(FileOk {
                    path: raw.clone(),
                    ok: true,
                    encoding: c.encoding.label().to_string(),
                    media_type: c.media_type,
                    size: c.size,
                    returned: c.returned,
                    truncated: c.truncated,
                    content: c.content,
                }),
                Err(err) => file_err(raw, "unreadable", err.to_string()),
            },
        })
        .collect();
    Ok(SkillFileOutput { skill: skill.name.clone(), results })
}

// ---------- definitions ----------

fn schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::common::schema_for_type::<T>()
}

fn output_schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    rmcp::handler::server::common::schema_for_output::<T>()
}

/// The tool definitions, with honest annotations: the read tools change
/// nothing, return the same answer for the same call, and reach nothing
/// outside the skills directories.
pub fn definitions() -> Vec<Tool> {
    let read_only = |title: &str| ToolAnnotations::with_title(title).read_only(true).destructive(false).idempotent(true).open_world(false);
    vec![
        Tool::new_with_raw(
            "skill_list",
            Some("List the skills this server serves: name, description, files, declared scripts and whether each can run here, plus every problem found while discovering them.".into()),
            schema::<SkillListInput>(),
        )
        .with_raw_output_schema(output_schema::<SkillListOutput>())
        .with_annotations(read_only("List skills")),
        Tool::new_with_raw(
            "skill_load",
            Some("Load one skill: its SKILL.md instructions (body verbatim), frontmatter, file list with sizes, and declared scripts with their status. Call this before using a skill.".into()),
            schema::<SkillLoadInput>(),
        )
        .with_raw_output_schema(output_schema::<SkillLoadOutput>())
        .with_annotations(read_only("Load a skill")),
        Tool::new_with_raw(
            "skill_file",
            Some(format!(
                "Read up to {FILE_PATHS_PER_CALL} files of one skill in one call ({} per file, {} per call). Text comes back as UTF-8, other files as base64. A bad path fails only its own entry.",
                bytes_text(FILE_ENTRY_CAP),
                bytes_text(FILE_CALL_CAP)
            ).into()),
            schema::<SkillFileInput>(),
        )
        .with_raw_output_schema(output_schema::<SkillFileOutput>())
        .with_annotations(read_only("Read skill files")),
        Tool::new_with_raw(
            "skill_search",
            Some(format!(
                "Find the skills that fit a task: the words are looked for in names, then descriptions, then authors (case, accents and small typos do not matter; every word must match). Optional category; ranked best first, {SEARCH_RESULTS_DEFAULT} results unless `limit` asks for up to {SEARCH_RESULTS_MAX}. `scope: catalog` searches the catalog of skills in public repositories instead, with how to install each (for callers who may create SkillPackages)."
            ).into()),
            schema::<super::search::SkillSearchInput>(),
        )
        .with_raw_output_schema(output_schema::<super::search::SkillSearchOutput>())
        .with_annotations(read_only("Search skills")),
    ]
}

#[cfg(test)]
#[path = "tools_tests.rs"]
mod tests;
