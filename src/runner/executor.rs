//! The standalone server's [`Executor`]: the local job store plus the local
//! (sandboxed) process runner.
//!
//! Start-up work that costs milliseconds (the bubblewrap self-test, opening
//! the job store and sweeping its leftovers) is not on the path of the
//! server's first answer: [`LocalExecutor::start`] begins it in the
//! background and the first call that needs it waits for it. `skill_list`
//! reports the sandbox as pending until the self-test has finished.
//!
//! Jobs belong to the principal that created them: every call checks the
//! record's owner first and answers "no such job" to anyone else, so a
//! job id learnt from elsewhere opens nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::{OnceCell, OwnedSemaphorePermit};

use crate::core::confirm::ConfirmMode;
use crate::core::fence::RunPlan;
use crate::core::paths::resolve_inside;
use crate::jobs::{Chunk, FileInfo, JobError, JobLimits, JobRecord, JobStore, ReadTarget};
use crate::mcp::error::ToolError;
use crate::mcp::executor::{Caller, ExecutionSummary, Executor, JobStatus, RunCommand, RunControl, RunReport, SandboxSummary};

use super::cgroup::CgroupMode;
use super::egress::EgressOptions;
use super::local::{LocalRunner, RunnerOptions, SandboxBackend, SandboxMode};

/// How the local backend is set up (from `serve`'s flags): the runner's
/// options and the job store's limits.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    pub runner: RunnerOptions,
    pub limits: JobLimits,
}

impl LocalOptions {
    /// The defaults `serve` uses, for a data directory.
    pub fn new(data_dir: PathBuf) -> LocalOptions {
        LocalOptions {
            runner: RunnerOptions {
                sandbox: SandboxMode::Auto,
                sandbox_backend: SandboxBackend::Auto,
                max_concurrent: 1,
                run_as_uid: None,
                run_as_uids: None,
                cgroup: CgroupMode::Auto,
                cgroup_parent: None,
                cgroup_favor_dynmods: true,
                egress: EgressOptions::default(),
                self_exe: None,
                spawn_helper: true,
                data_dir,
            },
            limits: JobLimits::default(),
        }
    }
}

/// What the background start-up produces.
struct Ready {
    runner: LocalRunner,
    jobs: JobStore,
}

/// The local backend.
pub struct LocalExecutor {
    options: LocalOptions,
    ready: OnceCell<Result<Arc<Ready>, String>>,
}

fn lookup(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Run a job-store call off the async threads.
async fn store<T: Send + 'static>(
    ready: &Arc<Ready>,
    f: impl FnOnce(&JobStore) -> Result<T, JobError> + Send + 'static,
) -> Result<T, ToolError> {
    let ready = ready.clone();
    Ok(tokio::task::spawn_blocking(move || f(&ready.jobs)).await??)
}

impl LocalExecutor {
    /// The backend, with its start-up work begun in the background.
    pub fn start(options: LocalOptions) -> Arc<LocalExecutor> {
        let executor = Arc::new(LocalExecutor { options, ready: OnceCell::new() });
        let background = executor.clone();
        tokio::spawn(async move {
            if let Err(err) = background.ready().await {
                tracing::warn!(%err, "the local execution backend could not start; runs will fail with this reason");
            }
        });
        executor
    }

    async fn ready(&self) -> Result<&Arc<Ready>, ToolError> {
        let ready = self
            .ready
            .get_or_init(|| async {
                let o = &self.options;
                let runner = LocalRunner::detect(o.runner.clone()).await;
                let (dir, limits) = (o.runner.data_dir.clone(), o.limits);
                let opened = tokio::task::spawn_blocking(move || JobStore::open(&dir, limits)).await;
                let (jobs, report) = match opened {
                    Ok(Ok(opened)) => opened,
                    Ok(Err(err)) => return Err(format!("cannot open the job store in {}: {err}", o.runner.data_dir.display())),
                    Err(err) => return Err(format!("opening the job store failed: {err}")),
                };
                for id in &report.interrupted {
                    tracing::warn!(job = %id, "a run was interrupted by a restart; it is marked interrupted and not re-run");
                }
                for skipped in &report.skipped {
                    tracing::warn!(job = %skipped.name, reason = %skipped.reason, "unreadable job left in place");
                }
                Ok(Arc::new(Ready { runner, jobs }))
            })
            .await;
        ready.as_ref().map_err(|why| ToolError::new(crate::mcp::error::codes::BACKEND, why.clone()))
    }

    /// The in-process egress proxy, once the backend has started (tests read its verdicts).
    pub async fn egress_proxy(&self) -> Option<crate::egress::Proxy> {
        self.ready().await.ok().and_then(|r| r.runner.egress().map(|e| e.proxy().clone()))
    }

    /// The interpreters runs can use (waits for the start-up probe).
    pub async fn interpreters(&self) -> std::collections::BTreeSet<crate::core::declaration::Interpreter> {
        match self.ready().await {
            Ok(ready) => ready.runner.interpreters(),
            Err(_) => Default::default(),
        }
    }

    /// The caller's job record, or "no such job" when it is someone else's.
    async fn owned(&self, caller: &Caller, job: &str) -> Result<(Arc<Ready>, JobRecord), ToolError> {
        let ready = self.ready().await?.clone();
        let id = job.to_string();
        let record = store(&ready, move |jobs| jobs.get(&id)).await?;
        if record.owner != caller.principal {
            return Err(JobError::NotFound(job.to_string()).into());
        }
        Ok((ready, record))
    }

    /// Run a plan in an existing `created` job, holding the run slot the
    /// caller took before anything was created.
    async fn run_in_job(
        &self,
        ready: Arc<Ready>,
        job: String,
        plan: RunPlan,
        confirmed: Vec<(String, String)>,
        permit: OwnedSemaphorePermit,
    ) -> Result<RunReport, ToolError> {
        // Re-check the script as it is now (the resolved check) right before it starts.
        resolve_inside(&plan.skill_dir, &plan.script)
            .map_err(|e| ToolError::new("unavailable", format!("{} cannot run: {e}", plan.script)))?;
        let (id, script, args) = (job.clone(), plan.script.to_string(), plan.args.clone());
        let work = store(&ready, move |jobs| jobs.begin_run(&id, &script, &args, Some(&confirmed))).await?;
        let job_bytes = self.options.limits.job_bytes;
        let (spec, command) = match ready.runner.command(&plan, &work, job_bytes, &lookup) {
            Ok((spec, command, _)) => (spec, command),
            Err(err) => return Err(self.failed_start(&ready, &job, err.into()).await),
        };
        let done = match ready.runner.run(&plan, spec, &job, &work, job_bytes, permit).await {
            Ok(done) => done,
            Err(err) => return Err(self.failed_start(&ready, &job, err.into()).await),
        };
        let executed = done.exec;
        // The uid it really ran as (a leased one differs from the preview's first uid of the range).
        let mut command = command;
        command.run_as = Some(executed.uid);
        let mut notes: Vec<String> = Vec::new();
        if let Some(limit) = done.limit_note {
            notes.push(limit);
        }
        if executed.hard_deadline_hit {
            notes.push("the process did not settle before the hard deadline; its output may be incomplete".to_string());
        } else if executed.outcome.exit_code != Some(0) && !plan.egress.is_empty() && !plan.egress_granted {
            notes.push(format!(
                "this run had no network (egress to {} not granted); a failure reaching it looks like a connection error from inside",
                plan.egress.join(", ")
            ));
        } else if executed.outcome.exit_code != Some(0) && plan.egress_granted {
            notes.push(format!(
                "this run reached the network only through the egress proxy, allowed: {}; a refused connection (HTTP 403 from the proxy, with its reason) may be the allowlist",
                plan.egress.join(", ")
            ));
        }
        let note = (!notes.is_empty()).then(|| notes.join("; "));
        // The outputs are listed once, now (the job is still running to the
        // store, so nothing else writes its work directory), and stored.
        // Then the run is finished, in the same trip to the blocking pool.
        let (id, outcome, finish_note) = (job.clone(), executed.outcome.clone(), note.clone());
        let (stdout, stderr) = (executed.stdout, executed.stderr);
        let (outputs, record, stdout, stderr) = store(&ready, move |jobs| {
            let listing = jobs.scan_outputs(&id)?;
            jobs.save_outputs(&id, &listing)?;
            let record = jobs.finish_run(&id, &outcome, finish_note, &stdout, &stderr)?;
            Ok((listing, record, stdout, stderr))
        })
        .await?;
        Ok(RunReport { record, stdout, stderr, outputs, command, note, backend_id: None })
    }

    /// Record that the script never started, and pass the reason on.
    async fn failed_start(&self, ready: &Arc<Ready>, job: &str, err: ToolError) -> ToolError {
        let (id, note) = (job.to_string(), format!("could not start: {}", err.message));
        let outcome = crate::api::outcome::RunOutcome::default();
        if let Err(record_err) = store(ready, move |jobs| jobs.finish_run(&id, &outcome, Some(note), b"", b"")).await {
            tracing::warn!(job, %record_err, "could not record a failed start");
        }
        err
    }

    fn placeholder_work(&self) -> PathBuf {
        self.options.runner.data_dir.join("jobs").join("<new job>").join("work")
    }
}

#[async_trait::async_trait]
impl Executor for LocalExecutor {
    fn summary(&self, mode: ConfirmMode) -> ExecutionSummary {
        let sandbox = match self.ready.get() {
            Some(Ok(ready)) => ready.runner.sandbox_status(),
            Some(Err(why)) => SandboxSummary { mode: self.options.runner.sandbox.as_str().into(), active: false, detail: why.clone() },
            None => SandboxSummary {
                mode: self.options.runner.sandbox.as_str().into(),
                active: self.options.runner.sandbox != SandboxMode::Off,
                detail: "the sandbox self-test is still running (it runs in the background at start-up; a run waits for it)".into(),
            },
        };
        ExecutionSummary {
            backend: "local".into(),
            sandbox,
            confirm: mode,
            data_dir: Some(self.options.runner.data_dir.display().to_string()),
        }
    }

    fn limits(&self) -> JobLimits {
        self.options.limits
    }

    async fn describe(&self, plan: &RunPlan, job: Option<&str>) -> Result<RunCommand, ToolError> {
        let ready = self.ready().await?.clone();
        let work = match job {
            Some(id) => {
                let id = id.to_string();
                store(&ready, move |jobs| jobs.work_dir(&id)).await?
            }
            None => self.placeholder_work(),
        };
        let (_, command, _) = ready.runner.command(plan, &work, self.options.limits.job_bytes, &lookup)?;
        Ok(command)
    }

    async fn create(&self, caller: &Caller, skill: &str) -> Result<JobRecord, ToolError> {
        let ready = self.ready().await?.clone();
        let (skill, owner) = (skill.to_string(), caller.principal.clone());
        store(&ready, move |jobs| jobs.create(&skill, &owner)).await
    }

    async fn upload(&self, caller: &Caller, job: &str, path: &str, offset: u64, bytes: Vec<u8>) -> Result<FileInfo, ToolError> {
        let (ready, record) = self.owned(caller, job).await?;
        let path = path.to_string();
        store(&ready, move |jobs| jobs.upload(&record.id, &path, offset, &bytes)).await
    }

    async fn get(&self, caller: &Caller, job: &str) -> Result<JobRecord, ToolError> {
        Ok(self.owned(caller, job).await?.1)
    }

    async fn run_new(
        &self,
        caller: &Caller,
        plan: RunPlan,
        inputs: Vec<(String, Vec<u8>)>,
        _control: RunControl,
    ) -> Result<RunReport, ToolError> {
        let ready = self.ready().await?.clone();
        // Take the run slot before creating anything: a busy server leaves no job behind.
        let permit = ready.runner.try_acquire()?;
        let record = self.create(caller, &plan.skill).await?;
        let confirmed: Vec<(String, String)> = inputs.iter().map(|(p, b)| (p.clone(), crate::core::package::digest(b))).collect();
        if !inputs.is_empty() {
            let id = record.id.clone();
            let uploaded = store(&ready, move |jobs| {
                for (path, bytes) in &inputs {
                    if let Err(err) = jobs.upload(&id, path, 0, bytes) {
                        let _ = jobs.delete(&id);
                        return Err(err);
                    }
                }
                Ok(())
            })
            .await;
            uploaded?;
        }
        self.run_in_job(ready, record.id, plan, confirmed, permit).await
    }

    async fn run(
        &self,
        caller: &Caller,
        job: &str,
        plan: RunPlan,
        inputs: Vec<(String, String)>,
        _control: RunControl,
    ) -> Result<RunReport, ToolError> {
        let (ready, record) = self.owned(caller, job).await?;
        let permit = ready.runner.try_acquire()?;
        self.run_in_job(ready, record.id, plan, inputs, permit).await
    }

    async fn status(&self, caller: &Caller, job: &str) -> Result<JobStatus, ToolError> {
        let (ready, record) = self.owned(caller, job).await?;
        let outputs = if record.state.is_finished() {
            let id = record.id.clone();
            Some(store(&ready, move |jobs| jobs.outputs(&id)).await?)
        } else {
            None
        };
        Ok(JobStatus { record, outputs })
    }

    async fn read(&self, caller: &Caller, job: &str, target: ReadTarget, offset: u64, limit: u64) -> Result<Chunk, ToolError> {
        let (ready, record) = self.owned(caller, job).await?;
        store(&ready, move |jobs| jobs.read(&record.id, target, offset, limit)).await
    }

    async fn delete(&self, caller: &Caller, job: &str) -> Result<(), ToolError> {
        let (ready, record) = self.owned(caller, job).await?;
        store(&ready, move |jobs| jobs.delete(&record.id)).await
    }

    async fn list(&self, caller: &Caller) -> Result<Vec<JobRecord>, ToolError> {
        let ready = self.ready().await?.clone();
        let owner = caller.principal.clone();
        let all = store(&ready, |jobs| jobs.list()).await?;
        Ok(all.into_iter().filter(|j| j.owner == owner).collect())
    }
}

/// The default data directory (see `serve --data-dir`).
pub fn default_data_dir(lookup: &dyn Fn(&str) -> Option<String>, is_root: bool) -> PathBuf {
    use crate::core::grants::is_set;
    if let Some(dir) = lookup("MCP_DATA_DIR").filter(|v| is_set(v)) {
        return PathBuf::from(dir).join("skill-operator");
    }
    if is_root {
        return PathBuf::from("/var/lib/skill-operator");
    }
    if let Some(state) = lookup("XDG_STATE_HOME").filter(|v| is_set(v)) {
        return PathBuf::from(state).join("skill-operator");
    }
    match lookup("HOME").filter(|v| is_set(v)) {
        Some(home) => PathBuf::from(home).join(".local/state/skill-operator"),
        None => std::env::temp_dir().join("skill-operator"),
    }
}

/// Prepare what must exist before the server answers anything: the
/// server's own environment protected from same-uid scripts, and the data
/// directory. Cheap; the rest happens in [`LocalExecutor::start`].
pub fn prepare(data_dir: &Path) -> Result<(), PrepareError> {
    // SAFETY: trivial getter.
    let is_root = unsafe { libc::geteuid() } == 0;
    if !is_root {
        // Scripts then share our uid: make /proc/<pid>/environ unreadable to them.
        super::process::protect_server_environ().map_err(PrepareError::Protect)?;
    }
    std::fs::create_dir_all(data_dir).map_err(|source| PrepareError::DataDir { path: data_dir.to_path_buf(), source })
}

/// Why the local backend could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("cannot protect the server's environment from scripts: {0}")]
    Protect(#[source] super::process::ExecError),
    #[error("cannot create the data directory {path}: {source} (give another with --data-dir)")]
    DataDir { path: PathBuf, source: std::io::Error },
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn data_dir_defaults() {
        assert_eq!(default_data_dir(&env(&[("MCP_DATA_DIR", "/data")]), true), PathBuf::from("/data/skill-operator"));
        assert_eq!(default_data_dir(&env(&[]), true), PathBuf::from("/var/lib/skill-operator"));
        assert_eq!(default_data_dir(&env(&[("XDG_STATE_HOME", "/s"), ("HOME", "/h")]), false), PathBuf::from("/s/skill-operator"));
        assert_eq!(default_data_dir(&env(&[("HOME", "/h")]), false), PathBuf::from("/h/.local/state/skill-operator"));
    }
}
