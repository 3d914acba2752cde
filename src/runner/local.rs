//! The local backend: carries out a checked [`RunPlan`] as a process on this
//! machine, sandboxed with bubblewrap when it is available (and required
//! when the operator says so).
//!
//! Inside the sandbox the skill package is mounted read-only at `/skill`,
//! the job's work directory writable at `/work` (the working directory), and
//! `/tmp` is private. Without the sandbox the same directories are used at
//! their real paths. Either way the script runs as an unprivileged uid when
//! the server is root (see [`super::process`]).

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::core::declaration::Interpreter;
use crate::core::fence::{script_env, RunPlan, ScriptEnv};
use crate::core::limits::MAX_TIMEOUT_SECS;
use crate::mcp::error::{codes, ToolError};
use crate::mcp::executor::{RunCommand, SandboxSummary};

use super::process::{check_accessible, execute, ExecError, ExecOutcome, ExecSpec, RunAs};
use super::sandbox::{bwrap_self_test, detect_bwrap, SandboxSpec};

/// Where interpreters are looked for: system directories only. The server's
/// own PATH may point into a user's home (pyenv, nvm), which an unprivileged
/// run-as uid cannot read and a sandbox does not mount.
pub const INTERPRETER_DIRS: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

/// Mount points inside the sandbox.
pub const SKILL_MOUNT: &str = "/skill";
pub const WORK_MOUNT: &str = "/work";

/// The operator's sandbox choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// Refuse to run anything without a working sandbox.
    Required,
    /// Sandbox when bubblewrap works here, plain processes otherwise.
    Auto,
    /// Never sandbox.
    Off,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Required => "required",
            SandboxMode::Auto => "auto",
            SandboxMode::Off => "off",
        }
    }
}

/// Why a run could not be carried out (the script never started, or the
/// backend failed around it).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("another run is in progress (at most {0} at a time); try again when it finishes")]
    Busy(usize),
    #[error("the sandbox is required but not available: {0}")]
    SandboxRequired(String),
    #[error("no usable `{program}` in {dirs} for interpreter `{interpreter}`")]
    NoInterpreter { interpreter: Interpreter, program: &'static str, dirs: String },
    #[error("could not prepare the run directory {path}: {source}")]
    Prepare { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl From<RunError> for ToolError {
    fn from(err: RunError) -> Self {
        let code = match &err {
            RunError::Busy(_) => codes::BUSY,
            RunError::SandboxRequired(_) => "sandbox-required",
            RunError::NoInterpreter { .. } => "no-interpreter",
            RunError::Prepare { .. } => "prepare-failed",
            RunError::Exec(_) => "exec-failed",
        };
        ToolError::new(code, err.to_string())
    }
}

/// The uid scripts run as: a dedicated one when the server is root and
/// one was given, otherwise the executor's default (see [`RunAs::Auto`]).
pub fn run_as_for(run_as_uid: Option<u32>) -> RunAs {
    // SAFETY: trivial getter.
    let is_root = unsafe { libc::geteuid() } == 0;
    match run_as_uid {
        Some(uid) if is_root => RunAs::User { uid, gid: uid },
        _ => RunAs::Auto,
    }
}

/// The interpreters of the closed set found in [`INTERPRETER_DIRS`] that
/// `run_as` can execute. Cheap (a few stats): done before the first answer.
pub fn find_interpreters(run_as: RunAs) -> BTreeMap<Interpreter, PathBuf> {
    let mut interpreters = BTreeMap::new();
    for interpreter in Interpreter::ALL {
        let found = INTERPRETER_DIRS
            .iter()
            .map(|d| Path::new(d).join(interpreter.program()))
            .find(|p| p.is_file() && check_accessible(p, run_as, false).is_ok());
        if let Some(path) = found {
            interpreters.insert(interpreter, path);
        }
    }
    interpreters
}

/// The local backend.
pub struct LocalRunner {
    mode: SandboxMode,
    bwrap: Option<PathBuf>,
    sandbox_detail: String,
    interpreters: BTreeMap<Interpreter, PathBuf>,
    run_as: RunAs,
    /// Kill every leftover process of the run-as uid after an unsandboxed
    /// run: only sound with a dedicated uid and one run at a time.
    sweep: Option<(u32, u32)>,
    permits: Arc<Semaphore>,
    max_concurrent: usize,
}

impl LocalRunner {
    /// Probe the machine: interpreters usable by the run-as uid, and a
    /// bubblewrap that passes its self-test.
    ///
    /// `run_as_uid` names a dedicated uid for scripts (root servers only;
    /// default 65534). With a dedicated uid and one run at a time, every
    /// process left under that uid is killed after an unsandboxed run, so a
    /// detached grandchild cannot outlive its run and read the next one's
    /// environment. 65534 is shared with other daemons, so it is never swept.
    pub async fn detect(mode: SandboxMode, max_concurrent: usize, run_as_uid: Option<u32>) -> LocalRunner {
        // SAFETY: trivial getter.
        let is_root = unsafe { libc::geteuid() } == 0;
        let run_as = run_as_for(run_as_uid);
        let interpreters = find_interpreters(run_as);
        let (bwrap, sandbox_detail) = match mode {
            SandboxMode::Off => (None, "sandbox switched off (--sandbox off)".to_string()),
            _ => match detect_bwrap() {
                None => (None, "bubblewrap (bwrap) is not installed".to_string()),
                Some(path) => match bwrap_self_test(&path, run_as).await {
                    Ok(()) => (Some(path.clone()), format!("bubblewrap at {}", path.display())),
                    Err(err) => (None, format!("bubblewrap at {} does not work here: {err}", path.display())),
                },
            },
        };
        if mode == SandboxMode::Required && bwrap.is_none() {
            tracing::warn!(%sandbox_detail, "--sandbox required but unavailable: every run will be refused");
        }
        let max_concurrent = max_concurrent.max(1);
        let sweep = match run_as_uid {
            Some(uid) if is_root && uid != super::process::NOBODY_UID && uid != 0 && max_concurrent == 1 => Some((uid, uid)),
            _ => None,
        };
        if bwrap.is_none() && mode != SandboxMode::Required && sweep.is_none() && is_root {
            tracing::warn!(
                "runs are not sandboxed and the run-as uid is not dedicated: a detached grandchild can outlive its run; \
                 install bubblewrap, or give --run-as-uid a uid nothing else uses (with --max-concurrent-runs 1)"
            );
        }
        LocalRunner {
            mode,
            bwrap,
            sandbox_detail,
            interpreters,
            run_as,
            sweep,
            permits: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
        }
    }

    pub fn interpreters(&self) -> BTreeSet<Interpreter> {
        self.interpreters.keys().copied().collect()
    }

    pub fn sandbox_status(&self) -> SandboxSummary {
        SandboxSummary { mode: self.mode.as_str().into(), active: self.bwrap.is_some(), detail: self.sandbox_detail.clone() }
    }

    /// Take a run slot now, or say the server is busy.
    pub fn try_acquire(&self) -> Result<OwnedSemaphorePermit, RunError> {
        self.permits.clone().try_acquire_owned().map_err(|_| RunError::Busy(self.max_concurrent))
    }

    fn refuse_without_sandbox(&self) -> Result<(), RunError> {
        if self.mode == SandboxMode::Required && self.bwrap.is_none() {
            return Err(RunError::SandboxRequired(self.sandbox_detail.clone()));
        }
        Ok(())
    }

    fn network(&self, plan: &RunPlan) -> (bool, String) {
        match (&self.bwrap, plan.egress_granted) {
            (Some(_), false) => (false, "none (own network namespace)".into()),
            (Some(_), true) => (
                true,
                format!("host network for declared egress {} (host names are not enforced by the local sandbox)", plan.egress.join(", ")),
            ),
            (None, _) => (true, "unrestricted (no sandbox)".into()),
        }
    }

    fn program(&self, plan: &RunPlan) -> Result<&PathBuf, RunError> {
        self.interpreters.get(&plan.interpreter).ok_or(RunError::NoInterpreter {
            interpreter: plan.interpreter,
            program: plan.interpreter.program(),
            dirs: INTERPRETER_DIRS.join(", "),
        })
    }

    /// Build the exact process spec (and what the preview shows) for a plan.
    /// `work` is the job's work directory on the host.
    pub fn command(
        &self,
        plan: &RunPlan,
        work: &Path,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(ExecSpec, RunCommand, ScriptEnv), RunError> {
        self.refuse_without_sandbox()?;
        let program = self.program(plan)?.clone();
        let (network, network_text) = self.network(plan);
        let sandboxed = self.bwrap.is_some();
        let (script_path, cwd, home, tmp) = if sandboxed {
            (PathBuf::from(SKILL_MOUNT).join(plan.script.as_str()), PathBuf::from(WORK_MOUNT), "/tmp".to_string(), "/tmp".to_string())
        } else {
            let tmp = work.with_file_name("tmp");
            (plan.skill_dir.join(plan.script.as_str()), work.to_path_buf(), tmp.display().to_string(), tmp.display().to_string())
        };
        let env = script_env(plan, &home, &tmp, &[], lookup);
        let mut spec = ExecSpec::new(program.clone(), cwd.clone());
        spec.args = std::iter::once(script_path.clone().into_os_string()).chain(plan.args.iter().map(OsString::from)).collect();
        spec.env = env.vars.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect();
        spec.timeout = Duration::from_secs(plan.timeout_secs.min(MAX_TIMEOUT_SECS));
        spec.run_as = self.run_as;
        if let Some(bwrap) = &self.bwrap {
            let mut sb = SandboxSpec::new(bwrap).with_network(network);
            sb.ro_binds.push((plan.skill_dir.clone(), PathBuf::from(SKILL_MOUNT)));
            sb.rw_binds.push((work.to_path_buf(), PathBuf::from(WORK_MOUNT)));
            spec.sandbox = Some(sb);
        }
        let run_as = super::process::run_as_uid(self.run_as);
        let command = RunCommand {
            backend: "local".into(),
            program: program.display().to_string(),
            argv: std::iter::once(program.display().to_string())
                .chain(std::iter::once(script_path.display().to_string()))
                .chain(plan.args.iter().cloned())
                .collect(),
            cwd: cwd.display().to_string(),
            timeout_secs: spec.timeout.as_secs(),
            env: env.names.clone(),
            env_missing: env.missing.clone(),
            sandbox: if sandboxed { "bubblewrap".into() } else { "off".into() },
            network: network_text,
            run_as,
            limits: Vec::new(),
        };
        Ok((spec, command, env))
    }

    /// Execute a spec built by [`Self::command`] in `work` (prepared for the
    /// run-as uid first). The permit is held until the process is settled.
    pub async fn run(&self, spec: ExecSpec, work: &Path, _permit: OwnedSemaphorePermit) -> Result<ExecOutcome, RunError> {
        self.refuse_without_sandbox()?;
        let sandboxed = spec.sandbox.is_some();
        prepare_dirs(work, self.run_as, !sandboxed)?;
        let outcome = execute(spec).await?;
        if let (false, Some((uid, gid))) = (sandboxed, self.sweep) {
            // The sandbox's PID namespace already took every descendant with it.
            if let Err(err) = super::process::sweep_uid(uid, gid) {
                tracing::warn!(%err, uid, "could not sweep leftover processes of the run-as uid");
            }
        }
        Ok(outcome)
    }
}

/// Give the run-as uid its work directory (and, unsandboxed, a private tmp
/// next to it). Files uploaded by the server are handed over too.
fn prepare_dirs(work: &Path, run_as: RunAs, needs_tmp: bool) -> Result<(), RunError> {
    let prep = |path: &Path| RunError::Prepare { path: path.to_path_buf(), source: std::io::Error::last_os_error() };
    std::fs::create_dir_all(work).map_err(|source| RunError::Prepare { path: work.to_path_buf(), source })?;
    let mut dirs = vec![work.to_path_buf()];
    if needs_tmp {
        let tmp = work.with_file_name("tmp");
        std::fs::create_dir_all(&tmp).map_err(|source| RunError::Prepare { path: tmp.clone(), source })?;
        dirs.push(tmp);
    }
    if let Some((uid, gid)) = super::process::run_as_ids(run_as) {
        for dir in dirs {
            chown_tree(&dir, uid, gid).map_err(|_| prep(&dir))?;
        }
    }
    Ok(())
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}
