//! [`ToolError`]: a tool failure the caller can act on, with a stable code.
//!
//! Codes come from the typed errors of the layers below (each has its own
//! `code()`), never from strings typed here twice: a refusal by the fence,
//! a job-store error and a confirmation error keep their own codes.

use serde_json::Value;

use crate::core::confirm::ConfirmError;
use crate::core::fence::Refusal;
use crate::jobs::JobError;

/// A tool failure: a stable code and a message saying what to do.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ToolError {
    pub code: &'static str,
    pub message: String,
    /// Extra structured context (e.g. the preview of a refused run).
    pub detail: Option<Value>,
}

/// Codes this layer produces itself (the rest come from the typed errors below).
pub mod codes {
    pub const INVALID_ARGUMENTS: &str = "invalid-arguments";
    pub const INTERNAL: &str = "internal";
    pub const NO_EXECUTION: &str = "no-execution";
    pub const RUNS_REFUSED: &str = "runs-refused";
    pub const INPUTS_TOO_LARGE: &str = "inputs-too-large";
    pub const BAD_BASE64: &str = "bad-base64";
    pub const BAD_ENCODING: &str = "bad-encoding";
    pub const BAD_PATH: &str = "bad-path";
    pub const BAD_STREAM: &str = "bad-stream";
    pub const BAD_TARGET: &str = "bad-target";
    pub const NO_PATHS: &str = "no-paths";
    pub const TOO_MANY_PATHS: &str = "too-many-paths";
    pub const CALL_TOO_LARGE: &str = "call-too-large";
    pub const UNREADABLE_SKILL_MD: &str = "unreadable-skill-md";
    pub const BUSY: &str = "busy";
    pub const UNAUTHORIZED: &str = "unauthorized";
    pub const FORBIDDEN: &str = "forbidden";
    pub const BACKEND: &str = "backend-unavailable";
    /// `skill_search` scope `catalog` on a server without a catalog (serve).
    pub const NO_CATALOG: &str = "no-catalog";
}

impl ToolError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        ToolError { code, message: message.into(), detail: None }
    }

    pub fn with_detail(mut self, detail: Value) -> Self {
        self.detail = Some(detail);
        self
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ToolError::new(codes::INTERNAL, message)
    }
}

impl From<JobError> for ToolError {
    fn from(err: JobError) -> Self {
        ToolError::new(err.code(), err.to_string())
    }
}

impl From<Refusal> for ToolError {
    fn from(err: Refusal) -> Self {
        ToolError::new(err.code(), err.to_string())
    }
}

impl From<ConfirmError> for ToolError {
    fn from(err: ConfirmError) -> Self {
        ToolError::new(err.code(), err.to_string())
    }
}

impl From<tokio::task::JoinError> for ToolError {
    fn from(err: tokio::task::JoinError) -> Self {
        ToolError::internal(format!("the tool failed: {err}"))
    }
}
