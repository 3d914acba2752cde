//! Moving bytes between the client and the checked upstream, under the
//! job's byte budgets, the idle timeout and the tunnel lifetime.
//!
//! Both directions run in the connection's own task (`try_join`), each
//! waiting for readiness with no buffer held: a buffer of
//! [`SPLICE_BUFFER_BYTES`] is taken when bytes are ready and dropped when
//! the socket runs dry, so an idle tunnel costs its task and two sockets,
//! not two 64 KiB buffers (the memory bound of the issue: ≤ 20 KiB per idle
//! tunnel). Each direction half-closes the other side on end of stream, so
//! request/response protocols that close one way still finish.
//!
//! A direction that has carried [`ZERO_COPY_AFTER_BYTES`] moves the rest
//! with splice(2) through a pipe of its own ([`super::zerocopy`]), under
//! the same budget, idle and half-close rules: the bytes of a bulk
//! transfer never enter user space, which takes the proxy's CPU per byte
//! down by more than half (the egress benchmark in docs/benchmarks.md).
//!
//! Two optional first steps:
//! - up, for CONNECT: the ClientHello is read (bounded in size and time),
//!   its SNI and ECH checked against the CONNECT host, and only then are
//!   any bytes sent upstream (see [`super::tls`]);
//! - down, for plain HTTP: the upstream's response head is rewritten to
//!   `Connection: close`, so the client never reuses a connection that was
//!   authorised for one request.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::{show, JobLimits, Limits, SPLICE_BUFFER_BYTES, ZERO_COPY_AFTER_BYTES, ZERO_COPY_PIPE_BYTES};
use super::head::{self, hop_by_hop};
use super::host::Host;
use super::io::{read_buf, write_all, Socket};
use super::refusal::{Reason, Refusal};
use super::registry::Usage;
use super::tls::{self, ClientHello, HelloError, ALERT_HANDSHAKE_FAILURE, ALERT_UNRECOGNIZED_NAME};
use super::zerocopy::{Pipe, SpliceError};

/// The ClientHello check of a CONNECT tunnel.
#[derive(Debug, Clone)]
pub(super) struct TlsCheck {
    /// The CONNECT host the SNI must name.
    pub host: Host,
    /// The port is a TLS port: anything but TLS is refused.
    pub required: bool,
}

/// What a tunnel is asked to do.
pub(super) struct Tunnel<'a> {
    pub usage: &'a Usage,
    pub budget: JobLimits,
    pub limits: &'a Limits,
    /// Bytes for upstream before anything read from the client.
    pub up_first: Vec<u8>,
    pub tls: Option<TlsCheck>,
    pub rewrite_response: bool,
    /// Move bulk with splice(2) ([`ProxyConfig::zero_copy`](super::ProxyConfig::zero_copy)).
    pub zero_copy: bool,
}

/// How a tunnel ended.
#[derive(Debug)]
pub(super) enum End {
    /// Both directions reached end of stream.
    Closed,
    /// A socket error ended it (a reset is a normal way for peers to leave).
    Io(io::Error),
    /// The ClientHello was refused: send `alert`, close.
    Refused { refusal: Refusal, alert: Option<[u8; 7]> },
    /// A bound cut it.
    Cut(Refusal),
    /// The upstream misbehaved; answer with this if nothing was sent down yet.
    Failed(Refusal),
}

/// Bytes moved and how it ended.
#[derive(Debug)]
pub(super) struct Outcome {
    pub up: u64,
    pub down: u64,
    /// Of `up` and `down`, what splice(2) moved.
    pub zero_copy_up: u64,
    pub zero_copy_down: u64,
    pub end: End,
}

struct Counters {
    started: Instant,
    /// Milliseconds after `started` of the last byte either way.
    last_ms: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    /// Of `up` and `down`, the bytes moved with splice(2).
    zero_copy_up: AtomicU64,
    zero_copy_down: AtomicU64,
}

impl Counters {
    fn touch(&self) {
        self.last_ms.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

struct Ctx<'a> {
    t: &'a Tunnel<'a>,
    c: &'a Counters,
}

impl Ctx<'_> {
    /// Charge `n` bytes that arrived to the job's budget: how many of them
    /// may be forwarded (all, or up to the budget's edge).
    fn charge(&self, up: bool, n: usize) -> usize {
        self.t.usage.charge(up, n, self.budget(up))
    }

    fn budget(&self, up: bool) -> u64 {
        if up {
            self.t.budget.max_bytes_up
        } else {
            self.t.budget.max_bytes_down
        }
    }

    /// Count `n` bytes that went out (and whether splice moved them).
    fn sent(&self, up: bool, n: usize, zero_copy: bool) {
        let (all, spliced) = if up { (&self.c.up, &self.c.zero_copy_up) } else { (&self.c.down, &self.c.zero_copy_down) };
        all.fetch_add(n as u64, Ordering::Relaxed);
        if zero_copy {
            spliced.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The budget of this direction is spent: the tunnel ends.
    fn cut(&self, up: bool) -> End {
        let name = if up { "max_bytes_up" } else { "max_bytes_down" };
        End::Cut(Refusal::new(Reason::ByteBudget, format!("the job's byte budget {name} = {} is spent", self.budget(up))))
    }

    /// Charge `data` to the budget, forward what fits, cut when it did not all fit.
    async fn forward<S: Socket>(&self, to: &S, data: &[u8], up: bool) -> Result<(), End> {
        let fit = self.charge(up, data.len());
        if fit > 0 {
            write_all(to, &data[..fit]).await.map_err(End::Io)?;
            self.sent(up, fit, false);
        }
        if fit < data.len() {
            return Err(self.cut(up));
        }
        Ok(())
    }
}

/// Run the tunnel until both sides close, a bound fires, or `cancel`.
pub(super) async fn run<C: Socket>(client: &C, upstream: &TcpStream, tunnel: Tunnel<'_>, cancel: &CancellationToken) -> Outcome {
    let counters = Counters {
        started: Instant::now(),
        last_ms: AtomicU64::new(0),
        up: AtomicU64::new(0),
        down: AtomicU64::new(0),
        zero_copy_up: AtomicU64::new(0),
        zero_copy_down: AtomicU64::new(0),
    };
    let limits = tunnel.limits;
    let ctx = Ctx { t: &tunnel, c: &counters };
    let pumps = async { tokio::try_join!(up(client, upstream, &ctx), down(client, upstream, &ctx)) };
    let end = tokio::select! {
        r = pumps => match r { Ok(_) => End::Closed, Err(end) => end },
        _ = idle(&counters, limits.idle_timeout) => End::Cut(Refusal::new(
            Reason::IdleTimeout,
            format!("no byte either way for idle_timeout = {}", show(limits.idle_timeout)),
        )),
        _ = tokio::time::sleep_until(counters.started + limits.tunnel_lifetime) => End::Cut(Refusal::new(
            Reason::Lifetime,
            format!("the tunnel reached tunnel_lifetime = {}", show(limits.tunnel_lifetime)),
        )),
        _ = cancel.cancelled() => End::Cut(Refusal::new(Reason::ShuttingDown, "the proxy is shutting down")),
    };
    let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
    Outcome {
        up: load(&counters.up),
        down: load(&counters.down),
        zero_copy_up: load(&counters.zero_copy_up),
        zero_copy_down: load(&counters.zero_copy_down),
        end,
    }
}

/// Resolves once no byte has moved for `idle`.
async fn idle(c: &Counters, idle: Duration) {
    loop {
        let due = c.started + Duration::from_millis(c.last_ms.load(Ordering::Relaxed)) + idle;
        if Instant::now() >= due {
            return;
        }
        tokio::time::sleep_until(due).await;
    }
}

/// Client to upstream: first bytes, the ClientHello check, then bytes.
async fn up<C: Socket>(client: &C, upstream: &TcpStream, ctx: &Ctx<'_>) -> Result<(), End> {
    let mut pending = ctx.t.up_first.clone();
    if let Some(check) = &ctx.t.tls {
        let eof = check_client_hello(client, &mut pending, check, ctx).await?;
        if !pending.is_empty() {
            ctx.forward(upstream, &pending, true).await?;
        }
        if eof {
            let _ = upstream.shutdown_write();
            return Ok(());
        }
    } else if !pending.is_empty() {
        ctx.forward(upstream, &pending, true).await?;
    }
    drop(pending);
    pump(client, upstream, true, ctx).await
}

/// Read until the ClientHello can be judged; `Ok(true)` when the client
/// closed before sending anything (nothing to judge).
async fn check_client_hello<C: Socket>(client: &C, pending: &mut Vec<u8>, check: &TlsCheck, ctx: &Ctx<'_>) -> Result<bool, End> {
    let limits = ctx.t.limits;
    let mut deadline: Option<Instant> = None;
    loop {
        match tls::parse(pending, limits.max_client_hello_bytes) {
            Ok(Some(hello)) => return judge(&hello, &check.host).map(|_| false),
            Ok(None) => {}
            Err(HelloError::NotTls) if !check.required => return Ok(false),
            Err(HelloError::NotTls) => {
                return Err(End::Refused {
                    refusal: Refusal::new(Reason::NotTls, "this port requires TLS and the stream is not TLS"),
                    alert: None,
                })
            }
            Err(e) => {
                return Err(End::Refused {
                    refusal: Refusal::new(Reason::BadClientHello, e.to_string()),
                    alert: Some(ALERT_HANDSHAKE_FAILURE),
                })
            }
        }
        // The hello's clock starts at once on a TLS port, and at its first
        // byte elsewhere (a server-speaks-first protocol may be silent).
        if deadline.is_none() && (check.required || !pending.is_empty()) {
            deadline = Some(Instant::now() + limits.client_hello_timeout);
        }
        let read = read_buf(client, pending, 4096);
        let n = match deadline {
            Some(d) => match tokio::time::timeout_at(d, read).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(End::Refused {
                        refusal: Refusal::new(
                            Reason::ClientHelloTimeout,
                            format!("no complete ClientHello within client_hello_timeout = {}", show(limits.client_hello_timeout)),
                        ),
                        alert: None,
                    })
                }
            },
            None => read.await,
        }
        .map_err(End::Io)?;
        ctx.c.touch();
        if n == 0 {
            if pending.is_empty() {
                return Ok(true);
            }
            return Err(End::Refused {
                refusal: Refusal::new(Reason::BadClientHello, "the client closed in the middle of its ClientHello"),
                alert: None,
            });
        }
    }
}

/// SNI must be the CONNECT host (absent for an IP); with ECH the outer SNI must.
fn judge(hello: &ClientHello, host: &Host) -> Result<(), End> {
    let refuse = |reason, detail: String| Err(End::Refused { refusal: Refusal::new(reason, detail), alert: Some(ALERT_UNRECOGNIZED_NAME) });
    match (host, &hello.sni, hello.ech) {
        (Host::Name(name), Some(sni), _) if sni == name => Ok(()),
        (Host::Name(name), Some(sni), true) => {
            refuse(Reason::EchOuterMismatch, format!("the ECH outer SNI {sni:?} is not the CONNECT host {name:?}"))
        }
        (Host::Name(name), Some(sni), false) => {
            refuse(Reason::SniMismatch, format!("the TLS SNI {sni:?} is not the CONNECT host {name:?}"))
        }
        (Host::Name(name), None, true) => {
            refuse(Reason::EchOuterMismatch, format!("ECH without an outer SNI; the CONNECT host is {name:?}"))
        }
        (Host::Name(name), None, false) => {
            refuse(Reason::SniMissing, format!("the ClientHello names no server (SNI); the CONNECT host is {name:?}"))
        }
        (Host::Ip(_), None, false) => Ok(()),
        (Host::Ip(ip), Some(sni), false) => refuse(Reason::SniMismatch, format!("CONNECT to the address {ip} with the TLS SNI {sni:?}")),
        (Host::Ip(ip), _, true) => refuse(Reason::EchOuterMismatch, format!("ECH offered on a CONNECT to the address {ip}")),
    }
}

/// Upstream to client: the response-head rewrite, then bytes.
async fn down<C: Socket>(client: &C, upstream: &TcpStream, ctx: &Ctx<'_>) -> Result<(), End> {
    if ctx.t.rewrite_response {
        rewrite_response_heads(client, upstream, ctx).await?;
    }
    pump(upstream, client, false, ctx).await
}

/// Forward the upstream's response head(s) as `Connection: close`.
async fn rewrite_response_heads<C: Socket>(client: &C, upstream: &TcpStream, ctx: &Ctx<'_>) -> Result<(), End> {
    let limits = ctx.t.limits;
    let fail = |why: String| End::Failed(Refusal::new(Reason::BadUpstreamResponse, why));
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let parsed =
            head::parse_response(&buf, limits.max_headers).map_err(|e| fail(format!("the upstream's response head is malformed ({e})")))?;
        let Some(resp) = parsed else {
            if buf.len() >= limits.max_response_head_bytes {
                return Err(fail(format!(
                    "the upstream's response head exceeds max_response_head_bytes = {}",
                    limits.max_response_head_bytes
                )));
            }
            let want = (limits.max_response_head_bytes - buf.len()).min(8192);
            let n = read_buf(upstream, &mut buf, want).await.map_err(End::Io)?;
            ctx.c.touch();
            if n == 0 {
                return Err(fail("the upstream closed without a response".into()));
            }
            continue;
        };
        let interim = (100..200).contains(&resp.code) && resp.code != 101;
        let drop_names = hop_by_hop(&resp.headers);
        let mut out = format!("HTTP/1.1 {} {}\r\n", resp.code, resp.reason).into_bytes();
        for (name, value) in &resp.headers {
            if !drop_names.iter().any(|d| name.eq_ignore_ascii_case(d)) {
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        }
        if !interim {
            out.extend_from_slice(b"Connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        ctx.forward(client, &out, false).await?;
        let rest = buf.split_off(resp.len);
        buf = rest;
        if !interim {
            if !buf.is_empty() {
                ctx.forward(client, &buf, false).await?;
            }
            return Ok(());
        }
    }
}

/// Move bytes until end of stream; half-close the other side then.
///
/// Each direction starts with the copy loop and, with zero copy on,
/// switches to splice(2) once it has carried [`ZERO_COPY_AFTER_BYTES`]:
/// request/response chatter and idle tunnels never hold a pipe (two
/// descriptors and kernel memory each), bulk transfers skip user space.
async fn pump<F: Socket, T: Socket>(from: &F, to: &T, up: bool, ctx: &Ctx<'_>) -> Result<(), End> {
    if ctx.t.zero_copy {
        if copy(from, to, up, ctx, ZERO_COPY_AFTER_BYTES).await? == Copied::Eof {
            return Ok(());
        }
        if spliced(from, to, up, ctx).await? {
            return Ok(());
        }
    }
    copy(from, to, up, ctx, u64::MAX).await.map(|_| ())
}

#[derive(Debug, PartialEq, Eq)]
enum Copied {
    Eof,
    /// `until` bytes went through.
    Bulk,
}

/// The copy loop: until end of stream (half-closing `to`) or `until` bytes.
async fn copy<F: Socket, T: Socket>(from: &F, to: &T, up: bool, ctx: &Ctx<'_>, until: u64) -> Result<Copied, End> {
    let mut moved = 0u64;
    loop {
        from.readable().await.map_err(End::Io)?;
        // Taken only while bytes are ready (see the module docs).
        let mut buf = Vec::with_capacity(SPLICE_BUFFER_BYTES);
        loop {
            buf.clear();
            match from.try_read_buf(&mut buf) {
                Ok(0) => {
                    let _ = to.shutdown_write();
                    return Ok(Copied::Eof);
                }
                Ok(n) => {
                    ctx.c.touch();
                    ctx.forward(to, &buf, up).await?;
                    moved += n as u64;
                    if moved >= until {
                        return Ok(Copied::Bulk);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(End::Io(e)),
            }
        }
    }
}

/// The splice loop (see [`super::zerocopy`]): fill the pipe, charge what
/// came, send what fits, cut at the budget's edge. `Ok(false)`: splice is
/// not available here and nothing was moved, so the caller copies instead.
async fn spliced<F: Socket, T: Socket>(from: &F, to: &T, up: bool, ctx: &Ctx<'_>) -> Result<bool, End> {
    let mut pipe = match Pipe::new(ZERO_COPY_PIPE_BYTES) {
        Ok(pipe) => pipe,
        Err(e) => {
            // Out of descriptors, typically: copying still works.
            tracing::debug!(target: "skill_operator::egress", error = %e, "no pipe for zero copy; copying");
            return Ok(false);
        }
    };
    let mut first = true;
    loop {
        let n = match pipe.fill(from).await {
            Ok(0) => {
                // The pipe is empty here: every byte that came went out.
                let _ = to.shutdown_write();
                return Ok(true);
            }
            Ok(n) => n,
            Err(SpliceError::Unsupported(e)) if first => {
                tracing::debug!(target: "skill_operator::egress", error = %e, "splice not available; copying");
                return Ok(false);
            }
            Err(e) => return Err(End::Io(e.into())),
        };
        first = false;
        ctx.c.touch();
        let fit = ctx.charge(up, n);
        let mut left = fit;
        while left > 0 {
            // Bytes are in the pipe now: any failure here ends the tunnel.
            let k = pipe.send(to, left).await.map_err(|e| End::Io(e.into()))?;
            left -= k;
            ctx.sent(up, k, true);
            ctx.c.touch();
        }
        if fit < n {
            return Err(ctx.cut(up));
        }
    }
}
