//! The forked child's side of a start, shared by the direct spawn
//! ([`super::process`]) and the spawn helper ([`super::spawn_helper`]):
//! what it is given, computed before the fork, and the fence's set-up it
//! runs between fork and exec.

use std::ffi::OsString;
use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;

/// One rlimit, soft and hard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    pub cur: u64,
    pub max: u64,
}

impl Rlimit {
    pub fn both(v: u64) -> Rlimit {
        Rlimit { cur: v, max: v }
    }

    fn raw(self) -> libc::rlimit {
        libc::rlimit { rlim_cur: self.cur as libc::rlim_t, rlim_max: self.max as libc::rlim_t }
    }
}

/// rlimits computed in the parent so the child does no allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChildLimits {
    pub data: Option<Rlimit>,
    pub addr: Option<Rlimit>,
    pub nproc: Option<Rlimit>,
    pub fsize: Option<Rlimit>,
    pub cpu: Option<Rlimit>,
    pub nofile: Option<Rlimit>,
}

/// Everything the forked child needs, computed before the fork (no
/// allocation happens after it).
#[derive(Debug, Clone)]
pub struct ChildPlan {
    pub limits: ChildLimits,
    /// `cgroup.procs` descriptors to write `0` into.
    pub cgroups: Vec<RawFd>,
    /// Descriptors to keep across exec.
    pub keep: Vec<RawFd>,
    /// `(uid, gid)` to switch to, after joining the cgroups.
    pub switch: Option<(u32, u32)>,
    /// The server is root: clear supplementary groups on a switch.
    pub clear_groups: bool,
}

/// Runs in the forked child between fork and exec, after std has applied
/// chdir and setpgid. Async-signal-safe calls only; no allocation, no
/// locks. The order matters: the cgroups are joined while the child still
/// has the server's privileges (the run's `cgroup.procs` belong to the
/// server), then the uid is dropped, then the limits that count per uid
/// are set.
pub fn child_setup(p: &ChildPlan) -> io::Result<()> {
    // SAFETY: each call is async-signal-safe and takes only plain values / pointers to
    // values owned by this stack frame or by `p`, which outlives the fork.
    unsafe {
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        for fd in &p.cgroups {
            if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some((uid, gid)) = p.switch {
            if p.clear_groups && libc::setgroups(0, std::ptr::null()) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let l = &p.limits;
        macro_rules! set {
            ($res:expr, $v:expr) => {
                if let Some(v) = $v {
                    if libc::setrlimit($res, &Rlimit::raw(v)) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
            };
        }
        set!(libc::RLIMIT_CORE, Some(Rlimit::both(0)));
        set!(libc::RLIMIT_DATA, l.data);
        set!(libc::RLIMIT_AS, l.addr);
        set!(libc::RLIMIT_NPROC, l.nproc);
        set!(libc::RLIMIT_FSIZE, l.fsize);
        set!(libc::RLIMIT_CPU, l.cpu);
        set!(libc::RLIMIT_NOFILE, l.nofile);
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Mark every fd >= 3 close-on-exec (fds the server inherited without
        // O_CLOEXEC). CLOEXEC rather than close: std's own exec-error pipe must stay
        // open until exec. Best effort on kernels < 5.11.
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
        libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC);
        // Then exactly the descriptors the program is meant to have.
        for fd in &p.keep {
            if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// A start, computed before any fork: the same for a direct spawn and
/// for the spawn helper ([`super::spawn_helper`]).
pub struct Launch {
    pub program: PathBuf,
    /// argv after `argv[0]` (which is `program`).
    pub args: Vec<OsString>,
    /// The whole environment.
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
    pub plan: ChildPlan,
}
