//! A connection's I/O with the head and idle deadlines, and the in-flight
//! count that tells the two apart from a request being served.
//!
//! Phases, as the reads see them: `Head` (the first request: from the
//! accept; later ones: from the head's first byte) ends at
//! `header_timeout`; `Idle` (a kept-alive connection between requests, no
//! byte of the next head yet) ends at `idle_timeout`; while a request is in
//! flight (its response not yet fully produced) neither applies: the body
//! has its own deadline ([`super::body`]) and a streaming response may last
//! as long as it likes.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use futures::task::AtomicWaker;
use http_body::Frame;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::metrics::{Close, ListenerMetrics};
use super::Bounds;

/// Written when a head deadline fires (the head was started, so a client is there to read it).
const TIMEOUT_RESPONSE: &[u8] = b"HTTP/1.1 408 Request Timeout\r\nconnection: close\r\ncontent-type: text/plain\r\ncontent-length: 40\r\n\r\nthe request head did not arrive in time\n";

/// What the service side tells the I/O side.
#[derive(Debug, Default)]
pub(super) struct ConnState {
    in_flight: AtomicUsize,
    /// Bumped each time the last in-flight request finishes.
    finished: AtomicU64,
    /// The read that went pending while a request was in flight: woken
    /// when the last one finishes, so the idle deadline is armed.
    reader: AtomicWaker,
}

/// A request counted as in flight until dropped (with its response body).
pub(super) struct InFlight(Arc<ConnState>);

impl InFlight {
    pub(super) fn start(state: Arc<ConnState>) -> InFlight {
        state.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(state)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.finished.fetch_add(1, Ordering::AcqRel);
            self.0.reader.wake();
        }
    }
}

/// A response body that ends its request's in-flight time when it is done.
pub(super) struct TrackedBody {
    inner: Body,
    in_flight: Option<InFlight>,
}

impl TrackedBody {
    pub(super) fn new(inner: Body, in_flight: InFlight) -> TrackedBody {
        TrackedBody { inner, in_flight: Some(in_flight) }
    }
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.in_flight = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Waiting for (the rest of) a head since this instant.
    Head(Instant),
    /// Between requests, no byte of the next head yet.
    Idle(Instant),
}

/// The connection's socket, with the deadlines applied to its reads.
pub(super) struct BoundedIo {
    stream: TcpStream,
    state: Arc<ConnState>,
    bounds: Bounds,
    metrics: ListenerMetrics,
    phase: Phase,
    seen_finished: u64,
    timer: Pin<Box<Sleep>>,
}

impl BoundedIo {
    pub(super) fn new(stream: TcpStream, state: Arc<ConnState>, bounds: Bounds, metrics: ListenerMetrics) -> BoundedIo {
        let now = Instant::now();
        BoundedIo {
            stream,
            state,
            bounds,
            metrics,
            phase: Phase::Head(now),
            seen_finished: 0,
            timer: Box::pin(tokio::time::sleep_until(now + bounds.header_timeout)),
        }
    }

    fn deadline(&self) -> (Instant, Close) {
        match self.phase {
            Phase::Head(since) => (since + self.bounds.header_timeout, Close::HeaderTimeout),
            Phase::Idle(since) => (since + self.bounds.idle_timeout, Close::IdleTimeout),
        }
    }
}

impl AsyncRead for BoundedIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let busy = this.state.in_flight.load(Ordering::Acquire) > 0;
        if !busy {
            let finished = this.state.finished.load(Ordering::Acquire);
            if finished != this.seen_finished {
                this.seen_finished = finished;
                this.phase = Phase::Idle(Instant::now());
            }
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if !busy && buf.filled().len() > before {
                    if let Phase::Idle(_) = this.phase {
                        this.phase = Phase::Head(Instant::now());
                    }
                }
                Poll::Ready(r)
            }
            Poll::Pending if busy => {
                this.state.reader.register(cx.waker());
                // It may have finished between the load above and the register.
                if this.state.in_flight.load(Ordering::Acquire) == 0 {
                    cx.waker().wake_by_ref();
                }
                Poll::Pending
            }
            Poll::Pending => {
                let (deadline, why) = this.deadline();
                if this.timer.deadline() != deadline {
                    this.timer.as_mut().reset(deadline);
                }
                if this.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.metrics.count(why);
                if why == Close::HeaderTimeout {
                    let _ = this.stream.try_write(TIMEOUT_RESPONSE);
                }
                Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why.as_str())))
            }
        }
    }
}

impl AsyncWrite for BoundedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
