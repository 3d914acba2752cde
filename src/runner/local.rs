//! The local backend: carries out a checked [`RunPlan`] as a process on this
//! machine, sandboxed with bubblewrap when it is available (and required
//! when the operator says so).
//!
//! Inside the sandbox the skill package is mounted read-only at `/skill`,
//! the job's work directory writable at `/work` (the working directory), and
//! `/tmp` and `/dev/shm` are a private, sized tmpfs. Without the sandbox the
//! same directories are used at their real paths, and the script is handed
//! to its interpreter as a descriptor opened beneath the skill
//! ([`super::script`]).
//!
//! # What one run gets, and when it is set up
//!
//! [`LocalRunner::command`] builds what a preview shows (and refuses what
//! cannot run here); [`LocalRunner::run`] then sets up, for this run alone:
//!
//! 1. a uid: one leased from `--run-as-uids` when given ([`super::uids`]),
//!    else the default run-as uid (65534 for a root server); a root server
//!    refuses unsandboxed runs without a range;
//! 2. the job's work directory `0700` to that uid (and given back to the
//!    server when the run ends; the job directory and its record stay the
//!    server's);
//! 3. a cgroup ([`super::cgroup`]) the child joins before it execs;
//! 4. a root server's tmpfs for `/tmp` and `/dev/shm` ([`super::tmpfs`]);
//! 5. with granted egress (sandboxed only): the proxy socket and the
//!    forwarder ([`super::egress`]);
//! 6. a watcher for every limit ([`super::watch`]).
//!
//! Then the process runs ([`super::process::execute`]); afterwards the
//! limits are checked once more, every process left in the cgroup or under
//! the leased uid is killed, and everything above is taken down in reverse.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::core::declaration::Interpreter;
use crate::core::fence::{script_env, RunPlan, ScriptEnv};
use crate::core::limits::{bytes_text, MAX_TIMEOUT_SECS, RUN_FILE_BYTES, RUN_TMP_BYTES};
use crate::mcp::error::{codes, ToolError};
use crate::mcp::executor::{RunCommand, SandboxSummary};
use crate::shutdown::Shutdown;

use super::cgroup::{CgroupMode, Cgroups, RunCgroup, RunCgroups, RunLimits};
use super::egress::{EgressError, EgressOptions, LocalEgress, RunEgress, EXE_INSIDE, FORWARD_ADDR, SOCKET_INSIDE};
use super::process::{check_accessible, execute, ExecError, ExecOutcome, ExecSpec, RunAs};
use super::sandbox::{detect_bwrap, Launcher, SandboxSpec};
use super::sandbox_probe::{builtin_self_test, bwrap_self_test};
use super::script::{fd_path, open_beneath, ScriptError};
use super::spawn_helper::SpawnHelper;
use super::tmpfs::RunTmpfs;
use super::uids::{UidLease, UidPool, UidRange};
use super::watch::{Finding, Watch};

/// How long a run's leftovers (SIGKILLed in its cgroup) may take to be
/// gone before the run's uid is swept the slow way instead.
const LEFTOVERS_GONE_WITHIN: Duration = Duration::from_secs(1);

/// Where interpreters are looked for: system directories only. The server's
/// own PATH may point into a user's home (pyenv, nvm), which an unprivileged
/// run-as uid cannot read and a sandbox does not mount.
pub const INTERPRETER_DIRS: &[&str] = &["/usr/local/bin", "/usr/bin", "/bin"];

/// Mount points inside the sandbox.
pub const SKILL_MOUNT: &str = "/skill";
pub const WORK_MOUNT: &str = "/work";

/// Which sandbox carries runs out, when there is a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SandboxBackend {
    /// bubblewrap when it is installed and works here, else the built-in sandbox.
    Auto,
    /// bubblewrap only.
    Bwrap,
    /// The built-in sandbox only (this binary's `sandbox-exec`).
    Builtin,
}

/// The operator's sandbox choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// Refuse to run anything without a working sandbox.
    Required,
    /// Sandbox when a sandbox works here, plain processes otherwise.
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
    #[error("every dedicated uid of --run-as-uids {0} is in use by a run; try again when one finishes (or give a larger range)")]
    NoFreeUid(UidRange),
    #[error("the sandbox is required but not available: {0}")]
    SandboxRequired(String),
    #[error(
        "this server runs as root without the sandbox ({0}), and no --run-as-uids range is configured: unsandboxed runs would share one uid and could read each other's files, so none runs; give --run-as-uids FIRST-LAST (uids nothing else uses), or make bubblewrap work"
    )]
    UnsandboxedNeedsUids(String),
    #[error("a cgroup per run is required (--cgroup required) but not available: {0}")]
    CgroupRequired(String),
    #[error("could not set up the run's cgroup: {0}")]
    Cgroup(std::io::Error),
    #[error("could not mount the run's tmpfs at {path}: {source}")]
    Tmpfs { path: PathBuf, source: std::io::Error },
    #[error("no usable `{program}` in {dirs} for interpreter `{interpreter}`")]
    NoInterpreter { interpreter: Interpreter, program: &'static str, dirs: String },
    #[error("could not prepare the run directory {path}: {source}")]
    Prepare { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Script(#[from] ScriptError),
    #[error(transparent)]
    Egress(#[from] EgressError),
    #[error("granted egress needs this server's own binary inside the sandbox, and it is not available: {0}")]
    NoSelfExe(String),
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl From<RunError> for ToolError {
    fn from(err: RunError) -> Self {
        let code = match &err {
            RunError::Busy(_) | RunError::NoFreeUid(_) => codes::BUSY,
            RunError::SandboxRequired(_) => "sandbox-required",
            RunError::UnsandboxedNeedsUids(_) => "unsandboxed-needs-uids",
            RunError::CgroupRequired(_) => "cgroup-required",
            RunError::NoInterpreter { .. } => "no-interpreter",
            RunError::Prepare { .. } | RunError::Cgroup(_) | RunError::Tmpfs { .. } => "prepare-failed",
            RunError::Script(_) => "unavailable",
            RunError::Egress(_) | RunError::NoSelfExe(_) => "egress-failed",
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

/// How the local runner is set up.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    pub sandbox: SandboxMode,
    pub sandbox_backend: SandboxBackend,
    pub max_concurrent: usize,
    /// The uid sandboxed runs use when no range is given (root servers only).
    pub run_as_uid: Option<u32>,
    /// Dedicated uids, one per run (root servers only).
    pub run_as_uids: Option<UidRange>,
    pub cgroup: CgroupMode,
    /// cgroup v2: where run cgroups are made instead of the server's own cgroup.
    pub cgroup_parent: Option<PathBuf>,
    /// Ask the kernel for cgroup migrations without an RCU grace period ([`super::cgroup`]).
    pub cgroup_favor_dynmods: bool,
    pub egress: EgressOptions,
    /// This binary, bound into sandboxes that need the forwarder (default:
    /// the running executable when it is `skill-operator`).
    pub self_exe: Option<PathBuf>,
    /// Start scripts from the pre-forked spawn helper ([`super::spawn_helper`])
    /// rather than by forking the server.
    pub spawn_helper: bool,
    /// Where the proxy's per-run sockets live.
    pub data_dir: PathBuf,
}

/// The runner's cgroups, or why runs have per-process limits only.
enum Limits {
    Cgroups(Arc<RunCgroups>),
    PerProcess(String),
}

/// The local backend.
pub struct LocalRunner {
    mode: SandboxMode,
    /// The sandbox runs use, when one works here.
    sandbox: Option<Launcher>,
    sandbox_detail: String,
    interpreters: BTreeMap<Interpreter, PathBuf>,
    /// The default uid (no range, or the preview before a uid is leased).
    run_as: RunAs,
    uids: Option<Arc<UidPool>>,
    limits: Limits,
    cgroup_mode: CgroupMode,
    egress: Result<LocalEgress, String>,
    /// `--egress-allow-cidr`, for previews.
    egress_allow: Vec<ipnet::IpNet>,
    /// This binary, open for `--ro-bind-fd` (O_PATH).
    self_exe: Result<Arc<OwnedFd>, String>,
    /// Where scripts are forked from, when not this process.
    spawner: Option<Arc<SpawnHelper>>,
    is_root: bool,
    permits: Arc<Semaphore>,
    max_concurrent: usize,
}

/// A finished run: how the process ended, with any limit it passed.
#[derive(Debug)]
pub struct RunDone {
    pub exec: ExecOutcome,
    /// The sentence naming the limit the run passed, if any.
    pub limit_note: Option<String>,
}

fn open_self_exe(path: Option<&Path>) -> Result<Arc<OwnedFd>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = match path {
        Some(p) => p.to_path_buf(),
        None => {
            let exe = std::env::current_exe().map_err(|e| format!("cannot find the running executable: {e}"))?;
            let name = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if !name.starts_with("skill-operator") {
                return Err(format!(
                    "the running executable {} is not skill-operator (give its path in the runner options)",
                    exe.display()
                ));
            }
            exe
        }
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    Ok(Arc::new(file.into()))
}

/// What to do on a machine where no sandbox works, in the words every
/// message about it uses.
pub const SANDBOX_REMEDY: &str = "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap), \
or allow unprivileged user namespaces for the built-in sandbox (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)";

/// The sandbox runs get here, and in words: bubblewrap when it passes its
/// self-test (where asked for or on `auto`), else the built-in one when
/// it passes the same test.
async fn detect_sandbox(backend: SandboxBackend, exe: Option<Arc<OwnedFd>>, probe_as: RunAs) -> (Option<Launcher>, String) {
    let mut why: Vec<String> = Vec::new();
    if backend != SandboxBackend::Builtin {
        match detect_bwrap() {
            None => why.push("bubblewrap (bwrap) is not installed".into()),
            Some(path) => match bwrap_self_test(&path, probe_as).await {
                Ok(()) => return (Some(Launcher::Bwrap(path.clone())), format!("bubblewrap at {}", path.display())),
                Err(err) => why.push(format!("bubblewrap at {} does not work here: {err}", path.display())),
            },
        }
    }
    if backend != SandboxBackend::Bwrap {
        match exe {
            None => why.push("the built-in sandbox needs this server's own binary, which could not be opened".into()),
            Some(exe) => {
                let fd = std::os::fd::AsRawFd::as_raw_fd(exe.as_ref());
                match builtin_self_test(exe, probe_as).await {
                    Ok(()) => {
                        let mut detail =
                            "built-in sandbox (user, mount, PID, network, IPC and UTS namespaces; no capabilities; seccomp)".to_string();
                        if !why.is_empty() {
                            detail.push_str(&format!(": {}", why.join("; ")));
                        }
                        return (Some(Launcher::Builtin(fd)), detail);
                    }
                    Err(err) => why.push(format!("the built-in sandbox does not work here: {err}")),
                }
            }
        }
    }
    (None, format!("{}; {SANDBOX_REMEDY}", why.join("; ")))
}

impl LocalRunner {
    /// Probe the machine: interpreters usable by the run-as uid, a
    /// bubblewrap that passes its self-test, cgroups, the egress proxy.
    pub async fn detect(o: RunnerOptions) -> LocalRunner {
        // SAFETY: trivial getter.
        let is_root = unsafe { libc::geteuid() } == 0;
        let run_as = run_as_for(o.run_as_uid);
        // A single dedicated --run-as-uid is a range of one.
        let range = match (o.run_as_uids, o.run_as_uid) {
            (Some(range), _) => Some(range),
            (None, Some(uid)) if is_root => UidRange::new(uid, uid).ok(),
            _ => None,
        };
        let uids = if is_root { range.map(UidPool::new) } else { None };
        if let (false, Some(range)) = (is_root, range) {
            tracing::warn!(%range, "--run-as-uids needs a root server; runs use the server's own uid");
        }
        let probe_as = uids.as_ref().map(|p| RunAs::User { uid: p.range().first, gid: p.range().first }).unwrap_or(run_as);
        let interpreters = find_interpreters(probe_as);
        let self_exe = open_self_exe(o.self_exe.as_deref());
        let (sandbox, sandbox_detail) = match o.sandbox {
            SandboxMode::Off => (None, "sandbox switched off (--sandbox off)".to_string()),
            _ => detect_sandbox(o.sandbox_backend, self_exe.as_ref().ok().cloned(), probe_as).await,
        };
        if o.sandbox == SandboxMode::Required && sandbox.is_none() {
            tracing::warn!(%sandbox_detail, "--sandbox required but unavailable: every run will be refused");
        } else if o.sandbox == SandboxMode::Auto && sandbox.is_none() && !is_root {
            tracing::warn!(%sandbox_detail, "no sandbox works here: runs are NOT sandboxed (they can read your files and reach the network)");
        }
        if sandbox.is_none() && o.sandbox != SandboxMode::Required && is_root && uids.is_none() {
            tracing::warn!(
                "runs are not sandboxed and no --run-as-uids range is configured: unsandboxed runs are refused; \
                 {SANDBOX_REMEDY}, or give --run-as-uids a range of uids nothing else uses"
            );
        }
        let max_concurrent = o.max_concurrent.max(1);
        if let Some(pool) = &uids {
            if pool.range().len() < max_concurrent {
                tracing::warn!(range = %pool.range(), max_concurrent, "fewer dedicated uids than concurrent runs: a run finding none free is refused as busy");
            }
        }
        let limits = match o.cgroup {
            CgroupMode::Off => Limits::PerProcess("cgroups switched off (--cgroup off)".into()),
            _ => {
                let parent = o.cgroup_parent.clone();
                let favor = o.cgroup_favor_dynmods;
                match tokio::task::spawn_blocking(move || Cgroups::detect(parent.as_deref(), RunLimits::default(), favor)).await {
                    Ok(Ok(cg)) => {
                        let cgroups = Arc::new(RunCgroups::new(cg));
                        let first = cgroups.clone();
                        tokio::task::spawn_blocking(move || first.refill());
                        Limits::Cgroups(cgroups)
                    }
                    Ok(Err(why)) => Limits::PerProcess(why.0),
                    Err(e) => Limits::PerProcess(format!("the cgroup probe failed: {e}")),
                }
            }
        };
        if let Limits::PerProcess(why) = &limits {
            if o.cgroup != CgroupMode::Off {
                tracing::warn!(reason = %why, "no cgroup per run: limits are per process only (memory not counted across processes or for shared memory)");
            }
        }
        let egress = match sandbox {
            Some(_) => LocalEgress::new(&o.data_dir, &o.egress).map_err(|e| e.to_string()),
            None => Err("no sandbox".into()),
        };
        let spawner = match (&self_exe, o.spawn_helper) {
            (Ok(exe), true) => SpawnHelper::start(exe.clone()).map_err(|err| tracing::warn!(%err, "no spawn helper")).ok(),
            (Err(why), true) => {
                tracing::debug!(%why, "no spawn helper without this binary; runs fork the server");
                None
            }
            (_, false) => None,
        };
        LocalRunner {
            mode: o.sandbox,
            sandbox,
            sandbox_detail,
            interpreters,
            run_as,
            uids,
            limits,
            cgroup_mode: o.cgroup,
            egress,
            egress_allow: o.egress.allow_cidrs.clone(),
            self_exe,
            spawner,
            is_root,
            permits: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
        }
    }

    pub fn interpreters(&self) -> BTreeSet<Interpreter> {
        self.interpreters.keys().copied().collect()
    }

    /// The in-process egress proxy (when runs are sandboxed).
    pub fn egress(&self) -> Option<&LocalEgress> {
        self.egress.as_ref().ok()
    }

    pub fn sandbox_status(&self) -> SandboxSummary {
        let limits = match &self.limits {
            Limits::Cgroups(cg) => format!("run limits: {}", cg.cgroups().describe()),
            Limits::PerProcess(why) => format!("run limits: per process only ({why})"),
        };
        SandboxSummary {
            mode: self.mode.as_str().into(),
            active: self.sandbox.is_some(),
            detail: format!("{}; {limits}", self.sandbox_detail),
        }
    }

    /// Take a run slot now, or say the server is busy.
    pub fn try_acquire(&self) -> Result<OwnedSemaphorePermit, RunError> {
        self.permits.clone().try_acquire_owned().map_err(|_| RunError::Busy(self.max_concurrent))
    }

    /// Everything that refuses a run here before anything starts.
    fn refusals(&self) -> Result<(), RunError> {
        if self.mode == SandboxMode::Required && self.sandbox.is_none() {
            return Err(RunError::SandboxRequired(self.sandbox_detail.clone()));
        }
        if self.sandbox.is_none() && self.is_root && self.uids.is_none() {
            return Err(RunError::UnsandboxedNeedsUids(self.sandbox_detail.clone()));
        }
        if let (CgroupMode::Required, Limits::PerProcess(why)) = (self.cgroup_mode, &self.limits) {
            return Err(RunError::CgroupRequired(why.clone()));
        }
        Ok(())
    }

    /// Whether this plan reaches the network through the proxy here, and in words.
    fn network(&self, plan: &RunPlan) -> (bool, String) {
        match (&self.sandbox, plan.egress_granted) {
            (Some(_), false) => (false, "none (own network namespace)".into()),
            (Some(_), true) => {
                let (allow, dropped) = super::egress::allowlist(&plan.egress);
                if allow.is_empty() {
                    return (false, "none (own network namespace; no declared egress entry is a host the proxy can allow)".into());
                }
                let except = if self.egress_allow.is_empty() {
                    String::new()
                } else {
                    format!(" except {} (--egress-allow-cidr)", self.egress_allow.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", "))
                };
                let mut text = format!(
                    "only through the egress proxy, to {allow} (own network namespace: no route out, the server and host-local services unreachable; names resolving to loopback, private or link-local addresses refused{except})"
                );
                if !dropped.is_empty() {
                    text.push_str(&format!("; not allowed, unreadable: {}", dropped.join(", ")));
                }
                (true, text)
            }
            (None, _) if plan.egress.is_empty() => (false, "unrestricted: no sandbox, so nothing keeps the script off the network".into()),
            (None, _) => (
                false,
                format!(
                    "unrestricted: no sandbox, so egress is NOT enforced (declared: {}; the script can reach any host, this server and host-local services)",
                    plan.egress.join(", ")
                ),
            ),
        }
    }

    fn program(&self, plan: &RunPlan) -> Result<&PathBuf, RunError> {
        self.interpreters.get(&plan.interpreter).ok_or(RunError::NoInterpreter {
            interpreter: plan.interpreter,
            program: plan.interpreter.program(),
            dirs: INTERPRETER_DIRS.join(", "),
        })
    }

    /// The run's limits in words, for the preview.
    fn limit_words(&self, sandboxed: bool, job_bytes: u64) -> Vec<String> {
        let mut words = match &self.limits {
            Limits::Cgroups(cg) => cg.cgroups().limits().words(),
            Limits::PerProcess(why) => vec![format!(
                "per process only, no cgroup ({why}): memory {} per process (shared memory not counted), {} processes per uid",
                bytes_text(crate::core::limits::RUN_MEMORY_BYTES),
                crate::core::limits::RUN_PIDS
            )],
        };
        if sandboxed || self.is_root {
            words.push(format!("/tmp and /dev/shm: {}", bytes_text(RUN_TMP_BYTES)));
        }
        words.push(format!("/work: {} (the job's disk limit)", bytes_text(job_bytes)));
        words.push(format!("{} per file", bytes_text(RUN_FILE_BYTES)));
        words
    }

    /// The uid a preview names: the range when runs lease one.
    fn run_as_text(&self) -> Option<u32> {
        match &self.uids {
            Some(pool) => Some(pool.range().first),
            None => super::process::run_as_uid(self.run_as),
        }
    }

    /// Build the exact process spec (and what the preview shows) for a plan.
    /// `work` is the job's work directory on the host; `job_bytes` its disk limit.
    pub fn command(
        &self,
        plan: &RunPlan,
        work: &Path,
        job_bytes: u64,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(ExecSpec, RunCommand, ScriptEnv), RunError> {
        self.refusals()?;
        let program = self.program(plan)?.clone();
        let (egress, network_text) = self.network(plan);
        let sandboxed = self.sandbox.is_some();
        let (script_path, cwd, tmp) = if sandboxed {
            (PathBuf::from(SKILL_MOUNT).join(plan.script.as_str()), PathBuf::from(WORK_MOUNT), "/tmp".to_string())
        } else {
            let tmp = if self.is_root { work.with_file_name("tmp").join("tmp") } else { work.with_file_name("tmp") };
            (plan.skill_dir.join(plan.script.as_str()), work.to_path_buf(), tmp.display().to_string())
        };
        let extra = if egress { RunEgress::env() } else { Vec::new() };
        let env = script_env(plan, &tmp, &tmp, &extra, lookup);
        let mut spec = ExecSpec::new(program.clone(), cwd.clone());
        spec.args = std::iter::once(script_path.clone().into_os_string()).chain(plan.args.iter().map(OsString::from)).collect();
        spec.env = env.vars.iter().map(|(k, v)| (OsString::from(k), OsString::from(v))).collect();
        spec.timeout = Duration::from_secs(plan.timeout_secs.min(MAX_TIMEOUT_SECS));
        spec.run_as = self.run_as;
        if let Some(launcher) = &self.sandbox {
            let mut sb = SandboxSpec::with_launcher(launcher.clone()).with_network(egress);
            if let (Launcher::Builtin(_), Ok(exe)) = (launcher, &self.self_exe) {
                spec.keep_fds.push(exe.clone());
            }
            sb.ro_binds.push((plan.skill_dir.clone(), PathBuf::from(SKILL_MOUNT)));
            sb.rw_binds.push((work.to_path_buf(), PathBuf::from(WORK_MOUNT)));
            spec.sandbox = Some(sb);
        }
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
            sandbox: self.sandbox.as_ref().map_or("off", Launcher::name).into(),
            network: network_text,
            run_as: self.run_as_text(),
            limits: self.limit_words(sandboxed, job_bytes),
        };
        Ok((spec, command, env))
    }

    /// Execute a spec built by [`Self::command`] for `plan` in job `job`,
    /// whose work directory is `work` (see the module docs for what is set
    /// up around it). The permit is held until the run is settled.
    pub async fn run(
        &self,
        plan: &RunPlan,
        mut spec: ExecSpec,
        job: &str,
        work: &Path,
        job_bytes: u64,
        _permit: OwnedSemaphorePermit,
    ) -> Result<RunDone, RunError> {
        self.refusals()?;
        let began = std::time::Instant::now();
        let sandboxed = spec.sandbox.is_some();
        let job_dir = work.parent().map(Path::to_path_buf).unwrap_or_else(|| work.to_path_buf());

        // 1. The uid.
        let lease: Option<UidLease> = match &self.uids {
            Some(pool) => Some(pool.take().ok_or(RunError::NoFreeUid(pool.range()))?),
            None => None,
        };
        if let Some(lease) = &lease {
            spec.run_as = RunAs::User { uid: lease.uid(), gid: lease.uid() };
        }
        let owner = super::process::run_as_ids(spec.run_as);

        // 2. The work directory, 0700 to the run's uid. Given back below, whatever happens.
        let tmp_dir = work.with_file_name("tmp");
        let prepared = prepare_dirs(&job_dir, work, &tmp_dir, owner, !sandboxed && !self.is_root);
        let prepared_us = began.elapsed().as_micros() as u64;
        let mut emptied = false;
        let result = match prepared {
            Ok(()) => self.run_prepared(plan, spec, job, work, &job_dir, &tmp_dir, job_bytes, owner, sandboxed, &mut emptied).await,
            Err(e) => Err(e),
        };
        let ran_us = began.elapsed().as_micros() as u64;

        // Nothing of the run may outlive it under its uid: a leased uid is
        // dedicated, so every process it still has is a leftover. A run
        // whose cgroup was emptied has none (see `kill_and_wait_empty`).
        if let Some(lease) = lease.as_ref().filter(|_| !emptied) {
            if let Err(err) = super::process::sweep_uid(lease.uid(), lease.uid()) {
                tracing::warn!(%err, uid = lease.uid(), "could not sweep leftover processes of the run's uid");
            }
        }
        if let Err(e) = reclaim_dirs(&job_dir, work, &tmp_dir, owner) {
            tracing::warn!(job, error = %e, "could not take the job directory back from the run's uid");
        }
        drop(lease);
        // Where a run's time goes beyond the script (the benchmark's breakdown).
        tracing::debug!(job, prepared_us, ran_us, swept_and_reclaimed_us = began.elapsed().as_micros() as u64 - ran_us, "run done");
        result
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_prepared(
        &self,
        plan: &RunPlan,
        mut spec: ExecSpec,
        job: &str,
        work: &Path,
        job_dir: &Path,
        tmp_dir: &Path,
        job_bytes: u64,
        owner: Option<(u32, u32)>,
        sandboxed: bool,
        emptied: &mut bool,
    ) -> Result<RunDone, RunError> {
        let entered = std::time::Instant::now();
        // 3. The cgroup.
        let cgroup: Option<Arc<RunCgroup>> = match &self.limits {
            Limits::Cgroups(cg) => match cg.take_spare() {
                Some(made) => Some(Arc::new(made)),
                None => {
                    let name = format!("{job}-{}", uuid::Uuid::new_v4().simple());
                    let made = tokio::task::spawn_blocking({
                        let cg = cg.clone();
                        move || cg.cgroups().create(&name)
                    })
                    .await
                    .map_err(|e| RunError::Cgroup(std::io::Error::other(e.to_string())))?;
                    Some(Arc::new(made.map_err(RunError::Cgroup)?))
                }
            },
            Limits::PerProcess(_) => None,
        };
        if let Some(cg) = &cgroup {
            spec.cgroup_procs = cg.join_fds();
            spec.limits.nproc = Some(crate::core::limits::RUN_UID_PROCS);
        }

        // 4. A root server's tmpfs for /tmp and /dev/shm (TMPDIR unsandboxed).
        let tmpfs = if self.is_root {
            let owner = owner.unwrap_or((0, 0));
            let mounted = RunTmpfs::mount(tmp_dir, owner).map_err(|source| RunError::Tmpfs { path: tmp_dir.to_path_buf(), source })?;
            Some(Arc::new(mounted))
        } else {
            None
        };
        if let (Some(t), Some(sb)) = (&tmpfs, spec.sandbox.as_mut()) {
            sb.tmpfs.clear();
            sb.rw_binds.push((t.tmp(), PathBuf::from("/tmp")));
            sb.rw_binds.push((t.shm(), PathBuf::from("/dev/shm")));
        }

        // 5. Egress through the proxy, sandboxed only.
        let (egress, _) = self.network(plan);
        let mut run_egress: Option<RunEgress> = None;
        if egress && sandboxed {
            let proxy = self.egress.as_ref().map_err(|why| RunError::NoSelfExe(why.clone()))?;
            let exe = self.self_exe.as_ref().map_err(|why| RunError::NoSelfExe(why.clone()))?.clone();
            let opened = proxy.open(job, &plan.egress, owner)?;
            if let Some(sb) = spec.sandbox.as_mut() {
                sb.ro_binds.push((opened.socket().to_path_buf(), PathBuf::from(SOCKET_INSIDE)));
                sb.fd_binds.push((std::os::fd::AsRawFd::as_raw_fd(exe.as_ref()), PathBuf::from(EXE_INSIDE)));
                sb.wrapper = [EXE_INSIDE, "sandbox-init", "--forward", &format!("{FORWARD_ADDR}={SOCKET_INSIDE}"), "--"]
                    .iter()
                    .map(OsString::from)
                    .collect();
            }
            spec.keep_fds.push(exe);
            run_egress = Some(opened);
        }

        // Unsandboxed: the script opened once, beneath the skill.
        if !sandboxed {
            let fd = Arc::new(open_beneath(&plan.skill_dir, &plan.script)?);
            let mut args: Vec<OsString> = Vec::with_capacity(spec.args.len() + 1);
            if plan.interpreter == Interpreter::Node {
                // Node opens its main module's real path otherwise (see super::script).
                args.push("--preserve-symlinks-main".into());
            }
            args.push(fd_path(&fd).into_os_string());
            args.extend(spec.args.iter().skip(1).cloned());
            spec.args = args;
            spec.keep_fds.push(fd);
        }

        // 6. The watcher.
        let watch = Arc::new(Watch {
            cgroup: cgroup.clone(),
            work: if !sandboxed && !self.is_root { job_dir.to_path_buf() } else { work.to_path_buf() },
            work_bytes: job_bytes,
            tmpfs: tmpfs.clone(),
        });
        let (tx, rx) = tokio::sync::watch::channel(None);
        spec.stop = Some(rx);
        let stop_watch = Shutdown::new();
        let watcher = watch.clone().spawn(tx, stop_watch.clone());

        spec.spawner = self.spawner.clone();
        let before_exec = std::time::Instant::now();
        let executed = execute(spec).await;
        let after_exec = std::time::Instant::now();

        stop_watch.trigger();
        let watched: Option<Finding> = watcher.await.ok().flatten();
        // One trip to the blocking pool settles the run: the limits checked
        // once more (a run that passed one and exited before the next tick
        // is still reported), everything left in its cgroup killed, wherever
        // it went, before the result is told (a leftover could still change
        // the run's files), and its tmpfs unmounted. Then, off the caller's
        // path, the cgroup is removed and the next run's made.
        let settled = tokio::task::spawn_blocking(move || {
            let finding = watched.or_else(|| watch.check());
            drop(watch);
            let emptied = cgroup.as_ref().is_some_and(|cg| cg.kill_and_wait_empty(LEFTOVERS_GONE_WITHIN));
            drop(tmpfs);
            (finding, emptied, cgroup)
        })
        .await;
        let finding = match settled {
            Ok((finding, was_emptied, cgroup)) => {
                *emptied = was_emptied;
                if let (Some(run), Limits::Cgroups(cgroups)) = (cgroup, &self.limits) {
                    let cgroups = cgroups.clone();
                    tokio::task::spawn_blocking(move || cgroups.retire(run));
                }
                finding
            }
            // The settling task panicked: nothing says the run's cgroup is
            // empty, so its uid is swept (emptied stays false).
            Err(e) => {
                tracing::warn!(job, error = %e, "settling a run failed; its uid is swept instead");
                None
            }
        };
        drop(run_egress);
        tracing::debug!(
            job,
            setup_us = (before_exec - entered).as_micros() as u64,
            exec_us = (after_exec - before_exec).as_micros() as u64,
            settled_us = after_exec.elapsed().as_micros() as u64,
            "run settled"
        );
        let mut exec = executed?;
        if let Some(f) = &finding {
            exec.outcome.limit_exceeded.get_or_insert(f.limit);
        }
        Ok(RunDone { exec, limit_note: finding.map(|f| f.note) })
    }
}

/// Give the run's uid its work directory (`0700`) and, unsandboxed on a
/// server that cannot mount, a private tmp next to it; files uploaded by
/// the server are handed over too. The job directory itself stays the
/// server's (`0711` while the run goes on: the uid may pass through to its
/// work directory, and cannot list it or touch the job's record).
fn prepare_dirs(job_dir: &Path, work: &Path, tmp: &Path, owner: Option<(u32, u32)>, plain_tmp: bool) -> Result<(), RunError> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |path: &Path, source: std::io::Error| RunError::Prepare { path: path.to_path_buf(), source };
    std::fs::create_dir_all(work).map_err(|e| fail(work, e))?;
    if plain_tmp {
        std::fs::create_dir_all(tmp).map_err(|e| fail(tmp, e))?;
    }
    std::fs::set_permissions(job_dir, std::fs::Permissions::from_mode(0o711)).map_err(|e| fail(job_dir, e))?;
    for dir in std::iter::once(work).chain(plain_tmp.then_some(tmp)) {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| fail(dir, e))?;
        if let Some((uid, gid)) = owner {
            chown_tree(dir, uid, gid).map_err(|e| fail(dir, e))?;
        }
    }
    Ok(())
}

/// The job directory back to the server alone, after the run.
fn reclaim_dirs(job_dir: &Path, work: &Path, tmp: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if owner.is_some() {
        // SAFETY: trivial getters.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        chown_tree(work, uid, gid)?;
        if tmp.exists() {
            chown_tree(tmp, uid, gid)?;
        }
    }
    std::fs::set_permissions(job_dir, std::fs::Permissions::from_mode(0o700))
}

/// `lchown` a whole tree (never following a link, never leaving the tree).
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
