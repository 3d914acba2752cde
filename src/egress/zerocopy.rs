//! Zero-copy byte moving with splice(2): socket → pipe → socket.
//!
//! The copy loop reads every byte into a buffer and writes it out again:
//! two copies through user space per byte, most of the proxy's CPU in a
//! bulk transfer. splice(2) moves page references
//! from one socket's receive queue into a pipe and from the pipe into the
//! other socket's send queue, so the bytes never enter the proxy.
//!
//! The pipe is the direction's buffer. The caller fills it from one socket,
//! charges what arrived to the budget, and sends exactly what fits before
//! filling again; the pipe is therefore empty whenever the direction waits
//! for bytes, and an end of stream never leaves bytes behind it.
//!
//! Both ends are non-blocking (tokio's sockets are `O_NONBLOCK`, the pipe
//! is too, and every call is `SPLICE_F_NONBLOCK`) and readiness is tokio's:
//! each splice runs inside `try_io`, so `EAGAIN` clears the readiness of
//! the socket the call waited on. That is only right while the pipe cannot
//! be the cause of `EAGAIN`, which the fill-then-send order guarantees: a
//! fill starts on an empty pipe, a send on a non-empty one.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;

use super::io::Socket;

/// Why a splice did not move bytes.
#[derive(Debug, thiserror::Error)]
pub(super) enum SpliceError {
    /// The kernel or this descriptor cannot splice; nothing was moved, so
    /// the caller copies instead.
    #[error("splice(2) is not available for this socket ({0}); bytes are copied through user space instead")]
    Unsupported(#[source] io::Error),
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<SpliceError> for io::Error {
    fn from(e: SpliceError) -> io::Error {
        match e {
            SpliceError::Unsupported(e) | SpliceError::Io(e) => e,
        }
    }
}

/// A non-blocking pipe holding one direction's bytes between two splices.
pub(super) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// What one fill may take (the pipe's size in bytes).
    capacity: usize,
    /// Bytes filled and not yet sent.
    held: usize,
}

impl Pipe {
    /// A pipe of `want` bytes if the kernel grants it. Past the per-user
    /// pipe allowance (`/proc/sys/fs/pipe-user-pages-soft`) it refuses to
    /// grow pipes; the default size then only means more splice calls.
    pub(super) fn new(want: usize) -> io::Result<Pipe> {
        let mut fds: [libc::c_int; 2] = [-1, -1];
        // SAFETY: `fds` is a writable array of two ints, as pipe2 requires.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both are open descriptors that
        // nothing else owns; each gets exactly one owner here.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let want = libc::c_int::try_from(want).unwrap_or(libc::c_int::MAX);
        // SAFETY: fcntl on a descriptor owned above; these commands take an
        // int argument and touch no user memory.
        let granted = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
        let size = if granted > 0 {
            granted
        } else {
            // SAFETY: as above.
            unsafe { libc::fcntl(write.as_raw_fd(), libc::F_GETPIPE_SZ) }
        };
        let capacity = usize::try_from(size).ok().filter(|&n| n > 0).ok_or_else(io::Error::last_os_error)?;
        Ok(Pipe { read, write, capacity, held: 0 })
    }

    /// Wait until `from` has bytes and move what is there (up to the pipe's
    /// size) into the empty pipe; 0 is end of stream.
    pub(super) async fn fill<S: Socket>(&mut self, from: &S) -> Result<usize, SpliceError> {
        debug_assert_eq!(self.held, 0, "a fill starts on an empty pipe (see the module docs)");
        let (src, dst, len) = (from.as_raw_fd(), self.write.as_raw_fd(), self.capacity);
        loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || splice(src, dst, len)) {
                Ok(n) => {
                    self.held += n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(classify(e)),
            }
        }
    }

    /// Wait until `to` can take bytes and move up to `max` of the held ones.
    pub(super) async fn send<S: Socket>(&mut self, to: &S, max: usize) -> Result<usize, SpliceError> {
        let len = max.min(self.held);
        debug_assert!(len > 0, "a send starts on a non-empty pipe (see the module docs)");
        let (src, dst) = (self.read.as_raw_fd(), to.as_raw_fd());
        loop {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || splice(src, dst, len)) {
                // The pipe holds `len` bytes: nothing moved means the socket took none.
                Ok(0) => return Err(SpliceError::Io(io::ErrorKind::WriteZero.into())),
                Ok(n) => {
                    self.held -= n;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(classify(e)),
            }
        }
    }
}

/// One non-blocking splice between two descriptors, neither with an offset.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: both descriptors are open for the whole call (borrowed
        // from owners that outlive it); null offsets are what pipes and
        // sockets require; the kernel touches no user memory.
        let n = unsafe {
            libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK)
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// `EINVAL`/`EOPNOTSUPP`: this descriptor has no splice support; `ENOSYS`:
/// the kernel has none (or a seccomp filter hides it). A fill that meets
/// one has moved nothing, so the caller may copy instead; a send that does
/// has bytes in the pipe, and the caller ends the tunnel (TCP and unix
/// stream sockets take spliced pages on every kernel this runs on).
fn classify(e: io::Error) -> SpliceError {
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => SpliceError::Unsupported(e),
        _ => SpliceError::Io(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_grows_to_the_size_asked_for_within_the_allowance() {
        let pipe = Pipe::new(256 * 1024).unwrap();
        // The default is 64 KiB; more than that proves F_SETPIPE_SZ took.
        assert!(pipe.capacity >= 256 * 1024, "{}", pipe.capacity);
        let small = Pipe::new(1).unwrap();
        assert!(small.capacity >= 4096, "{}", small.capacity);
    }

    #[test]
    fn a_descriptor_without_splice_support_is_reported_as_unsupported() {
        // An eventfd has no splice operations: the kernel answers EINVAL,
        // which must make the caller copy rather than fail the tunnel.
        // SAFETY: eventfd takes two ints and returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(1, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor nothing else owns.
        let event = unsafe { OwnedFd::from_raw_fd(fd) };
        let pipe = Pipe::new(4096).unwrap();
        let e = splice(event.as_raw_fd(), pipe.write.as_raw_fd(), 8).unwrap_err();
        assert!(matches!(classify(e), SpliceError::Unsupported(_)));
        // A reset peer is a fault, never a reason to switch to copying.
        let reset = io::Error::from_raw_os_error(libc::ECONNRESET);
        assert!(matches!(classify(reset), SpliceError::Io(_)));
    }
}
