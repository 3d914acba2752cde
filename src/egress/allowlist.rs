//! The allowlist: which hosts and ports a job may reach.
//!
//! An entry is an exact host (`api.example.com`), a suffix wildcard
//! (`*.example.org`) or an IP entry (`203.0.113.7`, `[2001:db8::1]`), each
//! with its own port list (default [`DEFAULT_PORTS`], 443 only). Names are
//! stored as lower-case punycode, exactly as [`super::host`] normalises a
//! request, so matching is plain string comparison.
//!
//! Rules:
//! - `*.example.com` matches `a.example.com` and `a.b.example.com`, never
//!   `example.com` itself and never `badexample.com` (the label boundary is
//!   part of the suffix).
//! - An IP entry is the only way an IP literal is ever allowed, and it
//!   matches only the literal itself: never a name that resolves to it.
//! - A bare `*`, or a wildcard over a single label (`*.com`), is refused as
//!   too broad.
//! - Empty means no network at all.
//! - A binding narrows, never widens ([`effective`]): ports intersect, and a
//!   narrowing entry no allowed entry covers is dropped and reported.
//!
//! Text form (the admin's and the file's): `host[:port,port...]`,
//! `*.suffix[:ports]`, `a.b.c.d[:ports]`, `[v6][:ports]`. Serde accepts that
//! string or `{ "host": "...", "ports": [443, 8443] }`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::host::{self, Host, HostError};

/// Ports an entry allows when it names none.
pub const DEFAULT_PORTS: &[u16] = &[443];
/// Ports one entry may list.
pub const MAX_PORTS_PER_ENTRY: usize = 64;

/// The host part of an entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostPattern {
    /// Exactly this name.
    Exact(String),
    /// Any name strictly below this suffix (written `*.suffix`).
    Suffix(String),
    /// Exactly this IP literal.
    Ip(IpAddr),
}

impl HostPattern {
    /// Whether a requested host matches.
    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Exact(e), Host::Name(n)) => e == n,
            (HostPattern::Suffix(s), Host::Name(n)) => is_below(n, s),
            (HostPattern::Ip(a), Host::Ip(b)) => a == b,
            _ => false,
        }
    }

    /// Whether every host `other` matches is matched by `self`.
    fn covers(&self, other: &HostPattern) -> bool {
        match (self, other) {
            (HostPattern::Exact(a), HostPattern::Exact(b)) => a == b,
            (HostPattern::Suffix(s), HostPattern::Exact(n)) => is_below(n, s),
            (HostPattern::Suffix(s), HostPattern::Suffix(t)) => s == t || is_below(t, s),
            (HostPattern::Ip(a), HostPattern::Ip(b)) => a == b,
            _ => false,
        }
    }
}

/// `name` is strictly below `suffix`, on a label boundary.
fn is_below(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1 && name.ends_with(suffix) && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(n) => f.write_str(n),
            HostPattern::Suffix(s) => write!(f, "*.{s}"),
            HostPattern::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            HostPattern::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// One allowlist entry: a host pattern and the ports it allows (sorted,
/// distinct, never empty).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    pub host: HostPattern,
    ports: Vec<u16>,
}

/// Why an entry was refused; the messages say how to write it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("allowlist entry {entry:?}: {source}")]
    Host {
        entry: String,
        #[source]
        source: HostError,
    },
    #[error("allowlist entry {0:?}: a wildcard is `*.` followed by a domain of at least two labels, e.g. `*.example.com`")]
    Wildcard(String),
    #[error("allowlist entry {0:?}: ports are a comma-separated list of 1-65535, e.g. `host:443,8443`")]
    Ports(String),
    #[error("allowlist entry {0:?}: more than {MAX_PORTS_PER_ENTRY} ports")]
    TooManyPorts(String),
    #[error("allowlist entry {0:?}: this address can never be a destination (unspecified or IPv4 inside IPv6); list the plain address")]
    Ip(String),
}

impl Entry {
    /// An entry from a host pattern text and a port list (empty: 443).
    pub fn new(host: &str, ports: &[u16]) -> Result<Entry, EntryError> {
        let pattern = parse_pattern(host.trim())?;
        Entry::from_parts(pattern, ports).ok_or_else(|| EntryError::Ports(host.to_string()))
    }

    /// An entry from its parts; `None` when a port is 0. No ports: 443.
    pub fn from_parts(host: HostPattern, ports: &[u16]) -> Option<Entry> {
        let mut ports = if ports.is_empty() { DEFAULT_PORTS.to_vec() } else { ports.to_vec() };
        if ports.contains(&0) {
            return None;
        }
        ports.sort_unstable();
        ports.dedup();
        Some(Entry { host, ports })
    }

    /// Parse the text form (see the module docs).
    pub fn parse(text: &str) -> Result<Entry, EntryError> {
        let text = text.trim();
        let (host, ports) = split_ports(text)?;
        let pattern = parse_pattern(host).map_err(|e| match e {
            EntryError::Host { source, .. } => EntryError::Host { entry: text.to_string(), source },
            other => other,
        })?;
        let ports = match ports {
            None => Vec::new(),
            Some(list) => {
                let ports = list
                    .split(',')
                    .map(|p| host::parse_port(p.trim()).map_err(|_| EntryError::Ports(text.to_string())))
                    .collect::<Result<Vec<u16>, EntryError>>()?;
                if ports.len() > MAX_PORTS_PER_ENTRY {
                    return Err(EntryError::TooManyPorts(text.to_string()));
                }
                ports
            }
        };
        Entry::from_parts(pattern, &ports).ok_or_else(|| EntryError::Ports(text.to_string()))
    }

    /// The ports this entry allows (sorted).
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }
}

/// Split `host[:ports]`, minding brackets and bare IPv6 entries.
fn split_ports(text: &str) -> Result<(&str, Option<&str>), EntryError> {
    if text.starts_with('[') {
        let close = text.find(']').ok_or_else(|| EntryError::Host {
            entry: text.to_string(),
            source: HostError::BadName { host: text.to_string(), why: "an opening `[` without `]`" },
        })?;
        let (host, rest) = text.split_at(close + 1);
        return match rest {
            "" => Ok((host, None)),
            _ => rest.strip_prefix(':').map(|p| (host, Some(p))).ok_or_else(|| EntryError::Ports(text.to_string())),
        };
    }
    // A bare IPv6 address (two or more colons) has no port part.
    if text.matches(':').count() > 1 {
        return Ok((text, None));
    }
    Ok(match text.split_once(':') {
        Some((host, ports)) => (host, Some(ports)),
        None => (text, None),
    })
}

fn parse_pattern(host: &str) -> Result<HostPattern, EntryError> {
    let wrap = |source| EntryError::Host { entry: host.to_string(), source };
    if let Some(suffix) = host.strip_prefix("*.") {
        let name = host::normalize_name(suffix).map_err(wrap)?;
        if !name.contains('.') {
            return Err(EntryError::Wildcard(host.to_string()));
        }
        return Ok(HostPattern::Suffix(name));
    }
    if host.contains('*') {
        return Err(EntryError::Wildcard(host.to_string()));
    }
    // A bare IPv6 address is accepted in entries (an admin's text), bracketed or not.
    let bracketed;
    let host_text = if host.contains(':') && !host.starts_with('[') {
        bracketed = format!("[{host}]");
        bracketed.as_str()
    } else {
        host
    };
    match host::parse_host(host_text) {
        Ok(Host::Name(name)) => Ok(HostPattern::Exact(name)),
        Ok(Host::Ip(ip)) if ip.is_unspecified() => Err(EntryError::Ip(host.to_string())),
        Ok(Host::Ip(ip)) => Ok(HostPattern::Ip(ip)),
        Err(HostError::IpLiteral(_)) if host_text.starts_with('[') => Err(EntryError::Ip(host.to_string())),
        Err(e) => Err(wrap(e)),
    }
}

impl FromStr for Entry {
    type Err = EntryError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Entry::parse(s)
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.host)?;
        for (i, p) in self.ports.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl Serialize for Entry {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Text(String),
            Parts {
                host: String,
                #[serde(default)]
                ports: Vec<u16>,
            },
        }
        match Form::deserialize(d)? {
            Form::Text(text) => Entry::parse(&text),
            Form::Parts { host, ports } => Entry::new(&host, &ports),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// A job's allowlist. Empty: no network at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Vec<Entry>", into = "Vec<Entry>")]
pub struct Allowlist {
    entries: Vec<Entry>,
}

impl From<Vec<Entry>> for Allowlist {
    fn from(entries: Vec<Entry>) -> Self {
        Allowlist::new(entries)
    }
}

impl From<Allowlist> for Vec<Entry> {
    fn from(list: Allowlist) -> Self {
        list.entries
    }
}

/// Why a target is not on the allowlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The allowlist is empty: this job has no network.
    Empty,
    /// No entry names the host.
    Host,
    /// An IP literal no IP entry lists.
    IpNotListed,
    /// The host is listed, the port is not; these ports are.
    Port(Vec<u16>),
}

impl Allowlist {
    /// Entries as given; entries with the same host pattern merge their ports.
    pub fn new(entries: impl IntoIterator<Item = Entry>) -> Allowlist {
        let mut out: Vec<Entry> = Vec::new();
        for entry in entries {
            match out.iter_mut().find(|e| e.host == entry.host) {
                Some(existing) => {
                    existing.ports.extend(entry.ports);
                    existing.ports.sort_unstable();
                    existing.ports.dedup();
                }
                None => out.push(entry),
            }
        }
        Allowlist { entries: out }
    }

    /// Parse text entries.
    pub fn parse<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Allowlist, EntryError> {
        Ok(Allowlist::new(items.into_iter().map(Entry::parse).collect::<Result<Vec<_>, _>>()?))
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `host:port` is allowed. An entry whose host matches but whose
    /// ports do not is reported as [`Mismatch::Port`] so the refusal can
    /// name the ports that are allowed.
    pub fn check(&self, host: &Host, port: u16) -> Result<(), Mismatch> {
        if self.entries.is_empty() {
            return Err(Mismatch::Empty);
        }
        let mut ports: Vec<u16> = Vec::new();
        for entry in self.entries.iter().filter(|e| e.host.matches(host)) {
            if entry.ports.contains(&port) {
                return Ok(());
            }
            ports.extend(&entry.ports);
        }
        if !ports.is_empty() {
            ports.sort_unstable();
            ports.dedup();
            return Err(Mismatch::Port(ports));
        }
        match host {
            Host::Ip(_) => Err(Mismatch::IpNotListed),
            Host::Name(_) => Err(Mismatch::Host),
        }
    }
}

impl fmt::Display for Allowlist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entries.is_empty() {
            return f.write_str("(none)");
        }
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// What narrowing made of an allowlist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effective {
    /// Allowed ∩ narrowing.
    pub allowlist: Allowlist,
    /// Narrowing entries (or ports of them) that were not allowed.
    pub dropped: Vec<Dropped>,
}

/// A narrowing entry, or some of its ports, that would have widened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// The host and the ports that were dropped.
    pub entry: Entry,
    pub why: DropReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// No allowed entry covers every host of this pattern.
    HostNotAllowed,
    /// The host is allowed, these ports are not.
    PortsNotAllowed,
}

impl fmt::Display for Dropped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.why {
            DropReason::HostNotAllowed => write!(f, "{} is not covered by the allowed hosts; dropped", self.entry.host),
            DropReason::PortsNotAllowed => write!(f, "{}: these ports are not allowed; dropped", self.entry),
        }
    }
}

/// The effective allowlist: `allowed` when there is no narrowing, else
/// `allowed ∩ narrowing`. A narrowing entry survives only for the ports
/// some allowed entry covering its whole host pattern allows; the rest is
/// reported in [`Effective::dropped`]. A narrowing wildcard under an
/// allowed exact host is dropped (it would widen), not rewritten.
pub fn effective(allowed: &Allowlist, narrowing: Option<&[Entry]>) -> Effective {
    let Some(narrowing) = narrowing else {
        return Effective { allowlist: allowed.clone(), dropped: Vec::new() };
    };
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for n in narrowing {
        let covering: Vec<&Entry> = allowed.entries.iter().filter(|a| a.host.covers(&n.host)).collect();
        if covering.is_empty() {
            dropped.push(Dropped { entry: n.clone(), why: DropReason::HostNotAllowed });
            continue;
        }
        let (ports, lost): (Vec<u16>, Vec<u16>) = n.ports.iter().partition(|p| covering.iter().any(|a| a.ports.contains(p)));
        if !lost.is_empty() {
            dropped.push(Dropped { entry: Entry { host: n.host.clone(), ports: lost }, why: DropReason::PortsNotAllowed });
        }
        if !ports.is_empty() {
            kept.push(Entry { host: n.host.clone(), ports });
        }
    }
    Effective { allowlist: Allowlist::new(kept), dropped }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Host {
        host::parse_host(s).unwrap()
    }

    fn list(items: &[&str]) -> Allowlist {
        Allowlist::parse(items.iter().copied()).unwrap()
    }

    #[test]
    fn parses_text_and_serde_forms() {
        let e = Entry::parse("api.example.com").unwrap();
        assert_eq!(e.host, HostPattern::Exact("api.example.com".into()));
        assert_eq!(e.ports(), &[443]);
        let e = Entry::parse("*.Example.org:8443,443,443").unwrap();
        assert_eq!(e.host, HostPattern::Suffix("example.org".into()));
        assert_eq!(e.ports(), &[443, 8443]);
        assert_eq!(e.to_string(), "*.example.org:443,8443");
        let e = Entry::parse("bücher.example:80").unwrap();
        assert_eq!(e.host, HostPattern::Exact("xn--bcher-kva.example".into()));
        assert_eq!(Entry::parse("203.0.113.7").unwrap().host, HostPattern::Ip("203.0.113.7".parse().unwrap()));
        assert_eq!(Entry::parse("[2001:db8::1]:443,8443").unwrap().ports(), &[443, 8443]);
        assert_eq!(Entry::parse("2001:db8::1").unwrap().host, HostPattern::Ip("2001:db8::1".parse().unwrap()));

        let json: Vec<Entry> =
            serde_json::from_str(r#"["api.example.com", {"host": "*.example.org", "ports": [443, 8443]}, {"host": "x.test"}]"#).unwrap();
        assert_eq!(json[1].to_string(), "*.example.org:443,8443");
        assert_eq!(json[2].ports(), &[443]);
        let back: Vec<Entry> = serde_json::from_str(&serde_json::to_string(&json).unwrap()).unwrap();
        assert_eq!(back, json);
        assert!(serde_json::from_str::<Entry>(r#"{"host": "x.test", "ports": [0]}"#).is_err());
    }

    #[test]
    fn refuses_bad_entries() {
        for bad in [
            "*",
            "*.com",
            "a.*.example.com",
            "*example.com",
            "api.example.com:0",
            "api.example.com:443,",
            "api.example.com:70000",
            "0177.0.0.1",
            "2130706433",
            "0.0.0.0",
            "[::]",
            "[::ffff:10.0.0.1]",
            "[fe80::1%eth0]",
            "user@api.example.com",
            "api.example.com.",
            "",
        ] {
            assert!(Entry::parse(bad).is_err(), "{bad:?} was accepted");
        }
        let too_many: Vec<String> = (1..=65).map(|p| p.to_string()).collect();
        assert_eq!(
            Entry::parse(&format!("x.test:{}", too_many.join(","))),
            Err(EntryError::TooManyPorts(format!("x.test:{}", too_many.join(","))))
        );
    }

    #[test]
    fn wildcards_match_strictly_below_the_suffix() {
        let l = list(&["*.example.com"]);
        assert_eq!(l.check(&h("a.example.com"), 443), Ok(()));
        assert_eq!(l.check(&h("a.b.example.com"), 443), Ok(()));
        assert_eq!(l.check(&h("example.com"), 443), Err(Mismatch::Host));
        assert_eq!(l.check(&h("badexample.com"), 443), Err(Mismatch::Host));
        assert_eq!(l.check(&h("a.example.com.evil.test"), 443), Err(Mismatch::Host));
        assert_eq!(l.check(&h("a.example.com"), 80), Err(Mismatch::Port(vec![443])));
    }

    #[test]
    fn ip_literals_pass_only_through_ip_entries() {
        let l = list(&["api.example.com", "203.0.113.7:8443"]);
        assert_eq!(l.check(&h("203.0.113.7"), 8443), Ok(()));
        assert_eq!(l.check(&h("203.0.113.7"), 443), Err(Mismatch::Port(vec![8443])));
        assert_eq!(l.check(&h("203.0.113.8"), 8443), Err(Mismatch::IpNotListed));
        assert_eq!(l.check(&h("[2001:db8::1]"), 443), Err(Mismatch::IpNotListed));
        assert_eq!(Allowlist::default().check(&h("api.example.com"), 443), Err(Mismatch::Empty));
    }

    #[test]
    fn duplicate_hosts_merge_ports() {
        let l = list(&["x.test:80", "X.test:443"]);
        assert_eq!(l.entries().len(), 1);
        assert_eq!(l.entries()[0].ports(), &[80, 443]);
    }

    #[test]
    fn narrowing_never_widens() {
        let allowed = list(&["*.example.com:443,8443", "api.other.test", "203.0.113.7:443"]);
        assert_eq!(effective(&allowed, None).allowlist, allowed);

        let narrow: Vec<Entry> =
            ["a.example.com:8443,9000", "*.b.example.com", "*.other.test", "evil.test", "example.com", "203.0.113.7:80"]
                .iter()
                .map(|s| Entry::parse(s).unwrap())
                .collect();
        let eff = effective(&allowed, Some(&narrow));
        assert_eq!(eff.allowlist.to_string(), "a.example.com:8443 *.b.example.com:443");
        let dropped: Vec<String> = eff.dropped.iter().map(|d| d.to_string()).collect();
        assert_eq!(
            dropped,
            [
                "a.example.com:9000: these ports are not allowed; dropped",
                "*.other.test is not covered by the allowed hosts; dropped",
                "evil.test is not covered by the allowed hosts; dropped",
                "example.com is not covered by the allowed hosts; dropped",
                "203.0.113.7:80: these ports are not allowed; dropped",
            ]
        );
        // Narrowing to nothing is no network at all.
        assert!(effective(&allowed, Some(&[])).allowlist.is_empty());
        // An empty allowed list stays empty whatever the binding says.
        assert!(effective(&Allowlist::default(), Some(&narrow)).allowlist.is_empty());
    }
}
