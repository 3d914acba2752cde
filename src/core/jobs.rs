//! The job store: one directory per job, holding the inputs a client
//! uploaded, the single run of a script over them, and what that run left
//! behind. Synchronous and filesystem-only; the MCP tools and the runners
//! call into it.
//!
//! # Layout
//!
//! ```text
//! <root>/jobs/<id>/job.json   the record (JobRecord), replaced atomically
//! <root>/jobs/<id>/work/      inputs; the script's cwd (/work); outputs
//! <root>/jobs/<id>/stdout     captured streams, written by finish_run
//! <root>/jobs/<id>/stderr
//! ```
//!
//! A job is born in a `.tmp-<uuid>` directory and renamed into place, and is
//! deleted by renaming it to `.trash-<uuid>` first, so a crash never leaves a
//! half-made or half-deleted job under a real id; [`JobStore::open`] sweeps
//! both kinds of leftover, and the `job.json.tmp-*` files an interrupted
//! record write leaves behind.
//!
//! # Why the lifecycle is what it is
//!
//! `Created -> Running -> Succeeded | Failed | TimedOut`, or `Interrupted`.
//!
//! - **One run per job.** A run mutates `work/`: the script may rewrite or
//!   delete its inputs. A second run would start from whatever the first left
//!   behind, so "the same job run twice" would not mean "the same inputs run
//!   twice", and outputs of the two runs could not be told apart. A job is
//!   therefore the record of exactly one run; running again means a new job.
//! - **Uploads are closed once a job has run.** For the same reason: an upload
//!   after the run would mix client bytes into the script's outputs, and the
//!   job record would no longer say which files the script produced. Closing
//!   uploads at `begin_run` also means nothing but the script writes to
//!   `work/` from then on.
//! - **Interrupted runs are never re-run.** A job found `Running` when the
//!   store opens was cut off by a restart. Its script may have had side
//!   effects (network, partial outputs), and tool calls are not idempotent, so
//!   silently running it again could do them twice. It is marked
//!   `Interrupted` with a note and left for the client to inspect; running
//!   again is an explicit new job.
//! - **A running job's files are withheld.** While the script runs it can
//!   swap a checked file for a symlink between our check and our open; once
//!   the runner has reported the end of the run (and so has stopped the
//!   script) nothing writes to `work/` any more and the checks hold.
//!   The runner must therefore call [`JobStore::finish_run`] only after the
//!   script's process group is gone; if it cannot confirm that, it should
//!   leave the job `Running` (files stay withheld, delete is refused).
//!
//! # Symlinks and other hostile entries
//!
//! The script is third-party code with write access to `work/`: it can plant
//! `out -> /etc/passwd`, `d -> /`, or a link into a sibling job. So:
//!
//! - every client path passes [`RelPath::parse`] before any filesystem access
//!   (no `..`, no absolute paths, no percent escapes, no NUL, no backslash);
//! - every read of a work file goes through [`resolve_inside`] against the
//!   real `work/` directory: the real path, symlinks followed, must stay
//!   inside it and be a regular file, otherwise the read is refused. A link
//!   to another file *inside* `work/` is served;
//! - the output listing never follows a symlink: links, FIFOs, sockets and
//!   devices are reported as skipped with a reason;
//! - uploads never write through a symlink: every parent directory inside
//!   `work/` is checked with `lstat` and refused if it is a link, a new file
//!   is made with `create_new` (which does not follow a final symlink), and
//!   an appended file is checked by comparing the opened handle's inode with
//!   the `lstat` of its name;
//! - the store's own files (`job.json`, `stdout`, `stderr`) are opened only if
//!   `lstat` says they are regular files and the opened handle is that file.
//!
//! # Concurrency
//!
//! One mutex serialises every state transition (create, upload, begin/finish
//! run, delete), so two `begin_run` calls on one job cannot both succeed and
//! concurrent `create` calls cannot pass the retained-jobs cap. Reads of a
//! finished job take no lock: a finished state is final and record writes
//! are atomic renames.

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::paths::{resolve_inside, PathError, RelPath, ResolveError};

/// Bytes accepted per upload call.
pub const JOB_UPLOAD_CHUNK: u64 = 1024 * 1024;
/// Bytes per input file.
pub const JOB_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Bytes of inputs per job (sum of input file sizes).
pub const JOB_BYTES: u64 = 128 * 1024 * 1024;
/// Input files per job; also the cap on entries in an output listing.
pub const JOB_FILES: usize = 2_000;
/// Jobs kept on disk per server; `create` refuses past this.
pub const JOBS_RETAINED: usize = 100;
/// Bytes returned per read call.
pub const JOB_READ_CHUNK: u64 = 256 * 1024;
/// Deepest nesting of an uploaded path (segments) and of the output walk.
pub const JOB_MAX_DEPTH: usize = 32;
/// Largest `job.json` read back (2,000 inputs with 1 KiB paths fit easily).
const RECORD_READ_CAP: u64 = 8 * 1024 * 1024;
/// Note put on a job found running when the store opens.
pub const INTERRUPTED_NOTE: &str = "the server restarted during this run; it was not re-run";

const RECORD: &str = "job.json";
const WORK: &str = "work";
const STDOUT: &str = "stdout";
const STDERR: &str = "stderr";
const NEW_JOB_PREFIX: &str = ".tmp-";
const TRASH_PREFIX: &str = ".trash-";

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
            upload_chunk: JOB_UPLOAD_CHUNK,
            file_bytes: JOB_FILE_BYTES,
            job_bytes: JOB_BYTES,
            files: JOB_FILES,
            retained: JOBS_RETAINED,
            read_chunk: JOB_READ_CHUNK,
            durable: false,
        }
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
            JobState::Interrupted => "interrupted",
        }
    }

    /// The run is over (whatever its outcome); files may be served.
    pub fn is_finished(self) -> bool {
        !matches!(self, JobState::Created | JobState::Running)
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
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Bytes the script wrote, which may exceed the bytes kept.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub note: Option<String>,
}

/// `job.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    pub id: String,
    pub skill: String,
    pub created_at_ms: u64,
    pub state: JobState,
    /// Sorted by path.
    pub inputs: Vec<FileInfo>,
    pub run: Option<RunRecord>,
}

/// What the runner reports at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFinish {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// Bytes the script wrote to stdout (kept or not).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub note: Option<String>,
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
}

/// A regular file found under `work/` after the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputFile {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    pub input: InputMatch,
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

/// Everything under `work/` after the run.
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

/// Every way a job-store call fails. Messages say what to do next.
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
trait IoContext<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| JobError::Io { what: what(), source })
    }
}

/// A hash in progress for the last file appended to in a job, so that a file
/// sent in N chunks is hashed once, not N times. A cache only: when it does
/// not match (other file, restart), the prefix is re-read from disk.
struct PartialHash {
    path: String,
    size: u64,
    hasher: Sha256,
}

#[derive(Default)]
struct Inner {
    /// Keyed by job id; at most one entry per job in `Created`.
    partial: HashMap<String, PartialHash>,
}

/// The job store. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct JobStore {
    /// `<root>/jobs`, canonicalised.
    jobs_dir: PathBuf,
    limits: JobLimits,
    inner: Mutex<Inner>,
}

impl fmt::Debug for JobStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobStore").field("jobs_dir", &self.jobs_dir).field("limits", &self.limits).finish()
    }
}

impl JobStore {
    /// Open (creating) `<root>/jobs`. Jobs found `Running` become
    /// `Interrupted` and are never re-run; unreadable job directories are
    /// reported and left alone; leftovers of interrupted writes are removed.
    pub fn open(root: &Path, limits: JobLimits) -> Result<(JobStore, OpenReport)> {
        let jobs = root.join("jobs");
        fs::create_dir_all(&jobs).ctx(|| format!("create {}", jobs.display()))?;
        let jobs_dir = jobs.canonicalize().ctx(|| format!("resolve {}", jobs.display()))?;
        let store = JobStore { jobs_dir, limits, inner: Mutex::new(Inner::default()) };
        let mut report = OpenReport::default();

        let mut names = Vec::new();
        for entry in fs::read_dir(&store.jobs_dir).ctx(|| "list the jobs directory".into())? {
            let entry = entry.ctx(|| "list the jobs directory".into())?;
            names.push(entry.file_name());
        }
        names.sort();
        for raw in names {
            let name = raw.to_string_lossy().into_owned();
            let path = store.jobs_dir.join(&raw);
            if name.starts_with(NEW_JOB_PREFIX) || name.starts_with(TRASH_PREFIX) {
                // A create or delete that did not finish: never a live job.
                let removed = match fs::symlink_metadata(&path) {
                    Ok(meta) if meta.is_dir() => fs::remove_dir_all(&path),
                    Ok(_) => fs::remove_file(&path),
                    Err(err) => Err(err),
                };
                match removed {
                    Ok(()) => report.cleaned.push(name),
                    Err(err) => report.skipped.push(SkippedJob { name, reason: format!("leftover could not be removed: {err}") }),
                }
                continue;
            }
            if check_id(&name).is_err() {
                report.skipped.push(SkippedJob { name, reason: "not a job directory name (32 lowercase hex)".into() });
                continue;
            }
            match store.recover(&name, &mut report.cleaned) {
                Ok(true) => report.interrupted.push(name),
                Ok(false) => {}
                Err(err) => report.skipped.push(SkippedJob { name, reason: err.to_string() }),
            }
        }
        Ok((store, report))
    }

    /// Sweep one job's temp files and mark it interrupted if it was
    /// running. Returns whether it was.
    fn recover(&self, id: &str, cleaned: &mut Vec<String>) -> Result<bool> {
        let dir = self.job_dir_checked(id)?;
        for entry in fs::read_dir(&dir).ctx(|| format!("list job {id}"))? {
            let entry = entry.ctx(|| format!("list job {id}"))?;
            let name = entry.file_name();
            if is_temp_name(&name.to_string_lossy()) {
                fs::remove_file(entry.path()).ctx(|| format!("remove a leftover record file in job {id}"))?;
                cleaned.push(format!("{id}/{}", name.to_string_lossy()));
            }
        }
        let mut record = self.load(id)?;
        if record.state != JobState::Running {
            return Ok(false);
        }
        record.state = JobState::Interrupted;
        if let Some(run) = record.run.as_mut() {
            run.note = Some(match run.note.take() {
                Some(previous) => format!("{INTERRUPTED_NOTE}; {previous}"),
                None => INTERRUPTED_NOTE.to_string(),
            });
        }
        save_record(&dir, &record, self.limits.durable)?;
        Ok(true)
    }

    pub fn limits(&self) -> &JobLimits {
        &self.limits
    }

    /// A new job for `skill`, refused once [`JobLimits::retained`] job
    /// directories exist (unreadable ones included: they still use disk).
    pub fn create(&self, skill: &str) -> Result<JobRecord> {
        let _guard = self.lock();
        let retained = self.job_names()?.len();
        if retained >= self.limits.retained {
            return Err(JobError::CapReached { max: self.limits.retained });
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let record = JobRecord {
            id: id.clone(),
            skill: skill.to_string(),
            created_at_ms: now_ms(),
            state: JobState::Created,
            inputs: Vec::new(),
            run: None,
        };
        // Build the job under a temporary name and rename it into place, so
        // an id directory always has a complete record.
        let tmp = self.jobs_dir.join(format!("{NEW_JOB_PREFIX}{id}"));
        let built = (|| {
            fs::create_dir(&tmp).ctx(|| "create the job directory".into())?;
            fs::create_dir(tmp.join(WORK)).ctx(|| "create the job's work directory".into())?;
            save_record(&tmp, &record, self.limits.durable)?;
            fs::rename(&tmp, self.jobs_dir.join(&id)).ctx(|| "move the new job into place".into())?;
            sync_dir(&self.jobs_dir, self.limits.durable)
        })();
        if let Err(err) = built {
            let _ = fs::remove_dir_all(&tmp);
            return Err(err);
        }
        Ok(record)
    }

    /// Write `bytes` into input `path` at `offset`: 0 creates or replaces the
    /// file, the file's current size appends; anything else is refused with
    /// the expected offset. Only while the job is `Created`.
    pub fn upload(&self, id: &str, path: &str, offset: u64, bytes: &[u8]) -> Result<FileInfo> {
        check_id(id)?;
        let rel = parse_path(path)?;
        let depth = rel.as_str().split('/').count();
        if depth > JOB_MAX_DEPTH {
            return Err(JobError::PathTooDeep { path: rel.to_string(), depth, max: JOB_MAX_DEPTH });
        }
        let len = bytes.len() as u64;
        if len > self.limits.upload_chunk {
            return Err(JobError::ChunkTooLarge { got: len, max: self.limits.upload_chunk });
        }

        let mut inner = self.lock();
        let dir = self.job_dir_checked(id)?;
        let mut record = self.load(id)?;
        if record.state != JobState::Created {
            return Err(JobError::UploadsClosed { id: id.to_string(), state: record.state });
        }
        let existing = record.inputs.iter().position(|f| f.path == rel.as_str());
        if offset != 0 {
            let expected = existing.map_or(0, |i| record.inputs[i].size);
            if offset != expected {
                return Err(JobError::WrongOffset { path: rel.to_string(), got: offset, expected });
            }
        }
        let size = offset + len;
        if size > self.limits.file_bytes {
            return Err(JobError::FileTooLarge { path: rel.to_string(), size, max: self.limits.file_bytes });
        }
        let others: u64 = record.inputs.iter().filter(|f| f.path != rel.as_str()).map(|f| f.size).sum();
        if others + size > self.limits.job_bytes {
            return Err(JobError::JobTooLarge { total: others + size, max: self.limits.job_bytes });
        }
        let count = record.inputs.len() + usize::from(existing.is_none());
        if count > self.limits.files {
            return Err(JobError::TooManyFiles { count, max: self.limits.files });
        }

        let work = self.work_dir_checked(id, &dir)?;
        let parent = make_parents(&work, &rel)?;
        let target = parent.join(rel.file_name());
        let cached = inner.partial.remove(id).filter(|p| p.path == rel.as_str() && p.size == offset);
        let hasher = if offset == 0 {
            write_new(&target, &rel, bytes)?;
            let mut hasher = Sha256::new();
            hasher.update(bytes);
            hasher
        } else {
            append(&target, &rel, offset, bytes, cached.map(|p| p.hasher))?
        };

        let info = FileInfo { path: rel.to_string(), size, sha256: digest_label(hasher.clone()) };
        match existing {
            Some(i) => record.inputs[i] = info.clone(),
            None => {
                record.inputs.push(info.clone());
                record.inputs.sort_by(|a, b| a.path.cmp(&b.path));
            }
        }
        save_record(&dir, &record, self.limits.durable)?;
        inner.partial.insert(id.to_string(), PartialHash { path: rel.to_string(), size, hasher });
        Ok(info)
    }

    /// The job's record.
    pub fn get(&self, id: &str) -> Result<JobRecord> {
        check_id(id)?;
        self.load(id)
    }

    /// Every readable job, newest first. Unreadable ones are left out (they
    /// were reported by [`JobStore::open`], and `get` names their problem).
    pub fn list(&self) -> Result<Vec<JobRecord>> {
        let mut records: Vec<JobRecord> = self.job_names()?.iter().filter_map(|id| self.load(id).ok()).collect();
        records.sort_by(|a, b| b.created_at_ms.cmp(&a.created_at_ms).then_with(|| a.id.cmp(&b.id)));
        Ok(records)
    }

    /// `Created -> Running`, persisted before this returns, so a restart
    /// from here on finds the job `Running` and marks it `Interrupted` rather
    /// than running it again. Returns the real work directory (the script's
    /// cwd). Uploads are closed from this point.
    pub fn begin_run(&self, id: &str, script: &str, args: &[String]) -> Result<PathBuf> {
        check_id(id)?;
        let mut inner = self.lock();
        let dir = self.job_dir_checked(id)?;
        let mut record = self.load(id)?;
        match record.state {
            JobState::Created => {}
            JobState::Running => return Err(JobError::AlreadyRunning { id: id.to_string() }),
            state => return Err(JobError::AlreadyRan { id: id.to_string(), state }),
        }
        let work = self.work_dir_checked(id, &dir)?;
        record.state = JobState::Running;
        record.run = Some(RunRecord {
            script: script.to_string(),
            args: args.to_vec(),
            started_at_ms: now_ms(),
            finished_at_ms: None,
            exit_code: None,
            signal: None,
            timed_out: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            note: None,
        });
        save_record(&dir, &record, self.limits.durable)?;
        inner.partial.remove(id);
        Ok(work)
    }

    /// `Running -> Succeeded` (exit 0, no signal) `| Failed | TimedOut`, and
    /// the captured streams saved. Call only once the script has stopped.
    /// A stream that cannot be saved is noted on the run rather than leaving
    /// the job `Running` (which would block its deletion).
    pub fn finish_run(&self, id: &str, finish: RunFinish, stdout: &[u8], stderr: &[u8]) -> Result<JobRecord> {
        check_id(id)?;
        let _guard = self.lock();
        let dir = self.job_dir_checked(id)?;
        let mut record = self.load(id)?;
        if record.state != JobState::Running {
            return Err(JobError::NotRunning { id: id.to_string(), state: record.state });
        }
        let mut notes: Vec<String> = finish.note.into_iter().collect();
        for (name, bytes) in [(STDOUT, stdout), (STDERR, stderr)] {
            if let Err(err) = write_atomic(&dir, name, bytes, self.limits.durable) {
                notes.push(format!("{name} could not be saved: {err}"));
            }
        }
        record.state = if finish.timed_out {
            JobState::TimedOut
        } else if finish.exit_code == Some(0) && finish.signal.is_none() {
            JobState::Succeeded
        } else {
            JobState::Failed
        };
        let started_at_ms = record.run.as_ref().map_or(0, |r| r.started_at_ms);
        let (script, args) = record.run.take().map(|r| (r.script, r.args)).unwrap_or_default();
        record.run = Some(RunRecord {
            script,
            args,
            started_at_ms,
            finished_at_ms: Some(now_ms()),
            exit_code: finish.exit_code,
            signal: finish.signal,
            timed_out: finish.timed_out,
            stdout_bytes: finish.stdout_bytes.max(stdout.len() as u64),
            stderr_bytes: finish.stderr_bytes.max(stderr.len() as u64),
            stdout_truncated: finish.stdout_truncated,
            stderr_truncated: finish.stderr_truncated,
            note: if notes.is_empty() { None } else { Some(notes.join("; ")) },
        });
        save_record(&dir, &record, self.limits.durable)?;
        Ok(record)
    }

    /// Every regular file under `work/` once the run is over, with its hash
    /// and whether it is an untouched input. Symlinks are never followed;
    /// they and special files are listed as skipped. Stops (flagged) at
    /// [`JobLimits::files`] files, directories or skipped entries.
    pub fn outputs(&self, id: &str) -> Result<OutputListing> {
        check_id(id)?;
        let record = self.load(id)?;
        self.check_finished(&record)?;
        let dir = self.job_dir_checked(id)?;
        let work = self.work_dir_checked(id, &dir)?;
        let inputs: HashMap<&str, &str> = record.inputs.iter().map(|f| (f.path.as_str(), f.sha256.as_str())).collect();
        let cap = self.limits.files;
        let mut listing = OutputListing { files: Vec::new(), skipped: Vec::new(), total_bytes: 0, truncated: false };
        let mut dirs_seen = 0usize;
        // (real directory, its path relative to work/ ("" for work/), depth)
        let mut stack: Vec<(PathBuf, String, usize)> = vec![(work, String::new(), 0)];
        'walk: while let Some((real_dir, prefix, depth)) = stack.pop() {
            dirs_seen += 1;
            if dirs_seen > cap {
                listing.truncated = true;
                break;
            }
            let mut entries = Vec::new();
            match fs::read_dir(&real_dir) {
                Ok(iter) => {
                    for entry in iter {
                        match entry {
                            Ok(entry) => entries.push(entry),
                            Err(err) => {
                                skip(
                                    &mut listing,
                                    cap,
                                    display_rel(&prefix, "?"),
                                    SkipKind::Unreadable,
                                    format!("directory entry unreadable: {err}"),
                                );
                            }
                        }
                    }
                }
                Err(err) => {
                    skip(&mut listing, cap, display_rel(&prefix, ""), SkipKind::Unreadable, format!("directory unreadable: {err}"));
                    continue;
                }
            }
            entries.sort_by_key(|e| e.file_name());
            let mut subdirs = Vec::new();
            for entry in entries {
                let raw = entry.file_name();
                let shown = display_rel(&prefix, &raw.to_string_lossy());
                let Some(name) = raw.to_str() else {
                    skip(&mut listing, cap, shown, SkipKind::BadName, "the name is not UTF-8, so it cannot be addressed".into());
                    continue;
                };
                let rel = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
                if let Err(err) = RelPath::parse(&rel) {
                    skip(&mut listing, cap, shown, SkipKind::BadName, format!("the path cannot be addressed: {err}"));
                    continue;
                }
                let entry_path = entry.path();
                // lstat: the entry itself, never what a link points to.
                let meta = match fs::symlink_metadata(&entry_path) {
                    Ok(meta) => meta,
                    Err(err) => {
                        skip(&mut listing, cap, rel, SkipKind::Unreadable, format!("cannot stat: {err}"));
                        continue;
                    }
                };
                let file_type = meta.file_type();
                if file_type.is_symlink() {
                    let target = fs::read_link(&entry_path).map(|t| format!("{:?}", t)).unwrap_or_else(|_| "an unreadable target".into());
                    skip(&mut listing, cap, rel, SkipKind::Symlink, format!("symlink to {}; not followed", clip(&target, 200)));
                } else if file_type.is_dir() {
                    if depth + 1 >= JOB_MAX_DEPTH {
                        skip(
                            &mut listing,
                            cap,
                            rel,
                            SkipKind::TooDeep,
                            format!("directory nested deeper than {JOB_MAX_DEPTH} levels; not walked"),
                        );
                    } else {
                        subdirs.push((entry_path, rel, depth + 1));
                    }
                } else if file_type.is_file() {
                    if listing.files.len() >= cap {
                        listing.truncated = true;
                        break 'walk;
                    }
                    match hash_regular(&entry_path, &meta) {
                        Ok((size, sha256)) => {
                            let input = match inputs.get(rel.as_str()) {
                                None => InputMatch::NotAnInput,
                                Some(h) if *h == sha256 => InputMatch::Unchanged,
                                Some(_) => InputMatch::Changed,
                            };
                            listing.total_bytes += size;
                            listing.files.push(OutputFile { path: rel, size, sha256, input });
                        }
                        Err(reason) => skip(&mut listing, cap, rel, SkipKind::Unreadable, reason),
                    }
                } else {
                    skip(&mut listing, cap, rel, SkipKind::Special, format!("{}; only regular files are served", special_kind(&file_type)));
                }
            }
            // Reverse so the walk pops directories in name order.
            stack.extend(subdirs.into_iter().rev());
        }
        listing.files.sort_by(|a, b| a.path.cmp(&b.path));
        if listing.skipped.len() >= cap {
            listing.truncated = true;
        }
        Ok(listing)
    }

    /// At most [`JobLimits::read_chunk`] bytes of a captured stream or a work
    /// file, from `offset`. An offset at or past the end gives no data and
    /// `eof`. Work files are served only once the run is over and only if
    /// their real path stays inside `work/`.
    pub fn read(&self, id: &str, target: ReadTarget, offset: u64, limit: u64) -> Result<Chunk> {
        check_id(id)?;
        let rel = match &target {
            ReadTarget::File(path) => Some(parse_path(path)?),
            ReadTarget::Stdout | ReadTarget::Stderr => None,
        };
        if limit > self.limits.read_chunk {
            return Err(JobError::ReadTooLarge { got: limit, max: self.limits.read_chunk });
        }
        let record = self.load(id)?;
        self.check_finished(&record)?;
        let dir = self.job_dir_checked(id)?;
        let file = match rel {
            None => {
                let stream = if target == ReadTarget::Stdout { STDOUT } else { STDERR };
                match open_own_file(&dir.join(stream)) {
                    Ok(file) => file,
                    Err(err) if err.kind() == io::ErrorKind::NotFound => {
                        return Err(JobError::NoStream { id: id.to_string(), stream, state: record.state });
                    }
                    Err(err) => return Err(err).ctx(|| format!("open job {id}'s {stream}")),
                }
            }
            Some(rel) => {
                let work = self.work_dir_checked(id, &dir)?;
                let real = resolve_inside(&work, &rel).map_err(|err| match err {
                    ResolveError::NotFound => JobError::NoSuchFile { id: id.to_string(), path: rel.to_string() },
                    ResolveError::Escapes => JobError::Escapes { id: id.to_string(), path: rel.to_string() },
                    ResolveError::NotAFile => JobError::NotAFile { path: rel.to_string() },
                    ResolveError::Io(source) => JobError::Io { what: format!("resolve {rel} in job {id}"), source },
                })?;
                let file = File::open(&real).ctx(|| format!("open {rel} in job {id}"))?;
                let meta = file.metadata().ctx(|| format!("stat {rel} in job {id}"))?;
                if !meta.is_file() {
                    return Err(JobError::NotAFile { path: rel.to_string() });
                }
                file
            }
        };
        read_chunk(file, offset, limit).ctx(|| format!("read job {id}"))
    }

    /// Remove a job and its files. Refused while it runs; allowed for an
    /// unreadable job, so its slot can be freed.
    pub fn delete(&self, id: &str) -> Result<()> {
        check_id(id)?;
        let mut inner = self.lock();
        let dir = self.job_dir_checked(id)?;
        match self.load(id) {
            Ok(record) if record.state == JobState::Running => return Err(JobError::DeleteWhileRunning { id: id.to_string() }),
            Ok(_) | Err(JobError::Corrupt { .. }) => {}
            Err(err) => return Err(err),
        }
        // Rename first: the job disappears at once and whole; the removal
        // after it may be slow, and if it fails `open` finishes it.
        let trash = self.jobs_dir.join(format!("{TRASH_PREFIX}{}", uuid::Uuid::new_v4().simple()));
        fs::rename(&dir, &trash).ctx(|| format!("delete job {id}"))?;
        inner.partial.remove(id);
        sync_dir(&self.jobs_dir, self.limits.durable)?;
        // remove_dir_all does not follow symlinks inside the tree.
        fs::remove_dir_all(&trash).ctx(|| format!("erase job {id}'s files (it is deleted; the rest is removed at the next start)"))
    }

    /// The job's real work directory (the script's cwd).
    pub fn work_dir(&self, id: &str) -> Result<PathBuf> {
        check_id(id)?;
        let dir = self.job_dir_checked(id)?;
        self.work_dir_checked(id, &dir)
    }

    // -- helpers -----------------------------------------------------------

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The guarded data is a hash cache: after a panic elsewhere it is
        // still a valid cache (entries are checked before use).
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Names under `jobs/` that are job ids (temporaries excluded).
    fn job_names(&self) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.jobs_dir).ctx(|| "list the jobs directory".into())? {
            let entry = entry.ctx(|| "list the jobs directory".into())?;
            if let Some(name) = entry.file_name().to_str() {
                if check_id(name).is_ok() {
                    names.push(name.to_string());
                }
            }
        }
        Ok(names)
    }

    /// `jobs/<id>`, which must be a real directory (not a symlink).
    fn job_dir_checked(&self, id: &str) -> Result<PathBuf> {
        let dir = self.jobs_dir.join(id);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(dir),
            Ok(_) => Err(JobError::Corrupt { id: id.to_string(), reason: "the job path is not a directory".into() }),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Err(JobError::NotFound(id.to_string())),
            Err(err) => Err(err).ctx(|| format!("stat job {id}")),
        }
    }

    /// `jobs/<id>/work`, which must be a real directory (not a symlink).
    fn work_dir_checked(&self, id: &str, dir: &Path) -> Result<PathBuf> {
        let work = dir.join(WORK);
        match fs::symlink_metadata(&work) {
            Ok(meta) if meta.is_dir() => Ok(work),
            Ok(_) => Err(JobError::Corrupt { id: id.to_string(), reason: "its work directory is not a directory".into() }),
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                Err(JobError::Corrupt { id: id.to_string(), reason: "its work directory is missing".into() })
            }
            Err(err) => Err(err).ctx(|| format!("stat job {id}'s work directory")),
        }
    }

    fn load(&self, id: &str) -> Result<JobRecord> {
        let dir = self.job_dir_checked(id)?;
        let corrupt = |reason: String| JobError::Corrupt { id: id.to_string(), reason };
        let file = open_own_file(&dir.join(RECORD)).map_err(|err| corrupt(format!("{RECORD}: {err}")))?;
        let mut text = Vec::new();
        file.take(RECORD_READ_CAP + 1).read_to_end(&mut text).map_err(|err| corrupt(format!("{RECORD}: {err}")))?;
        if text.len() as u64 > RECORD_READ_CAP {
            return Err(corrupt(format!("{RECORD} is over {RECORD_READ_CAP} bytes")));
        }
        let record: JobRecord = serde_json::from_slice(&text).map_err(|err| corrupt(format!("{RECORD}: {err}")))?;
        if record.id != id {
            return Err(corrupt(format!("{RECORD} names another job ({})", clip(&record.id, 40))));
        }
        Ok(record)
    }

    fn check_finished(&self, record: &JobRecord) -> Result<()> {
        match record.state {
            JobState::Created => Err(JobError::NotRunYet { id: record.id.clone() }),
            JobState::Running => Err(JobError::StillRunning { id: record.id.clone() }),
            _ => Ok(()),
        }
    }
}

// -- free helpers ------------------------------------------------------------

/// A temp file [`write_atomic`] left behind (`job.json.tmp-*`, `stdout.tmp-*`, `stderr.tmp-*`).
fn is_temp_name(name: &str) -> bool {
    [RECORD, STDOUT, STDERR].iter().any(|base| name.strip_prefix(base).is_some_and(|rest| rest.starts_with(".tmp-")))
}

/// Exactly 32 lowercase hex characters, checked before any path is built.
fn check_id(id: &str) -> Result<()> {
    if id.len() == 32 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        Ok(())
    } else {
        Err(JobError::BadId(clip(&format!("{id:?}"), 80)))
    }
}

fn parse_path(raw: &str) -> Result<RelPath> {
    RelPath::parse(raw).map_err(|source| JobError::BadPath { path: clip(&format!("{raw:?}"), 120), source })
}

/// At most `max` characters of `s`, marked when cut.
fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut cut: String = s.chars().take(max).collect();
        cut.push('…');
        cut
    }
}

fn display_rel(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}/{name}"),
    }
}

fn skip(listing: &mut OutputListing, cap: usize, path: String, kind: SkipKind, reason: String) {
    if listing.skipped.len() < cap {
        listing.skipped.push(SkippedEntry { path, kind, reason });
    } else {
        listing.truncated = true;
    }
}

fn special_kind(file_type: &fs::FileType) -> &'static str {
    if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_char_device() {
        "a character device"
    } else {
        "a special file"
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn digest_label(hasher: Sha256) -> String {
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

fn same_file(a: &fs::Metadata, b: &fs::Metadata) -> bool {
    a.dev() == b.dev() && a.ino() == b.ino()
}

/// Open a file the store itself wrote (`job.json`, `stdout`, `stderr`),
/// refusing a symlink or special file planted in its place.
fn open_own_file(path: &Path) -> io::Result<File> {
    let before = fs::symlink_metadata(path)?;
    if !before.is_file() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "not a regular file (a symlink or special file was put in its place)"));
    }
    let file = File::open(path)?;
    let after = file.metadata()?;
    if !same_file(&before, &after) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "the file changed while it was being opened"));
    }
    Ok(file)
}

/// Hash a regular file found by the walk, checking the opened handle is the
/// entry that was `lstat`ed (not a link swapped in since).
fn hash_regular(path: &Path, meta: &fs::Metadata) -> Result<(u64, String), String> {
    let file = File::open(path).map_err(|err| format!("cannot open: {err}"))?;
    let opened = file.metadata().map_err(|err| format!("cannot stat: {err}"))?;
    if !opened.is_file() || !same_file(meta, &opened) {
        return Err("the file changed while it was being listed".into());
    }
    let mut hasher = Sha256::new();
    let mut file = file;
    let size = io::copy(&mut file, &mut hasher).map_err(|err| format!("cannot read: {err}"))?;
    Ok((size, digest_label(hasher)))
}

/// Read `limit` bytes from `offset` (no data past the end).
fn read_chunk(mut file: File, offset: u64, limit: u64) -> io::Result<Chunk> {
    let size = file.metadata()?.len();
    if offset >= size {
        return Ok(Chunk { data: Vec::new(), offset, size, eof: true });
    }
    let want = limit.min(size - offset);
    file.seek(SeekFrom::Start(offset))?;
    let mut data = Vec::with_capacity(want as usize);
    file.take(want).read_to_end(&mut data)?;
    let eof = offset + data.len() as u64 >= size;
    Ok(Chunk { data, offset, size, eof })
}

/// Create the missing parent directories of `rel` under `work`, refusing any
/// existing component that is a symlink or not a directory. Returns the
/// parent directory of the final component.
fn make_parents(work: &Path, rel: &RelPath) -> Result<PathBuf> {
    let segments: Vec<&str> = rel.as_str().split('/').collect();
    let mut current = work.to_path_buf();
    let mut shown = String::new();
    for segment in &segments[..segments.len().saturating_sub(1)] {
        current.push(segment);
        if !shown.is_empty() {
            shown.push('/');
        }
        shown.push_str(segment);
        let obstructed = |what| JobError::ParentObstructed { path: rel.to_string(), component: shown.clone(), what };
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => return Err(obstructed("a symlink")),
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(obstructed("a file, not a directory")),
            // create_dir does not follow a symlink at its last component: if
            // one appeared since the lstat it fails with AlreadyExists.
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&current).ctx(|| format!("create directory {shown}"))?;
            }
            Err(err) => return Err(err).ctx(|| format!("stat {shown}")),
        }
    }
    Ok(current)
}

fn obstruction(meta: &fs::Metadata) -> Option<&'static str> {
    let file_type = meta.file_type();
    if file_type.is_symlink() {
        Some("a symlink")
    } else if file_type.is_dir() {
        Some("a directory")
    } else if !file_type.is_file() {
        Some("a special file")
    } else {
        None
    }
}

/// Offset 0: replace whatever regular file is at `target` with `bytes`.
fn write_new(target: &Path, rel: &RelPath, bytes: &[u8]) -> Result<()> {
    match fs::symlink_metadata(target) {
        Ok(meta) => {
            if let Some(what) = obstruction(&meta) {
                return Err(JobError::PathObstructed { path: rel.to_string(), what });
            }
            fs::remove_file(target).ctx(|| format!("replace {rel}"))?;
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).ctx(|| format!("stat {rel}")),
    }
    // create_new = O_CREAT|O_EXCL: fails on any existing name, a symlink
    // included, so the write can never land outside work/.
    let mut file = OpenOptions::new().write(true).create_new(true).open(target).ctx(|| format!("create {rel}"))?;
    file.write_all(bytes).ctx(|| format!("write {rel}"))
}

/// Append `bytes` at `offset` (the recorded size) and return the hash of the
/// whole file, continuing `cached` when it covers exactly `offset` bytes.
fn append(target: &Path, rel: &RelPath, offset: u64, bytes: &[u8], cached: Option<Sha256>) -> Result<Sha256> {
    let before = match fs::symlink_metadata(target) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(JobError::InputOutOfSync { path: rel.to_string(), expected: offset, found: 0 });
        }
        Err(err) => return Err(err).ctx(|| format!("stat {rel}")),
    };
    if let Some(what) = obstruction(&before) {
        return Err(JobError::PathObstructed { path: rel.to_string(), what });
    }
    let mut file = OpenOptions::new().read(true).write(true).open(target).ctx(|| format!("open {rel}"))?;
    let opened = file.metadata().ctx(|| format!("stat {rel}"))?;
    if !same_file(&before, &opened) {
        return Err(JobError::PathObstructed { path: rel.to_string(), what: "a file that changed while it was being opened" });
    }
    if opened.len() < offset {
        return Err(JobError::InputOutOfSync { path: rel.to_string(), expected: offset, found: opened.len() });
    }
    let hasher = match cached {
        Some(hasher) => hasher,
        None => {
            let mut hasher = Sha256::new();
            file.seek(SeekFrom::Start(0)).ctx(|| format!("read {rel}"))?;
            let read = io::copy(&mut (&mut file).take(offset), &mut hasher).ctx(|| format!("read {rel}"))?;
            if read != offset {
                return Err(JobError::InputOutOfSync { path: rel.to_string(), expected: offset, found: read });
            }
            hasher
        }
    };
    // Drop any tail a crash left past the recorded size, then append.
    file.set_len(offset).ctx(|| format!("write {rel}"))?;
    file.seek(SeekFrom::Start(offset)).ctx(|| format!("write {rel}"))?;
    file.write_all(bytes).ctx(|| format!("write {rel}"))?;
    let mut hasher = hasher;
    hasher.update(bytes);
    Ok(hasher)
}

/// Write `dir/name` atomically: a fresh temp file (never an existing name,
/// so never through a symlink), fsync, rename over the old one, fsync the
/// directory. A crash leaves the old file or the new one, never a mix; a
/// leftover temp file is removed by [`JobStore::open`].
fn write_atomic(dir: &Path, name: &str, bytes: &[u8], durable: bool) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp-{}", uuid::Uuid::new_v4().simple()));
    let written = (|| -> io::Result<()> {
        let mut file = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        fs::rename(&tmp, dir.join(name))
    })();
    if let Err(err) = written {
        let _ = fs::remove_file(&tmp);
        return Err(err).ctx(|| format!("write {name}"));
    }
    sync_dir(dir, durable)
}

fn save_record(dir: &Path, record: &JobRecord, durable: bool) -> Result<()> {
    let json = serde_json::to_vec(record).map_err(|err| JobError::Io { what: "encode the job record".into(), source: err.into() })?;
    write_atomic(dir, RECORD, &json, durable)
}

fn sync_dir(dir: &Path, durable: bool) -> Result<()> {
    if !durable {
        return Ok(());
    }
    File::open(dir).and_then(|d| d.sync_all()).ctx(|| format!("sync {}", dir.display()))
}

#[cfg(test)]
#[path = "jobs_tests.rs"]
mod tests;
