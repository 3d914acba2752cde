//! The job store's records and listings (what `job.json` and the tools show).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::api::outcome::{RunEnd, RunOutcome};
use crate::core::limits;

/// The store's bounds. [`Default`] gives the production numbers; tests shrink
/// them to reach the edges quickly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLimits {
    /// Bytes per upload call.
    pub upload_chunk: u64,
    /// Bytes per input file.
    pub file_bytes: u64,
    /// Bytes of inputs per job.
    pub job_bytes: u64,
    /// Input files per job, and entries per output listing.
    pub files: usize,
    /// Jobs kept on disk.
    pub retained: usize,
    /// Bytes per read call.
    pub read_chunk: u64,
    /// fsync records and directories on every state change. Without it a
    /// record is still replaced atomically (write a temp file, rename), so a
    /// killed or restarted server finds the old state or the new one, never a
    /// mix; fsync adds safety against power loss for about 4 ms per change.
    pub durable: bool,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            upload_chunk: limits::JOB_UPLOAD_CHUNK,
            file_bytes: limits::MAX_FILE_BYTES,
            job_bytes: limits::MAX_TOTAL_BYTES,
            files: limits::MAX_FILES,
            retained: limits::JOBS_RETAINED,
            read_chunk: limits::JOB_READ_CHUNK,
            durable: false,
        }
    }
}

impl JobLimits {
    /// The input rules for one file of `size` bytes, beside `others` bytes
    /// in the job's other inputs, the job then holding `count` files: the
    /// one place they are spelled (uploads to a stored job, to a draft, and
    /// inline inputs checked at their preview).
    pub fn check_input(&self, path: &str, size: u64, others: u64, count: usize) -> Result<(), super::JobError> {
        use super::JobError;
        if size > self.file_bytes {
            return Err(JobError::FileTooLarge { path: path.to_string(), size, max: self.file_bytes });
        }
        if others + size > self.job_bytes {
            return Err(JobError::JobTooLarge { total: others + size, max: self.job_bytes });
        }
        if count > self.files {
            return Err(JobError::TooManyFiles { count, max: self.files });
        }
        Ok(())
    }

    /// A whole set of inputs (a `skill_run`'s inline ones) against the
    /// same rules, and against itself: a path given twice, or a file where
    /// another input needs a directory, could not all be written.
    pub fn check_input_set<'a>(&self, inputs: impl IntoIterator<Item = (&'a str, u64)>) -> Result<(), super::JobError> {
        use super::JobError;
        let mut seen = std::collections::BTreeSet::new();
        let mut total = 0u64;
        for (count, (path, size)) in inputs.into_iter().enumerate() {
            self.check_input(path, size, total, count + 1)?;
            total += size;
            if !seen.insert(path) {
                return Err(JobError::PathObstructed { path: path.to_string(), what: "given twice among the inputs" });
            }
        }
        // A path that is another's directory: sorted, a directory comes right before what it holds.
        let sorted: Vec<&str> = seen.into_iter().collect();
        for pair in sorted.windows(2) {
            if let Some(rest) = pair[1].strip_prefix(pair[0]) {
                if rest.starts_with('/') {
                    return Err(JobError::ParentObstructed {
                        path: pair[1].to_string(),
                        component: pair[0].to_string(),
                        what: "another input file",
                    });
                }
            }
        }
        Ok(())
    }
}

/// Where a job is in its one-way life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobState {
    /// Accepting uploads; not run yet.
    Created,
    /// The script is running (or the runner has not reported its end).
    Running,
    /// Exited 0.
    Succeeded,
    /// Exited non-zero, was killed by a signal, or could not start.
    Failed,
    /// Killed at its deadline.
    TimedOut,
    /// Stopped because it passed a run-wide limit (memory, processes, disk).
    LimitExceeded,
    /// Stopped because the run was cancelled.
    Cancelled,
    /// Found running when the store opened; never re-run.
    Interrupted,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Created => "created",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::TimedOut => "timed-out",
            JobState::LimitExceeded => "limit-exceeded",
            JobState::Cancelled => "cancelled",
            JobState::Interrupted => "interrupted",
        }
    }

    /// The run is over (whatever its outcome); files may be served.
    pub fn is_finished(self) -> bool {
        !matches!(self, JobState::Created | JobState::Running)
    }

    /// The state a finished run's outcome means (see [`RunOutcome::end`]).
    pub fn after(outcome: &RunOutcome) -> JobState {
        match outcome.end() {
            RunEnd::Succeeded => JobState::Succeeded,
            RunEnd::Failed => JobState::Failed,
            RunEnd::TimedOut => JobState::TimedOut,
            RunEnd::Cancelled => JobState::Cancelled,
            RunEnd::LimitExceeded(_) => JobState::LimitExceeded,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An input file as recorded at upload time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileInfo {
    /// Relative to `work/`, as given to [`RelPath::parse`].
    pub path: String,
    pub size: u64,
    /// `sha256:<hex>` of the whole file.
    pub sha256: String,
}

/// The one run of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    pub script: String,
    pub args: Vec<String>,
    pub started_at_ms: u64,
    /// `None` while running, and for an interrupted run (its end is unknown).
    pub finished_at_ms: Option<u64>,
    /// How it ended (all defaults while running).
    #[serde(flatten)]
    pub outcome: RunOutcome,
    pub note: Option<String>,
}

/// `job.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    pub id: String,
    pub skill: String,
    /// The principal that created the job; no other principal sees it.
    /// Records written before jobs had owners belong to the local caller.
    #[serde(default = "local_owner")]
    pub owner: String,
    pub created_at_ms: u64,
    pub state: JobState,
    /// Sorted by path.
    pub inputs: Vec<FileInfo>,
    pub run: Option<RunRecord>,
}

fn local_owner() -> String {
    "local".into()
}

/// How an output file relates to the uploaded inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InputMatch {
    /// No input was uploaded at this path: the script made it.
    NotAnInput,
    /// An input, byte-for-byte as uploaded.
    Unchanged,
    /// An input path whose content the script changed.
    Changed,
    /// Not hashed (the run's outputs passed the hash budget): whether it is
    /// the uploaded input is not known.
    Unhashed,
}

/// A regular file found under `work/` after the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputFile {
    pub path: String,
    pub size: u64,
    /// `sha256:<hex>`; empty (and left out of the JSON) for a file past the
    /// run's hash budget ([`crate::core::limits::OUTPUT_HASH_BUDGET`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    pub input: InputMatch,
    /// Where the whole file can be downloaded in one request (the
    /// gateway's file route, for files over one MCP call's worth).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<String>,
}

/// Why an entry under `work/` is not listed as a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipKind {
    Symlink,
    Special,
    BadName,
    TooDeep,
    Unreadable,
}

/// An entry the listing did not follow or could not address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedEntry {
    /// Relative to `work/` (lossy if the name is not UTF-8).
    pub path: String,
    pub kind: SkipKind,
    pub reason: String,
}

/// Everything under `work/` after the run, listed once when the run ends
/// and stored beside the record (`outputs.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputListing {
    /// Sorted by path.
    pub files: Vec<OutputFile>,
    pub skipped: Vec<SkippedEntry>,
    /// Sum of `files[].size`.
    pub total_bytes: u64,
    /// The walk stopped at the file, directory or skipped-entry cap
    /// ([`JobLimits::files`] each); more entries exist than are shown.
    pub truncated: bool,
}

/// What [`JobStore::read`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadTarget {
    Stdout,
    Stderr,
    /// A path under `work/`, checked with [`RelPath::parse`].
    File(String),
}

/// A slice of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub data: Vec<u8>,
    /// Offset of `data[0]` (the offset asked for).
    pub offset: u64,
    /// The whole file's size.
    pub size: u64,
    /// `offset + data.len() >= size`: nothing more to read.
    pub eof: bool,
    /// Where the whole file can be downloaded in one request instead (the
    /// gateway's file route, for files over one MCP call's worth).
    pub download: Option<String>,
}

/// A job directory [`JobStore::open`] could not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedJob {
    /// The directory name under `jobs/`.
    pub name: String,
    pub reason: String,
}

/// What [`JobStore::open`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Jobs found `Running`, now `Interrupted` (not re-run).
    pub interrupted: Vec<String>,
    /// Job directories left alone because they could not be read; they still
    /// count toward the retained cap until deleted.
    pub skipped: Vec<SkippedJob>,
    /// Leftovers of interrupted creates, deletes and record writes, removed.
    pub cleaned: Vec<String>,
}
