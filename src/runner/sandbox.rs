//! Bubblewrap (`bwrap`) wrapping for [`super::process::execute`].
//!
//! When an [`ExecSpec`] carries a [`SandboxSpec`], the executor does not spawn the
//! interpreter itself: it spawns `bwrap` with the argv built by [`bwrap_args`], and
//! bwrap execs the interpreter inside fresh namespaces. Everything else (uid drop,
//! rlimits, process group, timeout, caps on output) is applied by the executor to the
//! bwrap process and therefore inherited by everything inside.
//!
//! # Flags, and why each one
//!
//! * `--unshare-all` — new user, mount, IPC, UTS, cgroup, **PID** and **network**
//!   namespaces. The new network namespace has only a loopback of its own, so the
//!   script has no network at all (not even the host's 127.0.0.1 services).
//!   `--share-net` is never used: a run with granted egress gets the same empty
//!   namespace plus the egress proxy's unix socket bound in and a forwarder on its
//!   own 127.0.0.1 ([`super::egress`], [`super::init`]), so the proxy is its only
//!   way out and the server's endpoint and every host-local service stay unreachable.
//! * `--unshare-user` explicitly, plus `--disable-userns` — the child cannot create
//!   nested user namespaces (the usual first step of kernel attack surface probing).
//!   Requires bwrap >= 0.8.
//! * `--cap-drop ALL` — no capabilities inside, even if bwrap were started as root.
//! * `--die-with-parent` — bwrap gets `PR_SET_PDEATHSIG(SIGKILL)`. The PID namespace
//!   init is bwrap itself, so when the outer bwrap dies (our SIGTERM/SIGKILL on
//!   timeout, or the server dying) the kernel kills *every* process in the PID
//!   namespace, detached grandchildren included. This is stronger than the process
//!   group signal of the unsandboxed path. Caveat: PDEATHSIG fires when the *thread*
//!   that forked bwrap exits; tokio runtime worker threads live as long as the
//!   runtime, so call `execute` from a runtime task, not from a short-lived thread.
//! * `--new-session` — `setsid()` inside, so the script cannot push input into a
//!   controlling terminal with TIOCSTI. Side effect: the script is in its own session
//!   inside, so our group SIGTERM reaches the outer bwrap only; bwrap then dies and
//!   the namespace is torn down (SIGKILL). The script gets no graceful SIGTERM.
//! * `--proc /proc` (fresh procfs of the new PID namespace: the server and every other
//!   host process are invisible, so `/proc/<ppid>/environ` of the server does not
//!   exist), `--dev /dev` (minimal devtmpfs: null, zero, random, urandom, tty...),
//!   `--size N --tmpfs /tmp` and `--size N --tmpfs /dev/shm` (private, sized to
//!   [`RUN_TMP_BYTES`], vanish with the sandbox; a root server binds a host tmpfs it
//!   mounted for the run instead, so it can tell afterwards that it filled up), then
//!   `--remount-ro /dev` and `--remount-ro /`: bubblewrap's root and `/dev` are tmpfs
//!   of half the RAM, writable unless remounted.
//! * Read-only system binds: `/usr` and the merged-/usr symlinks (`/bin`, `/lib`,
//!   `/lib64`, `/sbin` mirrored as symlinks when they are symlinks on the host, or
//!   read-only binds when not), `/etc/ld.so.cache`, `/etc/alternatives`,
//!   `/etc/localtime` (try-binds: skipped if absent). Nothing from `/root`, `/home`,
//!   `/work`, `/var`, `/run`, or the rest of `/etc` (no `/etc/passwd`, no host
//!   secrets). With `network: true` (egress through the proxy), the files TLS and
//!   name lookups read are added (`/etc/resolv.conf`, `/etc/hosts`,
//!   `/etc/nsswitch.conf`, `/etc/ssl`, `/etc/ca-certificates`); DNS itself goes
//!   nowhere, the proxy resolves names.
//! * `--json-status-fd`: how the runner tells bubblewrap's own failure from the
//!   script's exit (see [`super::process`]); the script never holds this descriptor.
//! * Caller binds: the skill package via [`SandboxSpec::ro_bind`], a private work dir
//!   via [`SandboxSpec::rw_bind`]; `--chdir` to the spec's `cwd`.
//!
//! # Environment
//!
//! The brief asked for `--clearenv` + the given env. We get the same result without
//! putting values on bwrap's command line: bwrap is spawned with a *cleared*
//! environment containing exactly `ExecSpec::env`, and bwrap passes its environment to
//! the child unchanged. `--setenv NAME VALUE` would put every granted secret into
//! `/proc/<bwrap-pid>/cmdline`, which is world-readable on the host for the life of
//! the sandbox; the environment is readable only by the same uid / CAP_SYS_PTRACE.
//! One addition cannot be avoided: bwrap always exports `PWD` (= `--chdir`) after
//! its own option processing, so the sandboxed child sees `PWD=<cwd>` on top of the
//! given variables.
//!
//! # Identity
//!
//! When the server is root, the executor switches to the run-as uid *before* exec'ing
//! bwrap, so bwrap runs unprivileged and builds a user namespace mapping that uid to
//! itself. The script's kernel uid (kuid) is then the unprivileged uid, which is what
//! makes `RLIMIT_NPROC` apply (it is not enforced for kuid 0, and `bwrap --uid` run as
//! root would map the inside uid to kuid 0 outside).
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::process::{execute, ExecError, ExecSpec, RunAs};
use crate::core::limits::RUN_TMP_BYTES;

/// Which program builds the sandbox from [`bwrap_args`]' command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launcher {
    /// bubblewrap, at this absolute path (see [`detect_bwrap`]).
    Bwrap(PathBuf),
    /// This binary's `sandbox-exec` ([`crate::runner::builtin`]), exec'd
    /// through a descriptor of it that the caller keeps open and lists in
    /// [`ExecSpec::keep_fds`]: the run's uid then needs no path to the
    /// binary (a server under a 0700 home still sandboxes its runs).
    Builtin(RawFd),
}

impl Launcher {
    /// The program to exec and the arguments before bubblewrap's options.
    pub(crate) fn program(&self) -> (PathBuf, Option<&'static str>) {
        match self {
            Launcher::Bwrap(path) => (path.clone(), None),
            Launcher::Builtin(fd) => (PathBuf::from(format!("/proc/self/fd/{fd}")), Some("sandbox-exec")),
        }
    }

    /// The name a preview and the status give this sandbox.
    pub fn name(&self) -> &'static str {
        match self {
            Launcher::Bwrap(_) => "bubblewrap",
            Launcher::Builtin(_) => "builtin",
        }
    }
}

/// How to build the sandbox. Paths are absolute; binds are
/// `(host source, path inside the sandbox)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The program that builds it: bubblewrap or the built-in sandbox.
    pub launcher: Launcher,
    /// Read-only binds whose source must exist (validated before spawn).
    pub ro_binds: Vec<(PathBuf, PathBuf)>,
    /// Read-only binds skipped silently when the source is missing (`--ro-bind-try`).
    pub ro_binds_try: Vec<(PathBuf, PathBuf)>,
    /// Writable binds whose source must exist.
    pub rw_binds: Vec<(PathBuf, PathBuf)>,
    /// `(target, link)`: `--symlink target link`.
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// Private tmpfs mounts of a fixed size in bytes (`--size`), mounted
    /// before the caller binds (so a bind may live under one).
    pub tmpfs: Vec<(PathBuf, u64)>,
    /// The run reaches the network through the egress proxy: the files TLS
    /// clients need (CA certificates) are bound too. The sandbox never
    /// shares the host's network namespace: its only way out is the
    /// proxy's socket, bound in by the runner.
    pub network: bool,
    /// `(descriptor, path inside)`: `--ro-bind-fd`. The descriptor (kept
    /// open by the caller and listed in [`ExecSpec::keep_fds`]) is bound,
    /// not a path, so the run-as uid needs no access to where it lives.
    pub fd_binds: Vec<(RawFd, PathBuf)>,
    /// Programs and arguments placed before the script's interpreter
    /// (`skill-operator sandbox-init ... --`); empty for none.
    pub wrapper: Vec<OsString>,
    /// Set by [`super::process::execute`]: bubblewrap's `--json-status-fd`.
    pub status_fd: Option<RawFd>,
}

/// Host directories that may be merged-/usr symlinks; mirrored as symlinks or bound read-only.
const ROOT_LINK_CANDIDATES: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// Small read-only files the dynamic loader and runtimes want.
const ETC_RUNTIME: &[&str] = &["/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime"];
/// Added only with `network: true` (egress through the proxy).
const ETC_NETWORK: &[&str] = &["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/ssl", "/etc/ca-certificates", "/etc/gai.conf"];

impl SandboxSpec {
    /// A sandbox with only the system runtime visible (read-only `/usr`, the root
    /// symlinks, loader cache), a tmpfs `/tmp`, and no network. Add the skill package
    /// with [`Self::ro_bind`] and a work dir with [`Self::rw_bind`].
    pub fn new(bwrap: impl Into<PathBuf>) -> Self {
        Self::with_launcher(Launcher::Bwrap(bwrap.into()))
    }

    /// The same sandbox, built by this binary's `sandbox-exec` from `exe`,
    /// an open descriptor of it (kept open by the caller, in `keep_fds`).
    pub fn builtin(exe: RawFd) -> Self {
        Self::with_launcher(Launcher::Builtin(exe))
    }

    pub fn with_launcher(launcher: Launcher) -> Self {
        let mut ro_binds = vec![(PathBuf::from("/usr"), PathBuf::from("/usr"))];
        let mut symlinks = Vec::new();
        for cand in ROOT_LINK_CANDIDATES {
            let p = Path::new(cand);
            match std::fs::symlink_metadata(p) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(p) {
                        symlinks.push((target, p.to_path_buf()));
                    }
                }
                Ok(m) if m.is_dir() => ro_binds.push((p.to_path_buf(), p.to_path_buf())),
                _ => {}
            }
        }
        SandboxSpec {
            launcher,
            ro_binds,
            ro_binds_try: ETC_RUNTIME.iter().map(|p| (PathBuf::from(p), PathBuf::from(p))).collect(),
            rw_binds: Vec::new(),
            symlinks,
            tmpfs: vec![(PathBuf::from("/tmp"), RUN_TMP_BYTES), (PathBuf::from("/dev/shm"), RUN_TMP_BYTES)],
            network: false,
            fd_binds: Vec::new(),
            wrapper: Vec::new(),
            status_fd: None,
        }
    }

    /// Bind `path` read-only at the same path inside.
    pub fn ro_bind(mut self, path: impl Into<PathBuf>) -> Self {
        let p = path.into();
        self.ro_binds.push((p.clone(), p));
        self
    }

    /// Bind `path` writable at the same path inside.
    pub fn rw_bind(mut self, path: impl Into<PathBuf>) -> Self {
        let p = path.into();
        self.rw_binds.push((p.clone(), p));
        self
    }

    /// Bind the files a TLS client needs (`true`: the run has egress
    /// through the proxy); the network namespace is the sandbox's own either way.
    pub fn with_network(mut self, network: bool) -> Self {
        self.network = network;
        self
    }

    /// Host paths the run-as uid must be able to read (and, for rw, write) for bwrap
    /// to set the binds up: `(path, writable)`.
    pub(crate) fn required_sources(&self) -> impl Iterator<Item = (&Path, bool)> {
        self.ro_binds.iter().map(|(s, _)| (s.as_path(), false)).chain(self.rw_binds.iter().map(|(s, _)| (s.as_path(), true)))
    }

    /// Is `inside` (a path in the sandbox view) under one of the mounts or symlinks?
    pub(crate) fn covers(&self, inside: &Path) -> bool {
        if inside == Path::new("/") {
            return true;
        }
        self.ro_binds
            .iter()
            .chain(self.rw_binds.iter())
            .chain(self.ro_binds_try.iter())
            .map(|(_, d)| d.as_path())
            .chain(self.symlinks.iter().map(|(_, l)| l.as_path()))
            .chain(self.tmpfs.iter().map(|(p, _)| p.as_path()))
            .chain(self.fd_binds.iter().map(|(_, p)| p.as_path()))
            .any(|d| inside.starts_with(d))
    }
}

fn check_abs(path: &Path, what: &'static str) -> Result<(), ExecError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(ExecError::SandboxPath { path: path.to_path_buf(), reason: what })
    }
}

/// Validate the spec and build bwrap's argv (without the bwrap program itself).
/// Also usable for a dry-run preview: it contains no environment values.
pub fn bwrap_args(sb: &SandboxSpec, spec: &ExecSpec) -> Result<Vec<OsString>, ExecError> {
    if let Launcher::Bwrap(path) = &sb.launcher {
        check_abs(path, "the bwrap path must be absolute")?;
    }
    for (src, dst) in sb.ro_binds.iter().chain(sb.rw_binds.iter()) {
        check_abs(src, "bind sources must be absolute")?;
        check_abs(dst, "bind destinations must be absolute")?;
        if !src.exists() {
            return Err(ExecError::SandboxPath { path: src.clone(), reason: "bind source does not exist" });
        }
    }
    for (src, dst) in &sb.ro_binds_try {
        check_abs(src, "bind sources must be absolute")?;
        check_abs(dst, "bind destinations must be absolute")?;
    }
    for (_, link) in &sb.symlinks {
        check_abs(link, "symlink paths must be absolute")?;
    }
    for (t, _) in &sb.tmpfs {
        check_abs(t, "tmpfs mount points must be absolute")?;
    }
    for (_, dest) in &sb.fd_binds {
        check_abs(dest, "bind destinations must be absolute")?;
    }
    check_abs(&spec.cwd, "the working directory must be absolute")?;
    if !sb.covers(&spec.cwd) {
        return Err(ExecError::SandboxPath {
            path: spec.cwd.clone(),
            reason: "the working directory is not inside any bind or tmpfs of the sandbox; bind it (rw_bind for a work dir)",
        });
    }
    if !sb.covers(&spec.program) {
        return Err(ExecError::SandboxPath {
            path: spec.program.clone(),
            reason: "the interpreter is not inside any bind of the sandbox; add its directory with ro_bind",
        });
    }
    if let Some(first) = sb.wrapper.first() {
        if !sb.covers(Path::new(first)) {
            return Err(ExecError::SandboxPath {
                path: PathBuf::from(first),
                reason: "the wrapper program is not inside any bind of the sandbox",
            });
        }
    }

    let mut a: Vec<OsString> = Vec::with_capacity(64 + 2 * spec.args.len());
    let mut push = |s: &str| a.push(OsString::from(s));
    push("--unshare-all");
    push("--unshare-user");
    push("--disable-userns");
    push("--cap-drop");
    push("ALL");
    push("--die-with-parent");
    push("--new-session");
    let pair = |a: &mut Vec<OsString>, flag: &str, x: &Path, y: &Path| {
        a.push(flag.into());
        a.push(x.as_os_str().to_owned());
        a.push(y.as_os_str().to_owned());
    };
    // System binds first (they are the first entries of ro_binds when built by new());
    // order matters only in that tmpfs must precede binds that live beneath it.
    for (target, link) in &sb.symlinks {
        pair(&mut a, "--symlink", target, link);
    }
    a.push("--proc".into());
    a.push("/proc".into());
    a.push("--dev".into());
    a.push("/dev".into());
    for (t, size) in &sb.tmpfs {
        a.push("--size".into());
        a.push(size.to_string().into());
        a.push("--tmpfs".into());
        a.push(t.as_os_str().to_owned());
    }
    for (s, d) in &sb.ro_binds {
        pair(&mut a, "--ro-bind", s, d);
    }
    for (s, d) in &sb.ro_binds_try {
        pair(&mut a, "--ro-bind-try", s, d);
    }
    if sb.network {
        for p in ETC_NETWORK {
            pair(&mut a, "--ro-bind-try", Path::new(p), Path::new(p));
        }
    }
    for (s, d) in &sb.rw_binds {
        pair(&mut a, "--bind", s, d);
    }
    for (fd, d) in &sb.fd_binds {
        a.push("--ro-bind-fd".into());
        a.push(fd.to_string().into());
        a.push(d.as_os_str().to_owned());
    }
    // Every mount point exists now: the root and /dev become read-only
    // (they are tmpfs of half the RAM otherwise; what a run may write is
    // /work, the sized /tmp and /dev/shm).
    a.push("--remount-ro".into());
    a.push("/dev".into());
    a.push("--remount-ro".into());
    a.push("/".into());
    if let Some(fd) = sb.status_fd {
        a.push("--json-status-fd".into());
        a.push(fd.to_string().into());
    }
    a.push("--chdir".into());
    a.push(spec.cwd.as_os_str().to_owned());
    a.push("--".into());
    a.extend(sb.wrapper.iter().cloned());
    a.push(spec.program.as_os_str().to_owned());
    a.extend(spec.args.iter().cloned());
    Ok(a)
}

/// Find a `bwrap` binary: the server's own `PATH` first, then the usual locations.
/// Existence is not enough to use it — run [`bwrap_self_test`] once at startup.
pub fn detect_bwrap() -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let mut candidates: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).map(|d| d.join("bwrap")).collect()).unwrap_or_default();
    candidates.extend(["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"].iter().map(PathBuf::from));
    candidates.into_iter().filter(|p| p.is_absolute()).find_map(|p| {
        let m = std::fs::metadata(&p).ok()?;
        (m.is_file() && m.permissions().mode() & 0o111 != 0).then(|| std::fs::canonicalize(&p).unwrap_or(p))
    })
}

/// Prove that bwrap actually works here, as the uid scripts will run as: it may be
/// installed yet fail (user namespaces disabled by sysctl or by a container's seccomp
/// profile, bwrap < 0.8 without `--disable-userns`, ...). Runs `true` in exactly the
/// sandbox shape the executor uses. Call once at startup and fall back (or refuse) on
/// error; the error carries bwrap's own message.
///
/// A probe that failed for want of a kernel resource at that moment (EAGAIN
/// from clone(2): the user-namespace or process count while other sandboxes
/// start) says nothing about whether bwrap works here, and the verdict lasts
/// the server's lifetime: it is tried again, [`SELF_TEST_ATTEMPTS`] times in
/// all, before the sandbox is given up.
pub async fn bwrap_self_test(bwrap: &Path, run_as: RunAs) -> Result<(), ExecError> {
    sandbox_self_test(&Launcher::Bwrap(bwrap.to_path_buf()), None, run_as).await
}

/// [`bwrap_self_test`] for the built-in sandbox: `exe` is an open
/// descriptor of this binary (see [`Launcher::Builtin`]).
pub async fn builtin_self_test(exe: Arc<OwnedFd>, run_as: RunAs) -> Result<(), ExecError> {
    sandbox_self_test(&Launcher::Builtin(exe.as_raw_fd()), Some(exe), run_as).await
}

async fn sandbox_self_test(launcher: &Launcher, keep: Option<Arc<OwnedFd>>, run_as: RunAs) -> Result<(), ExecError> {
    let mut pause = SELF_TEST_FIRST_PAUSE;
    for attempt in 1..SELF_TEST_ATTEMPTS {
        match self_test_once(launcher, keep.clone(), run_as).await {
            Err(ExecError::SandboxSelfTest { message }) if message.contains(TRANSIENT) => {
                tracing::warn!(sandbox = launcher.name(), attempt, %message, "sandbox self-test hit a transient limit; trying again");
                tokio::time::sleep(pause).await;
                pause *= 2;
            }
            other => return other,
        }
    }
    self_test_once(launcher, keep, run_as).await
}

/// How often the self-test runs when it keeps failing transiently, and its
/// first pause (doubled after each try: 0.1 + 0.2 + 0.4 s at most).
pub const SELF_TEST_ATTEMPTS: u32 = 4;
const SELF_TEST_FIRST_PAUSE: Duration = Duration::from_millis(100);
/// strerror(EAGAIN), as bwrap (and the built-in sandbox) print it.
const TRANSIENT: &str = "Resource temporarily unavailable";

async fn self_test_once(launcher: &Launcher, keep: Option<Arc<OwnedFd>>, run_as: RunAs) -> Result<(), ExecError> {
    let program = ["/usr/bin/true", "/bin/true"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| ExecError::SandboxSelfTest { message: "no /usr/bin/true to run inside the sandbox".into() })?;
    let mut spec = ExecSpec::new(program, "/");
    spec.env = vec![("PATH".into(), "/usr/bin:/bin".into())];
    spec.timeout = Duration::from_secs(10);
    spec.run_as = run_as;
    spec.sandbox = Some(SandboxSpec::with_launcher(launcher.clone()));
    spec.keep_fds.extend(keep);
    let out = match execute(spec).await {
        Ok(o) => o,
        Err(ExecError::SandboxSetup { message, .. }) => return Err(ExecError::SandboxSelfTest { message }),
        Err(e) => return Err(ExecError::SandboxSelfTest { message: e.to_string() }),
    };
    if out.outcome.exit_code == Some(0) {
        tracing::debug!(sandbox = launcher.name(), "sandbox self-test passed");
        Ok(())
    } else {
        Err(ExecError::SandboxSelfTest {
            message: format!(
                "exit {:?}, signal {:?}, timed out {}: {}",
                out.outcome.exit_code,
                out.outcome.signal,
                out.outcome.timed_out,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}
