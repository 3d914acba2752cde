//! One shutdown value for every task of the process.
//!
//! `main` makes it once ([`Shutdown::on_signals`]), before anything else
//! runs, so a SIGTERM never meets the default action (which would kill an
//! upload sidecar before it has uploaded, or a launcher before it has
//! stopped its script). Every task gets a clone and either waits for it
//! ([`Shutdown::wait`]) or hands its token to a library that takes one
//! (rmcp, axum's graceful shutdown, kube's controllers).

use std::io;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use tokio_util::sync::CancellationToken;

/// A shared "stop now" flag that can be awaited.
#[derive(Clone, Debug, Default)]
pub struct Shutdown {
    token: CancellationToken,
}

impl Shutdown {
    /// A shutdown nothing triggers but [`Shutdown::trigger`] (tests, embedding).
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// A shutdown triggered by the first SIGTERM or SIGINT. The handlers are
    /// installed before this returns. Needs a tokio runtime.
    pub fn on_signals() -> io::Result<Shutdown> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = Shutdown::new();
        let trigger = shutdown.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            }
            trigger.trigger();
        });
        Ok(shutdown)
    }

    /// A shutdown triggered by the first SIGTERM or SIGINT sent from
    /// outside this process's PID namespace (the sender's pid reads 0 here:
    /// the kubelet's runtime, for a container's PID 1) or by this process's
    /// parent; every other sender is ignored and counted
    /// ([`ignored_stop_signals`]). For the in-pod launcher, whose script
    /// runs as its uid and could otherwise stop it and so forge a
    /// `cancelled` verdict. Replaces the handlers [`Shutdown::on_signals`]
    /// installed. Needs a tokio runtime.
    pub fn on_outside_signals() -> io::Result<Shutdown> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: pipe2 fills the two-element array we own.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just made and are owned here alone.
        let (read, write) = unsafe {
            use std::os::fd::FromRawFd;
            (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1]))
        };
        // SAFETY: getppid cannot fail.
        ACCEPTED_SENDER.store(unsafe { libc::getppid() }, Ordering::SeqCst);
        // The write end lives as long as the process: the handler may run at any time.
        STOP_PIPE.store(std::os::fd::IntoRawFd::into_raw_fd(write), Ordering::SeqCst);
        for signal in [libc::SIGTERM, libc::SIGINT] {
            // SAFETY: a zeroed sigaction with our handler, SA_SIGINFO (so it
            // gets the sender) and SA_RESTART; the handler is async-signal-safe.
            let rc = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_stop_signal as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(signal, &action, std::ptr::null_mut())
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let mut receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(read)?;
        let shutdown = Shutdown::new();
        let trigger = shutdown.clone();
        tokio::spawn(async move {
            let mut byte = [0u8; 1];
            use tokio::io::AsyncReadExt;
            if receiver.read(&mut byte).await.is_ok() {
                tracing::info!("a stop signal from outside the container: shutting down");
                trigger.trigger();
            }
        });
        Ok(shutdown)
    }

    pub fn trigger(&self) {
        self.token.cancel();
    }

    pub fn is_triggered(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once shutdown is triggered (at once if it already was).
    pub async fn wait(&self) {
        self.token.cancelled().await
    }

    /// An owned future for APIs that want `'static` (axum, kube).
    pub fn wait_owned(&self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        self.token.clone().cancelled_owned()
    }

    /// The token, for libraries that take one (rmcp's HTTP service).
    pub fn token(&self) -> CancellationToken {
        self.token.clone()
    }
}

/// The write end of [`Shutdown::on_outside_signals`]'s pipe (-1: none yet).
static STOP_PIPE: AtomicI32 = AtomicI32::new(-1);
/// The one sender inside the PID namespace whose stop is taken: the parent.
static ACCEPTED_SENDER: AtomicI32 = AtomicI32::new(0);
static IGNORED: AtomicU64 = AtomicU64::new(0);

/// Stop signals [`Shutdown::on_outside_signals`] ignored (sent from inside).
pub fn ignored_stop_signals() -> u64 {
    IGNORED.load(Ordering::SeqCst)
}

extern "C" fn on_stop_signal(_signal: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO; si_pid is
    // set for signals sent by a process (0 when the sender is not in our
    // PID namespace, and for the kernel's own).
    let sender = if info.is_null() { 0 } else { unsafe { (*info).si_pid() } };
    if sender == 0 || sender == ACCEPTED_SENDER.load(Ordering::SeqCst) {
        let fd = STOP_PIPE.load(Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: write(2) is async-signal-safe; a full pipe already holds a stop.
            unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
        }
    } else {
        IGNORED.fetch_add(1, Ordering::SeqCst);
    }
}
