//! The one way every HTTP listener of the project is built (`serve --http`,
//! the artifact endpoint, the controller's and the egress proxy's
//! metrics/health, the gateway), so that none of them can be held open by
//! clients that never finish.
//!
//! Every connection is bounded, and each bound, when hit, closes the
//! connection (with an answer where one can still be sent) and counts in
//! [`ListenerMetrics`] (`skill_operator_http_listener_closed_total{reason}`):
//!
//! | bound | when hit | reason |
//! |---|---|---|
//! | [`Bounds::header_timeout`]: the request head must arrive in time (from the accept for the first request, from its first byte for later ones) | 408, closed | `header_timeout` |
//! | [`Bounds::idle_timeout`]: between requests on a kept-alive connection | closed | `idle_timeout` |
//! | [`Bounds::body_grace`] + size / [`Bounds::body_min_rate`]: the request body | the body fails (the handler answers 408), closed | `body_timeout` |
//! | [`Bounds::max_connections`] open on the listener | 503, closed at once | `connections_full` |
//! | [`Bounds::max_connections_per_address`] open from one client address | 503, closed at once | `address_full` |
//! | [`Bounds::max_head_bytes`] / [`Bounds::max_headers`] | 431 (hyper), closed | `head_too_large` |
//!
//! The head and idle deadlines live in the connection's I/O ([`io`]): they
//! run only while no request is in flight, so a long streaming response
//! (rmcp's SSE streams) is never cut by them. Authentication stays where
//! each router puts it, a layer or the first check of a handler: it runs
//! once the head is read and before any byte of the body is.
//!
//! Shutdown: the accept loop stops, every connection is told to finish its
//! in-flight request and close (hyper's graceful shutdown), and [`serve`]
//! returns when the last one has.

mod body;
mod caps;
mod io;
mod metrics;

pub use body::{is_body_timeout, BodyTimeout};
pub use caps::{AddressSlot, PerAddress};
pub use metrics::{Close, ListenerMetrics};

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::core::limits::{
    LISTEN_BODY_GRACE, LISTEN_BODY_MIN_RATE, LISTEN_HEADER_TIMEOUT, LISTEN_IDLE_TIMEOUT, LISTEN_MAX_CONNECTIONS,
    LISTEN_MAX_CONNECTIONS_PER_ADDRESS, LISTEN_MAX_HEADERS, LISTEN_MAX_HEAD_BYTES,
};

/// The bounds of one listener. `Default` is the production value of each
/// (`src/core/limits.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub body_grace: Duration,
    /// Bytes per second.
    pub body_min_rate: u64,
    pub max_connections: usize,
    pub max_connections_per_address: usize,
    pub max_head_bytes: usize,
    pub max_headers: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            header_timeout: LISTEN_HEADER_TIMEOUT,
            idle_timeout: LISTEN_IDLE_TIMEOUT,
            body_grace: LISTEN_BODY_GRACE,
            body_min_rate: LISTEN_BODY_MIN_RATE,
            max_connections: LISTEN_MAX_CONNECTIONS,
            max_connections_per_address: LISTEN_MAX_CONNECTIONS_PER_ADDRESS,
            max_head_bytes: LISTEN_MAX_HEAD_BYTES,
            max_headers: LISTEN_MAX_HEADERS,
        }
    }
}

/// A bound that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum BoundsError {
    #[error("--listen-{0} must be at least 1")]
    Zero(&'static str),
    #[error("--listen-max-head-bytes must be at least {min} (a request line and a Host header), not {value}")]
    HeadTooSmall { value: usize, min: usize },
}

/// The smallest head cap accepted.
const MIN_HEAD_BYTES: usize = 1024;

impl Bounds {
    pub fn check(&self) -> Result<(), BoundsError> {
        for (name, zero) in [
            ("header-timeout-ms", self.header_timeout.is_zero()),
            ("idle-timeout-ms", self.idle_timeout.is_zero()),
            ("body-min-rate", self.body_min_rate == 0),
            ("max-connections", self.max_connections == 0),
            ("max-connections-per-address", self.max_connections_per_address == 0),
            ("max-headers", self.max_headers == 0),
        ] {
            if zero {
                return Err(BoundsError::Zero(name));
            }
        }
        if self.max_head_bytes < MIN_HEAD_BYTES {
            return Err(BoundsError::HeadTooSmall { value: self.max_head_bytes, min: MIN_HEAD_BYTES });
        }
        Ok(())
    }
}

/// The listener flags, shared by every command that listens (`#[command(flatten)]`).
#[derive(Debug, Clone, clap::Args)]
pub struct ListenerArgs {
    /// Milliseconds for a request head to arrive (slowloris bound; 408 when hit).
    #[arg(long, value_name = "MS", default_value_t = LISTEN_HEADER_TIMEOUT.as_millis() as u64)]
    pub listen_header_timeout_ms: u64,
    /// Milliseconds a kept-alive connection may wait for its next request.
    #[arg(long, value_name = "MS", default_value_t = LISTEN_IDLE_TIMEOUT.as_millis() as u64)]
    pub listen_idle_timeout_ms: u64,
    /// Milliseconds every request body gets on top of its size at --listen-body-min-rate.
    #[arg(long, value_name = "MS", default_value_t = LISTEN_BODY_GRACE.as_millis() as u64)]
    pub listen_body_grace_ms: u64,
    /// Slowest average rate a request body may arrive at, bytes per second.
    #[arg(long, value_name = "BYTES", default_value_t = LISTEN_BODY_MIN_RATE)]
    pub listen_body_min_rate: u64,
    /// Connections open at once (503 past it).
    #[arg(long, value_name = "N", default_value_t = LISTEN_MAX_CONNECTIONS)]
    pub listen_max_connections: usize,
    /// Connections open at once from one client address (503 past it; raise it behind a proxy).
    #[arg(long, value_name = "N", default_value_t = LISTEN_MAX_CONNECTIONS_PER_ADDRESS)]
    pub listen_max_connections_per_address: usize,
    /// Bytes of a request head, request line included (431 past it).
    #[arg(long, value_name = "BYTES", default_value_t = LISTEN_MAX_HEAD_BYTES)]
    pub listen_max_head_bytes: usize,
    /// Header lines of a request head (431 past it).
    #[arg(long, value_name = "N", default_value_t = LISTEN_MAX_HEADERS)]
    pub listen_max_headers: usize,
}

impl Default for ListenerArgs {
    fn default() -> Self {
        ListenerArgs::from(Bounds::default())
    }
}

impl From<Bounds> for ListenerArgs {
    fn from(b: Bounds) -> Self {
        ListenerArgs {
            listen_header_timeout_ms: b.header_timeout.as_millis() as u64,
            listen_idle_timeout_ms: b.idle_timeout.as_millis() as u64,
            listen_body_grace_ms: b.body_grace.as_millis() as u64,
            listen_body_min_rate: b.body_min_rate,
            listen_max_connections: b.max_connections,
            listen_max_connections_per_address: b.max_connections_per_address,
            listen_max_head_bytes: b.max_head_bytes,
            listen_max_headers: b.max_headers,
        }
    }
}

impl ListenerArgs {
    /// The bounds, checked.
    pub fn bounds(&self) -> Result<Bounds, BoundsError> {
        let b = Bounds {
            header_timeout: Duration::from_millis(self.listen_header_timeout_ms),
            idle_timeout: Duration::from_millis(self.listen_idle_timeout_ms),
            body_grace: Duration::from_millis(self.listen_body_grace_ms),
            body_min_rate: self.listen_body_min_rate,
            max_connections: self.listen_max_connections,
            max_connections_per_address: self.listen_max_connections_per_address,
            max_head_bytes: self.listen_max_head_bytes,
            max_headers: self.listen_max_headers,
        };
        b.check()?;
        Ok(b)
    }
}

/// Handshakes the kernel queues for the accept loop (capped by
/// `net.core.somaxconn`): a flood must not fill the queue before the loop
/// gets to refuse it, or other clients' handshakes are dropped with it.
pub const ACCEPT_BACKLOG: u32 = 4096;

/// Bind a listening socket for [`serve`] (address reuse on, the deep backlog).
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

/// The answer to a connection over a cap, written before it is closed.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\nretry-after: 1\r\ncontent-type: text/plain\r\ncontent-length: 52\r\n\r\ntoo many connections; retry later or use fewer ones\n";

/// Serve `app` on `listener` under `bounds` until `shutdown` resolves, then
/// let in-flight requests finish (see the module docs).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    bounds: Bounds,
    metrics: ListenerMetrics,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    if let Err(e) = bounds.check() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()));
    }
    let connections = Arc::new(Semaphore::new(bounds.max_connections));
    let per_address = Arc::new(PerAddress::new(bounds.max_connections_per_address));
    // Every connection task holds a sender; when the last is dropped, all are done.
    let (done_tx, mut done_rx) = mpsc::channel::<()>(1);
    let stop = CancellationToken::new();
    let mut backoff = Duration::from_millis(5);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => {
                backoff = Duration::from_millis(5);
                pair
            }
            Err(e) => {
                // EMFILE and friends: wait and retry rather than spin or stop serving.
                tracing::warn!(error = %e, "accept failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let Some(slot) = per_address.try_acquire(peer.ip()) else {
            refuse(stream, &metrics, Close::AddressFull);
            continue;
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            refuse(stream, &metrics, Close::ConnectionsFull);
            continue;
        };
        let (app, metrics, done, stop) = (app.clone(), metrics.clone(), done_tx.clone(), stop.clone());
        tokio::spawn(async move {
            metrics.open.inc();
            connection(stream, app, bounds, &metrics, stop).await;
            metrics.open.dec();
            drop((slot, permit, done));
        });
    }
    drop(listener);
    stop.cancel();
    drop(done_tx);
    let _ = done_rx.recv().await;
    Ok(())
}

fn refuse(stream: TcpStream, metrics: &ListenerMetrics, why: Close) {
    metrics.count(why);
    // Best effort: the socket is new, its send buffer empty.
    let _ = stream.try_write(BUSY);
    let _ = socket2::SockRef::from(&stream).shutdown(std::net::Shutdown::Write);
}

/// One connection, from accept to close.
async fn connection(stream: TcpStream, app: Router, bounds: Bounds, metrics: &ListenerMetrics, stop: CancellationToken) {
    let _ = stream.set_nodelay(true);
    let state = Arc::new(io::ConnState::default());
    let io = io::BoundedIo::new(stream, state.clone(), bounds, metrics.clone());
    let service_metrics = metrics.clone();
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let in_flight = io::InFlight::start(state.clone());
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let request = request.map(|b| Body::new(body::DeadlineBody::new(b, bounds, cut.clone(), service_metrics.clone())));
        let app = app.clone();
        async move {
            let response = match app.oneshot(request).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let (mut parts, inner) = response.into_parts();
            if cut.load(std::sync::atomic::Ordering::Relaxed) {
                // The rest of a cut body is still on the wire: this connection cannot carry another request.
                parts.headers.insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            }
            Ok::<_, Infallible>(http::Response::from_parts(parts, Body::new(io::TrackedBody::new(inner, in_flight))))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.max_headers(bounds.max_headers).max_header_size(bounds.max_head_bytes).header_read_timeout(None).keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.as_mut().await
        }
    };
    if let Err(e) = result {
        if e.is_parse_too_large() {
            metrics.count(Close::HeadTooLarge);
        } else {
            tracing::debug!(error = %e, "HTTP connection ended with an error");
        }
    }
}
