//! Refusals: a reason code, the HTTP status it maps to, and a one-line
//! message a script can print.
//!
//! Every refusal before the tunnel opens is an HTTP response: status
//! (403 for policy, 407 for credentials, 502/504 for upstream failures,
//! 400/408/431 for malformed, slow or oversized heads, 503 when the proxy
//! is full), an `X-Egress-Refused: <code>` header and a body of one line:
//! `egress refused (<code>): <what and what to do>`. After `200 Connection
//! Established` the only way left to refuse is to close (after a TLS alert
//! when the ClientHello was refused); the reason then is in the access log
//! and the metrics.

use std::fmt;

/// The reason codes (stable: scripts and dashboards match on them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The request head is not HTTP/1.x.
    BadRequest,
    /// The request head exceeded `max_header_bytes` / `max_headers`.
    HeaderTooLarge,
    /// The request head did not arrive within `header_timeout`.
    HeaderTimeout,
    /// Not a proxy request (origin-form target, or a method other than CONNECT with a relative target).
    NotProxyRequest,
    /// An absolute `https://` (or other) URI: use CONNECT for TLS.
    UseConnect,
    /// No `Proxy-Authorization`.
    ProxyAuthRequired,
    /// Malformed, unknown or wrong credentials.
    BadCredentials,
    /// A valid credential from an address other than the job's pod.
    WrongSource,
    /// The job of a unix-socket listener is no longer registered.
    JobGone,
    /// A malformed host.
    BadHost,
    /// A port outside 1-65535, or missing.
    BadPort,
    /// An IP literal no IP entry lists (any notation).
    IpLiteral,
    /// The job's allowlist is empty.
    NoEgress,
    /// The host is not on the allowlist.
    HostNotAllowed,
    /// The host is on the allowlist, the port is not.
    PortNotAllowed,
    /// The job holds `max_connections` tunnels already.
    JobConnectionLimit,
    /// The job's byte budget is spent (or was spent mid-tunnel).
    ByteBudget,
    /// `max_tunnels` or `max_pending` reached.
    ProxyBusy,
    /// `max_pending_per_address` reached: this address has that many connections still sending their head.
    AddressBusy,
    /// The name did not resolve.
    ResolveFailed,
    /// The name did not resolve within `resolve_timeout`.
    ResolveTimeout,
    /// A resolved address is not allowed (private, loopback, ...).
    AddressDenied,
    /// The request came back to the proxy through itself.
    ProxyLoop,
    /// No checked address accepted the connection.
    ConnectFailed,
    /// No checked address connected within `connect_timeout`.
    ConnectTimeout,
    /// The upstream's response head was malformed or too large.
    BadUpstreamResponse,
    /// A TLS port, and the stream is not TLS.
    NotTls,
    /// A ClientHello that cannot be parsed, or too large.
    BadClientHello,
    /// The ClientHello did not arrive within `client_hello_timeout`.
    ClientHelloTimeout,
    /// The ClientHello has no SNI (on a name).
    SniMissing,
    /// The SNI differs from the CONNECT host (domain fronting).
    SniMismatch,
    /// ECH is offered and its outer SNI differs from the CONNECT host.
    EchOuterMismatch,
    /// The tunnel saw no byte for `idle_timeout`.
    IdleTimeout,
    /// The tunnel reached `tunnel_lifetime`.
    Lifetime,
    /// The proxy is shutting down.
    ShuttingDown,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "bad_request",
            Reason::HeaderTooLarge => "header_too_large",
            Reason::HeaderTimeout => "header_timeout",
            Reason::NotProxyRequest => "not_proxy_request",
            Reason::UseConnect => "use_connect",
            Reason::ProxyAuthRequired => "proxy_auth_required",
            Reason::BadCredentials => "bad_credentials",
            Reason::WrongSource => "wrong_source",
            Reason::JobGone => "job_gone",
            Reason::BadHost => "bad_host",
            Reason::BadPort => "bad_port",
            Reason::IpLiteral => "ip_literal",
            Reason::NoEgress => "no_egress",
            Reason::HostNotAllowed => "host_not_allowed",
            Reason::PortNotAllowed => "port_not_allowed",
            Reason::JobConnectionLimit => "job_connection_limit",
            Reason::ByteBudget => "byte_budget",
            Reason::ProxyBusy => "proxy_busy",
            Reason::AddressBusy => "address_busy",
            Reason::ResolveFailed => "resolve_failed",
            Reason::ResolveTimeout => "resolve_timeout",
            Reason::AddressDenied => "address_denied",
            Reason::ProxyLoop => "proxy_loop",
            Reason::ConnectFailed => "connect_failed",
            Reason::ConnectTimeout => "connect_timeout",
            Reason::BadUpstreamResponse => "bad_upstream_response",
            Reason::NotTls => "not_tls",
            Reason::BadClientHello => "bad_client_hello",
            Reason::ClientHelloTimeout => "client_hello_timeout",
            Reason::SniMissing => "sni_missing",
            Reason::SniMismatch => "sni_mismatch",
            Reason::EchOuterMismatch => "ech_outer_mismatch",
            Reason::IdleTimeout => "idle_timeout",
            Reason::Lifetime => "lifetime",
            Reason::ShuttingDown => "shutting_down",
        }
    }

    /// The HTTP status of a refusal with this reason.
    pub fn status(self) -> u16 {
        match self {
            Reason::BadRequest | Reason::NotProxyRequest | Reason::UseConnect => 400,
            Reason::HeaderTimeout => 408,
            Reason::HeaderTooLarge => 431,
            Reason::ProxyAuthRequired | Reason::BadCredentials => 407,
            Reason::ProxyBusy | Reason::AddressBusy | Reason::ShuttingDown => 503,
            Reason::ResolveFailed | Reason::ConnectFailed | Reason::BadUpstreamResponse => 502,
            Reason::ResolveTimeout | Reason::ConnectTimeout => 504,
            _ => 403,
        }
    }

    /// Every reason (docs and tests).
    pub const ALL: &'static [Reason] = &[
        Reason::BadRequest,
        Reason::HeaderTooLarge,
        Reason::HeaderTimeout,
        Reason::NotProxyRequest,
        Reason::UseConnect,
        Reason::ProxyAuthRequired,
        Reason::BadCredentials,
        Reason::WrongSource,
        Reason::JobGone,
        Reason::BadHost,
        Reason::BadPort,
        Reason::IpLiteral,
        Reason::NoEgress,
        Reason::HostNotAllowed,
        Reason::PortNotAllowed,
        Reason::JobConnectionLimit,
        Reason::ByteBudget,
        Reason::ProxyBusy,
        Reason::AddressBusy,
        Reason::ResolveFailed,
        Reason::ResolveTimeout,
        Reason::AddressDenied,
        Reason::ProxyLoop,
        Reason::ConnectFailed,
        Reason::ConnectTimeout,
        Reason::BadUpstreamResponse,
        Reason::NotTls,
        Reason::BadClientHello,
        Reason::ClientHelloTimeout,
        Reason::SniMissing,
        Reason::SniMismatch,
        Reason::EchOuterMismatch,
        Reason::IdleTimeout,
        Reason::Lifetime,
        Reason::ShuttingDown,
    ];
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal: a reason and the one-line detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub detail: String,
}

/// The header every refusal carries.
pub const REFUSED_HEADER: &str = "X-Egress-Refused";
/// The longest detail sent (the log keeps it whole).
const MAX_DETAIL: usize = 400;

impl Refusal {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Refusal {
        Refusal { reason, detail: detail.into() }
    }

    /// The one line of the body.
    pub fn line(&self) -> String {
        let mut detail: String = self.detail.chars().filter(|c| !c.is_control()).collect();
        if detail.len() > MAX_DETAIL {
            let mut cut = MAX_DETAIL;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
            detail.push_str("...");
        }
        format!("egress refused ({}): {detail}\n", self.reason.as_str())
    }

    /// The whole HTTP/1.1 response.
    pub fn response(&self) -> Vec<u8> {
        let status = self.reason.status();
        let body = self.line();
        let auth = if status == 407 { "Proxy-Authenticate: Basic realm=\"skill-operator egress\"\r\n" } else { "" };
        format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\n{REFUSED_HEADER}: {}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            status_text(status),
            self.reason.as_str(),
            body.len()
        )
        .into_bytes()
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason.as_str(), self.detail)
    }
}

fn status_text(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            assert!(seen.insert(r.as_str()), "{r:?}");
            assert!(r.as_str().bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
        }
    }

    #[test]
    fn response_is_one_line_with_the_code() {
        let r = Refusal::new(Reason::HostNotAllowed, "other.test:443 is not allowed\r\nInjected: yes");
        let text = String::from_utf8(r.response()).unwrap();
        assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{text}");
        assert!(text.contains("\r\nX-Egress-Refused: host_not_allowed\r\n"));
        assert!(!text.contains("\r\nInjected"));
        assert!(text.ends_with("\r\n\r\negress refused (host_not_allowed): other.test:443 is not allowedInjected: yes\n"), "{text}");
        let text = String::from_utf8(Refusal::new(Reason::ProxyAuthRequired, "x").response()).unwrap();
        assert!(text.contains("Proxy-Authenticate: Basic"));
    }
}
