//! The pre-forked spawn helper: `serve` starts its scripts from a small
//! single-threaded process instead of forking itself.
//!
//! # Why
//!
//! Forking the server costs about a millisecond more than forking a small
//! process: the kernel copies the page tables of a multi-threaded server
//! with a large address space, and the `pre_exec` set-up the fence needs
//! rules out `posix_spawn`'s `vfork`. The helper is exec'd from this
//! binary once, at start-up (`skill-operator spawn-helper`), before any
//! run, and forks each script from its own small address space.
//!
//! # How
//!
//! The server and the helper share a Unix socket pair. A request carries
//! the script's program, argv, environment, working directory and the
//! fence's child set-up ([`super::child::ChildPlan`]), with the
//! descriptors the child needs attached (`SCM_RIGHTS`): the write ends of
//! its stdout and stderr pipes, the run's `cgroup.procs` files, and the
//! descriptors it keeps, each placed in the child at the number it has in
//! the server. The helper forks with `clone3(CLONE_PARENT | CLONE_PIDFD)`:
//! the script is born a child of the *server*, which waits for it, reaps
//! it and reads its exit status through the pidfd the helper sends back,
//! as for a child it forked itself. The helper waits only until `execve`
//! has succeeded (or reports the step that failed, with its errno), and
//! holds nothing between requests.
//!
//! With `CLONE_PARENT` the script's parent is the server *thread* that
//! started the helper, so bubblewrap's `--die-with-parent` (a
//! `PR_SET_PDEATHSIG`, which fires when that thread exits) holds as for a
//! direct spawn as long as that thread lives: the helper is started and
//! restarted from the runtime tasks that call
//! [`super::process::execute`], whose worker threads live as long as the
//! runtime (the same rule the direct spawn has).
//!
//! The child runs the same set-up as a direct spawn, in the same order
//! (stdio, working directory, process group, then
//! [`super::child::child_setup`]: signals, cgroups, uid, rlimits,
//! `no_new_privs`, descriptors), so a run is fenced the same either way.
//!
//! # When it is not there
//!
//! - It is restarted when it dies: a request that could not be delivered
//!   goes to a new helper; a run whose helper died after the request was
//!   sent fails with that reason (its child, if one was made, is in the
//!   run's cgroup or under its uid and goes with the run's clean-up).
//! - It answers within [`REPLY_WITHIN`] or is killed and restarted (a
//!   script of the server's own uid may stop it with SIGSTOP, as it may
//!   stop the server).
//! - Where `clone3`, `CLONE_PIDFD` or `CLONE_PARENT` is refused (kernels
//!   before 5.3, seccomp filters), or the binary cannot be exec'd, runs
//!   fork the server as before, and the log says so once.
//! - The helper is not dumpable (a same-uid script cannot ptrace it or
//!   read its memory), and ends when the server's end of the socket
//!   closes, however the server ends.

mod helper;
pub mod wire;

use std::ffi::OsString;
use std::io::{self, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use rustix::process::{WaitId, WaitIdOptions, WaitIdStatus};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

pub use helper::main;
use wire::{Reply, Request, Stage, MAX_REQUEST_BYTES, MAX_REQUEST_FDS, REPLY_BYTES};

use super::child::Launch;

/// How long the server waits for the helper's answer to one request
/// (it answers once `execve` has happened, within milliseconds) before it
/// kills and restarts it.
pub const REPLY_WITHIN: Duration = Duration::from_secs(10);

/// The helper's subcommand name (hidden from `--help`).
pub const SUBCOMMAND: &str = "spawn-helper";

/// The server's end of the helper.
pub struct SpawnHelper {
    /// This binary (O_PATH), exec'd through `/proc/self/fd`.
    exe: Arc<OwnedFd>,
    conn: Mutex<Option<Conn>>,
    /// Set once the kernel refuses the helper's fork: runs fork the server.
    refused: AtomicBool,
    restarts: AtomicU64,
    started: AtomicU64,
}

/// One running helper.
struct Conn {
    sock: OwnedFd,
    process: std::process::Child,
}

/// Why the helper could not be started.
#[derive(Debug, thiserror::Error)]
#[error("the spawn helper could not start ({0}); runs fork the server instead")]
pub struct StartError(#[source] io::Error);

impl Conn {
    fn open(exe: &OwnedFd) -> io::Result<Conn> {
        let (ours, theirs) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::STREAM,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        let timeout = Some(REPLY_WITHIN);
        rustix::net::sockopt::set_socket_timeout(&ours, rustix::net::sockopt::Timeout::Recv, timeout)?;
        rustix::net::sockopt::set_socket_timeout(&ours, rustix::net::sockopt::Timeout::Send, timeout)?;
        let fd = theirs.as_raw_fd();
        let mut command = std::process::Command::new(format!("/proc/self/fd/{}", exe.as_raw_fd()));
        command
            .arg0("skill-operator")
            .arg(SUBCOMMAND)
            .arg("--fd")
            .arg(fd.to_string())
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        // SAFETY: fcntl is async-signal-safe; it only keeps the helper's end across exec.
        unsafe {
            command.pre_exec(move || {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let process = command.spawn()?;
        drop(theirs);
        Ok(Conn { sock: ours, process })
    }

    /// Kill and reap it (it may already be gone).
    fn close(mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// What one round trip gave.
enum Answer {
    /// The helper could not be reached before anything was sent.
    NotSent(io::Error),
    /// Sent, but no answer came (the helper died or hung).
    Lost(io::Error),
    Replied(Reply, Option<OwnedFd>),
}

impl SpawnHelper {
    /// Start the helper from this binary.
    pub fn start(exe: Arc<OwnedFd>) -> Result<Arc<SpawnHelper>, StartError> {
        let conn = Conn::open(&exe).map_err(StartError)?;
        tracing::debug!(pid = conn.process.id(), "spawn helper started");
        Ok(Arc::new(SpawnHelper {
            exe,
            conn: Mutex::new(Some(conn)),
            refused: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            started: AtomicU64::new(0),
        }))
    }

    /// The running helper's pid (none between a death and the next run).
    pub fn pid(&self) -> Option<u32> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|c| c.process.id())
    }

    /// How many times it was started again after dying.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Whether the kernel refused its fork, so that runs fork the server.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// How many scripts it has started (the server forked none of them).
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Start `launch` through the helper. `Ok(None)`: the helper is not
    /// usable here (nothing was started); fork the server instead.
    pub fn spawn(&self, launch: &Launch) -> Result<Option<HelperChild>, io::Error> {
        if self.refused.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let request = request_of(launch);
        let body = request.encode();
        if body.len() > MAX_REQUEST_BYTES {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, wire::WireError::TooLarge(body.len())));
        }
        let (out_read, out_write) = pipe_pair()?;
        let (err_read, err_write) = pipe_pair()?;
        let mut fds: Vec<BorrowedFd<'_>> = vec![out_write.as_fd(), err_write.as_fd()];
        // SAFETY: every raw number in the plan is a descriptor the caller's
        // spec owns for the whole call (its cgroups and kept descriptors).
        fds.extend(launch.plan.cgroups.iter().chain(&launch.plan.keep).map(|fd| unsafe { BorrowedFd::borrow_raw(*fd) }));
        if fds.len() > MAX_REQUEST_FDS {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many descriptors for one spawn request"));
        }

        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let mut answer = Answer::NotSent(io::Error::from(io::ErrorKind::NotConnected));
        // A request never delivered may go to a fresh helper once.
        for _ in 0..2 {
            if conn.is_none() {
                match Conn::open(&self.exe) {
                    Ok(fresh) => {
                        let n = self.restarts.fetch_add(1, Ordering::Relaxed) + 1;
                        tracing::warn!(pid = fresh.process.id(), restarts = n, "the spawn helper was gone; started a new one");
                        *conn = Some(fresh);
                    }
                    Err(err) => {
                        tracing::warn!(%err, "the spawn helper cannot be started again; this run forks the server");
                        return Ok(None);
                    }
                }
            }
            let Some(c) = conn.as_ref() else { break };
            answer = round_trip(&c.sock, &body, &fds);
            match &answer {
                Answer::NotSent(_) => {
                    if let Some(dead) = conn.take() {
                        dead.close();
                    }
                }
                Answer::Lost(_) => {
                    if let Some(dead) = conn.take() {
                        dead.close();
                    }
                    break;
                }
                Answer::Replied(..) => break,
            }
        }
        drop(conn);
        drop(fds);
        drop((out_write, err_write));

        match answer {
            Answer::NotSent(err) => Err(io::Error::other(format!("the spawn helper could not be reached: {err}"))),
            Answer::Lost(err) => Err(io::Error::other(format!(
                "the spawn helper died or hung while starting the script ({err}); it is started again for the next run"
            ))),
            Answer::Replied(Reply::Started { pid }, Some(pidfd)) => {
                self.started.fetch_add(1, Ordering::Relaxed);
                Ok(Some(HelperChild::new(pid, pidfd, out_read, err_read)?))
            }
            Answer::Replied(Reply::Started { .. }, None) => Err(io::Error::other("the spawn helper started the script but sent no pidfd")),
            Answer::Replied(Reply::Failed { stage, errno, .. }, pidfd) => {
                if let Some(pidfd) = pidfd {
                    // Our child, exiting right after its report: reap it.
                    let _ = rustix::process::waitid(WaitId::PidFd(pidfd.as_fd()), WaitIdOptions::EXITED);
                }
                if stage == Stage::Clone && matches!(errno, libc::ENOSYS | libc::EINVAL | libc::EPERM) {
                    if !self.refused.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            errno,
                            "this kernel refuses the spawn helper's clone3 (CLONE_PARENT | CLONE_PIDFD); runs fork the server instead"
                        );
                    }
                    return Ok(None);
                }
                let source = io::Error::from_raw_os_error(errno);
                match stage {
                    // The messages a direct spawn gives for the same failures.
                    Stage::Exec | Stage::Fence => Err(source),
                    _ => Err(io::Error::new(source.kind(), format!("{} failed: {source}", stage.describe()))),
                }
            }
        }
    }
}

impl Drop for SpawnHelper {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
            conn.close();
        }
    }
}

fn request_of(launch: &Launch) -> Request {
    let program = launch.program.clone();
    let mut argv: Vec<OsString> = Vec::with_capacity(launch.args.len() + 1);
    argv.push(program.clone().into_os_string());
    argv.extend(launch.args.iter().cloned());
    let envp = launch
        .env
        .iter()
        .map(|(k, v)| {
            let mut entry = k.clone().into_vec();
            entry.push(b'=');
            entry.extend_from_slice(v.as_encoded_bytes());
            OsString::from_vec(entry)
        })
        .collect();
    Request {
        program,
        argv,
        envp,
        cwd: launch.cwd.clone(),
        limits: launch.plan.limits,
        switch: launch.plan.switch,
        clear_groups: launch.plan.clear_groups,
        cgroups: launch.plan.cgroups.len() as u32,
        keep: launch.plan.keep.clone(),
    }
}

fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two-element array or fails.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn round_trip(sock: &OwnedFd, body: &[u8], fds: &[BorrowedFd<'_>]) -> Answer {
    let mut framed = Vec::with_capacity(4 + body.len());
    framed.extend_from_slice(&(body.len() as u32).to_le_bytes());
    framed.extend_from_slice(body);
    let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_REQUEST_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    control.push(SendAncillaryMessage::ScmRights(fds));
    // The descriptors go with the first bytes; the rest follows plainly.
    let sent = match rustix::net::sendmsg(sock, &[io::IoSlice::new(&framed)], &mut control, SendFlags::NOSIGNAL) {
        Ok(n) => n,
        Err(err) => return Answer::NotSent(err.into()),
    };
    if sent < framed.len() {
        let mut file = std::fs::File::from(match sock.try_clone() {
            Ok(s) => s,
            Err(err) => return Answer::Lost(err),
        });
        if let Err(err) = file.write_all(&framed[sent..]) {
            return Answer::Lost(err);
        }
    }
    let mut reply = [0u8; REPLY_BYTES];
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut pidfd: Option<OwnedFd> = None;
    let mut got = 0;
    while got < REPLY_BYTES {
        let msg = match rustix::net::recvmsg(sock, &mut [IoSliceMut::new(&mut reply[got..])], &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(msg) => msg,
            Err(rustix::io::Errno::INTR) => continue,
            // The helper closed its end with our request still unread in
            // it (a closed end that had read it all gives an end of file):
            // nothing of it was started.
            Err(rustix::io::Errno::CONNRESET) if got == 0 => return Answer::NotSent(io::Error::from(io::ErrorKind::ConnectionReset)),
            Err(err) => return Answer::Lost(err.into()),
        };
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(mut received) = message {
                pidfd = received.next();
            }
        }
        if msg.bytes == 0 {
            return Answer::Lost(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        got += msg.bytes;
    }
    match Reply::decode(&reply) {
        Ok(reply) => Answer::Replied(reply, pidfd),
        Err(err) => Answer::Lost(io::Error::new(io::ErrorKind::InvalidData, err)),
    }
}

/// A script the helper started: the server's own child, waited for
/// through its pidfd.
pub struct HelperChild {
    pid: i32,
    pidfd: Option<AsyncFd<OwnedFd>>,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    status: Option<ExitStatus>,
}

impl HelperChild {
    /// The started child, or an error with the child killed and reaped
    /// (it is ours: nothing else would ever reap it).
    fn new(pid: i32, pidfd: OwnedFd, out: OwnedFd, err: OwnedFd) -> io::Result<HelperChild> {
        // `AsyncFd::try_new` is deprecated from tokio 1.54 in favour of the
        // unsafe `register` (absent from older 1.x); with an OwnedFd we
        // exclusively own it is sound.
        #[allow(deprecated)]
        let registered = AsyncFd::try_new(pidfd);
        let pidfd = match registered {
            Ok(fd) => fd,
            Err(e) => {
                let (fd, err) = e.into_parts();
                let _ = rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL);
                let _ = rustix::process::waitid(WaitId::PidFd(fd.as_fd()), WaitIdOptions::EXITED);
                return Err(err);
            }
        };
        // From here a failure drops the child, whose Drop kills and reaps it.
        let mut child = HelperChild { pid, pidfd: Some(pidfd), stdout: None, stderr: None, status: None };
        child.stdout = Some(pipe::Receiver::from_owned_fd(out)?);
        child.stderr = Some(pipe::Receiver::from_owned_fd(err)?);
        Ok(child)
    }

    pub fn id(&self) -> i32 {
        self.pid
    }

    /// Readable once the process has exited (it stays a zombie, its pid
    /// reserved, until [`Self::wait`] reaps it).
    pub fn pidfd(&self) -> Option<&AsyncFd<OwnedFd>> {
        self.pidfd.as_ref()
    }

    /// Wait for the exit and reap it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let Some(fd) = self.pidfd.as_ref() else { return Err(io::Error::other("no pidfd")) };
        loop {
            let mut ready = fd.readable().await?;
            match rustix::process::waitid(WaitId::PidFd(fd.get_ref().as_fd()), WaitIdOptions::EXITED | WaitIdOptions::NOHANG) {
                Ok(Some(status)) => {
                    let status = exit_status(&status);
                    self.status = Some(status);
                    return Ok(status);
                }
                Ok(None) => ready.clear_ready(),
                Err(rustix::io::Errno::INTR) => continue,
                Err(err) => return Err(err.into()),
            }
        }
    }
}

impl Drop for HelperChild {
    /// Like `kill_on_drop`: a run dropped before its end kills its
    /// process and reaps it off the caller's path.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let Some(fd) = self.pidfd.take() else { return };
        let fd = fd.into_inner();
        let _ = rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL);
        let reap = move || {
            let _ = rustix::process::waitid(WaitId::PidFd(fd.as_fd()), WaitIdOptions::EXITED);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(reap);
            }
            Err(_) => {
                std::thread::spawn(reap);
            }
        }
    }
}

/// `waitid`'s answer as the status `waitpid` would have given.
fn exit_status(s: &WaitIdStatus) -> ExitStatus {
    let raw = if let Some(code) = s.exit_status() {
        (code & 0xff) << 8
    } else if let Some(signal) = s.terminating_signal() {
        (signal & 0x7f) | if s.dumped() { 0x80 } else { 0 }
    } else {
        0
    };
    ExitStatus::from_raw(raw)
}

/// The helper's command line, for the CLI.
#[derive(Debug, Clone, clap::Args)]
pub struct HelperArgs {
    /// The server's end of the socket pair.
    #[arg(long, value_name = "FD")]
    pub fd: RawFd,
}
