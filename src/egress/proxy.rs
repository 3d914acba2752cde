//! One proxy request, start to end: head, identity, target, allowlist,
//! budgets, resolution, address policy, dial, then the tunnel; and the
//! access-log line and counters for it.
//!
//! The order is deliberate: nothing about the target is looked at before
//! the job is identified (an unauthenticated client learns nothing about
//! allowlists), nothing is resolved before the allowlist matched (a
//! refused name is never looked up, so DNS is no side channel), and
//! nothing is dialed before every resolved address passed the policy.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::audit::{Event, Outcome, Record};

use super::addr::canonical;
use super::allowlist::{Allowlist, Mismatch};
use super::config::{show, MAX_ADDRESSES};
use super::head::{self, hop_by_hop, HeadError, RequestHead};
use super::host::{self, Host, HostError, Target};
use super::identity::{self, JobId};
use super::io::{write_all, Socket};
use super::metrics::Verdict;
use super::refusal::{Reason, Refusal};
use super::registry::JobEntry;
use super::shared::Shared;
use super::splice::{self, End, TlsCheck, Tunnel};

/// Who is asking.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    /// A TCP client: identified by its credential, checked against its
    /// address (`local`: the proxy's end of the connection).
    Tcp { peer: SocketAddr, local: SocketAddr },
    /// A unix-socket listener bound to one job: the socket is the identity.
    Unix(JobId),
}

impl Origin {
    /// The client as the access log and the audit trail name it.
    fn peer(&self) -> String {
        match self {
            Origin::Tcp { peer, .. } => peer.to_string(),
            Origin::Unix(job) => format!("unix:{job}"),
        }
    }
}

/// The audit record of a connection refused at accept (too many pending heads).
pub(crate) fn audit_busy(shared: &Shared, refusal: &Refusal, origin: &Origin) {
    if shared.audit.enabled() {
        let record =
            Record::new(Event::Egress, Outcome::Refused).code(refusal.reason.as_str()).reason(refusal.detail.clone()).peer(origin.peer());
        shared.audit.record(record);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Connect,
    Http,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Connect => "connect",
            Kind::Http => "http",
        }
    }
}

/// The fields of the access-log line.
struct Access {
    job: Option<JobId>,
    kind: Option<Kind>,
    target: Option<Target>,
    addr: Option<SocketAddr>,
    peer: String,
}

enum Stop {
    Refuse(Refusal),
    /// The client left before a complete head: nobody to answer, nothing to log loudly.
    Gone,
}

impl From<Refusal> for Stop {
    fn from(r: Refusal) -> Self {
        Stop::Refuse(r)
    }
}

/// Serve one accepted connection.
pub(crate) async fn handle<C: Socket>(
    shared: Arc<Shared>,
    client: C,
    origin: Origin,
    accepted: Instant,
    pending: super::shared::Pending,
    cancel: CancellationToken,
) {
    let mut access = Access { job: None, kind: None, target: None, addr: None, peer: origin.peer() };
    let result = serve(&shared, &client, &origin, accepted, pending, &cancel, &mut access).await;
    let (verdict, reason, detail, up, down) = match result {
        Err(Stop::Gone) => {
            tracing::debug!(target: "skill_operator::egress", peer = %access.peer, "client left before sending a request head");
            return;
        }
        Err(Stop::Refuse(refusal)) => {
            let _ = write_all(&client, &refusal.response()).await;
            linger_close(&client).await;
            (verdict_of(refusal.reason), refusal.reason.as_str(), refusal.detail, 0, 0)
        }
        Ok(outcome) => {
            let (verdict, reason, detail) = match outcome.end {
                End::Closed => (Verdict::Allowed, "ok", String::new()),
                End::Io(e) => (Verdict::Allowed, "ok", e.to_string()),
                End::Refused { refusal, alert } => {
                    if let Some(alert) = alert {
                        let _ = write_all(&client, &alert).await;
                    }
                    (Verdict::Refused, refusal.reason.as_str(), refusal.detail)
                }
                End::Cut(refusal) => (Verdict::Cut, refusal.reason.as_str(), refusal.detail),
                End::Failed(refusal) => {
                    if outcome.down == 0 {
                        let _ = write_all(&client, &refusal.response()).await;
                    }
                    (Verdict::Failed, refusal.reason.as_str(), refusal.detail)
                }
            };
            shared.metrics.add_zero_copy_bytes(outcome.zero_copy_up, outcome.zero_copy_down);
            (verdict, reason, detail, outcome.up, outcome.down)
        }
    };
    shared.metrics.count(verdict, reason);
    shared.metrics.add_bytes(up, down);
    if shared.audit.enabled() {
        shared.audit.record(audit_record(&access, verdict, reason, &detail, up, down));
    }
    let job = access.job.as_ref().map(|j| j.to_string()).unwrap_or_else(|| "-".into());
    let (host, port) = match &access.target {
        Some(t) => (t.host.to_string(), t.port),
        None => ("-".into(), 0),
    };
    let addr = access.addr.map(|a| a.to_string()).unwrap_or_else(|| "-".into());
    tracing::info!(
        target: "skill_operator::egress",
        job = %job,
        peer = %access.peer,
        kind = access.kind.map(Kind::as_str).unwrap_or("-"),
        host = %host,
        port,
        addr = %addr,
        up,
        down,
        verdict = verdict.as_str(),
        reason,
        ms = accepted.elapsed().as_millis() as u64,
        detail = %detail,
        "egress"
    );
}

/// The connection's `egress` audit record: which job, where to, how it ended, bytes each way.
fn audit_record(access: &Access, verdict: Verdict, reason: &str, detail: &str, up: u64, down: u64) -> Record {
    let outcome = match verdict {
        Verdict::Allowed => Outcome::Ok,
        Verdict::Refused => Outcome::Refused,
        Verdict::Cut => Outcome::Cut,
        Verdict::Failed => Outcome::Failed,
    };
    let mut record = Record::new(Event::Egress, outcome).code(reason).peer(&access.peer).bytes(up, down);
    if !detail.is_empty() {
        record = record.reason(detail);
    }
    if let Some(job) = &access.job {
        if !job.namespace.is_empty() {
            record = record.namespace(&job.namespace);
        }
        record = record.skilljob_uid(&job.uid);
    }
    if let Some(t) = &access.target {
        record = record.target(t.host.to_string(), t.port);
    }
    record
}

fn verdict_of(reason: Reason) -> Verdict {
    match reason {
        Reason::ResolveFailed | Reason::ResolveTimeout | Reason::ConnectFailed | Reason::ConnectTimeout | Reason::BadUpstreamResponse => {
            Verdict::Failed
        }
        _ => Verdict::Refused,
    }
}

/// How long a refused client's remaining bytes are drained.
const LINGER: std::time::Duration = std::time::Duration::from_millis(500);

/// After a refusal: half-close, then read (and discard) what the client
/// still sends for a moment, so the kernel does not answer its unread
/// bytes with a reset that would destroy the refusal before it is read.
async fn linger_close<C: Socket>(client: &C) {
    let _ = client.shutdown_write();
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut total = 0usize;
        while total < 64 * 1024 {
            match super::io::read_some(client, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

async fn serve<C: Socket>(
    shared: &Shared,
    client: &C,
    origin: &Origin,
    accepted: Instant,
    pending: super::shared::Pending,
    cancel: &CancellationToken,
    access: &mut Access,
) -> Result<splice::Outcome, Stop> {
    let limits = &shared.limits;
    let head = match head::read_request(client, limits, accepted + limits.header_timeout).await {
        Ok(head) => head,
        Err(HeadError::Refuse(r)) => return Err(r.into()),
        Err(HeadError::Gone) => return Err(Stop::Gone),
    };

    if let Origin::Tcp { peer, local } = origin {
        if shared.is_outbound(*peer, *local) {
            return Err(Refusal::new(Reason::ProxyLoop, "this request came from the proxy's own upstream connection").into());
        }
    }

    let (kind, authority, path) = if head.method.eq_ignore_ascii_case("CONNECT") {
        (Kind::Connect, head.target.clone(), None)
    } else {
        let (authority, path) = split_absolute(&head.target)?;
        (Kind::Http, authority, Some(path))
    };
    access.kind = Some(kind);

    // Still counted as pending (overall and per source address) while it
    // may wait for its record: a pod holding a valid credential cannot pile
    // up waiting connections beyond those caps.
    let entry = identify_in_time(shared, origin, &head).await?;
    drop(pending);
    access.job = Some(entry.spec.id());

    let target = host::parse_authority(&authority, (kind == Kind::Http).then_some(80)).map_err(host_refusal)?;
    access.target = Some(target.clone());
    entry.spec.allow.check(&target.host, target.port).map_err(|m| mismatch_refusal(m, &target, &entry.spec.allow))?;

    let budget = entry.spec.limits.resolve(&limits.job);
    if let Some(which) = entry.usage.spent(&budget) {
        return Err(Refusal::new(Reason::ByteBudget, format!("the job's byte budget {which} is spent")).into());
    }
    let _slot = entry.usage.try_open(budget.max_connections).ok_or_else(|| {
        Refusal::new(Reason::JobConnectionLimit, format!("the job already holds max_connections = {} tunnels", budget.max_connections))
    })?;
    let _tunnel = shared.tunnels.clone().try_acquire_owned().map_err(|_| {
        Refusal::new(Reason::ProxyBusy, format!("the proxy holds max_tunnels = {} tunnels; retry later", limits.max_tunnels))
    })?;

    let addrs = resolve_checked(shared, &target).await?;
    let (upstream, addr) = dial(shared, &target, &addrs).await?;
    access.addr = Some(addr);
    let _outbound = shared.track_outbound(&upstream);

    let tunnel = match kind {
        Kind::Connect => {
            write_all(client, b"HTTP/1.1 200 Connection Established\r\n\r\n").await.map_err(|_| Stop::Gone)?;
            Tunnel {
                usage: &entry.usage,
                budget,
                limits,
                up_first: head.rest,
                tls: Some(TlsCheck { host: target.host.clone(), required: shared.tls_ports.contains(&target.port) }),
                rewrite_response: false,
                zero_copy: shared.zero_copy,
            }
        }
        Kind::Http => {
            let mut first = forward_head(&head, &target, path.as_deref().unwrap_or("/"));
            first.extend_from_slice(&head.rest);
            Tunnel { usage: &entry.usage, budget, limits, up_first: first, tls: None, rewrite_response: true, zero_copy: shared.zero_copy }
        }
    };
    shared.metrics.tunnels.inc();
    let outcome = splice::run(client, &upstream, tunnel, cancel).await;
    shared.metrics.tunnels.dec();
    Ok(outcome)
}

/// Split `http://authority/path`; anything else is not proxied here.
fn split_absolute(target: &str) -> Result<(String, String), Refusal> {
    let scheme_end = target.find("://");
    let scheme = scheme_end.map(|i| &target[..i]);
    match scheme {
        Some(s) if s.eq_ignore_ascii_case("http") => {}
        Some(s) if s.eq_ignore_ascii_case("https") => {
            return Err(Refusal::new(
                Reason::UseConnect,
                "https:// is proxied with CONNECT host:443 (set HTTPS_PROXY), never in absolute form",
            ))
        }
        _ => {
            return Err(Refusal::new(
                Reason::NotProxyRequest,
                "this is an egress proxy: send CONNECT host:port, or an absolute-form request (GET http://host/path)",
            ))
        }
    }
    let rest = &target[scheme_end.unwrap_or(0) + 3..];
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = rest[..end].to_string();
    let mut path = rest[end..].split('#').next().unwrap_or("").to_string();
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    Ok((authority, path))
}

/// How long a request with a valid credential waits for its job's record
/// (or its pod's address) to reach the registry. The controller writes the
/// record before the run's script can start (a warm pod gets its claim only
/// after it), but the proxy hears of it through a watch, which can trail.
pub const RECORD_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Why [`identify`] refused: for good, or for now (a valid credential whose
/// record may be on its way; see [`RECORD_GRACE`]).
enum Unidentified {
    Refused(Refusal),
    NotYet(Refusal),
}

/// One request in `egress_waiting_for_record` while it lives.
struct Waiting<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> Waiting<'a> {
    fn start(gauge: &'a prometheus_client::metrics::gauge::Gauge) -> Waiting<'a> {
        gauge.inc();
        Waiting(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// [`identify`], waiting up to [`RECORD_GRACE`] while the registry may still
/// learn the job: only for a credential whose mac verified, so only the
/// operator's own tokens ever wait.
async fn identify_in_time(shared: &Shared, origin: &Origin, head: &RequestHead) -> Result<Arc<JobEntry>, Refusal> {
    let mut changes = shared.registry.changes();
    let deadline = tokio::time::Instant::now() + RECORD_GRACE;
    loop {
        match identify(shared, origin, head) {
            Ok(entry) => return Ok(entry),
            Err(Unidentified::Refused(r)) => return Err(r),
            Err(Unidentified::NotYet(r)) => {
                let Some(rx) = changes.as_mut() else { return Err(r) };
                let changed = {
                    // Counted while it waits, however the wait ends (a dropped connection too).
                    let _waiting = Waiting::start(&shared.metrics.waiting_for_record);
                    tokio::time::timeout_at(deadline, rx.changed()).await
                };
                match changed {
                    Ok(Ok(())) => continue,
                    _ => return Err(r),
                }
            }
        }
    }
}

/// The job behind the request (see [`super::identity`] and the registry).
fn identify(shared: &Shared, origin: &Origin, head: &RequestHead) -> Result<Arc<JobEntry>, Unidentified> {
    match origin {
        Origin::Unix(job) => shared.registry.job(job).ok_or_else(|| {
            Unidentified::Refused(Refusal::new(Reason::JobGone, format!("the run {job} is no longer registered for egress")))
        }),
        Origin::Tcp { peer, .. } => {
            let refused = |reason, detail: &str| Unidentified::Refused(Refusal::new(reason, detail));
            let mut values = head.header("proxy-authorization");
            let Some(value) = values.next() else {
                return Err(refused(
                    Reason::ProxyAuthRequired,
                    "send Proxy-Authorization: Basic base64(job:<token>), e.g. HTTPS_PROXY=http://job:<token>@<proxy>:<port>",
                ));
            };
            if values.next().is_some() {
                return Err(refused(Reason::BadCredentials, "more than one Proxy-Authorization header"));
            }
            let (job, mac) = identity::parse_authorization(value).map_err(|e| refused(Reason::BadCredentials, &e.to_string()))?;
            // The mac first (constant time): a forged job name learns nothing.
            if !identity::verify(&shared.proxy_key, &job, &mac) {
                return Err(refused(Reason::BadCredentials, "the token is not valid for the job it names"));
            }
            let entry = shared.registry.job(&job).ok_or_else(|| {
                Unidentified::NotYet(Refusal::new(
                    Reason::BadCredentials,
                    format!("the job {job} is not (or no longer) registered with the proxy"),
                ))
            })?;
            match entry.spec.source {
                Some(source) if canonical(source) == canonical(peer.ip()) => Ok(entry),
                Some(_) => Err(refused(
                    Reason::WrongSource,
                    &format!("the credential of {job} is valid only from that job's pod, not from {}", peer.ip()),
                )),
                None => Err(Unidentified::NotYet(Refusal::new(
                    Reason::WrongSource,
                    format!("the pod address of {job} is not registered yet; retry when the pod runs"),
                ))),
            }
        }
    }
}

fn host_refusal(e: HostError) -> Refusal {
    let reason = match e {
        HostError::IpLiteral(_) | HostError::IpZone(_) => Reason::IpLiteral,
        HostError::BadPort(_) | HostError::MissingPort(_) => Reason::BadPort,
        _ => Reason::BadHost,
    };
    Refusal::new(reason, e.to_string())
}

fn mismatch_refusal(m: Mismatch, target: &Target, allow: &Allowlist) -> Refusal {
    match m {
        Mismatch::Empty => Refusal::new(
            Reason::NoEgress,
            "this job has no egress allowlist, so it may reach no host; an admin allows hosts on the SkillPackage runtime profile",
        ),
        Mismatch::Host => Refusal::new(Reason::HostNotAllowed, format!("{} is not on this job's allowlist ({allow})", target.host)),
        Mismatch::IpNotListed => Refusal::new(
            Reason::IpLiteral,
            format!("{} is an IP address no IP entry lists; name the host (allowlist: {allow})", target.host),
        ),
        Mismatch::Port(ports) => {
            let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
            Refusal::new(
                Reason::PortNotAllowed,
                format!("{}: port {} is not allowed (allowed: {})", target.host, target.port, ports.join(",")),
            )
        }
    }
}

/// Resolve once, check every address: refuse when any is denied.
///
/// Refusing on a mixed answer (rather than dialing only the good
/// addresses) is deliberate: a public name with an internal address in its
/// answer is misconfigured or attacking, and failing loudly names the
/// address so the admin sees it.
async fn resolve_checked(shared: &Shared, target: &Target) -> Result<Vec<IpAddr>, Refusal> {
    let limits = &shared.limits;
    let (mut ips, listed) = match &target.host {
        Host::Ip(ip) => (vec![*ip], true),
        Host::Name(name) => match tokio::time::timeout(limits.resolve_timeout, shared.resolver.resolve(name)).await {
            Err(_) => {
                return Err(Refusal::new(
                    Reason::ResolveTimeout,
                    format!("{name} did not resolve within resolve_timeout = {}", show(limits.resolve_timeout)),
                ))
            }
            Ok(Err(e)) => return Err(Refusal::new(Reason::ResolveFailed, format!("{name} did not resolve ({e})"))),
            Ok(Ok(ips)) if ips.is_empty() => return Err(Refusal::new(Reason::ResolveFailed, format!("{name} has no address"))),
            Ok(Ok(ips)) => (ips, false),
        },
    };
    ips.truncate(MAX_ADDRESSES);
    let own = shared.own_addresses();
    for ip in &ips {
        if let Err(denial) = shared.policy.check(*ip, target.port, listed, &own) {
            let detail = match &target.host {
                Host::Name(name) => format!("{name} resolves to {denial}; every address of an allowed host must be public"),
                Host::Ip(_) => format!("{denial}"),
            };
            return Err(Refusal::new(Reason::AddressDenied, detail));
        }
    }
    Ok(ips)
}

/// Dial the checked addresses in order, within one connect timeout.
async fn dial(shared: &Shared, target: &Target, ips: &[IpAddr]) -> Result<(TcpStream, SocketAddr), Refusal> {
    let timeout = shared.limits.connect_timeout;
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    for ip in ips {
        let addr = SocketAddr::new(*ip, target.port);
        match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok((stream, addr));
            }
            Ok(Err(e)) => last = format!("{addr}: {e}"),
            Err(_) => {
                return Err(Refusal::new(
                    Reason::ConnectTimeout,
                    format!("{target} did not accept a connection within connect_timeout = {}", show(timeout)),
                ))
            }
        }
    }
    Err(Refusal::new(Reason::ConnectFailed, format!("{target} refused the connection ({last})")))
}

/// The request head for upstream: origin-form target, `Host` from the
/// URI (a different `Host` header would pick another virtual host: plain
/// HTTP domain fronting), no hop-by-hop or proxy headers, `Connection:
/// close`.
fn forward_head(head: &RequestHead, target: &Target, path: &str) -> Vec<u8> {
    let drop = hop_by_hop(&head.headers);
    let host = if target.port == 80 { target.host.to_string() } else { target.to_string() };
    let mut out = format!("{} {path} HTTP/1.1\r\nHost: {host}\r\n", head.method).into_bytes();
    for (name, value) in &head.headers {
        if name.eq_ignore_ascii_case("host") || drop.iter().any(|d| name.eq_ignore_ascii_case(d)) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_targets() {
        assert_eq!(split_absolute("http://a.test/x?y").unwrap(), ("a.test".into(), "/x?y".into()));
        assert_eq!(split_absolute("HTTP://a.test:8080").unwrap(), ("a.test:8080".into(), "/".into()));
        assert_eq!(split_absolute("http://a.test?q").unwrap(), ("a.test".into(), "/?q".into()));
        assert_eq!(split_absolute("http://a.test/p#frag").unwrap(), ("a.test".into(), "/p".into()));
        assert_eq!(split_absolute("http://u@a.test/").unwrap().0, "u@a.test");
        assert_eq!(split_absolute("https://a.test/").unwrap_err().reason, Reason::UseConnect);
        assert_eq!(split_absolute("/relative").unwrap_err().reason, Reason::NotProxyRequest);
        assert_eq!(split_absolute("ftp://a.test/").unwrap_err().reason, Reason::NotProxyRequest);
    }

    #[test]
    fn forwarded_head_drops_proxy_and_hop_headers() {
        let head = RequestHead {
            method: "GET".into(),
            target: "http://a.test/x".into(),
            headers: vec![
                ("Host".into(), b"evil.test".to_vec()),
                ("Proxy-Authorization".into(), b"Basic xyz".to_vec()),
                ("Connection".into(), b"keep-alive, X-Secret".to_vec()),
                ("X-Secret".into(), b"1".to_vec()),
                ("Accept".into(), b"*/*".to_vec()),
            ],
            rest: Vec::new(),
        };
        let target = Target { host: Host::Name("a.test".into()), port: 8080 };
        let text = String::from_utf8(forward_head(&head, &target, "/x")).unwrap();
        assert_eq!(text, "GET /x HTTP/1.1\r\nHost: a.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    }
}
