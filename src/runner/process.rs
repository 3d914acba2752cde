//! Local process executor: runs one declared script under the fence and always returns.
//!
//! [`execute`] spawns an interpreter with an argv array (never a shell string), an
//! environment that is *exactly* the one given, its own process group, rlimits, an
//! unprivileged uid when the server is root, and optionally a bubblewrap sandbox
//! ([`super::sandbox`]). It returns exit code / signal / capped output; a non-zero
//! exit is an `Ok` outcome, `Err` is reserved for "could not run it at all".
//!
//! # Why the call always returns: exit + drain under a hard deadline
//!
//! Waiting for the stdout/stderr pipes to reach EOF is not a termination condition:
//! any descendant that inherited them keeps them open, and one that `setsid()`s
//! (e.g. `setsid sleep 100 &`) is outside the process group we signal. So the run
//! settles on the **main child's exit**, then reads the pipes for at most
//! [`ExecSpec::drain`] (250 ms) and closes them. On timeout the whole group gets
//! SIGTERM, then SIGKILL after [`ExecSpec::kill_grace`]. Every wait is also bounded by
//! a hard deadline `timeout + kill_grace + drain + 1 s` (see
//! [`ExecSpec::hard_deadline`]); if even SIGKILL has not produced an exit by then
//! (uninterruptible sleep), the outcome says `hard_deadline_hit` and tokio reaps the
//! child later. This bounds the *call*, not the life of a deliberately detached
//! grandchild: without the sandbox, killing that is the deployment tier's job (uid,
//! NPROC, a VM that stops). With the sandbox the PID namespace dies with bwrap and
//! takes every descendant with it.
//!
//! After the main child exits we SIGKILL its process group (background jobs it left
//! behind in its own group). To make that safe against pid reuse, exit is detected
//! with a pidfd, which becomes readable when the leader is a zombie but *before* it
//! is reaped: while the zombie exists its pid (= the pgid) cannot be recycled. The
//! same group kill runs from a drop guard if the `execute` future is cancelled.
//!
//! # Why the child runs as another uid when the server is root
//!
//! [`RunAs::Auto`] (default) maps to uid/gid 65534 (`nobody`) with supplementary
//! groups cleared when the server's euid is 0, and to the server's own uid otherwise.
//! Reasons, each verified by a test on Linux 6.x:
//! * `/proc/<ppid>/environ` (the server's environment, i.e. every credential the
//!   owner configured) is only readable by a process that passes
//!   `ptrace_may_access(PTRACE_MODE_READ)`: same uid and dumpable, or
//!   CAP_SYS_PTRACE. A root child has CAP_SYS_PTRACE, so for a root server the only
//!   sound non-sandbox answer is a different, unprivileged uid.
//! * `RLIMIT_NPROC` counts processes per *real uid* and is not enforced for uid 0
//!   (nor for CAP_SYS_ADMIN/CAP_SYS_RESOURCE), so a fork bomb is only capped once the
//!   child is not root. It counts *all* processes of that uid, which is why a
//!   dedicated uid that nothing else uses is better than 65534 in production (65534 is
//!   shared with other daemons, which a script could also signal or ptrace).
//! * `PR_SET_NO_NEW_PRIVS` is set so the script cannot regain privileges through a
//!   setuid binary.
//!
//! The interpreter, the script, the working directory and every sandbox bind source
//! must then be accessible to that uid; [`execute`] checks the mode bits up front and
//! fails with [`ExecError::NotAccessible`] naming the path (POSIX ACLs are not
//! considered). E.g. a pyenv python under `/root` is not usable; `/usr/bin/python3` is.
//!
//! A detached survivor of the unsandboxed path keeps running as the run-as uid, and
//! could ptrace or read the environment of the *next* script run under the same uid
//! (dumpable, same uid). With a dedicated uid and one run at a time (the caller's
//! semaphore), [`sweep_uid`] after each run kills everything left under that uid.
//! A run with a cgroup of its own needs no sweep: all its processes are born in
//! that cgroup and cannot leave it, so killing the cgroup's members until none
//! is left (`RunCgroup::kill_and_wait_empty`) is the same guarantee without
//! forking the server once more. The sandbox path does not need it: its PID
//! namespace dies with bwrap.
//!
//! # Why the server should call [`protect_server_environ`] at startup
//!
//! When the server is *not* root, the child necessarily has the server's uid and
//! could read `/proc/<ppid>/environ`. `prctl(PR_SET_DUMPABLE, 0)` on the server makes
//! that read (and ptrace, and `/proc/<ppid>/mem`) fail with EACCES for a same-uid
//! process without CAP_SYS_PTRACE; it is reset only by the server's own execve or a
//! credential change. It does not protect *other* same-uid processes (e.g. the MCP
//! client that launched the server with the same secrets): for that use the sandbox
//! (new PID namespace: no host process is visible at all) or run the server as root so
//! the child gets its own uid. In the sandbox the child's `/proc` is the namespace's
//! own; its parent there is bwrap's init, whose environment is exactly the one given.
//!
//! # Environment and argv
//!
//! The child's environment is cleared and then set to [`ExecSpec::env`] exactly; the
//! server's own variables never reach it. argv items are passed to `execve` as is:
//! no shell, no PATH lookup (the program must be absolute), no globbing. Inherited
//! file descriptors above 2 are marked close-on-exec (`close_range`), so fds the
//! server inherited from its own parent do not leak into the script; stdin is
//! `/dev/null`; signal dispositions are reset to default (an ignored SIGPIPE/SIGXFSZ in
//! the server would otherwise be inherited).
//!
//! # Resource limits
//!
//! Applied in `pre_exec` (after fork, before exec; only async-signal-safe calls:
//! `write`, `setgroups`/`setgid`/`setuid`, `setrlimit`, `signal`, `prctl`,
//! `close_range`, `fcntl`), in this order: the child first writes itself into the
//! run's cgroup ([`ExecSpec::cgroup_procs`], [`super::cgroup`]) while it still has
//! the server's privileges, then drops to the run-as uid (done here rather than by
//! `Command::uid`, which would drop before the cgroup could be joined), then sets the
//! rlimits, so nothing of the run ever executes outside its cgroup. The rlimits are
//! per process; the cgroup bounds the run as a whole. Memory is capped with
//! `RLIMIT_DATA`, not `RLIMIT_AS`: V8 reserves several GiB of address space at start
//! (node aborts with "Failed to reserve virtual memory for CodeRange" under a 512 MiB
//! RLIMIT_AS), while RLIMIT_DATA counts only private writable memory actually mapped
//! (not shared memory: that is what the cgroup is for). Core dumps are always
//! disabled (RLIMIT_CORE 0). A run's watcher ([`super::watch`]) can stop it for a
//! limit through [`ExecSpec::stop`]: the group is killed and the outcome names it.
//!
//! # The sandbox's own failures
//!
//! With a sandbox, bubblewrap's `--json-status-fd` is a pipe only the server reads:
//! bubblewrap writes `exit-code` there once the program it exec'd has exited, and
//! never passes the descriptor on. A sandboxed run without that line, not stopped by
//! us, is bubblewrap's own failure ([`ExecError::SandboxSetup`], its stderr as the
//! message); anything else is the script's outcome with its streams, whatever the
//! script printed (a script writing `bwrap: ...` to stderr and exiting 1 is a failed
//! run, not a set-up error).
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::{timeout_at, Instant};
use tracing::{debug, warn};

use super::child::{child_setup, ChildLimits, ChildPlan, Launch, Rlimit};
use super::sandbox::{bwrap_args, Inside, SandboxPathError, SandboxSpec};
use super::spawn_helper::{HelperChild, SpawnHelper};
use crate::api::outcome::{LimitHit, RunOutcome};
use crate::core::limits;
use crate::shutdown::Shutdown;

/// `nobody`/`nogroup` on Debian; used by [`RunAs::Auto`] when the server is root.
pub const NOBODY_UID: u32 = 65534;
pub const NOBODY_GID: u32 = 65534;

const READ_CHUNK: usize = 64 * 1024;

/// Per-child rlimits (soft = hard, except CPU whose hard limit is one second higher so
/// the child first gets SIGXCPU). `None` leaves the server's limit in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceLimits {
    /// RLIMIT_DATA: heap and private writable mappings (default 512 MiB).
    pub data_bytes: Option<u64>,
    /// RLIMIT_AS: total address space. Default `None`: node cannot start under 512 MiB.
    pub address_space_bytes: Option<u64>,
    /// RLIMIT_NPROC: processes+threads of the child's real uid (default 64). Not
    /// enforced for uid 0; counts every process of that uid, server's included when
    /// the child runs with the server's uid.
    pub nproc: Option<u64>,
    /// RLIMIT_FSIZE: largest file the child may write (default 64 MiB). Exceeding it
    /// raises SIGXFSZ (or EFBIG where the process ignores SIGXFSZ, as Python does).
    pub fsize_bytes: Option<u64>,
    /// RLIMIT_CPU in seconds (default 300, the timeout ceiling).
    pub cpu_seconds: Option<u64>,
    /// RLIMIT_NOFILE (default 256).
    pub nofile: Option<u64>,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            data_bytes: Some(limits::RUN_MEMORY_BYTES),
            address_space_bytes: None,
            nproc: Some(limits::RUN_PIDS),
            fsize_bytes: Some(limits::RUN_FILE_BYTES),
            cpu_seconds: Some(limits::MAX_TIMEOUT_SECS),
            nofile: Some(limits::RUN_OPEN_FILES),
        }
    }
}

/// Which uid/gid the child runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunAs {
    /// Root server: [`NOBODY_UID`]/[`NOBODY_GID`]. Otherwise: the server's own uid.
    #[default]
    Auto,
    /// Never switch. As root this leaves the child root (logged as a warning): no
    /// NPROC, and `/proc/<ppid>/environ` readable.
    Inherit,
    /// Switch to this uid/gid (supplementary groups cleared). Needs a root server,
    /// unless it equals the server's own ids.
    User { uid: u32, gid: u32 },
}

/// Everything needed to run one script. Its `Debug` output shows environment
/// variable *names* only, so logging a spec never logs a granted secret.
#[derive(Clone)]
pub struct ExecSpec {
    /// Absolute path of the interpreter (node/python3/bash). No PATH lookup.
    pub program: PathBuf,
    /// argv after the program, e.g. `[script_path, user args...]`; passed as is.
    pub args: Vec<OsString>,
    /// The COMPLETE environment of the child (cleared first).
    pub env: Vec<(OsString, OsString)>,
    /// Working directory (a path inside the sandbox when `sandbox` is set).
    pub cwd: PathBuf,
    /// Wall-clock timeout.
    pub timeout: Duration,
    /// SIGTERM to the group, then SIGKILL after this.
    pub kill_grace: Duration,
    /// After the main child exits, read pipes at most this long.
    pub drain: Duration,
    /// Bytes kept per stream; the rest is read, counted and discarded.
    pub stream_cap: usize,
    pub limits: ResourceLimits,
    pub run_as: RunAs,
    /// Run inside bubblewrap when `Some`.
    pub sandbox: Option<SandboxSpec>,
    /// Stops the run when triggered: SIGKILL to the whole group at once, and
    /// the outcome says `cancelled`.
    pub cancel: Option<Shutdown>,
    /// `cgroup.procs` files (open for writing) the child writes itself into
    /// after the fork, while it still has the server's privileges, before
    /// anything of the run can start (see [`super::cgroup`]).
    pub cgroup_procs: Vec<Arc<OwnedFd>>,
    /// Descriptors the program inherits (every other one above 2 is
    /// closed on exec): the script opened by the runner, a descriptor
    /// bubblewrap binds into the sandbox.
    pub keep_fds: Vec<Arc<OwnedFd>>,
    /// Stops the run when it carries a limit: SIGKILL to the whole group at
    /// once, and the outcome names the limit (the run's watcher sends it).
    pub stop: Option<tokio::sync::watch::Receiver<Option<LimitHit>>>,
    /// Start it through this helper rather than by forking this process.
    pub spawner: Option<Arc<SpawnHelper>>,
}

impl std::fmt::Debug for ExecSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecSpec")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("env_names", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("cwd", &self.cwd)
            .field("timeout", &self.timeout)
            .field("kill_grace", &self.kill_grace)
            .field("drain", &self.drain)
            .field("stream_cap", &self.stream_cap)
            .field("limits", &self.limits)
            .field("run_as", &self.run_as)
            .field("sandbox", &self.sandbox)
            .field("cancellable", &self.cancel.is_some())
            .field("cgroup_procs", &self.cgroup_procs.iter().map(|f| f.as_raw_fd()).collect::<Vec<_>>())
            .field("keep_fds", &self.keep_fds.iter().map(|f| f.as_raw_fd()).collect::<Vec<_>>())
            .field("stoppable", &self.stop.is_some())
            .field("spawn_helper", &self.spawner.is_some())
            .finish()
    }
}

impl ExecSpec {
    /// What the sandbox's command line is made of.
    pub fn inside(&self) -> Inside<'_> {
        Inside { program: &self.program, args: &self.args, cwd: &self.cwd }
    }

    /// A spec with the fence defaults (60 s, 2 s grace, 250 ms drain, 1 MiB per
    /// stream, default limits, [`RunAs::Auto`], no sandbox, empty env and args).
    pub fn new(program: impl Into<PathBuf>, cwd: impl Into<PathBuf>) -> Self {
        ExecSpec {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: cwd.into(),
            timeout: Duration::from_secs(limits::DEFAULT_TIMEOUT_SECS),
            kill_grace: limits::KILL_GRACE,
            drain: limits::DRAIN,
            stream_cap: limits::STREAM_CAP as usize,
            limits: ResourceLimits::default(),
            run_as: RunAs::Auto,
            sandbox: None,
            cancel: None,
            cgroup_procs: Vec::new(),
            keep_fds: Vec::new(),
            stop: None,
            spawner: None,
        }
    }

    /// `timeout + kill_grace + drain + 1 s`: [`execute`] returns by then, whatever the child does.
    pub fn hard_deadline(&self) -> Duration {
        self.timeout.saturating_add(self.kill_grace).saturating_add(self.drain).saturating_add(limits::HARD_DEADLINE_SLACK)
    }
}

/// What happened. A non-zero exit, a signal or a timeout are all normal outcomes.
///
/// In sandbox mode the exit status is bwrap's: bwrap reports a child killed by signal
/// N as exit code `128 + N` (so `signal` is `None` and `exit_code` is e.g. 137), and
/// `signal` is set only if bwrap itself was killed (timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    /// How the run ended, in the project's one shape (byte counts are what
    /// the child wrote until its pipes closed, kept or not).
    pub outcome: RunOutcome,
    /// The kept stdout (at most [`ExecSpec::stream_cap`] bytes).
    pub stdout: Vec<u8>,
    /// The kept stderr.
    pub stderr: Vec<u8>,
    /// Wall-clock time from spawn to settled, unrounded.
    pub duration: Duration,
    /// Gave up waiting at the hard deadline (child not reaped, or pipes cut short by it).
    pub hard_deadline_hit: bool,
    /// The uid the child (or bwrap) ran as.
    pub uid: u32,
}

/// Why a script could not be run at all. Each message names what to change.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("interpreter path {program:?} is not absolute: give the full path (e.g. /usr/bin/node); no PATH lookup is done")]
    ProgramNotAbsolute { program: PathBuf },
    #[error("interpreter {program:?} cannot be used: {source}")]
    ProgramUnusable { program: PathBuf, source: io::Error },
    #[error("interpreter {program:?} is not an executable regular file")]
    ProgramNotExecutable { program: PathBuf },
    #[error("cannot inspect {path:?}: {source}")]
    PathUnusable { path: PathBuf, source: io::Error },
    #[error("working directory {cwd:?} is not an existing directory")]
    CwdNotDirectory { cwd: PathBuf },
    #[error("{what} contains a NUL byte, which cannot be passed to a process")]
    NulByte { what: String },
    #[error("environment variable name {name:?} is invalid (empty, or contains '=')")]
    InvalidEnvName { name: OsString },
    #[error("invalid execution spec: {reason}")]
    InvalidSpec { reason: &'static str },
    #[error("cannot run the script as uid {uid}: switching users requires the server to run as root (it runs as uid {current}); use RunAs::Auto or RunAs::Inherit")]
    RunAsNeedsRoot { uid: u32, current: u32 },
    #[error("{path:?} is not {need} by uid {uid}, which the script runs as; make it and every parent directory accessible to that uid (e.g. chmod o+rx, or chown), or use another interpreter/location")]
    NotAccessible { path: PathBuf, uid: u32, need: &'static str },
    #[error("sandbox path {path:?}: {reason}")]
    SandboxPath { path: PathBuf, reason: &'static str },
    #[error("the sandbox could not be set up (exit {code}): {message}")]
    SandboxSetup { code: i32, message: String },
    #[error("bubblewrap does not work here: {message}")]
    SandboxSelfTest { message: String },
    #[error("failed to start {program:?}: {source}")]
    Spawn { program: PathBuf, source: io::Error },
    #[error("failed to wait for the script process: {source}")]
    Wait { source: io::Error },
    #[error("could not mark the server non-dumpable (prctl PR_SET_DUMPABLE): {source}")]
    ProtectEnviron { source: io::Error },
}

impl From<SandboxPathError> for ExecError {
    fn from(e: SandboxPathError) -> Self {
        ExecError::SandboxPath { path: e.path, reason: e.reason }
    }
}

/// Make the server process non-dumpable so a same-uid child cannot read
/// `/proc/<ppid>/environ`, `/proc/<ppid>/mem`, or ptrace it. Call once at startup,
/// before serving; harmless when root. See the module docs for what it does not cover.
pub fn protect_server_environ() -> Result<(), ExecError> {
    // SAFETY: plain prctl with integer arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    if rc != 0 {
        return Err(ExecError::ProtectEnviron { source: io::Error::last_os_error() });
    }
    Ok(())
}

/// Kill every process running as `uid` (SIGKILL), by forking a short-lived child that
/// switches to `uid` and calls `kill(-1, SIGKILL)`: the kernel then signals exactly the
/// processes that uid may signal, i.e. its own, including detached grandchildren
/// that left the script's process group. Needs root. Only sound with a *dedicated*
/// run-as uid and runs serialised (a concurrent run under the same uid would be
/// killed too); refuses uid 0 and the server's own uid. Do not use it on 65534 when
/// other daemons run as `nobody`.
pub fn sweep_uid(uid: u32, gid: u32) -> Result<(), ExecError> {
    // SAFETY: trivial getter.
    let euid = unsafe { libc::geteuid() };
    if uid == 0 || uid == euid {
        return Err(ExecError::InvalidSpec { reason: "sweep_uid refuses uid 0 and the server's own uid" });
    }
    if euid != 0 {
        return Err(ExecError::RunAsNeedsRoot { uid, current: euid });
    }
    // SAFETY: between fork and _exit the child only makes async-signal-safe syscalls
    // (setgroups, setgid, setuid, kill, _exit) on plain integers; no allocation, no locks.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(ExecError::Spawn { program: PathBuf::from("(uid sweeper)"), source: io::Error::last_os_error() });
    }
    if pid == 0 {
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                libc::_exit(2);
            }
            libc::kill(-1, libc::SIGKILL);
            libc::_exit(0);
        }
    }
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waiting for our own child; the wait is a few syscalls long.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(ExecError::Wait { source: e });
        }
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        debug!(uid, "swept every process of the run-as uid");
        Ok(())
    } else {
        Err(ExecError::Spawn {
            program: PathBuf::from("(uid sweeper)"),
            source: io::Error::other("could not switch to the uid to sweep it"),
        })
    }
}

/// Check, by mode bits, that `path` can be read (and written if `write`) by the uid
/// `run_as` resolves to, including search permission on every ancestor. `Ok` when no
/// uid switch happens (the server's own access is what counts then). Useful for the
/// script path, which the executor cannot recognise among the args.
pub fn check_accessible(path: &Path, run_as: RunAs, write: bool) -> Result<(), ExecError> {
    let ident = resolve_identity(run_as)?;
    match ident.switch {
        Some((uid, gid)) => check_access_as(path, uid, gid, if write { Need::ReadWrite } else { Need::Read }),
        None => Ok(()),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    Exec,
    Read,
    ReadWrite,
    Search,
}

impl Need {
    fn describe(self) -> &'static str {
        match self {
            Need::Exec => "executable",
            Need::Read => "readable",
            Need::ReadWrite => "readable and writable",
            Need::Search => "searchable (x on directories)",
        }
    }
}

fn perm_bits(meta: &std::fs::Metadata, uid: u32, gid: u32) -> u32 {
    let mode = meta.permissions().mode();
    if meta.uid() == uid {
        (mode >> 6) & 7
    } else if meta.gid() == gid {
        (mode >> 3) & 7
    } else {
        mode & 7
    }
}

fn check_access_as(path: &Path, uid: u32, gid: u32, need: Need) -> Result<(), ExecError> {
    let deny = |p: &Path, n: Need| ExecError::NotAccessible { path: p.to_path_buf(), uid, need: n.describe() };
    let unusable = |p: &Path, source: io::Error| ExecError::PathUnusable { path: p.to_path_buf(), source };
    // Resolve symlinks as root would; the target and its ancestors are what the kernel checks.
    let real = std::fs::canonicalize(path).map_err(|e| unusable(path, e))?;
    for anc in real.ancestors().skip(1) {
        let m = std::fs::metadata(anc).map_err(|e| unusable(anc, e))?;
        if perm_bits(&m, uid, gid) & 1 == 0 {
            return Err(deny(anc, Need::Search));
        }
    }
    let m = std::fs::metadata(&real).map_err(|e| unusable(&real, e))?;
    let bits = perm_bits(&m, uid, gid);
    let want = match need {
        Need::Exec => 1,
        Need::Search => 1,
        Need::Read if m.is_dir() => 4 | 1,
        Need::Read => 4,
        Need::ReadWrite if m.is_dir() => 4 | 2 | 1,
        Need::ReadWrite => 4 | 2,
    };
    if bits & want != want {
        return Err(deny(&real, need));
    }
    Ok(())
}

struct Identity {
    /// `Some((uid, gid))` when the child switches ids.
    switch: Option<(u32, u32)>,
    /// The uid the child ends up with.
    uid: u32,
}

/// The uid a script will run as under `run_as` (`None` when `run_as` is invalid here).
pub fn run_as_uid(run_as: RunAs) -> Option<u32> {
    resolve_identity(run_as).ok().map(|i| i.uid)
}

/// The uid/gid the child switches to, when it switches at all.
pub fn run_as_ids(run_as: RunAs) -> Option<(u32, u32)> {
    resolve_identity(run_as).ok().and_then(|i| i.switch)
}

fn resolve_identity(run_as: RunAs) -> Result<Identity, ExecError> {
    // SAFETY: trivial getters.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    Ok(match run_as {
        RunAs::Auto if euid == 0 => Identity { switch: Some((NOBODY_UID, NOBODY_GID)), uid: NOBODY_UID },
        RunAs::Auto => Identity { switch: None, uid: euid },
        RunAs::Inherit => {
            if euid == 0 {
                warn!(
                    "script runs as root (RunAs::Inherit): RLIMIT_NPROC is not enforced and the server's /proc/<pid>/environ is readable"
                );
            }
            Identity { switch: None, uid: euid }
        }
        RunAs::User { uid, gid } if uid == euid && gid == egid => Identity { switch: None, uid },
        RunAs::User { uid, gid } if euid == 0 => Identity { switch: Some((uid, gid)), uid },
        RunAs::User { uid, .. } => return Err(ExecError::RunAsNeedsRoot { uid, current: euid }),
    })
}

fn has_nul(s: &OsStr) -> bool {
    s.as_bytes().contains(&0)
}

fn validate(spec: &ExecSpec) -> Result<(), ExecError> {
    if !spec.program.is_absolute() {
        return Err(ExecError::ProgramNotAbsolute { program: spec.program.clone() });
    }
    if has_nul(spec.program.as_os_str()) {
        return Err(ExecError::NulByte { what: "the interpreter path".into() });
    }
    if has_nul(spec.cwd.as_os_str()) {
        return Err(ExecError::NulByte { what: "the working directory".into() });
    }
    for (i, a) in spec.args.iter().enumerate() {
        if has_nul(a) {
            return Err(ExecError::NulByte { what: format!("argument {i}") });
        }
    }
    for (k, v) in &spec.env {
        if k.is_empty() || k.as_bytes().contains(&b'=') || has_nul(k) {
            return Err(ExecError::InvalidEnvName { name: k.clone() });
        }
        if has_nul(v) {
            return Err(ExecError::NulByte { what: format!("the value of environment variable {}", k.to_string_lossy()) });
        }
    }
    if spec.timeout.is_zero() {
        return Err(ExecError::InvalidSpec { reason: "timeout must be greater than zero" });
    }
    const DAY: Duration = Duration::from_secs(86_400);
    if spec.timeout > DAY || spec.kill_grace > DAY || spec.drain > DAY {
        return Err(ExecError::InvalidSpec { reason: "timeout, kill_grace and drain must each be at most one day" });
    }
    if spec.sandbox.is_none() {
        let m = std::fs::metadata(&spec.program).map_err(|source| ExecError::ProgramUnusable { program: spec.program.clone(), source })?;
        if !m.is_file() || m.permissions().mode() & 0o111 == 0 {
            return Err(ExecError::ProgramNotExecutable { program: spec.program.clone() });
        }
        if !spec.cwd.is_dir() {
            return Err(ExecError::CwdNotDirectory { cwd: spec.cwd.clone() });
        }
    }
    Ok(())
}

/// The rlimits of `l`, computed in the parent so the child does no allocation.
fn child_limits(l: &ResourceLimits) -> ChildLimits {
    ChildLimits {
        data: l.data_bytes.map(Rlimit::both),
        addr: l.address_space_bytes.map(Rlimit::both),
        nproc: l.nproc.map(Rlimit::both),
        fsize: l.fsize_bytes.map(Rlimit::both),
        cpu: l.cpu_seconds.map(|s| Rlimit { cur: s, max: s.saturating_add(1) }),
        nofile: l.nofile.map(Rlimit::both),
    }
}

fn launch_of(spec: &ExecSpec, sandbox: Option<&SandboxSpec>, ident: &Identity) -> Result<Launch, ExecError> {
    let (program, args, cwd) = match sandbox {
        None => (spec.program.clone(), spec.args.clone(), spec.cwd.clone()),
        Some(sb) => {
            let (program, first) = sb.launcher.program();
            let mut args: Vec<OsString> = first.into_iter().map(OsString::from).collect();
            args.extend(bwrap_args(sb, &spec.inside())?);
            (program, args, PathBuf::from("/"))
        }
    };
    // SAFETY: trivial getter.
    let clear_groups = unsafe { libc::geteuid() } == 0;
    let mut keep: Vec<RawFd> = spec.keep_fds.iter().map(|f| f.as_raw_fd()).collect();
    if let Some(fd) = sandbox.and_then(|sb| sb.status_fd) {
        keep.push(fd);
    }
    if let Some(super::sandbox::Launcher::Builtin(fd)) = sandbox.map(|sb| &sb.launcher) {
        keep.push(*fd);
    }
    let plan = ChildPlan {
        limits: child_limits(&spec.limits),
        cgroups: spec.cgroup_procs.iter().map(|f| f.as_raw_fd()).collect(),
        keep,
        switch: ident.switch,
        clear_groups,
    };
    Ok(Launch { program, args, env: spec.env.clone(), cwd, plan })
}

/// The direct spawn: a fork of this process.
fn command(launch: Launch) -> Command {
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args).current_dir(&launch.cwd);
    cmd.env_clear();
    for (k, v) in &launch.env {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.process_group(0);
    cmd.kill_on_drop(true);
    let plan = launch.plan;
    // SAFETY: child_setup only performs async-signal-safe syscalls on data
    // computed before the fork.
    unsafe {
        cmd.pre_exec(move || child_setup(&plan));
    }
    cmd
}

/// A started process's stdout or stderr, whichever way it was started.
type Stream = Box<dyn AsyncRead + Send + Unpin>;

/// The started process: forked by this process, or by the spawn helper
/// (a child of this process all the same, see [`super::spawn_helper`]).
enum Started {
    Direct { child: Child, pidfd: Option<AsyncFd<OwnedFd>> },
    Helper(HelperChild),
}

impl Started {
    fn pid(&self) -> libc::pid_t {
        match self {
            Started::Direct { child, .. } => child.id().map(|p| p as libc::pid_t).unwrap_or(0),
            Started::Helper(child) => child.id(),
        }
    }

    fn pidfd(&self) -> Option<&AsyncFd<OwnedFd>> {
        match self {
            Started::Direct { pidfd, .. } => pidfd.as_ref(),
            Started::Helper(child) => child.pidfd(),
        }
    }

    async fn wait(&mut self) -> io::Result<ExitStatus> {
        match self {
            Started::Direct { child, .. } => child.wait().await,
            Started::Helper(child) => child.wait().await,
        }
    }

    /// Start `launch`: through the helper when there is one that works
    /// here, else by forking this process.
    fn spawn(launch: Launch, helper: Option<&SpawnHelper>) -> io::Result<(Started, [Option<Stream>; 2])> {
        if let Some(helper) = helper {
            if let Some(mut child) = helper.spawn(&launch)? {
                let streams: [Option<Stream>; 2] =
                    [child.stdout.take().map(|s| Box::new(s) as Stream), child.stderr.take().map(|s| Box::new(s) as Stream)];
                return Ok((Started::Helper(child), streams));
            }
        }
        let mut child = command(launch).spawn()?;
        let pid = child.id().map(|p| p as libc::pid_t).unwrap_or(0);
        let pidfd = if pid > 0 { pidfd_open(pid) } else { None };
        let streams: [Option<Stream>; 2] =
            [child.stdout.take().map(|s| Box::new(s) as Stream), child.stderr.take().map(|s| Box::new(s) as Stream)];
        Ok((Started::Direct { child, pidfd }, streams))
    }
}

#[derive(Default)]
struct Capture {
    kept: Vec<u8>,
    total: u64,
}

async fn pump<R: AsyncRead + Unpin>(mut r: R, cap: Arc<Mutex<Capture>>, limit: usize) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match r.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                let mut c = cap.lock().unwrap_or_else(|p| p.into_inner());
                c.total += n as u64;
                let room = limit.saturating_sub(c.kept.len());
                let take = room.min(n);
                if take > 0 {
                    c.kept.extend_from_slice(&buf[..take]);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                debug!(error = %e, "reading script output failed; stopping this stream");
                break;
            }
        }
    }
}

/// Aborts the reader task if `execute` returns or is cancelled while it still runs.
struct AbortOnDrop(JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// [`AbortOnDrop`] for a task with a result.
struct AbortOnDropT<T>(JoinHandle<T>);
impl<T> Drop for AbortOnDropT<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// SIGKILLs the process group if `execute` is dropped (cancelled) before settling.
struct GroupGuard {
    pgid: libc::pid_t,
    armed: bool,
}
impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            debug!(pgid = self.pgid, "execute cancelled: killing the script's process group");
            signal_group(self.pgid, libc::SIGKILL);
        }
    }
}

fn signal_group(pgid: libc::pid_t, sig: libc::c_int) {
    // Never kill(-1) / kill(0): those would hit every process we may signal / our own group.
    if pgid <= 1 {
        return;
    }
    // SAFETY: plain syscall.
    if unsafe { libc::kill(-pgid, sig) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            warn!(pgid, sig, error = %e, "could not signal the script's process group");
        }
    }
}

fn pidfd_open(pid: libc::pid_t) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open returns a new fd (O_CLOEXEC) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if fd < 0 {
        debug!(error = %io::Error::last_os_error(), "pidfd_open unavailable; falling back to waitpid");
        return None;
    }
    // SAFETY: fd is a fresh descriptor we own.
    let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // `AsyncFd::new` is deprecated from tokio 1.54 in favour of the unsafe `register`
    // (absent from older 1.x); with an OwnedFd that we exclusively own it is sound.
    #[allow(deprecated)]
    AsyncFd::new(owned).ok()
}

/// Wait until the leader has exited or `deadline`. With a pidfd the leader is left a
/// zombie (unreaped) so its pgid stays reserved for the group kill that follows.
async fn exited_by(child: &mut Started, deadline: Instant) -> Result<bool, ExecError> {
    if let Some(fd) = child.pidfd() {
        match timeout_at(deadline, fd.readable()).await {
            Ok(Ok(_ready)) => return Ok(true),
            Ok(Err(e)) => debug!(error = %e, "pidfd poll failed; falling back to waitpid"),
            Err(_) => return Ok(false),
        }
    }
    match timeout_at(deadline, child.wait()).await {
        Ok(Ok(_)) => Ok(true),
        Ok(Err(source)) => Err(ExecError::Wait { source }),
        Err(_) => Ok(false),
    }
}

enum Waited {
    Exited,
    Deadline,
    Cancelled,
    Limit(LimitHit),
}

/// What ends a wait early: a cancellation, or a limit the run's watcher reports.
struct Stops<'a> {
    cancel: Option<&'a Shutdown>,
    limit: Option<tokio::sync::watch::Receiver<Option<LimitHit>>>,
}

impl Stops<'_> {
    /// Resolves when the run must stop (never, when nothing can stop it).
    async fn fired(&mut self) -> Waited {
        let cancel = async {
            match self.cancel {
                Some(c) => c.wait().await,
                None => std::future::pending().await,
            }
        };
        let limit = async {
            let hit = match self.limit.as_mut() {
                // Err: the watcher is gone without a verdict; nothing more can come.
                Some(rx) => rx.wait_for(Option::is_some).await.ok().and_then(|hit| *hit),
                None => None,
            };
            match hit {
                Some(hit) => hit,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = cancel => Waited::Cancelled,
            hit = limit => Waited::Limit(hit),
        }
    }
}

/// [`exited_by`], or stop early when a cancellation or a limit fires.
async fn wait_or_stop(child: &mut Started, deadline: Instant, stops: &mut Stops<'_>) -> Result<Waited, ExecError> {
    let waited = async { Ok(if exited_by(child, deadline).await? { Waited::Exited } else { Waited::Deadline }) };
    tokio::select! {
        biased;
        stop = stops.fired() => Ok(stop),
        w = waited => w,
    }
}

/// bubblewrap's `--json-status-fd`: one JSON object per line. It writes
/// `child-pid` when it has cloned the sandbox's first process and
/// `exit-code` only once the program it exec'd has exited, so a run whose
/// status has no `exit-code` never ran its program: bubblewrap failed to
/// set up (or to exec), and its stderr says why. The script cannot write
/// to this descriptor (bubblewrap does not pass it on), so printing
/// `bwrap: ...` on stderr and exiting 1 is just a failed run.
#[derive(Debug, Default)]
struct BwrapStatus {
    program_exited: bool,
}

fn parse_bwrap_status(text: &str) -> BwrapStatus {
    let mut status = BwrapStatus::default();
    for line in text.lines() {
        if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(line) {
            if map.contains_key("exit-code") {
                status.program_exited = true;
            }
        }
    }
    status
}

/// A pipe for bubblewrap's status: (read end, write end), both close-on-exec.
fn status_pipe() -> Result<(OwnedFd, OwnedFd), ExecError> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two-element array or fails.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(ExecError::Spawn { program: PathBuf::from("(bwrap status pipe)"), source: io::Error::last_os_error() });
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Read the status pipe to its end (bubblewrap's exit), bounded.
async fn read_status(read: OwnedFd) -> String {
    let Ok(rx) = tokio::net::unix::pipe::Receiver::from_owned_fd(read) else { return String::new() };
    let mut text = Vec::new();
    let _ = rx.take(64 * 1024).read_to_end(&mut text).await;
    String::from_utf8_lossy(&text).into_owned()
}

/// Run `spec` and return how it ended. Returns within [`ExecSpec::hard_deadline`]
/// of the spawn. See the module docs for the guarantees and their reasons.
pub async fn execute(spec: ExecSpec) -> Result<ExecOutcome, ExecError> {
    validate(&spec)?;
    let ident = resolve_identity(spec.run_as)?;
    let mut status_read = None;
    let mut status_write = None;
    let sandbox = match &spec.sandbox {
        Some(sb) => {
            let (read, write) = status_pipe()?;
            let mut sb = sb.clone();
            sb.status_fd = Some(write.as_raw_fd());
            status_read = Some(read);
            status_write = Some(write);
            Some(sb)
        }
        None => None,
    };
    let launch = launch_of(&spec, sandbox.as_ref(), &ident)?;
    if let Some((uid, gid)) = ident.switch {
        match &spec.sandbox {
            None => {
                check_access_as(&spec.program, uid, gid, Need::Exec)?;
                check_access_as(&spec.cwd, uid, gid, Need::Search)?;
            }
            Some(sb) => {
                // The built-in launcher is exec'd from a descriptor: no path to check.
                if let super::sandbox::Launcher::Bwrap(bwrap) = &sb.launcher {
                    check_access_as(bwrap, uid, gid, Need::Exec)?;
                }
                for (src, write) in sb.required_sources() {
                    check_access_as(src, uid, gid, if write { Need::ReadWrite } else { Need::Read })?;
                }
            }
        }
    }

    let start = Instant::now();
    let term_at = start + spec.timeout;
    let kill_at = term_at + spec.kill_grace;
    let hard_at = start + spec.hard_deadline();

    let spawned_program = spec.sandbox.as_ref().map(|s| s.launcher.program().0).unwrap_or_else(|| spec.program.clone());
    let spawn_start = std::time::Instant::now();
    let spawned = Started::spawn(launch, spec.spawner.as_deref());
    // fork + the child's set-up + exec (both ways return once exec has succeeded).
    let spawn_us = spawn_start.elapsed().as_micros() as u64;
    // Our copy of the write end: bubblewrap holds its own now.
    drop(status_write);
    let (mut child, [stdout, stderr]) = spawned.map_err(|source| ExecError::Spawn { program: spawned_program, source })?;
    let status_reader = status_read.map(|read| AbortOnDropT(tokio::spawn(read_status(read))));
    let pid = child.pid();
    let mut guard = GroupGuard { pgid: pid, armed: true };
    let helper = matches!(child, Started::Helper(_));
    debug!(pid, uid = ident.uid, program = %spec.program.display(), sandbox = spec.sandbox.is_some(), helper, spawn_us, "script started");

    let out_cap = Arc::new(Mutex::new(Capture::default()));
    let err_cap = Arc::new(Mutex::new(Capture::default()));
    let mut readers: Vec<AbortOnDrop> = Vec::with_capacity(2);
    if let Some(s) = stdout {
        readers.push(AbortOnDrop(tokio::spawn(pump(s, out_cap.clone(), spec.stream_cap))));
    }
    if let Some(s) = stderr {
        readers.push(AbortOnDrop(tokio::spawn(pump(s, err_cap.clone(), spec.stream_cap))));
    }

    let mut timed_out = false;
    let mut cancelled = false;
    let mut limit: Option<LimitHit> = None;
    let mut stops = Stops { cancel: spec.cancel.as_ref(), limit: spec.stop.clone() };
    let mut exited = match wait_or_stop(&mut child, term_at, &mut stops).await? {
        Waited::Exited => true,
        Waited::Cancelled => {
            cancelled = true;
            false
        }
        Waited::Limit(hit) => {
            limit = Some(hit);
            false
        }
        Waited::Deadline => {
            timed_out = true;
            debug!(pid, "timeout: SIGTERM to the process group");
            signal_group(pid, libc::SIGTERM);
            match wait_or_stop(&mut child, kill_at, &mut stops).await? {
                Waited::Exited => true,
                Waited::Cancelled => {
                    cancelled = true;
                    false
                }
                Waited::Limit(hit) => {
                    limit = Some(hit);
                    false
                }
                Waited::Deadline => false,
            }
        }
    };
    if !exited {
        debug!(pid, cancelled, ?limit, "SIGKILL to the process group");
        signal_group(pid, libc::SIGKILL);
        exited = exited_by(&mut child, hard_at).await?;
    }
    let seen_exit = spawn_start.elapsed();
    // Leader exited (zombie, pgid still reserved) or we are at the hard deadline:
    // nothing of this run may keep going in its group.
    signal_group(pid, libc::SIGKILL);
    guard.armed = false;

    let mut status: Option<ExitStatus> = None;
    if exited {
        match timeout_at(hard_at, child.wait()).await {
            Ok(Ok(s)) => status = Some(s),
            Ok(Err(source)) => return Err(ExecError::Wait { source }),
            Err(_) => exited = false,
        }
    }
    let mut hard_deadline_hit = !exited;
    if hard_deadline_hit {
        warn!(pid, "script did not exit even after SIGKILL; returning at the hard deadline (it will be reaped later)");
    }

    let reaped = spawn_start.elapsed();
    // Drain: pipes may be held open by a descendant that left the group.
    let drain_at = std::cmp::min(Instant::now() + spec.drain, hard_at);
    let all_closed = timeout_at(drain_at, async {
        for r in readers.iter_mut() {
            let _ = (&mut r.0).await;
        }
    })
    .await
    .is_ok();
    if !all_closed {
        debug!(pid, "output pipes still open after the drain (a detached descendant holds them); closing them");
        for r in readers.iter() {
            r.0.abort();
        }
        for r in readers.iter_mut() {
            let _ = (&mut r.0).await;
        }
        if drain_at == hard_at {
            hard_deadline_hit = true;
        }
    }
    drop(readers);
    let duration = start.elapsed();

    let take = |c: &Arc<Mutex<Capture>>| {
        let mut g = c.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut g.kept), g.total)
    };
    let (stdout, stdout_bytes) = take(&out_cap);
    let (stderr, stderr_bytes) = take(&err_cap);
    let exit_code = status.and_then(|s| s.code());
    let signal = status.and_then(|s| s.signal());

    if let Some(mut reader) = status_reader {
        // bwrap has exited, so its status pipe is at its end (or a
        // descendant of ours holds it, which bwrap never lets happen);
        // bounded by the hard deadline either way.
        let text = match timeout_at(std::cmp::max(hard_at, Instant::now()), &mut reader.0).await {
            Ok(Ok(text)) => text,
            _ => String::new(),
        };
        let bwrap = parse_bwrap_status(&text);
        let stopped = timed_out || cancelled || limit.is_some() || hard_deadline_hit;
        if !bwrap.program_exited && !stopped && signal.is_none() {
            // The program never ran: this is bubblewrap's own failure.
            let message = String::from_utf8_lossy(&stderr).trim().to_string();
            return Err(ExecError::SandboxSetup { code: exit_code.unwrap_or(-1), message });
        }
    }

    // NB: `..default()` although every field is named today: RunOutcome is
    // the API's shape, and a field added there must not break this file.
    #[allow(clippy::needless_update)]
    let outcome = ExecOutcome {
        outcome: RunOutcome {
            exit_code,
            signal,
            timed_out,
            cancelled,
            limit_exceeded: limit,
            duration_ms: duration.as_millis() as u64,
            stdout_bytes,
            stderr_bytes,
            stdout_truncated: stdout_bytes > stdout.len() as u64,
            stderr_truncated: stderr_bytes > stderr.len() as u64,
            ..RunOutcome::default()
        },
        stdout,
        stderr,
        duration,
        hard_deadline_hit,
        uid: ident.uid,
    };
    debug!(
        pid,
        exit_code = ?outcome.outcome.exit_code,
        signal = ?outcome.outcome.signal,
        timed_out,
        hard_deadline_hit,
        ms = duration.as_millis() as u64,
        stdout_bytes,
        stderr_bytes,
        // Since the spawn began: the exit seen, the leader reaped, the output drained.
        exit_seen_us = seen_exit.as_micros() as u64,
        reaped_us = reaped.as_micros() as u64,
        drained_us = spawn_start.elapsed().as_micros() as u64,
        "script settled"
    );
    Ok(outcome)
}
