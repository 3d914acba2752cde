//! Every way a job-store call fails.

use std::io;

use thiserror::Error;

use super::types::JobState;
use crate::core::paths::PathError;

#[derive(Debug, Error)]
pub enum JobError {
    #[error("{0} is not a job id: ids are 32 lowercase hex characters, as returned when the job was created")]
    BadId(String),
    #[error("no job {0}: it may have been deleted; list jobs to see the retained ones")]
    NotFound(String),
    #[error("job {id} is unreadable ({reason}); delete it with skill_job_delete to free its slot")]
    Corrupt { id: String, reason: String },
    #[error("job cap reached ({max} retained jobs): delete finished jobs with skill_job_delete")]
    CapReached { max: usize },
    #[error("path {path} refused: {source}")]
    BadPath {
        path: String,
        #[source]
        source: PathError,
    },
    #[error("path {path} is nested {depth} levels deep; at most {max} are allowed")]
    PathTooDeep { path: String, depth: usize, max: usize },
    #[error("uploads are closed once a job has run (job {id} is {state}); create a new job for new inputs")]
    UploadsClosed { id: String, state: JobState },
    #[error("upload of {got} bytes is over the {max}-byte limit per call; send the file in chunks of at most {max} bytes, appending each at the file's current size")]
    ChunkTooLarge { got: u64, max: u64 },
    #[error("wrong offset {got} for {path}: expected {expected} (0 replaces the file; its current size, {expected}, appends)")]
    WrongOffset { path: String, got: u64, expected: u64 },
    #[error("{path} would be {size} bytes, over the {max}-byte limit per file")]
    FileTooLarge { path: String, size: u64, max: u64 },
    #[error("the job's inputs would total {total} bytes, over the {max}-byte limit per job; upload fewer or smaller files")]
    JobTooLarge { total: u64, max: u64 },
    #[error("the job would hold {count} input files, over the limit of {max} per job; pack small files into an archive")]
    TooManyFiles { count: usize, max: usize },
    #[error("cannot write {path}: {component} is {what}; upload under another path")]
    ParentObstructed { path: String, component: String, what: &'static str },
    #[error("cannot write {path}: it is {what}; upload under another path")]
    PathObstructed { path: String, what: &'static str },
    #[error("input {path} is {found} bytes on disk but the record says {expected}; upload it again from offset 0")]
    InputOutOfSync { path: String, expected: u64, found: u64 },
    #[error("job {id} already ran ({state}); create a new job to run again")]
    AlreadyRan { id: String, state: JobState },
    #[error("job {id}'s inputs are not the ones confirmed ({detail}); nothing ran: preview and confirm the run again")]
    InputsChanged { id: String, detail: String },
    #[error("job {id} is already running; wait for it to finish, or create a new job")]
    AlreadyRunning { id: String },
    #[error("job {id} is not running ({state}); only a running job can be finished")]
    NotRunning { id: String, state: JobState },
    #[error("job {id} is still running; its files and output are withheld until the run finishes")]
    StillRunning { id: String },
    #[error("job {id} has not run yet; run a script first, then list and read its outputs")]
    NotRunYet { id: String },
    #[error("job {id} cannot be deleted while it is running; wait for the run to finish")]
    DeleteWhileRunning { id: String },
    #[error("read limit {got} is over the {max}-byte maximum per call; read in chunks of at most {max} bytes")]
    ReadTooLarge { got: u64, max: u64 },
    #[error("job {id} has no captured {stream}: the run ended without the runner reporting it ({state})")]
    NoStream { id: String, stream: &'static str, state: JobState },
    #[error("no file {path} in job {id}; list the job's outputs to see what the run produced")]
    NoSuchFile { id: String, path: String },
    #[error("{path} is a symlink leading outside job {id}'s work directory; it is not served")]
    Escapes { id: String, path: String },
    #[error("{path} is not a regular file; only regular files can be read")]
    NotAFile { path: String },
    #[error("job store I/O error ({what}): {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl JobError {
    /// Stable code for clients (`job-` + the variant in kebab case).
    pub fn code(&self) -> &'static str {
        match self {
            JobError::BadId(..) => "job-bad-id",
            JobError::NotFound(..) => "job-not-found",
            JobError::Corrupt { .. } => "job-corrupt",
            JobError::CapReached { .. } => "job-cap-reached",
            JobError::BadPath { .. } => "job-bad-path",
            JobError::PathTooDeep { .. } => "job-path-too-deep",
            JobError::UploadsClosed { .. } => "job-uploads-closed",
            JobError::ChunkTooLarge { .. } => "job-chunk-too-large",
            JobError::WrongOffset { .. } => "job-wrong-offset",
            JobError::FileTooLarge { .. } => "job-file-too-large",
            JobError::JobTooLarge { .. } => "job-job-too-large",
            JobError::TooManyFiles { .. } => "job-too-many-files",
            JobError::ParentObstructed { .. } => "job-parent-obstructed",
            JobError::PathObstructed { .. } => "job-path-obstructed",
            JobError::InputOutOfSync { .. } => "job-input-out-of-sync",
            JobError::AlreadyRan { .. } => "job-already-ran",
            JobError::AlreadyRunning { .. } => "job-already-running",
            JobError::InputsChanged { .. } => "job-inputs-changed",
            JobError::NotRunning { .. } => "job-not-running",
            JobError::StillRunning { .. } => "job-still-running",
            JobError::NotRunYet { .. } => "job-not-run-yet",
            JobError::DeleteWhileRunning { .. } => "job-delete-while-running",
            JobError::ReadTooLarge { .. } => "job-read-too-large",
            JobError::NoStream { .. } => "job-no-stream",
            JobError::NoSuchFile { .. } => "job-no-such-file",
            JobError::Escapes { .. } => "job-escapes",
            JobError::NotAFile { .. } => "job-not-a-file",
            JobError::Io { .. } => "job-io",
        }
    }
}

pub type Result<T, E = JobError> = std::result::Result<T, E>;

/// Adds what was being attempted to an `io::Error`.
pub(super) trait IoContext<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| JobError::Io { what: what(), source })
    }
}
