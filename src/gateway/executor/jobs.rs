//! The job tools over drafts and SkillJobs: create, upload, get, run,
//! status, read, delete, list, with the job store's rules and errors
//! (offsets, sizes, one run per job, files withheld until the run is over).

use kube::api::{DeleteParams, ListParams, PropagationPolicy};
use kube::ResourceExt;

use super::drafts::{Draft, DraftState, Loaded};
use super::error::{ExecError, Result};
use super::limits::DRAFT_WRITE_RETRIES;
use super::names::{draft_id, is_job_id, owner_label, LABEL_OWNER};
use super::record::{self, is_finished};
use super::KubeExecutor;
use crate::api::job::{InputFile, SkillJob, SkillJobPhase};
use crate::artifacts::operator::ArtifactStore;
use crate::artifacts::WORK_PREFIX;
use crate::core::fence::RunPlan;
use crate::core::limits::{FILE_ROUTE_BYTES, MAX_DEPTH};
use crate::core::paths::RelPath;
use crate::jobs::{Chunk, FileInfo, JobError, JobLimits, JobRecord, JobState, ReadTarget};
use crate::mcp::executor::{Caller, JobStatus};

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A job path as uploads take it: relative, normalized, not too deep.
pub(super) fn upload_path(path: &str) -> Result<RelPath> {
    let rel = RelPath::parse(path).map_err(|source| JobError::BadPath { path: path.to_string(), source })?;
    let depth = rel.as_str().split('/').count();
    if depth > MAX_DEPTH {
        return Err(JobError::PathTooDeep { path: rel.to_string(), depth, max: MAX_DEPTH }.into());
    }
    Ok(rel)
}

/// Whether draft `d` takes `len` bytes at `offset` of `rel`: open, the
/// offset 0 or the file's size, and within the per-file, per-job and
/// file-count caps.
pub(super) fn upload_check(d: &Draft, job: &str, rel: &RelPath, offset: u64, len: u64, limits: &JobLimits) -> Result<()> {
    if d.state != DraftState::Open {
        return Err(JobError::UploadsClosed { id: job.to_string(), state: JobState::Running }.into());
    }
    let existing = d.inputs.iter().find(|f| f.path == rel.as_str());
    let expected = existing.map_or(0, |f| f.size);
    if offset != 0 && offset != expected {
        return Err(JobError::WrongOffset { path: rel.to_string(), got: offset, expected }.into());
    }
    let size = offset + len;
    let others: u64 = d.inputs.iter().filter(|f| f.path != rel.as_str()).map(|f| f.size).sum();
    let count = d.inputs.len() + usize::from(existing.is_none());
    Ok(limits.check_input(rel.as_str(), size, others, count)?)
}

fn draft_record(d: &Draft) -> JobRecord {
    JobRecord {
        id: d.id.clone(),
        skill: d.skill.clone(),
        owner: d.owner.clone(),
        created_at_ms: d.created_at_ms,
        state: match d.state {
            DraftState::Open => JobState::Created,
            DraftState::Starting => JobState::Running,
        },
        inputs: d.inputs.clone(),
        run: None,
    }
}

/// What a job id names for this caller.
enum Found {
    Run(Box<SkillJob>),
    Draft(Loaded),
}

impl KubeExecutor {
    async fn find(&self, caller: &Caller, job: &str) -> Result<Found> {
        let missing = || ExecError::Job(JobError::NotFound(job.to_string()));
        if !is_job_id(job) {
            return Err(missing());
        }
        // A draft that ran is a SkillJob of the same name: that wins.
        if let Some(sj) = self.owned_skilljob(caller, job).await? {
            return Ok(Found::Run(Box::new(sj)));
        }
        match self.drafts.load(job).await? {
            Some(loaded) if loaded.draft.owner == caller.principal => Ok(Found::Draft(loaded)),
            _ => Err(missing()),
        }
    }

    async fn record_of(&self, sj: &SkillJob) -> Result<JobRecord> {
        let outcome = if is_finished(sj) { self.results(sj).await?.0 } else { record::outcome_of(sj, None) };
        Ok(record::job_record(sj, &outcome))
    }

    pub(super) async fn draft_create(&self, caller: &Caller, skill: &str) -> Result<JobRecord> {
        self.check_cap().await?;
        let draft = Draft {
            id: draft_id(),
            namespace: self.options.namespace.clone(),
            skill: skill.to_string(),
            owner: caller.principal.clone(),
            created_at_ms: now_ms(),
            state: DraftState::Open,
            inputs: Vec::new(),
        };
        self.drafts.create(&draft).await?;
        Ok(draft_record(&draft))
    }

    /// [`crate::jobs::JobStore::upload`]'s rules, over the draft's staged
    /// set: offset 0 replaces the file, its current size appends (the
    /// endpoint stores whole files, so an append re-sends the file).
    pub(super) async fn draft_upload(&self, caller: &Caller, job: &str, path: &str, offset: u64, bytes: Vec<u8>) -> Result<FileInfo> {
        let rel = upload_path(path)?;
        let limits = self.options.limits;
        let len = bytes.len() as u64;
        if len > limits.upload_chunk {
            // Over one MCP call: the file route takes the whole file.
            return Err(ExecError::UploadTooLargeForCall {
                got: len,
                max: limits.upload_chunk,
                route_max: FILE_ROUTE_BYTES,
                url: self.file_route(job, rel.as_str()),
            });
        }
        let loaded = self.open_draft(caller, job).await?;
        upload_check(&loaded.draft, job, &rel, offset, len, &limits)?;
        let content = if offset == 0 {
            bytes
        } else {
            let mut old = self.artifacts.input_file(&self.options.namespace, job, rel.as_str()).await?;
            if old.len() as u64 != offset {
                return Err(JobError::InputOutOfSync { path: rel.to_string(), expected: offset, found: old.len() as u64 }.into());
            }
            old.extend_from_slice(&bytes);
            old
        };
        let staged = self.artifacts.stage_input(&self.options.namespace, job, rel.as_str(), content).await?;
        self.record_upload(loaded, job, FileInfo { path: rel.to_string(), size: staged.size, sha256: staged.digest }).await
    }

    /// The caller's draft `job`, still taking uploads (a job that ran is refused).
    pub(super) async fn open_draft(&self, caller: &Caller, job: &str) -> Result<Loaded> {
        match self.find(caller, job).await? {
            Found::Draft(loaded) => Ok(loaded),
            Found::Run(sj) => Err(JobError::UploadsClosed { id: job.to_string(), state: self.record_of(&sj).await?.state }.into()),
        }
    }

    /// Record a staged file in the draft; another replica's write in
    /// between means: read again, check again.
    pub(super) async fn record_upload(&self, mut loaded: Loaded, job: &str, info: FileInfo) -> Result<FileInfo> {
        for _ in 0..DRAFT_WRITE_RETRIES {
            let d = &mut loaded.draft;
            d.inputs.retain(|f| f.path != info.path);
            d.inputs.push(info.clone());
            d.inputs.sort_by(|a, b| a.path.cmp(&b.path));
            if self.drafts.save(&loaded).await? {
                return Ok(info);
            }
            loaded = self.drafts.load(job).await?.ok_or_else(|| JobError::NotFound(job.to_string()))?;
            if loaded.draft.state != DraftState::Open {
                return Err(JobError::UploadsClosed { id: job.to_string(), state: JobState::Running }.into());
            }
        }
        Err(ExecError::BadDraft { name: job.to_string(), reason: "its record kept changing under this upload; upload again".into() })
    }

    /// What a finished run of the caller's may be read from: the SkillJob
    /// (a draft has not run, a running job's files are withheld, and so are
    /// a `Locked` one's).
    pub(super) async fn finished_run(&self, caller: &Caller, job: &str) -> Result<SkillJob> {
        let sj = match self.find(caller, job).await? {
            Found::Draft(_) => return Err(JobError::NotRunYet { id: job.to_string() }.into()),
            Found::Run(sj) => *sj,
        };
        if !is_finished(&sj) {
            return Err(JobError::StillRunning { id: job.to_string() }.into());
        }
        if sj.status.as_ref().and_then(|s| s.phase) == Some(SkillJobPhase::Locked) {
            return Err(ExecError::Withheld { name: job.to_string() });
        }
        Ok(sj)
    }

    pub(super) async fn job_get(&self, caller: &Caller, job: &str) -> Result<JobRecord> {
        match self.find(caller, job).await? {
            Found::Run(sj) => self.record_of(&sj).await,
            Found::Draft(loaded) => Ok(draft_record(&loaded.draft)),
        }
    }

    /// Start a draft: uploads closed, its SkillJob (named the draft's id)
    /// written naming the confirmed inputs by digest, the staged files
    /// copied under the SkillJob's UID, each checked against its digest,
    /// and the draft removed. A retried call finds the SkillJob and attaches.
    pub(super) async fn draft_start(&self, caller: &Caller, job: &str, plan: &RunPlan, confirmed: &[(String, String)]) -> Result<SkillJob> {
        let mut loaded = match self.find(caller, job).await? {
            Found::Run(sj) => {
                let spec = self.spec_for(plan, sj.spec.inputs.clone())?;
                if sj.spec != spec {
                    return Err(JobError::AlreadyRan { id: job.to_string(), state: self.record_of(&sj).await?.state }.into());
                }
                // A retry of this start. If the draft is still recorded, the
                // attempt that wrote the SkillJob stopped before it had
                // copied the inputs and removed the draft: finish that.
                match self.drafts.load(job).await? {
                    Some(loaded) if loaded.draft.owner == caller.principal && loaded.draft.state == DraftState::Starting => loaded,
                    _ => return Ok(*sj),
                }
            }
            Found::Draft(loaded) => loaded,
        };
        let inputs_changed = |detail: String| ExecError::Job(JobError::InputsChanged { id: job.to_string(), detail });
        let have: Vec<(String, String)> = loaded.draft.inputs.iter().map(|f| (f.path.clone(), f.sha256.clone())).collect();
        let mut want = confirmed.to_vec();
        want.sort();
        if have != want {
            return Err(inputs_changed("the job's files differ from the confirmed ones".into()));
        }
        if loaded.draft.state == DraftState::Open {
            loaded.draft.state = DraftState::Starting;
            if !self.drafts.save(&loaded).await? {
                return Err(inputs_changed("an upload changed the job while its run was starting".into()));
            }
        }
        let named: Vec<InputFile> =
            loaded.draft.inputs.iter().map(|f| InputFile { path: f.path.clone(), digest: f.sha256.clone(), size: f.size }).collect();
        let spec = self.spec_for(plan, named)?;
        let wanted = self.new_skilljob(caller, job, &plan.skill, spec.clone());
        let sj = match self.jobs.create(&Default::default(), &wanted).await {
            Ok(sj) => {
                self.wrote(job, true);
                sj
            }
            Err(e) if super::error::is_status(&e, 409) => match self.owned_skilljob(caller, job).await? {
                Some(sj) if sj.spec == spec => sj,
                _ => return Err(ExecError::NameTaken { name: job.to_string() }),
            },
            Err(e) => return Err(ExecError::Kube { what: format!("create SkillJob {job}"), source: e }),
        };
        let ns = &self.options.namespace;
        let uid = sj.uid().ok_or_else(|| ExecError::Vanished { name: job.to_string() })?;
        for f in &loaded.draft.inputs {
            let bytes = self.artifacts.input_file(ns, job, &f.path).await?;
            let digest = crate::core::package::digest(&bytes);
            if digest != f.sha256 {
                // Nothing ran (the controller waits for exactly the named digests): undo.
                if self.jobs.delete(job, &DeleteParams::background()).await.is_ok() {
                    self.wrote(job, false);
                }
                loaded.draft.state = DraftState::Open;
                let _ = self.drafts.save(&loaded).await;
                return Err(inputs_changed(format!("{} is now {digest}, not the confirmed {}", f.path, f.sha256)));
            }
            self.artifacts.stage_input(ns, &uid, &f.path, bytes).await?;
        }
        self.mark_staged(&sj).await?;
        // The draft has become the SkillJob.
        if let Err(err) = self.drafts.delete(job).await {
            tracing::warn!(job, %err, "the started draft's record was not removed");
        }
        if let Err(err) = self.artifacts.delete(ns, job).await {
            tracing::warn!(job, %err, "the started draft's staged inputs were not removed");
        }
        Ok(sj)
    }

    pub(super) async fn job_status(&self, caller: &Caller, job: &str) -> Result<JobStatus> {
        match self.find(caller, job).await? {
            Found::Draft(loaded) => Ok(JobStatus { record: draft_record(&loaded.draft), outputs: None }),
            Found::Run(sj) if is_finished(&sj) => {
                let (outcome, listing) = self.results(&sj).await?;
                Ok(JobStatus { record: record::job_record(&sj, &outcome), outputs: Some(listing) })
            }
            Found::Run(sj) => Ok(JobStatus { record: record::job_record(&sj, &record::outcome_of(&sj, None)), outputs: None }),
        }
    }

    pub(super) async fn job_read(&self, caller: &Caller, job: &str, target: ReadTarget, offset: u64, limit: u64) -> Result<Chunk> {
        let max = self.options.limits.read_chunk;
        if limit > max {
            return Err(match &target {
                ReadTarget::File(path) => {
                    ExecError::ReadTooLargeForCall { got: limit, max, route_max: FILE_ROUTE_BYTES, url: self.file_route(job, path) }
                }
                _ => JobError::ReadTooLarge { got: limit, max }.into(),
            });
        }
        let sj = self.finished_run(caller, job).await?;
        let mut download = None;
        let data = match &target {
            ReadTarget::Stdout | ReadTarget::Stderr => {
                let stream = if target == ReadTarget::Stdout { "stdout" } else { "stderr" };
                self.stream(&sj, stream).await?.ok_or_else(|| JobError::NoStream {
                    id: job.to_string(),
                    stream,
                    state: record::state_of(&sj, &record::outcome_of(&sj, None)),
                })?
            }
            ReadTarget::File(path) => {
                let rel = RelPath::parse(path).map_err(|source| JobError::BadPath { path: path.clone(), source })?;
                let uid = sj.uid().ok_or_else(|| ExecError::Vanished { name: job.to_string() })?;
                let stored = format!("{WORK_PREFIX}{}", rel.as_str());
                let data = self
                    .artifacts
                    .output_file_opt(&self.options.namespace, &uid, &stored)
                    .await?
                    .ok_or_else(|| JobError::NoSuchFile { id: job.to_string(), path: rel.to_string() })?;
                // More than one MCP call's worth: point at the route that moves it whole.
                if data.len() as u64 > self.options.limits.upload_chunk {
                    download = Some(self.file_route(job, rel.as_str()));
                }
                data
            }
        };
        let size = data.len() as u64;
        let start = offset.min(size) as usize;
        let end = offset.saturating_add(limit).min(size) as usize;
        Ok(Chunk { data: data[start..end].to_vec(), offset, size, eof: end as u64 >= size, download })
    }

    pub(super) async fn job_delete(&self, caller: &Caller, job: &str) -> Result<()> {
        match self.find(caller, job).await? {
            Found::Draft(loaded) => {
                if loaded.draft.state == DraftState::Starting {
                    return Err(JobError::DeleteWhileRunning { id: job.to_string() }.into());
                }
                self.artifacts.delete(&self.options.namespace, job).await?;
                self.drafts.delete(job).await
            }
            Found::Run(sj) => {
                if !is_finished(&sj) {
                    return Err(JobError::DeleteWhileRunning { id: job.to_string() }.into());
                }
                // The controller's finalizer removes the run's artifacts with it.
                let dp = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
                match self.jobs.delete(job, &dp).await {
                    Ok(_) => {
                        self.wrote(job, false);
                        Ok(())
                    }
                    Err(e) if super::error::is_status(&e, 404) => Ok(()),
                    Err(e) => Err(ExecError::Kube { what: format!("delete SkillJob {job}"), source: e }),
                }
            }
        }
    }

    pub(super) async fn job_list(&self, caller: &Caller) -> Result<Vec<JobRecord>> {
        let mine = |sj: &SkillJob| self.owner_of(sj) == Some(caller.principal.as_str()) && sj.metadata.deletion_timestamp.is_none();
        let cached = match &self.index {
            Some(index) => index.jobs(&self.options.namespace).await,
            None => None,
        };
        let mut records: Vec<JobRecord> = match cached {
            Some(jobs) => jobs.iter().filter(|sj| mine(sj)).map(|sj| record::job_record(sj, &record::outcome_of(sj, None))).collect(),
            None => {
                let lp = ListParams::default().labels(&format!("{LABEL_OWNER}={}", owner_label(&caller.principal)));
                let list = self.jobs.list(&lp).await.map_err(ExecError::kube("list the caller's SkillJobs"))?;
                list.items.iter().filter(|sj| mine(sj)).map(|sj| record::job_record(sj, &record::outcome_of(sj, None))).collect()
            }
        };
        let (drafts, _) = self.drafts.list().await?;
        let drafts: Vec<JobRecord> =
            drafts.iter().filter(|d| d.owner == caller.principal && !records.iter().any(|r| r.id == d.id)).map(draft_record).collect();
        records.extend(drafts);
        records.sort_by(|a, b| b.created_at_ms.cmp(&a.created_at_ms).then_with(|| a.id.cmp(&b.id)));
        Ok(records)
    }
}
