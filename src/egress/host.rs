//! The host a request names: the CONNECT authority (`host:port`) or the
//! authority of an absolute-form URI (`http://host[:port]/...`).
//!
//! Everything a client writes is refused unless it is one of exactly two
//! things:
//! - a DNS name that survives IDNA (UTS #46, STD3 rules) as lower-case
//!   LDH labels of 1 to 63 bytes, at most 253 bytes in all, without a
//!   trailing dot; internationalised names become punycode (`xn--`);
//! - an IP address in its one canonical notation: dotted-decimal IPv4
//!   (`203.0.113.7`) or a bracketed IPv6 address without a zone
//!   (`[2001:db8::1]`). Such a literal still passes only when an IP entry of
//!   the allowlist lists it (see [`super::allowlist`]).
//!
//! Bypasses this closes: the URL parsers of browsers, curl and libc's
//! `inet_aton` read many spellings of one address (`2130706433`,
//! `0177.0.0.1`, `0x7f.1`, `127.1`, `127.0.0.1.`, full-width digits that
//! IDNA maps to ASCII); any name whose last label is a number in such a
//! notation is treated as an IP literal (the WHATWG "ends in a number"
//! rule) and refused, so no notation can reach an address the allowlist
//! did not name. IPv6 zones (`%25eth0`) select an interface and are refused;
//! IPv4-mapped and IPv4-compatible IPv6 literals are refused so an IPv4
//! address cannot be smuggled in IPv6 clothing. Userinfo (`user@host`) is
//! refused outright: `allowed.test@evil.test` means different hosts to
//! different parsers.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};

/// Longest authority (before IDNA) looked at; anything longer is refused.
pub const MAX_AUTHORITY_LEN: usize = 512;
/// Longest DNS name after IDNA (RFC 1035).
pub const MAX_NAME_LEN: usize = 253;
/// Longest DNS label (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;

/// A checked host: a normalised DNS name or a canonical IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// Lower-case ASCII (punycode) LDH labels, no trailing dot.
    Name(String),
    /// A canonical literal; allowed only through an IP entry.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// A checked host and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Why a host was refused. The messages say what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("no host given; name the host as host:port")]
    Empty,
    #[error("{0:?} carries userinfo (`user@`); name the host alone")]
    Userinfo(String),
    #[error("{0:?} is an IP address literal in a non-canonical or embedded notation; name the host (only a listed IP entry, written canonically, is ever allowed)")]
    IpLiteral(String),
    #[error("{0:?} has an IPv6 zone; zones select a local interface and are never allowed")]
    IpZone(String),
    #[error("{host:?} is not a valid host name: {why}")]
    BadName { host: String, why: &'static str },
    #[error("{0:?} ends with a dot; name the host without the trailing dot")]
    TrailingDot(String),
    #[error("the host is longer than {MAX_NAME_LEN} bytes")]
    TooLong,
    #[error("{0:?} is not a port in 1-65535")]
    BadPort(String),
    #[error("{0:?} has no port; CONNECT needs host:port")]
    MissingPort(String),
}

/// Parse `host[:port]` (`[v6][:port]`); `default_port` applies when no
/// port is written, and `None` makes the port mandatory (CONNECT).
pub fn parse_authority(authority: &str, default_port: Option<u16>) -> Result<Target, HostError> {
    if authority.is_empty() {
        return Err(HostError::Empty);
    }
    if authority.len() > MAX_AUTHORITY_LEN {
        return Err(HostError::TooLong);
    }
    if authority.contains('@') {
        return Err(HostError::Userinfo(authority.to_string()));
    }
    let (host, port) = if authority.starts_with('[') {
        let Some(close) = authority.find(']') else {
            return Err(HostError::BadName { host: authority.to_string(), why: "an opening `[` without `]`" });
        };
        let (host, rest) = authority.split_at(close + 1);
        match rest {
            "" => (host, None),
            _ => match rest.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(HostError::BadName { host: authority.to_string(), why: "text after `]` that is not `:port`" }),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(text) => parse_port(text)?,
        None => default_port.ok_or_else(|| HostError::MissingPort(authority.to_string()))?,
    };
    Ok(Target { host: parse_host(host)?, port })
}

/// A port: 1 to 5 ASCII digits, 1-65535 (no sign, no spaces).
pub fn parse_port(text: &str) -> Result<u16, HostError> {
    let bad = || HostError::BadPort(text.to_string());
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u32>() {
        Ok(p @ 1..=65535) => Ok(p as u16),
        _ => Err(bad()),
    }
}

/// Parse a host without a port (see the module docs for what passes).
pub fn parse_host(host: &str) -> Result<Host, HostError> {
    if host.is_empty() {
        return Err(HostError::Empty);
    }
    if host.len() > MAX_AUTHORITY_LEN {
        return Err(HostError::TooLong);
    }
    if host.contains('@') {
        return Err(HostError::Userinfo(host.to_string()));
    }
    if let Some(inner) = host.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return Err(HostError::BadName { host: host.to_string(), why: "an opening `[` without `]`" });
        };
        if inner.contains('%') {
            return Err(HostError::IpZone(host.to_string()));
        }
        let Ok(ip) = inner.parse::<Ipv6Addr>() else {
            return Err(HostError::BadName { host: host.to_string(), why: "brackets hold something that is not an IPv6 address" });
        };
        if embeds_ipv4_literal(&ip) {
            return Err(HostError::IpLiteral(host.to_string()));
        }
        return Ok(Host::Ip(IpAddr::V6(ip)));
    }
    if host.contains(':') {
        return Err(HostError::BadName { host: host.to_string(), why: "a `:` inside the host (an IPv6 address goes in brackets)" });
    }
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        // Only the exact canonical spelling is a literal an entry can list.
        if ip.to_string() == host {
            return Ok(Host::Ip(IpAddr::V4(ip)));
        }
        return Err(HostError::IpLiteral(host.to_string()));
    }
    normalize_name(host).map(Host::Name)
}

/// A DNS name to lower-case punycode LDH, or why not. Anything that reads
/// as an IP address in some notation is [`HostError::IpLiteral`].
pub fn normalize_name(host: &str) -> Result<String, HostError> {
    let bad = |why| HostError::BadName { host: host.to_string(), why };
    // First a lenient mapping (what a URL parser would do), so that
    // full-width digits and ideographic dots are seen as the ASCII they
    // become before the IP-literal check.
    let lenient = Uts46::new()
        .to_ascii(host.as_bytes(), AsciiDenyList::URL, Hyphens::Allow, DnsLength::Ignore)
        .map_err(|_| bad("IDNA (UTS #46) refuses it"))?;
    let core = lenient.strip_suffix('.').unwrap_or(&lenient);
    if ends_in_number(core) {
        return Err(HostError::IpLiteral(host.to_string()));
    }
    if lenient.ends_with('.') {
        return Err(HostError::TrailingDot(host.to_string()));
    }
    if lenient.len() > MAX_NAME_LEN {
        return Err(HostError::TooLong);
    }
    for label in lenient.split('.') {
        if label.is_empty() {
            return Err(bad("an empty label (`..`)"));
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(bad("a label longer than 63 bytes"));
        }
    }
    // Then the strict form that is used: STD3 (letters, digits, hyphen),
    // no hyphen first or last in a label, DNS lengths verified.
    let strict = Uts46::new()
        .to_ascii(host.as_bytes(), AsciiDenyList::STD3, Hyphens::CheckFirstLast, DnsLength::Verify)
        .map_err(|_| bad("a character outside letters, digits and `-` (after IDNA), or a label starting or ending with `-`"))?;
    let ldh = strict.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= MAX_LABEL_LEN
            && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if !ldh || strict.len() > MAX_NAME_LEN {
        return Err(bad("not LDH after IDNA"));
    }
    Ok(strict.into_owned())
}

/// The WHATWG URL "ends in a number" rule: a last label of digits, or
/// `0x`/`0X` and hex digits, makes URL parsers read the host as IPv4.
fn ends_in_number(host: &str) -> bool {
    let last = host.rsplit('.').next().unwrap_or_default();
    if last.is_empty() {
        return false;
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match last.strip_prefix("0x").or_else(|| last.strip_prefix("0X")) {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// IPv4-mapped (`::ffff:a.b.c.d`) and IPv4-compatible (`::a.b.c.d`) forms.
fn embeds_ipv4_literal(ip: &Ipv6Addr) -> bool {
    let s = ip.segments();
    let mapped = s[..5] == [0; 5] && s[5] == 0xffff;
    let compatible = s[..6] == [0; 6] && !ip.is_unspecified() && !ip.is_loopback();
    mapped || compatible
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Result<Target, HostError> {
        Ok(Target { host: Host::Name(s.to_string()), port: 443 })
    }

    fn ip(s: &str) -> Result<Target, HostError> {
        Ok(Target { host: Host::Ip(s.parse().unwrap()), port: 443 })
    }

    #[derive(Debug, PartialEq)]
    enum Kind {
        Ok,
        Userinfo,
        IpLiteral,
        IpZone,
        BadName,
        TrailingDot,
        TooLong,
        BadPort,
        MissingPort,
        Empty,
    }

    fn kind(r: &Result<Target, HostError>) -> Kind {
        match r {
            Ok(_) => Kind::Ok,
            Err(HostError::Userinfo(_)) => Kind::Userinfo,
            Err(HostError::IpLiteral(_)) => Kind::IpLiteral,
            Err(HostError::IpZone(_)) => Kind::IpZone,
            Err(HostError::BadName { .. }) => Kind::BadName,
            Err(HostError::TrailingDot(_)) => Kind::TrailingDot,
            Err(HostError::TooLong) => Kind::TooLong,
            Err(HostError::BadPort(_)) => Kind::BadPort,
            Err(HostError::MissingPort(_)) => Kind::MissingPort,
            Err(HostError::Empty) => Kind::Empty,
        }
    }

    /// Hostile spellings, each with the refusal it must meet (CONNECT form,
    /// port mandatory).
    #[test]
    fn hostile_authorities_are_refused() {
        let long_label = format!("{}.test:443", "a".repeat(64));
        let long_name = format!("{}:443", ["abcdefghij"; 24].join("."));
        let table: &[(&str, Kind)] = &[
            ("2130706433:443", Kind::IpLiteral),
            ("0177.0.0.1:443", Kind::IpLiteral),
            ("0x7f.0.0.1:443", Kind::IpLiteral),
            ("0x7f000001:443", Kind::IpLiteral),
            ("0X7F000001:443", Kind::IpLiteral),
            ("017700000001:443", Kind::IpLiteral),
            ("127.1:443", Kind::IpLiteral),
            ("127.0.1:443", Kind::IpLiteral),
            ("127.0.0.1.:443", Kind::IpLiteral),
            ("0:443", Kind::IpLiteral),
            ("0x:443", Kind::IpLiteral),
            ("1.2.3.999:443", Kind::IpLiteral),
            ("169.254.169.254.:443", Kind::IpLiteral),
            ("example.0x10:443", Kind::IpLiteral),
            ("\u{ff11}\u{ff12}\u{ff17}.0.0.1:443", Kind::IpLiteral),
            ("127\u{3002}0\u{3002}0\u{3002}1:443", Kind::IpLiteral),
            ("[::ffff:127.0.0.1]:443", Kind::IpLiteral),
            ("[::ffff:7f00:1]:443", Kind::IpLiteral),
            ("[::127.0.0.1]:443", Kind::IpLiteral),
            ("[fe80::1%25eth0]:443", Kind::IpZone),
            ("[fe80::1%eth0]:443", Kind::IpZone),
            ("::1:443", Kind::BadName),
            ("[::1:443", Kind::BadName),
            ("[::1]x:443", Kind::BadName),
            ("[not-v6]:443", Kind::BadName),
            ("user@allowed.test:443", Kind::Userinfo),
            ("allowed.test@evil.test:443", Kind::Userinfo),
            ("allowed.test:pw@evil.test:443", Kind::Userinfo),
            (":443", Kind::Empty),
            ("", Kind::Empty),
            ("allowed.test:0", Kind::BadPort),
            ("allowed.test:65536", Kind::BadPort),
            ("allowed.test:", Kind::BadPort),
            ("allowed.test:+443", Kind::BadPort),
            ("allowed.test: 443", Kind::BadPort),
            ("allowed.test:0x1bb", Kind::BadPort),
            ("allowed.test", Kind::MissingPort),
            ("a..test:443", Kind::BadName),
            (".allowed.test:443", Kind::BadName),
            (&long_label, Kind::BadName),
            (&long_name, Kind::TooLong),
            ("allowed_test.example:443", Kind::BadName),
            ("allowed.test.:443", Kind::TrailingDot),
            ("allowed.test%00:443", Kind::BadName),
            ("%31%32%37.0.0.1:443", Kind::BadName),
            ("-bad.test:443", Kind::BadName),
            ("bad-.test:443", Kind::BadName),
            ("exa mple.test:443", Kind::BadName),
            ("allowed.test\\@evil.test:443", Kind::Userinfo),
            ("allowed.test/evil:443", Kind::BadName),
            ("*.allowed.test:443", Kind::BadName),
        ];
        assert!(table.len() >= 25);
        for (input, want) in table {
            let got = parse_authority(input, None);
            assert_eq!(&kind(&got), want, "{input:?} -> {got:?}");
        }
    }

    #[test]
    fn names_are_normalised() {
        assert_eq!(parse_authority("ALLOWED.Test:443", None), name("allowed.test"));
        assert_eq!(parse_authority("bücher.example:443", None), name("xn--bcher-kva.example"));
        assert_eq!(parse_authority("xn--bcher-kva.example:443", None), name("xn--bcher-kva.example"));
        // A name whose labels look numeric but whose last label is not is a name.
        assert_eq!(parse_authority("127.0.0.1.nip.io:443", None), name("127.0.0.1.nip.io"));
        assert_eq!(parse_authority("r3---sn-abc.example:443", None), name("r3---sn-abc.example"));
        assert_eq!(parse_authority("localhost:443", None), name("localhost"));
    }

    #[test]
    fn canonical_literals_are_returned_for_the_allowlist_to_decide() {
        assert_eq!(parse_authority("203.0.113.7:443", None), ip("203.0.113.7"));
        assert_eq!(parse_authority("[2001:db8::1]:443", None), ip("2001:db8::1"));
        assert_eq!(parse_authority("[2001:DB8:0::1]:443", None), ip("2001:db8::1"));
        assert_eq!(parse_authority("[::1]:443", None), ip("::1"));
    }

    #[test]
    fn default_port_applies_to_absolute_uris() {
        assert_eq!(parse_authority("allowed.test", Some(80)).map(|t| t.port), Ok(80));
        assert_eq!(parse_authority("allowed.test:8080", Some(80)).map(|t| t.port), Ok(8080));
        assert_eq!(parse_authority("[2001:db8::1]", Some(80)).map(|t| t.port), Ok(80));
    }
}
