//! The Host check of every console route: the same list of names the MCP
//! endpoint accepts (loopback and `--allowed-host`, the chart's Service
//! names). A page on another site whose name was rebound to the
//! gateway's address would otherwise reach the API as same-origin; it
//! has no token, but in anonymous mode it would not need one.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::Console;
use crate::gateway::shared::json_error;

/// `host[:port]` lower-cased, without IPv6 brackets.
fn normalized(authority: &str) -> Option<(String, Option<u16>)> {
    let authority: axum::http::uri::Authority = authority.trim().parse().ok()?;
    if authority.as_str().contains('@') {
        return None;
    }
    Some((authority.host().trim_matches(['[', ']']).to_ascii_lowercase(), authority.port_u16()))
}

/// Whether `host` (a Host header) is one of `allowed` (names, optionally
/// with a port that must then match too). An empty list allows any.
pub fn host_allowed(host: Option<&str>, allowed: &[String]) -> bool {
    if allowed.is_empty() {
        return true;
    }
    let Some((name, port)) = host.and_then(normalized) else { return false };
    allowed
        .iter()
        .filter_map(|a| normalized(a).or_else(|| Some((a.trim_matches(['[', ']']).to_ascii_lowercase(), None))))
        .any(|(allowed_name, allowed_port)| allowed_name == name && allowed_port.is_none_or(|p| Some(p) == port))
}

pub async fn check_host(State(console): State<Console>, request: Request, next: Next) -> Response {
    let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok());
    if host_allowed(host, &console.allowed_hosts) {
        return next.run(request).await;
    }
    tracing::debug!(host = ?host, "console request for a host name this gateway does not serve");
    json_error(
        StatusCode::FORBIDDEN,
        "host-not-allowed",
        "this gateway does not serve the console under that host name; add it with --allowed-host (chart: gateway.allowedHosts)".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_listed_names_pass_and_a_listed_port_must_match() {
        let allowed: Vec<String> = ["localhost", "::1", "gw.skills.svc", "10.0.0.62:8090"].into_iter().map(String::from).collect();
        for ok in ["localhost", "localhost:8090", "LOCALHOST:1", "[::1]:8090", "gw.skills.svc:8090", "10.0.0.62:8090"] {
            assert!(host_allowed(Some(ok), &allowed), "{ok}");
        }
        for bad in ["evil.example", "evil.example:8090", "gw.skills.svc.evil.example", "10.0.0.62:9999", "10.0.0.62", "user@localhost", ""]
        {
            assert!(!host_allowed(Some(bad), &allowed), "{bad}");
        }
        assert!(!host_allowed(None, &allowed), "no Host header");
        assert!(host_allowed(Some("anything"), &[]), "an empty list checks nothing (tests)");
    }
}
