//! One audit record, as it is written (`docs/audit.md` is its reference).

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::mcp::executor::Caller;

/// What happened. The names are the schema's `event` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Event {
    /// A `tools/call`, whatever the tool and however it ended.
    #[serde(rename = "tool.call")]
    ToolCall,
    /// A run was shown for confirmation (a preview with a token, or a question), or the person declined it.
    #[serde(rename = "run.preview")]
    RunPreview,
    /// A confirmed run starts (`confirmation` says how it was confirmed).
    #[serde(rename = "run.start")]
    RunStart,
    /// A run ended (`state`, `exitCode`).
    #[serde(rename = "run.verdict")]
    RunVerdict,
    /// A file went into a job.
    #[serde(rename = "file.upload")]
    FileUpload,
    /// A job's file was read out.
    #[serde(rename = "file.download")]
    FileDownload,
    /// A request was refused before any tool saw it (authentication).
    #[serde(rename = "auth.refused")]
    AuthRefused,
    /// Any other HTTP request refused before a tool saw it (a bad path, a
    /// body over its cap, a malformed message, a host or origin refused, a
    /// rate limit on a route that is not a tool call).
    #[serde(rename = "request.refused")]
    RequestRefused,
    /// A connection through the egress proxy, once it ended.
    #[serde(rename = "egress")]
    Egress,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::ToolCall => "tool.call",
            Event::RunPreview => "run.preview",
            Event::RunStart => "run.start",
            Event::RunVerdict => "run.verdict",
            Event::FileUpload => "file.upload",
            Event::FileDownload => "file.download",
            Event::AuthRefused => "auth.refused",
            Event::RequestRefused => "request.refused",
            Event::Egress => "egress",
        }
    }
}

/// How it ended, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Done (a call answered, a run finished whatever its exit, a file moved, a connection allowed).
    Ok,
    /// A rule said no: the fence, authorization, authentication, the egress allowlist or address policy.
    Refused,
    /// Over a rate limit: nothing was done; `retryAfterSeconds` says when to come back.
    RateLimited,
    /// Shown to a person; nothing runs until they confirm.
    ConfirmationRequired,
    /// The person said no; nothing ran.
    Declined,
    /// Something broke (a backend, an upstream); `code` and `reason` say what.
    Failed,
    /// An allowed connection cut at a limit (bytes, lifetime).
    Cut,
}

/// Who, as the authenticator returned it.
#[derive(Debug, Clone, Serialize)]
pub struct Principal {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

impl From<&Caller> for Principal {
    fn from(c: &Caller) -> Self {
        Principal { name: c.principal.clone(), uid: c.uid.clone(), groups: c.groups.clone() }
    }
}

/// A file by path, size and content digest.
#[derive(Debug, Clone, Serialize)]
pub struct FileRef {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// The digest of a value's JSON encoding (`sha256:<hex>`): arguments are
/// recorded by digest only, so a secret passed as an argument never lands
/// in the trail, and a person holding the call can still match it.
pub fn digest_json<T: Serialize + ?Sized>(value: &T) -> String {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    format!("sha256:{}", hex::encode(Sha256::digest(&bytes)))
}

/// One record. Empty fields are left out of the line.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub schema: &'static str,
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// The writing process: `serve`, `gateway`, `controller`, `egress-proxy`.
    pub source: &'static str,
    pub event: Event,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<Principal>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// [`digest_json`] of the tool call's arguments object, or of a run's argument list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args_digest: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<FileRef>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<FileRef>,
    /// The job id the caller sees (a SkillJob's name in the gateway).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skilljob_uid: Option<String>,
    /// How a run was confirmed: `token`, `elicitation`, `input-response`, `auto`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<&'static str>,
    /// A run's end: the job state or SkillJob phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The error or refusal code the caller was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// The sentence the caller was given, or the rule's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<u64>,
    /// Egress: the host and port asked for, bytes each way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_up: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_down: Option<u64>,
    /// A network peer (egress client, refused HTTP caller).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// A refused HTTP request: its method and path (never its query or body).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
}

impl Record {
    pub fn new(event: Event, outcome: Outcome) -> Record {
        Record {
            schema: super::SCHEMA,
            time: format!("{:.3}", k8s_openapi::jiff::Timestamp::now()),
            source: "",
            event,
            outcome,
            principal: None,
            namespace: None,
            tool: None,
            skill: None,
            script: None,
            args_digest: None,
            inputs: Vec::new(),
            file: None,
            job: None,
            skilljob_uid: None,
            confirmation: None,
            state: None,
            exit_code: None,
            duration_ms: None,
            code: None,
            reason: None,
            retry_after_seconds: None,
            host: None,
            port: None,
            bytes_up: None,
            bytes_down: None,
            peer: None,
            request: None,
        }
    }

    pub fn caller(mut self, caller: &Caller) -> Record {
        self.principal = Some(caller.into());
        self
    }

    pub fn principal_name(mut self, name: impl Into<String>) -> Record {
        self.principal = Some(Principal { name: name.into(), uid: None, groups: Vec::new() });
        self
    }

    pub fn namespace(mut self, namespace: impl Into<String>) -> Record {
        self.namespace = Some(namespace.into());
        self
    }

    pub fn tool(mut self, tool: impl Into<String>) -> Record {
        self.tool = Some(tool.into());
        self
    }

    pub fn skill(mut self, skill: impl Into<String>) -> Record {
        self.skill = Some(skill.into());
        self
    }

    pub fn script(mut self, script: impl Into<String>) -> Record {
        self.script = Some(script.into());
        self
    }

    pub fn args_digest(mut self, digest: String) -> Record {
        self.args_digest = Some(digest);
        self
    }

    pub fn inputs(mut self, inputs: Vec<FileRef>) -> Record {
        self.inputs = inputs;
        self
    }

    pub fn file(mut self, file: FileRef) -> Record {
        self.file = Some(file);
        self
    }

    pub fn job(mut self, job: impl Into<String>) -> Record {
        self.job = Some(job.into());
        self
    }

    pub fn skilljob_uid(mut self, uid: impl Into<String>) -> Record {
        self.skilljob_uid = Some(uid.into());
        self
    }

    pub fn confirmation(mut self, how: &'static str) -> Record {
        self.confirmation = Some(how);
        self
    }

    pub fn state(mut self, state: impl Into<String>) -> Record {
        self.state = Some(state.into());
        self
    }

    pub fn exit_code(mut self, code: Option<i32>) -> Record {
        self.exit_code = code;
        self
    }

    pub fn duration_ms(mut self, ms: u64) -> Record {
        self.duration_ms = Some(ms);
        self
    }

    pub fn code(mut self, code: impl Into<String>) -> Record {
        self.code = Some(code.into());
        self
    }

    pub fn reason(mut self, reason: impl Into<String>) -> Record {
        self.reason = Some(reason.into());
        self
    }

    pub fn retry_after(mut self, secs: u64) -> Record {
        self.retry_after_seconds = Some(secs);
        self
    }

    pub fn target(mut self, host: impl Into<String>, port: u16) -> Record {
        self.host = Some(host.into());
        self.port = Some(port);
        self
    }

    pub fn bytes(mut self, up: u64, down: u64) -> Record {
        self.bytes_up = Some(up);
        self.bytes_down = Some(down);
        self
    }

    pub fn peer(mut self, peer: impl Into<String>) -> Record {
        self.peer = Some(peer.into());
        self
    }
}
