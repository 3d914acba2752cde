//! The request-body deadline: a body may take `body_grace` plus its size
//! at `body_min_rate`, counted from the handler's first read. A body that
//! falls behind fails with [`BodyTimeout`] (what the handler was spooling
//! is dropped with it) and its connection is closed after the answer.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Frame;
use hyper::body::Incoming;
use std::future::Future;
use tokio::time::{Instant, Sleep};

use super::metrics::{Close, ListenerMetrics};
use super::Bounds;

/// A request body that arrived too slowly.
#[derive(Debug, thiserror::Error)]
#[error("the request body arrived slower than {min_rate} bytes/s (after a {grace_ms} ms grace): send it faster or in smaller pieces")]
pub struct BodyTimeout {
    pub min_rate: u64,
    pub grace_ms: u64,
}

/// Whether an error (or one of its sources) is a [`BodyTimeout`].
pub fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<BodyTimeout>() {
            return true;
        }
        cur = err.source();
    }
    false
}

pub(super) struct DeadlineBody {
    inner: Incoming,
    bounds: Bounds,
    started: Option<Instant>,
    received: u64,
    timer: Option<Pin<Box<Sleep>>>,
    cut: Arc<AtomicBool>,
    metrics: ListenerMetrics,
}

impl DeadlineBody {
    pub(super) fn new(inner: Incoming, bounds: Bounds, cut: Arc<AtomicBool>, metrics: ListenerMetrics) -> DeadlineBody {
        DeadlineBody { inner, bounds, started: None, received: 0, timer: None, cut, metrics }
    }

    fn deadline(&self, started: Instant) -> Instant {
        let at_rate = Duration::from_secs_f64(self.received as f64 / self.bounds.body_min_rate as f64);
        started + self.bounds.body_grace + at_rate
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let started = *this.started.get_or_insert_with(Instant::now);
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let deadline = this.deadline(started);
                let timer = this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                if !this.cut.swap(true, Ordering::Relaxed) {
                    this.metrics.count(Close::BodyTimeout);
                }
                let e = BodyTimeout { min_rate: this.bounds.body_min_rate, grace_ms: this.bounds.body_grace.as_millis() as u64 };
                Poll::Ready(Some(Err(Box::new(e))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
