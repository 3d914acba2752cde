//! Every way a gateway run or job call fails, and the stable code each
//! becomes for the caller. Job-store errors the standalone server also
//! gives (no such job, offsets, sizes, inputs changed) keep that server's
//! variants and codes ([`JobError`]), so a client sees the same error on
//! both backends.

use crate::artifacts::operator::ArtifactError;
use crate::core::limits::bytes_text;
use crate::jobs::JobError;
use crate::mcp::error::{codes, ToolError};

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Job(#[from] JobError),
    #[error("the Kubernetes API refused or failed to {what}: {source}; the gateway's ServiceAccount needs create/get/list/watch/patch/delete on skilljobs and configmaps (see the chart's ClusterRole)")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}; try again once the artifact endpoint answers")]
    Artifacts(#[from] ArtifactError),
    #[error("namespace {namespace} already holds {held} jobs (SkillJobs and drafts), the most kept per namespace ({max}): delete finished ones first{}", oldest_text(.oldest))]
    CapReached { namespace: String, held: usize, max: usize, oldest: Vec<String> },
    #[error("skill {skill} is not served by any SkillBinding in namespace {namespace}; list the skills again")]
    NotBound { skill: String, namespace: String },
    #[error("a SkillJob named {name} already exists and is not the run of this call; nothing ran: preview and confirm the run again")]
    NameTaken { name: String },
    #[error("this confirmation token already ran its call as job {name}, which was deleted since; each token runs one call once: preview the run again for a new token")]
    TokenUsed { name: String },
    #[error("job {name}'s SkillJob was deleted before its run finished")]
    Vanished { name: String },
    #[error("the caller went away; job {name} keeps running (on-disconnect policy `keep`): read it with skill_job_status")]
    Kept { name: String },
    #[error("job {name}'s pod did not confirm it stopped; its files are withheld until an operator checks the node")]
    Withheld { name: String },
    #[error("upload of {got} bytes is over the {max}-byte limit per call; send the file in chunks of at most {max} bytes, appending each at the file's current size, or PUT it whole (up to {}) to {url} with your bearer token", bytes_text(*.route_max))]
    UploadTooLargeForCall { got: u64, max: u64, route_max: u64, url: String },
    #[error("read limit {got} is over the {max}-byte maximum per call; read in chunks of at most {max} bytes, or GET the whole file (up to {}) from {url} with your bearer token", bytes_text(*.route_max))]
    ReadTooLargeForCall { got: u64, max: u64, route_max: u64, url: String },
    #[error("job {name}'s draft record is unreadable ({reason}); delete it with skill_job_delete")]
    BadDraft { name: String, reason: String },
}

fn oldest_text(oldest: &[String]) -> String {
    if oldest.is_empty() {
        " (none has finished yet: wait for a run to end)".into()
    } else {
        format!(", oldest first: {}", oldest.join(", "))
    }
}

impl ExecError {
    pub(super) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ExecError {
        let what = what.into();
        move |source| ExecError::Kube { what, source }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ExecError::Job(e) => e.code(),
            ExecError::Kube { .. } | ExecError::Artifacts(_) => codes::BACKEND,
            ExecError::CapReached { .. } => "job-cap-reached",
            ExecError::NotBound { .. } => "skill-not-bound",
            ExecError::NameTaken { .. } => "job-name-taken",
            ExecError::TokenUsed { .. } => crate::core::confirm::ConfirmError::Reused.code(),
            ExecError::Vanished { .. } => "job-vanished",
            ExecError::Kept { .. } => "run-kept",
            ExecError::Withheld { .. } => "job-withheld",
            ExecError::BadDraft { .. } => "job-corrupt",
            // The job store's codes: the same refusal, with the route to use instead.
            ExecError::UploadTooLargeForCall { .. } => "job-chunk-too-large",
            ExecError::ReadTooLargeForCall { .. } => "job-read-too-large",
        }
    }
}

impl From<ExecError> for ToolError {
    fn from(err: ExecError) -> Self {
        ToolError::new(err.code(), err.to_string())
    }
}

pub type Result<T, E = ExecError> = std::result::Result<T, E>;

/// Whether a kube error is the API server's `code` answer.
pub(super) fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}
