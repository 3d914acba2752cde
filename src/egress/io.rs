//! The few socket operations the proxy needs, over TCP and unix streams.
//!
//! Everything goes through readiness (`readable` then `try_read`) on a
//! shared reference, so both directions of a tunnel can use one socket at
//! once and an idle direction holds no buffer (see [`super::splice`]).

use std::future::Future;
use std::io;
use std::net::Shutdown;
use std::os::fd::AsRawFd;

use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// A connected stream socket.
pub(super) trait Socket: AsRawFd + Send + Sync + 'static {
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
    fn try_read(&self, buf: &mut [u8]) -> io::Result<usize>;
    fn try_read_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize>;
    fn try_write(&self, buf: &[u8]) -> io::Result<usize>;
    /// Half-close: the peer reads end-of-stream.
    fn shutdown_write(&self) -> io::Result<()>;
    /// Run one non-blocking call on the raw socket (splice, see
    /// [`super::zerocopy`]); `WouldBlock` from it clears the readiness.
    fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}

macro_rules! socket_impl {
    ($t:ty) => {
        impl Socket for $t {
            fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
                <$t>::readable(self)
            }
            fn writable(&self) -> impl Future<Output = io::Result<()>> + Send {
                <$t>::writable(self)
            }
            fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
                <$t>::try_read(self, buf)
            }
            fn try_read_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
                <$t>::try_read_buf(self, buf)
            }
            fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
                <$t>::try_write(self, buf)
            }
            fn shutdown_write(&self) -> io::Result<()> {
                match socket2::SockRef::from(self).shutdown(Shutdown::Write) {
                    // The peer is gone already: nothing left to tell it.
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
                    other => other,
                }
            }
            fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
                <$t>::try_io(self, interest, f)
            }
        }
    };
}

socket_impl!(TcpStream);
socket_impl!(UnixStream);

/// Read what is available (waiting for readiness); 0 is end-of-stream.
pub(super) async fn read_some<S: Socket>(s: &S, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        s.readable().await?;
        match s.try_read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// Read into the spare capacity of `buf` (reserving `want` bytes first).
pub(super) async fn read_buf<S: Socket>(s: &S, buf: &mut Vec<u8>, want: usize) -> io::Result<usize> {
    buf.reserve(want);
    loop {
        s.readable().await?;
        match s.try_read_buf(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// Write all of `buf`.
pub(super) async fn write_all<S: Socket>(s: &S, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        s.writable().await?;
        match s.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
