//! The helper process itself (`skill-operator spawn-helper --fd N`): a
//! single-threaded loop that reads one request, forks the script with
//! `clone3(CLONE_PARENT | CLONE_PIDFD)`, waits only until its `execve`
//! has succeeded or failed, and answers with the pidfd.
//!
//! The child is born a child of the *server* (`CLONE_PARENT`), so the
//! server waits for it, reaps it and reads its exit status exactly as for
//! a process it forked itself; the helper keeps no state between requests.
//! It runs nothing but this loop, before and after any request: no async
//! runtime, no threads, so forking it is as cheap and as safe as forking a
//! small C program, and its child may run ordinary code until `execve`.

use std::ffi::{CString, OsString};
use std::io::{self, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::process::ExitCode;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

use super::super::child::{child_setup, ChildPlan};
use super::wire::{Reply, Request, Stage, MAX_REQUEST_BYTES, MAX_REQUEST_FDS};

/// `skill-operator spawn-helper`: serve requests on descriptor `fd` until
/// the server closes its end.
pub fn main(fd: RawFd) -> ExitCode {
    // SAFETY: plain prctl calls. The helper holds the runs' descriptors
    // (cgroups, output pipes) and, for a root server, root's privileges:
    // a script of the server's own uid must not ptrace it or read its
    // memory. (It outlives no server: the server's end of the socket
    // closes however the server ends, and the loop below ends with it.
    // Not PR_SET_PDEATHSIG, which fires when the *thread* that started
    // it exits, and tokio ends idle threads.)
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong);
        // Exec'd as /proc/self/fd/N, it would be called "N" in ps and top.
        libc::prctl(
            libc::PR_SET_NAME,
            c"spawn-helper".as_ptr() as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        );
    }
    if fd < 3 {
        eprintln!("skill-operator spawn-helper: --fd must name the server's socket (3 or above)");
        return ExitCode::from(2);
    }
    // SAFETY: the server passes us this descriptor, ours alone from here on.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // Never passed on to a script.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(sock.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    loop {
        let (reply, in_step) = match receive(&sock) {
            Ok(None) => return ExitCode::SUCCESS,
            Ok(Some((request, fds))) => (start(&request, fds), true),
            Err(err) => {
                let errno = err.raw_os_error().unwrap_or(libc::EPROTO);
                (Started { reply: Reply::Failed { stage: Stage::Request, errno, pid: 0 }, pidfd: None }, false)
            }
        };
        // After a request it could not read, the stream may stand in the
        // middle of one: answer, then end, and the server starts a new helper.
        if send(&sock, &reply).is_err() || !in_step {
            return ExitCode::SUCCESS;
        }
    }
}

/// One request and its descriptors, or `None` at the end of the stream.
fn receive(sock: &OwnedFd) -> io::Result<Option<(Request, Vec<OwnedFd>)>> {
    let mut head = [0u8; 4];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_REQUEST_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut got = 0;
    while got < head.len() {
        let msg = rustix::net::recvmsg(sock, &mut [IoSliceMut::new(&mut head[got..])], &mut control, RecvFlags::CMSG_CLOEXEC)?;
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if msg.bytes == 0 {
            return if got == 0 { Ok(None) } else { Err(io::Error::from(io::ErrorKind::UnexpectedEof)) };
        }
        got += msg.bytes;
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_REQUEST_BYTES {
        return Err(io::Error::from_raw_os_error(libc::E2BIG));
    }
    let mut body = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match rustix::io::read(sock, &mut body[got..]) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(err) => return Err(err.into()),
        }
    }
    let request = Request::decode(&body).map_err(|_| io::Error::from_raw_os_error(libc::EPROTO))?;
    if fds.len() != request.fds() {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    Ok(Some((request, fds)))
}

struct Started {
    reply: Reply,
    pidfd: Option<OwnedFd>,
}

fn send(sock: &OwnedFd, started: &Started) -> io::Result<()> {
    let bytes = started.reply.encode();
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(pidfd) = &started.pidfd {
        fds = [std::os::fd::AsFd::as_fd(pidfd)];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    let sent = rustix::net::sendmsg(sock, &[io::IoSlice::new(&bytes)], &mut control, SendFlags::NOSIGNAL)?;
    if sent != bytes.len() {
        return Err(io::Error::from(io::ErrorKind::WriteZero));
    }
    Ok(())
}

/// `clone3`'s argument (linux/sched.h, the first version's 64 bytes plus
/// `set_tid` and `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Everything the child needs as C data, made before the fork.
struct Exec {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
}

fn cstrings(items: &[OsString]) -> Option<Vec<CString>> {
    items.iter().map(|s| CString::new(s.clone().into_vec()).ok()).collect()
}

fn exec_of(r: &Request) -> Option<Exec> {
    Some(Exec {
        program: CString::new(r.program.clone().into_os_string().into_vec()).ok()?,
        argv: cstrings(&r.argv)?,
        envp: cstrings(&r.envp)?,
        cwd: CString::new(r.cwd.clone().into_os_string().into_vec()).ok()?,
    })
}

fn failed(stage: Stage, errno: i32) -> Started {
    Started { reply: Reply::Failed { stage, errno, pid: 0 }, pidfd: None }
}

/// Fork and exec one request; every descriptor of it is closed here
/// once the child has its copies.
fn start(request: &Request, fds: Vec<OwnedFd>) -> Started {
    let Some(exec) = exec_of(request) else { return failed(Stage::Request, libc::EINVAL) };
    let mut argv: Vec<*const libc::c_char> = exec.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = exec.envp.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let (streams, rest) = raw.split_at(2);
    let (cgroups, kept) = rest.split_at(request.cgroups as usize);
    let plan = request.plan(cgroups.to_vec());
    // The child reports a failed step here; `execve` closes it on success.
    let mut pipe = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the array or fails.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return failed(Stage::Clone, io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
    }
    // SAFETY: both descriptors are fresh and ours.
    let (report_read, report_write) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };

    let mut pidfd: libc::c_int = -1;
    // No exit_signal: with CLONE_PARENT the kernel takes the helper's own
    // (SIGCHLD, to the server) and refuses any other.
    let args = CloneArgs {
        flags: (libc::CLONE_PARENT | libc::CLONE_PIDFD) as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM is a fork: the child gets a copy of
    // this single-threaded process and returns 0 from the same call.
    let pid = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    if pid < 0 {
        return failed(Stage::Clone, io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
    }
    if pid == 0 {
        child(&ChildStart { exec: &exec, argv: &argv, envp: &envp, streams, kept, plan: &plan }, report_write.as_raw_fd());
    }
    drop(report_write);
    drop(fds);
    // SAFETY: the kernel wrote a fresh pidfd for the child into `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let pid = pid as i32;
    // Wait for `execve` (the pipe closes) or the child's report.
    let mut report = [0u8; 8];
    let mut file = std::fs::File::from(report_read);
    let mut got = 0;
    while got < report.len() {
        match file.read(&mut report[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let reply = if got == 0 {
        Reply::Started { pid }
    } else {
        let stage = Stage::from_u32(u32::from_le_bytes([report[0], report[1], report[2], report[3]])).unwrap_or(Stage::Exec);
        let errno = i32::from_le_bytes([report[4], report[5], report[6], report[7]]);
        Reply::Failed { stage, errno, pid }
    };
    Started { reply, pidfd: Some(pidfd) }
}

/// In the child, until `execve`: the descriptors at the numbers the
/// server gave them, stdio, the working directory, a process group of
/// its own, then the fence's own set-up ([`child_setup`], the same code a
/// direct spawn runs). A failed step is written to `report` as its
/// stage and errno, and the child exits 127.
fn child(start: &ChildStart<'_>, report: RawFd) -> ! {
    let mut report = report;
    let (stage, errno) = child_steps(start, &mut report);
    let bytes = [(stage as u32).to_le_bytes(), errno.to_le_bytes()].concat();
    // SAFETY: the child ends here, whatever happens to the report.
    unsafe {
        libc::write(report, bytes.as_ptr().cast(), bytes.len());
        libc::_exit(127)
    }
}

/// What the child starts, all made before the fork: the program's C
/// strings, the received descriptors (the two streams, the kept ones at
/// the helper's numbers) and the fence's set-up.
struct ChildStart<'a> {
    exec: &'a Exec,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    streams: &'a [RawFd],
    kept: &'a [RawFd],
    plan: &'a ChildPlan,
}

/// The steps of [`child`]; `report` follows the pipe to its lifted number.
fn child_steps(start: &ChildStart<'_>, report: &mut RawFd) -> (Stage, i32) {
    let ChildStart { exec, argv, envp, streams, kept, plan } = *start;
    let errno = || io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    // SAFETY: this is the only thread of a freshly forked copy of the
    // helper; every call below is a plain syscall on descriptors and C
    // strings made before the fork.
    unsafe {
        // First every descriptor we hold goes above the highest number a
        // kept one must take, so no dup2 below lands on one still needed.
        let floor = plan.keep.iter().copied().max().unwrap_or(2).max(2) + 1;
        let lift = |fd: RawFd| libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor);
        let lifted_report = lift(*report);
        if lifted_report < 0 {
            return (Stage::Setup, errno());
        }
        *report = lifted_report;
        let out = lift(streams[0]);
        let err = lift(streams[1]);
        if out < 0 || err < 0 {
            return (Stage::Setup, errno());
        }
        let mut cgroups = [0 as RawFd; MAX_REQUEST_FDS];
        for (slot, fd) in cgroups.iter_mut().zip(&plan.cgroups) {
            *slot = lift(*fd);
            if *slot < 0 {
                return (Stage::Setup, errno());
            }
        }
        let mut lifted = [0 as RawFd; MAX_REQUEST_FDS];
        for (slot, fd) in lifted.iter_mut().zip(kept) {
            *slot = lift(*fd);
            if *slot < 0 {
                return (Stage::Setup, errno());
            }
        }
        for (from, to) in lifted.iter().zip(&plan.keep) {
            if libc::dup2(*from, *to) < 0 {
                return (Stage::Setup, errno());
            }
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if null < 0 || libc::dup2(null, 0) < 0 || libc::dup2(out, 1) < 0 || libc::dup2(err, 2) < 0 {
            return (Stage::Setup, errno());
        }
        if libc::chdir(exec.cwd.as_ptr()) != 0 || libc::setpgid(0, 0) != 0 {
            return (Stage::Setup, errno());
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        let mut fence = plan.clone();
        fence.cgroups = cgroups[..plan.cgroups.len()].to_vec();
        if let Err(e) = child_setup(&fence) {
            return (Stage::Fence, e.raw_os_error().unwrap_or(libc::EIO));
        }
        // `child_setup` marked every descriptor but the kept ones
        // close-on-exec: the report pipe closes when `execve` succeeds.
        libc::execve(exec.program.as_ptr(), argv.as_ptr(), envp.as_ptr());
        (Stage::Exec, errno())
    }
}
