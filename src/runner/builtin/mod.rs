//! `skill-operator sandbox-exec`: the built-in sandbox, for machines
//! without bubblewrap. It takes bubblewrap's command line (the subset
//! [`crate::runner::sandbox::bwrap_args`] writes, nothing else: [`args`])
//! and builds the same sandbox with the same kernel features: new user,
//! mount, PID, network, IPC, UTS and cgroup namespaces; a tmpfs root with
//! read-only system binds ([`mounts`]); no capabilities; no nested user
//! namespaces ([`seccomp`]); `--json-status-fd` written as bubblewrap
//! writes it, so [`crate::runner::process`] tells a sandbox that failed to
//! set up from a script that failed, whichever backend ran.
//!
//! # Processes
//! - The launcher (this process, exec'd by the executor with the run's
//!   uid, rlimits and cgroup already set): clones the sandbox's first
//!   process into the new namespaces, writes its uid and gid maps (the
//!   run's uid mapped to itself, `setgroups` denied), reports
//!   `child-pid`, waits, reports `exit-code` once the program had been
//!   started, and exits with its status. It dies with its parent
//!   (`PR_SET_PDEATHSIG`), and the sandbox dies with it.
//! - The sandbox's init (PID 1 inside): builds the filesystem, brings up
//!   its own loopback, drops every capability (so a script of the same
//!   uid that reaches it gains nothing), blanks its command line, then
//!   forks the program and reaps whatever the script leaves behind. When
//!   the program exits so does init, and the kernel kills everything else
//!   in the PID namespace, detached grandchildren included.
//! - The program: its own session (`setsid`, no TIOCSTI into a terminal),
//!   `no_new_privs`, the seccomp filter, no descriptor but 0-2, then exec.
//!
//! Runs before any runtime thread exists (`main` dispatches it first):
//! the clone below is a fork of a single-threaded process, so the
//! children may allocate.

pub mod args;
pub mod mounts;
pub mod seccomp;

use std::ffi::{CString, OsString};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use args::Plan;

/// The namespaces of the sandbox (bubblewrap's `--unshare-all --unshare-user`).
const NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP;

/// Exit status of the launcher when the sandbox could not be built (as bubblewrap's).
const SETUP_FAILED: u8 = 1;

/// What the command line names it in messages.
const NAME: &str = "sandbox-exec";

fn die(what: impl std::fmt::Display) -> ! {
    let _ = writeln!(io::stderr(), "{NAME}: {what}");
    // SAFETY: ends this process at once (no destructors to run in a fork child).
    unsafe { libc::_exit(SETUP_FAILED as libc::c_int) }
}

/// The subcommand: carry out `args` or say why not (exit 1, no `exit-code` status).
pub fn command(args: Vec<OsString>) -> ExitCode {
    let mut plan = match args::parse(&args) {
        Ok(plan) => plan,
        Err(err) => {
            eprintln!("{NAME}: {err}");
            return ExitCode::from(SETUP_FAILED);
        }
    };
    plan.ops = match mounts::resolve_sources(std::mem::take(&mut plan.ops)) {
        Ok(ops) => ops,
        Err(err) => {
            eprintln!("{NAME}: {err}");
            return ExitCode::from(SETUP_FAILED);
        }
    };
    let Some(filter) = seccomp::program() else {
        eprintln!("{NAME}: the built-in sandbox has no seccomp filter for this architecture; install bubblewrap");
        return ExitCode::from(SETUP_FAILED);
    };
    ExitCode::from(launch(plan, &filter))
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two-element array or fails.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn write_all(fd: RawFd, bytes: &[u8]) -> io::Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: a live buffer of the given length.
        let n = unsafe { libc::write(fd, bytes[done..].as_ptr().cast(), bytes.len() - done) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

fn read_byte(fd: RawFd) -> Option<u8> {
    let mut b = 0u8;
    loop {
        // SAFETY: one byte into a live local.
        let n = unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) };
        if n == 1 {
            return Some(b);
        }
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None;
    }
}

/// The launcher's side. Returns its exit status.
fn launch(plan: Plan, filter: &[libc::sock_filter]) -> u8 {
    // SAFETY: plain prctl; the sandbox must not outlive whoever started it.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    // SAFETY: trivial getters.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let (go_read, go_write) = pipe().unwrap_or_else(|e| die(format_args!("pipe: {e}")));
    let (started_read, started_write) = pipe().unwrap_or_else(|e| die(format_args!("pipe: {e}")));

    // SAFETY: a fork-like clone of this single-threaded process (null stack).
    let pid = unsafe { libc::syscall(libc::SYS_clone, (NAMESPACES | libc::SIGCHLD) as libc::c_ulong, 0usize, 0usize, 0usize, 0usize) };
    if pid < 0 {
        let err = io::Error::last_os_error();
        die(format_args!(
            "cannot create the sandbox's namespaces: {err} (unprivileged user namespaces are off here: see sysctl kernel.unprivileged_userns_clone, user.max_user_namespaces, or an AppArmor userns restriction; or install bubblewrap)"
        ));
    }
    if pid == 0 {
        drop(go_write);
        drop(started_read);
        if let Some(fd) = plan.status_fd {
            // SAFETY: the status descriptor is the launcher's alone.
            unsafe { libc::close(fd) };
        }
        init(&plan, filter, go_read, started_write);
    }
    let pid = pid as libc::pid_t;
    drop(go_read);
    drop(started_write);
    if let Err(e) = write_maps(pid, uid, gid) {
        // SAFETY: our own child, killed before it can run anything.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        die(format_args!("cannot write the sandbox's uid/gid maps: {e}"));
    }
    if let Some(fd) = plan.status_fd {
        let _ = write_all(fd, format!("{{ \"child-pid\": {pid} }}\n").as_bytes());
    }
    let _ = write_all(go_write.as_raw_fd(), b"g");
    drop(go_write);

    let status = wait_for(pid);
    let code = status_code(status);
    let started = read_byte(started_read.as_raw_fd()).is_some();
    if started {
        if let Some(fd) = plan.status_fd {
            let _ = write_all(fd, format!("{{ \"exit-code\": {code} }}\n").as_bytes());
        }
    }
    code
}

fn write_maps(pid: libc::pid_t, uid: libc::uid_t, gid: libc::gid_t) -> io::Result<()> {
    let proc = format!("/proc/{pid}");
    std::fs::write(format!("{proc}/setgroups"), b"deny")?;
    std::fs::write(format!("{proc}/uid_map"), format!("{uid} {uid} 1\n"))?;
    std::fs::write(format!("{proc}/gid_map"), format!("{gid} {gid} 1\n"))?;
    Ok(())
}

fn wait_for(pid: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return status;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return 0x7f00;
        }
    }
}

/// A wait status as a shell reports it: the exit code, or 128 + the signal.
fn status_code(status: libc::c_int) -> u8 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status) as u8
    } else if libc::WIFSIGNALED(status) {
        (128 + libc::WTERMSIG(status)) as u8
    } else {
        SETUP_FAILED
    }
}

/// The sandbox's PID 1. Never returns.
fn init(plan: &Plan, filter: &[libc::sock_filter], go: OwnedFd, started: OwnedFd) -> ! {
    // SAFETY: plain prctl: init (and so the namespace) dies with the launcher.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) };
    if read_byte(go.as_raw_fd()).is_none() {
        die("the launcher went away before the sandbox was set up");
    }
    drop(go);
    hide_command_line();
    if let Err(e) = mounts::build(&plan.ops) {
        die(e);
    }
    if let Err(e) = loopback_up() {
        die(format_args!("cannot bring up the sandbox's loopback: {e}"));
    }
    // SAFETY: a plain prctl on this process.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            die(format_args!("no_new_privs: {}", io::Error::last_os_error()));
        }
    }
    if let Err(e) = drop_capabilities() {
        die(format_args!("cannot drop capabilities: {e}"));
    }
    let argv = cstrings(plan.argv.iter().map(|a| a.as_bytes()));
    let mut env: Vec<Vec<u8>> =
        std::env::vars_os().filter(|(k, _)| k != "PWD").map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat()).collect();
    let cwd = plan.chdir.clone().unwrap_or_else(|| "/".into());
    env.push([b"PWD=".as_slice(), cwd.as_os_str().as_bytes()].concat());
    let envp = cstrings(env.iter().map(|e| e.as_slice()));
    let cwd_c = CString::new(cwd.as_os_str().as_bytes()).unwrap_or_else(|_| die("the working directory has a NUL byte"));

    // SAFETY: fork of a single-threaded process.
    let child = unsafe { libc::fork() };
    if child < 0 {
        die(format_args!("fork: {}", io::Error::last_os_error()));
    }
    if child == 0 {
        program(&argv, &envp, &cwd_c, filter, started);
    }
    drop(started);
    reap(child)
}

fn cstrings<'a>(items: impl Iterator<Item = &'a [u8]>) -> Vec<CString> {
    items.map(|b| CString::new(b).unwrap_or_else(|_| die("an argument or variable has a NUL byte"))).collect()
}

/// The program's process. Never returns.
fn program(argv: &[CString], envp: &[CString], cwd: &CString, filter: &[libc::sock_filter], started: OwnedFd) -> ! {
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut envp_p: Vec<*const libc::c_char> = envp.iter().map(|a| a.as_ptr()).collect();
    envp_p.push(std::ptr::null());
    // SAFETY: syscalls on this process with live, NUL-terminated arguments.
    unsafe {
        if libc::setsid() < 0 {
            die(format_args!("setsid: {}", io::Error::last_os_error()));
        }
        if libc::chdir(cwd.as_ptr()) != 0 {
            die(format_args!("chdir {:?}: {}", cwd, io::Error::last_os_error()));
        }
        if let Err(e) = seccomp::install(filter) {
            die(format_args!("seccomp: {e}"));
        }
        let _ = write_all(started.as_raw_fd(), b"s");
        // Nothing but stdin, stdout and stderr reaches the program.
        libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint);
        libc::execve(argv_p[0], argv_p.as_ptr(), envp_p.as_ptr());
        let _ = writeln!(io::stderr(), "{NAME}: execve {:?}: {}", argv[0], io::Error::last_os_error());
        libc::_exit(127)
    }
}

/// PID 1's loop: reap everything, leave with the program's status.
fn reap(program: libc::pid_t) -> ! {
    loop {
        let mut status = 0;
        // SAFETY: reaps any child of ours.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r == program {
            // SAFETY: ends init; the kernel then kills the rest of the namespace.
            unsafe { libc::_exit(status_code(status) as libc::c_int) }
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            // SAFETY: as above.
            unsafe { libc::_exit(SETUP_FAILED as libc::c_int) }
        }
    }
}

/// Bring up `lo` in the sandbox's own network namespace (the forwarder to
/// the egress proxy listens there; nothing else is reachable).
fn loopback_up() -> io::Result<()> {
    // SAFETY: a socket only for the ioctls below, closed by OwnedFd.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is fresh and ours.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we own.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Blank this process's command line in place (`/proc/1/cmdline` is
/// world-readable inside, and the launcher's names every host path it
/// binds): what the script sees of its init is `init`.
fn hide_command_line() {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return };
    // Fields after the ")" that closes comm; arg_start and arg_end are fields 48 and 49.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { return };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (Some(start), Some(end)) =
        (fields.get(45).and_then(|f| f.parse::<usize>().ok()), fields.get(46).and_then(|f| f.parse::<usize>().ok()))
    else {
        return;
    };
    if end <= start {
        return;
    }
    const TITLE: &[u8] = b"init\0";
    // SAFETY: [start, end) is this process's own argument area, which the
    // kernel mapped writable and nothing reads once the plan is parsed.
    unsafe {
        std::ptr::write_bytes(start as *mut u8, 0, end - start);
        std::ptr::copy_nonoverlapping(TITLE.as_ptr(), start as *mut u8, TITLE.len().min(end - start));
    }
}

/// No capability left in any set, and none to gain back (bounding and
/// ambient sets cleared).
fn drop_capabilities() -> io::Result<()> {
    let last =
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse::<libc::c_ulong>().ok()).unwrap_or(40);
    // SAFETY: plain prctls on this process.
    unsafe {
        for cap in 0..=last {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                return Err(io::Error::last_os_error());
            }
        }
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0);
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header { version: VERSION_3, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset with a v3 header and its two data words.
    if unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
