//! Bubblewrap (`bwrap`) wrapping for [`super::process::execute`].
//!
//! When an exec spec carries a [`SandboxSpec`], the executor does not spawn the
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
//! environment containing exactly the exec spec's `env`, and bwrap passes its environment to
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
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use crate::core::limits::RUN_TMP_BYTES;

/// Which program builds the sandbox from [`bwrap_args`]' command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launcher {
    /// bubblewrap, at this absolute path (see [`detect_bwrap`]).
    Bwrap(PathBuf),
    /// This binary's `sandbox-exec` ([`crate::runner::builtin`]), exec'd
    /// through a descriptor of it that the caller keeps open and lists in
    /// the exec spec's `keep_fds`: the run's uid then needs no path to the
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
    /// open by the caller and listed in the exec spec's `keep_fds`) is bound,
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

/// What runs inside the sandbox: the part of an exec spec the sandbox's
/// command line is made of (the environment is never on it).
#[derive(Debug, Clone, Copy)]
pub struct Inside<'a> {
    pub program: &'a Path,
    pub args: &'a [OsString],
    pub cwd: &'a Path,
}

/// A sandbox path that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox path {}: {reason}", path.display())]
pub struct SandboxPathError {
    pub path: PathBuf,
    pub reason: &'static str,
}

fn check_abs(path: &Path, what: &'static str) -> Result<(), SandboxPathError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(SandboxPathError { path: path.to_path_buf(), reason: what })
    }
}

/// Validate the spec and build bwrap's argv (without the bwrap program itself).
/// Also usable for a dry-run preview: it contains no environment values.
pub fn bwrap_args(sb: &SandboxSpec, spec: &Inside<'_>) -> Result<Vec<OsString>, SandboxPathError> {
    if let Launcher::Bwrap(path) = &sb.launcher {
        check_abs(path, "the bwrap path must be absolute")?;
    }
    for (src, dst) in sb.ro_binds.iter().chain(sb.rw_binds.iter()) {
        check_abs(src, "bind sources must be absolute")?;
        check_abs(dst, "bind destinations must be absolute")?;
        if !src.exists() {
            return Err(SandboxPathError { path: src.clone(), reason: "bind source does not exist" });
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
    check_abs(spec.cwd, "the working directory must be absolute")?;
    if !sb.covers(spec.cwd) {
        return Err(SandboxPathError {
            path: spec.cwd.to_path_buf(),
            reason: "the working directory is not inside any bind or tmpfs of the sandbox; bind it (rw_bind for a work dir)",
        });
    }
    if !sb.covers(spec.program) {
        return Err(SandboxPathError {
            path: spec.program.to_path_buf(),
            reason: "the interpreter is not inside any bind of the sandbox; add its directory with ro_bind",
        });
    }
    if let Some(first) = sb.wrapper.first() {
        if !sb.covers(Path::new(first)) {
            return Err(SandboxPathError {
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
