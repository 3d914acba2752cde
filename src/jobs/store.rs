//! The store itself: create, upload, run bookkeeping, read, delete.

use crate::api::outcome::RunOutcome;
use crate::core::limits::{JOB_RECORD_CAP, MAX_DEPTH};
use crate::core::paths::{resolve_inside, ResolveError};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use super::error::IoContext;
use super::fsops::*;
use super::*;

/// A hash in progress for the last file appended to in a job, so that a file
/// sent in N chunks is hashed once, not N times. A cache only: when it does
/// not match (other file, restart), the prefix is re-read from disk.
pub(super) struct PartialHash {
    path: String,
    size: u64,
    hasher: Sha256,
}

#[derive(Default)]
pub(super) struct Inner {
    /// Keyed by job id; at most one entry per job in `Created`.
    partial: HashMap<String, PartialHash>,
}

/// The job store. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct JobStore {
    /// `<root>/jobs`, canonicalised.
    pub(super) jobs_dir: PathBuf,
    pub(super) limits: JobLimits,
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
        // Runs' uids may pass through to their own work directory, never list the jobs.
        fs::set_permissions(&jobs_dir, std::os::unix::fs::PermissionsExt::from_mode(0o711))
            .ctx(|| format!("restrict {}", jobs_dir.display()))?;
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
        // A run cut off by a crash may have left its tmpfs mounted (root
        // servers) and its private tmp: neither is part of the job.
        let tmp = dir.join("tmp");
        if fs::symlink_metadata(&tmp).is_ok_and(|m| m.is_dir()) {
            let _ = crate::runner::tmpfs::unmount(&tmp);
            if fs::remove_dir_all(&tmp).is_ok() {
                cleaned.push(format!("{id}/tmp"));
            }
        }
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
    pub fn create(&self, skill: &str, owner: &str) -> Result<JobRecord> {
        let _guard = self.lock();
        let retained = self.job_names()?.len();
        if retained >= self.limits.retained {
            return Err(JobError::CapReached { max: self.limits.retained });
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let record = JobRecord {
            id: id.clone(),
            skill: skill.to_string(),
            owner: owner.to_string(),
            created_at_ms: now_ms(),
            state: JobState::Created,
            inputs: Vec::new(),
            run: None,
        };
        // Build the job under a temporary name and rename it into place, so
        // an id directory always has a complete record.
        let tmp = self.jobs_dir.join(format!("{NEW_JOB_PREFIX}{id}"));
        let built = (|| {
            fs::DirBuilder::new().mode(0o700).create(&tmp).ctx(|| "create the job directory".into())?;
            fs::DirBuilder::new().mode(0o700).create(tmp.join(WORK)).ctx(|| "create the job's work directory".into())?;
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
        if depth > MAX_DEPTH {
            return Err(JobError::PathTooDeep { path: rel.to_string(), depth, max: MAX_DEPTH });
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
        let others: u64 = record.inputs.iter().filter(|f| f.path != rel.as_str()).map(|f| f.size).sum();
        let count = record.inputs.len() + usize::from(existing.is_none());
        self.limits.check_input(rel.as_str(), size, others, count)?;

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
    ///
    /// With `confirmed` (path, digest of every input, as the person who
    /// confirmed the run saw them), the job's inputs must be exactly those,
    /// both in the record and on disk (each file is hashed again here, under
    /// the store's lock, so no upload can slip in between); otherwise nothing
    /// starts and the job stays `Created`.
    pub fn begin_run(&self, id: &str, script: &str, args: &[String], confirmed: Option<&[(String, String)]>) -> Result<PathBuf> {
        check_id(id)?;
        let mut inner = self.lock();
        let dir = self.job_dir_checked(id)?;
        let mut record = self.load(id)?;
        match record.state {
            JobState::Created => {}
            JobState::Running => return Err(JobError::AlreadyRunning { id: id.to_string() }),
            state => return Err(JobError::AlreadyRan { id: id.to_string(), state }),
        }
        if let Some(confirmed) = confirmed {
            let work = self.work_dir_checked(id, &dir)?;
            check_confirmed_inputs(id, &record.inputs, confirmed, &work)?;
        }
        let work = self.work_dir_checked(id, &dir)?;
        record.state = JobState::Running;
        record.run = Some(RunRecord {
            script: script.to_string(),
            args: args.to_vec(),
            started_at_ms: now_ms(),
            finished_at_ms: None,
            outcome: RunOutcome::default(),
            note: None,
        });
        save_record(&dir, &record, self.limits.durable)?;
        inner.partial.remove(id);
        Ok(work)
    }

    /// `Running ->` the state the outcome means ([`JobState::after`]), and
    /// the captured streams saved. Call only once the script has stopped.
    /// A stream that cannot be saved is noted on the run rather than leaving
    /// the job `Running` (which would block its deletion).
    pub fn finish_run(&self, id: &str, outcome: &RunOutcome, note: Option<String>, stdout: &[u8], stderr: &[u8]) -> Result<JobRecord> {
        check_id(id)?;
        let _guard = self.lock();
        let dir = self.job_dir_checked(id)?;
        let mut record = self.load(id)?;
        if record.state != JobState::Running {
            return Err(JobError::NotRunning { id: id.to_string(), state: record.state });
        }
        let mut notes: Vec<String> = note.into_iter().collect();
        for (name, bytes) in [(STDOUT, stdout), (STDERR, stderr)] {
            if let Err(err) = write_atomic(&dir, name, bytes, self.limits.durable) {
                notes.push(format!("{name} could not be saved: {err}"));
            }
        }
        record.state = JobState::after(outcome);
        let mut outcome = outcome.clone();
        outcome.stdout_bytes = outcome.stdout_bytes.max(stdout.len() as u64);
        outcome.stderr_bytes = outcome.stderr_bytes.max(stderr.len() as u64);
        let (script, args, started_at_ms) = record.run.take().map(|r| (r.script, r.args, r.started_at_ms)).unwrap_or_default();
        record.run = Some(RunRecord {
            script,
            args,
            started_at_ms,
            finished_at_ms: Some(now_ms()),
            outcome,
            note: if notes.is_empty() { None } else { Some(notes.join("; ")) },
        });
        save_record(&dir, &record, self.limits.durable)?;
        Ok(record)
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

    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        // The guarded data is a hash cache: after a panic elsewhere it is
        // still a valid cache (entries are checked before use).
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Names under `jobs/` that are job ids (temporaries excluded).
    pub(super) fn job_names(&self) -> Result<Vec<String>> {
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
    pub(super) fn job_dir_checked(&self, id: &str) -> Result<PathBuf> {
        let dir = self.jobs_dir.join(id);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(dir),
            Ok(_) => Err(JobError::Corrupt { id: id.to_string(), reason: "the job path is not a directory".into() }),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Err(JobError::NotFound(id.to_string())),
            Err(err) => Err(err).ctx(|| format!("stat job {id}")),
        }
    }

    /// `jobs/<id>/work`, which must be a real directory (not a symlink).
    pub(super) fn work_dir_checked(&self, id: &str, dir: &Path) -> Result<PathBuf> {
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

    pub(super) fn load(&self, id: &str) -> Result<JobRecord> {
        let dir = self.job_dir_checked(id)?;
        let corrupt = |reason: String| JobError::Corrupt { id: id.to_string(), reason };
        let file = open_own_file(&dir.join(RECORD)).map_err(|err| corrupt(format!("{RECORD}: {err}")))?;
        let mut text = Vec::new();
        file.take(JOB_RECORD_CAP + 1).read_to_end(&mut text).map_err(|err| corrupt(format!("{RECORD}: {err}")))?;
        if text.len() as u64 > JOB_RECORD_CAP {
            return Err(corrupt(format!("{RECORD} is over {JOB_RECORD_CAP} bytes")));
        }
        let record: JobRecord = serde_json::from_slice(&text).map_err(|err| corrupt(format!("{RECORD}: {err}")))?;
        if record.id != id {
            return Err(corrupt(format!("{RECORD} names another job ({})", clip(&record.id, 40))));
        }
        Ok(record)
    }

    pub(super) fn check_finished(&self, record: &JobRecord) -> Result<()> {
        match record.state {
            JobState::Created => Err(JobError::NotRunYet { id: record.id.clone() }),
            JobState::Running => Err(JobError::StillRunning { id: record.id.clone() }),
            _ => Ok(()),
        }
    }
}
