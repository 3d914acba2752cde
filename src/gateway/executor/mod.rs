//! The gateway's [`Executor`]: every run is a SkillJob in the endpoint's
//! namespace, which the controller admits (the same fence as `serve`), runs
//! as a restricted pod and records; this executor writes it, stages its
//! inputs at the artifact endpoint with the operator credential, waits for
//! the controller's verdict and reads the result back in the shapes `serve`
//! answers with.
//!
//! One `KubeExecutor` serves one namespace: every API call it makes is
//! namespaced to it (drafts: see [`drafts`]), so a job id of another
//! namespace names nothing here.
//!
//! # Ownership
//! Every SkillJob and draft records its caller (`Caller.principal`) in
//! [`crate::api::job::REQUESTED_BY_ANNOTATION`] (the audit trail names the
//! agent, not the gateway), and every SkillJob carries the gateway's seal
//! over it ([`crate::core::owner`]): every call checks the seal, so a job
//! of another principal, or one whose annotation claims a principal it
//! cannot prove (written with `kubectl`), is answered exactly as a job
//! that does not exist.
//!
//! # Idempotent runs
//! A run's SkillJob is named from the confirmation key ([`names::run_name`]).
//! A retried confirmed call finds the SkillJob the first attempt wrote:
//! same owner and spec → it attaches to that run (staging inputs the first
//! attempt may not have finished); anything else → refused, nothing runs.
//!
//! # Waiting
//! A watch on the one SkillJob (no sleeping poll): each phase change is a
//! progress notification, and a silent stretch gets one every
//! [`limits::PROGRESS_INTERVAL`]. When the caller goes away first
//! (`RunControl.cancel`), [`OnDisconnect`] decides: `Cancel` (default) sets
//! [`crate::controller::skilljob::CANCEL_ANNOTATION`], on which the
//! controller deletes the run's Job (its pod gets SIGTERM and the launcher
//! kills the script) and records `Cancelled`; `Keep` leaves it running.
//!
//! Layout: [`names`] (ids, labels), [`record`] (SkillJob → job shapes),
//! [`drafts`] (jobs before their script), `run` (create, stage, wait,
//! report), `jobs` (the job tools), `files` (the file route's uploads and
//! downloads), `tasks` (MCP Tasks hooks).

pub mod drafts;
pub mod error;
mod files;
pub mod index;
mod jobs;
pub mod limits;
pub mod names;
pub mod record;
mod run;
mod tasks;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::Client;

use crate::api::job::SkillJob;
use crate::artifacts::operator::HttpArtifacts;
use crate::core::confirm::ConfirmMode;
use crate::core::fence::RunPlan;
use crate::core::owner::OwnerSeal;
use crate::jobs::{Chunk, FileInfo, JobLimits, JobRecord, ReadTarget};
use crate::mcp::error::ToolError;
use crate::mcp::executor::{Caller, ExecutionSummary, Executor, JobStatus, RunCommand, RunControl, RunReport, SandboxSummary};

pub use error::ExecError;
pub use tasks::{TaskState, TaskStatus};

/// What happens to a run whose caller went away before it ended
/// (`gateway --on-disconnect`). The MCP spec treats a closed request
/// stream as a cancel, hence the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OnDisconnect {
    /// Cancel the SkillJob (its pod is stopped).
    #[default]
    Cancel,
    /// Leave it running; the caller reads it later with the job tools.
    Keep,
}

/// Which SkillBinding serves a skill name in the namespace (the catalog's
/// snapshot knows; tests give a map).
pub trait SkillBindings: Send + Sync {
    fn binding_of(&self, skill: &str) -> Option<String>;
}

/// Skill name → binding name.
impl SkillBindings for BTreeMap<String, String> {
    fn binding_of(&self, skill: &str) -> Option<String> {
        self.get(skill).cloned()
    }
}

/// How one namespace's executor is set up.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// The tenant namespace (the endpoint's `/mcp/{namespace}`).
    pub namespace: String,
    /// The gateway's own namespace, where draft records live.
    pub gateway_namespace: String,
    pub on_disconnect: OnDisconnect,
    /// Silence after which a waiting caller gets a progress heartbeat.
    pub progress_interval: Duration,
    pub limits: JobLimits,
    /// The gateway's address as its clients reach it (`--public-url`);
    /// empty: file route URLs in messages are paths on the address the
    /// client called.
    pub public_base: String,
    /// What proves a SkillJob is a caller's ([`crate::core::owner`]).
    pub owner_seal: OwnerSeal,
}

impl KubeOptions {
    pub fn new(namespace: impl Into<String>, gateway_namespace: impl Into<String>, owner_seal: OwnerSeal) -> KubeOptions {
        KubeOptions {
            owner_seal,
            namespace: namespace.into(),
            gateway_namespace: gateway_namespace.into(),
            on_disconnect: OnDisconnect::default(),
            progress_interval: limits::PROGRESS_INTERVAL,
            limits: JobLimits::default(),
            public_base: String::new(),
        }
    }
}

/// The SkillJob-backed executor of one namespace.
pub struct KubeExecutor {
    jobs: Api<SkillJob>,
    drafts: drafts::Drafts,
    artifacts: Arc<HttpArtifacts>,
    bindings: Arc<dyn SkillBindings>,
    options: KubeOptions,
    /// The gateway's shared SkillJob cache: job lists read it instead of
    /// listing (`None`: every list asks the API server).
    index: Option<Arc<index::JobIndex>>,
}

impl KubeExecutor {
    pub fn new(client: Client, artifacts: Arc<HttpArtifacts>, bindings: Arc<dyn SkillBindings>, options: KubeOptions) -> KubeExecutor {
        KubeExecutor {
            jobs: Api::namespaced(client.clone(), &options.namespace),
            drafts: drafts::Drafts::new(client, &options.gateway_namespace, &options.namespace),
            artifacts,
            bindings,
            options,
            index: None,
        }
    }

    /// Lists from `index` (see [`index`]).
    pub fn with_index(mut self, index: Arc<index::JobIndex>) -> Self {
        self.index = Some(index);
        self
    }

    /// The caller `sj` was proven to be made for, if any.
    fn owner_of<'a>(&self, sj: &'a SkillJob) -> Option<&'a str> {
        record::owner(sj, &self.options.owner_seal)
    }

    /// This executor created (`present`) or deleted SkillJob `name`: the
    /// shared index shows the caller their own write in their next list.
    fn wrote(&self, name: &str, present: bool) {
        if let Some(index) = &self.index {
            index.expect(&self.options.namespace, name, present);
        }
    }

    pub fn namespace(&self) -> &str {
        &self.options.namespace
    }

    /// The file route URL of `path` in `job` (what a refusal of a large
    /// upload or read points to).
    pub fn file_route(&self, job: &str, path: &str) -> String {
        format!("{}{}", self.options.public_base, crate::gateway::file_url::route_path(&self.options.namespace, job, path))
    }

    fn command(&self, plan: &RunPlan) -> RunCommand {
        let network = if plan.egress.is_empty() {
            "none: the run's pod has no network but the artifact endpoint".to_string()
        } else if plan.egress_granted {
            format!("through the egress proxy to {} only", plan.egress.join(", "))
        } else {
            format!("none (egress to {} not granted)", plan.egress.join(", "))
        };
        let mut argv = vec![plan.script.to_string()];
        argv.extend(plan.args.iter().cloned());
        RunCommand {
            backend: "kubernetes".into(),
            program: plan.interpreter.to_string(),
            argv,
            cwd: "/work".into(),
            timeout_secs: plan.timeout_secs,
            env: plan.granted_env.clone(),
            env_missing: Vec::new(),
            sandbox: "pod".into(),
            network,
            run_as: Some(crate::controller::builders::job::DEFAULT_RUN_AS as u32),
            limits: vec![format!(
                "a SkillJob in namespace {}: a restricted pod of its own (the package's runtime profile sets its CPU, memory and disk)",
                self.options.namespace
            )],
        }
    }
}

#[async_trait::async_trait]
impl Executor for KubeExecutor {
    fn summary(&self, mode: ConfirmMode) -> ExecutionSummary {
        ExecutionSummary {
            backend: "kubernetes".into(),
            sandbox: SandboxSummary {
                mode: "pod".into(),
                active: true,
                detail: format!(
                    "each run is a SkillJob in namespace {}: a pod of its own under Pod Security `restricted`, no service-account token, its files through the artifact endpoint",
                    self.options.namespace
                ),
            },
            confirm: mode,
            data_dir: None,
        }
    }

    fn limits(&self) -> JobLimits {
        self.options.limits
    }

    async fn describe(&self, plan: &RunPlan, _job: Option<&str>) -> Result<RunCommand, ToolError> {
        Ok(self.command(plan))
    }

    async fn create(&self, caller: &Caller, skill: &str) -> Result<JobRecord, ToolError> {
        Ok(self.draft_create(caller, skill).await?)
    }

    async fn upload(&self, caller: &Caller, job: &str, path: &str, offset: u64, bytes: Vec<u8>) -> Result<FileInfo, ToolError> {
        Ok(self.draft_upload(caller, job, path, offset, bytes).await?)
    }

    async fn get(&self, caller: &Caller, job: &str) -> Result<JobRecord, ToolError> {
        Ok(self.job_get(caller, job).await?)
    }

    async fn run_new(
        &self,
        caller: &Caller,
        plan: RunPlan,
        inputs: Vec<(String, Vec<u8>)>,
        control: RunControl,
    ) -> Result<RunReport, ToolError> {
        let name = names::run_name(&self.options.namespace, &caller.principal, &control.key);
        let sj = self.submit_named(caller, &plan, &inputs, &name).await?;
        Ok(self.settle(caller, sj, &plan, &control).await?)
    }

    async fn run(
        &self,
        caller: &Caller,
        job: &str,
        plan: RunPlan,
        inputs: Vec<(String, String)>,
        control: RunControl,
    ) -> Result<RunReport, ToolError> {
        let sj = self.draft_start(caller, job, &plan, &inputs).await?;
        Ok(self.settle(caller, sj, &plan, &control).await?)
    }

    async fn status(&self, caller: &Caller, job: &str) -> Result<JobStatus, ToolError> {
        Ok(self.job_status(caller, job).await?)
    }

    async fn read(&self, caller: &Caller, job: &str, target: ReadTarget, offset: u64, limit: u64) -> Result<Chunk, ToolError> {
        Ok(self.job_read(caller, job, target, offset, limit).await?)
    }

    async fn delete(&self, caller: &Caller, job: &str) -> Result<(), ToolError> {
        Ok(self.job_delete(caller, job).await?)
    }

    async fn list(&self, caller: &Caller) -> Result<Vec<JobRecord>, ToolError> {
        Ok(self.job_list(caller).await?)
    }
}
