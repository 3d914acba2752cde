//! The address policy: which resolved addresses the proxy may dial.
//!
//! It runs after resolution, on every address a name resolved to, so a
//! name that points (or later re-points: DNS rebinding) at an internal
//! address is refused whatever the allowlist says. Denied by default:
//!
//! | class | ranges |
//! |---|---|
//! | unspecified / "this network" | `0.0.0.0/8`, `::` |
//! | loopback | `127.0.0.0/8`, `::1` |
//! | private (RFC 1918) | `10/8`, `172.16/12`, `192.168/16` |
//! | CGNAT | `100.64.0.0/10` |
//! | link-local (cloud metadata `169.254.169.254`) | `169.254.0.0/16`, `fe80::/10` |
//! | IETF protocol assignments | `192.0.0.0/24`, `2001::/23` outside Teredo |
//! | benchmarking | `198.18.0.0/15`, `2001:2::/48` |
//! | documentation | `192.0.2/24`, `198.51.100/24`, `203.0.113/24`, `2001:db8::/32`, `3fff::/20` |
//! | multicast | `224.0.0.0/4`, `ff00::/8` |
//! | broadcast | `255.255.255.255` |
//! | reserved | `240.0.0.0/4`, `192.88.99.0/24`, all IPv6 outside `2000::/3`, `64:ff9b:1::/48`, `100::/64` |
//! | unique local | `fc00::/7` |
//! | IPv4-compatible IPv6 | `::a.b.c.d` (deprecated) |
//!
//! IPv6 forms that carry an IPv4 address are judged by that address too:
//! IPv4-mapped `::ffff:a.b.c.d` (the kernel dials the IPv4 address), NAT64
//! `64:ff9b::/96`, 6to4 `2002::/16` and Teredo `2001::/32` (server and
//! de-obfuscated client). `64:ff9b::a9fe:a9fe` is the metadata service.
//!
//! On top: the configured deny CIDRs (the cluster's pod and service
//! ranges) and the proxy's own listen addresses (a request to itself would
//! launder its own checks).
//!
//! Documentation ranges are denied after resolution (no public name
//! legitimately resolves there; one that does is misconfigured or an
//! attack) but allowed when an IP entry names that exact address: they are
//! unroutable on the internet, so listing one costs nothing, and examples
//! and tests can use them.
//!
//! `allow_cidrs` is the one override: for tests (which can only reach
//! loopback) and for admins who must reach an internal host on purpose. It
//! matches the address exactly as resolved (`127.0.0.0/8` does not allow
//! `::ffff:127.0.0.1`), and a longer deny CIDR still wins over a shorter
//! allow CIDR. Without it, loopback is refused like everything else.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

/// Why an address is not a public destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrClass {
    Unspecified,
    Loopback,
    Private,
    Cgnat,
    LinkLocal,
    IetfAssignment,
    Benchmark,
    Documentation,
    Multicast,
    Broadcast,
    Reserved,
    UniqueLocal,
    Ipv4Compatible,
}

impl AddrClass {
    pub fn as_str(self) -> &'static str {
        match self {
            AddrClass::Unspecified => "unspecified",
            AddrClass::Loopback => "loopback",
            AddrClass::Private => "private (RFC 1918)",
            AddrClass::Cgnat => "CGNAT (100.64/10)",
            AddrClass::LinkLocal => "link-local (incl. the metadata service)",
            AddrClass::IetfAssignment => "IETF protocol assignment",
            AddrClass::Benchmark => "benchmarking",
            AddrClass::Documentation => "documentation",
            AddrClass::Multicast => "multicast",
            AddrClass::Broadcast => "broadcast",
            AddrClass::Reserved => "reserved",
            AddrClass::UniqueLocal => "IPv6 unique local (fc00::/7)",
            AddrClass::Ipv4Compatible => "IPv4-compatible IPv6 (deprecated)",
        }
    }
}

/// Why one address was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub addr: IpAddr,
    pub why: DenyReason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DenyReason {
    /// A built-in class, possibly of an IPv4 address embedded in the IPv6 one.
    Class { class: AddrClass, embedded: Option<Ipv4Addr> },
    /// A configured deny CIDR.
    DenyCidr(IpNet),
    /// One of the proxy's own listen addresses.
    ProxyItself,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.why {
            DenyReason::Class { class, embedded: None } => write!(f, "{} is {}", self.addr, class.as_str()),
            DenyReason::Class { class, embedded: Some(v4) } => write!(f, "{} embeds {v4}, which is {}", self.addr, class.as_str()),
            DenyReason::DenyCidr(net) => write!(f, "{} is inside the denied range {net}", self.addr),
            DenyReason::ProxyItself => write!(f, "{} is the proxy itself", self.addr),
        }
    }
}

/// The checked policy (build once; cheap to consult).
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    deny: Vec<IpNet>,
    allow: Vec<IpNet>,
}

impl AddressPolicy {
    /// `deny`: extra ranges (pod and service CIDRs). `allow`: see the module docs.
    pub fn new(deny: Vec<IpNet>, allow: Vec<IpNet>) -> AddressPolicy {
        AddressPolicy { deny: deny.into_iter().map(|n| n.trunc()).collect(), allow: allow.into_iter().map(|n| n.trunc()).collect() }
    }

    /// Check one resolved address for `port`. `listed`: an IP entry names
    /// this exact address (lifts the documentation class only). `own`: the
    /// proxy's listen sockets.
    pub fn check(&self, ip: IpAddr, port: u16, listed: bool, own: &[SocketAddr]) -> Result<(), Denial> {
        let deny = |why| Err(Denial { addr: ip, why });
        if is_own(ip, port, own) {
            return deny(DenyReason::ProxyItself);
        }
        let longest = |nets: &[IpNet], ip: IpAddr| nets.iter().filter(|n| n.contains(&ip)).max_by_key(|n| n.prefix_len()).copied();
        let allow = longest(&self.allow, ip);
        // Deny CIDRs apply to the address and to any IPv4 it carries.
        for candidate in std::iter::once(ip).chain(embedded_v4(ip).into_iter().map(IpAddr::V4)) {
            if let Some(d) = longest(&self.deny, candidate) {
                let overridden = candidate == ip && allow.is_some_and(|a| a.prefix_len() > d.prefix_len());
                if !overridden {
                    return deny(DenyReason::DenyCidr(d));
                }
            }
        }
        if allow.is_some() {
            return Ok(());
        }
        match classify(ip) {
            None => Ok(()),
            Some((AddrClass::Documentation, None)) if listed => Ok(()),
            Some((class, embedded)) => deny(DenyReason::Class { class, embedded }),
        }
    }
}

fn is_own(ip: IpAddr, port: u16, own: &[SocketAddr]) -> bool {
    let ip = canonical(ip);
    own.iter().any(|l| {
        l.port() == port && {
            let lip = canonical(l.ip());
            lip == ip || (lip.is_unspecified() && is_local_address(ip))
        }
    })
}

/// `::ffff:a.b.c.d` as `a.b.c.d` (what the kernel would dial).
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Whether `ip` is one of this host's addresses: binding to it works only
/// then (cheaper and simpler than walking the interfaces).
fn is_local_address(ip: IpAddr) -> bool {
    ip.is_loopback() || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// The class of a non-public address (`None`: public), with the embedded
/// IPv4 address when the class came from one.
pub fn classify(ip: IpAddr) -> Option<(AddrClass, Option<Ipv4Addr>)> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4).map(|c| (c, None)),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    (u32::from(ip) & mask) == (u32::from(Ipv4Addr::from(net)) & mask)
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], len: u32) -> bool {
    let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
    (u128::from(ip) & mask) == (u128::from(Ipv6Addr::from(net)) & mask)
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddrClass> {
    const TABLE: &[([u8; 4], u32, AddrClass)] = &[
        ([0, 0, 0, 0], 8, AddrClass::Unspecified),
        ([10, 0, 0, 0], 8, AddrClass::Private),
        ([100, 64, 0, 0], 10, AddrClass::Cgnat),
        ([127, 0, 0, 0], 8, AddrClass::Loopback),
        ([169, 254, 0, 0], 16, AddrClass::LinkLocal),
        ([172, 16, 0, 0], 12, AddrClass::Private),
        ([192, 0, 0, 0], 24, AddrClass::IetfAssignment),
        ([192, 0, 2, 0], 24, AddrClass::Documentation),
        ([192, 88, 99, 0], 24, AddrClass::Reserved),
        ([192, 168, 0, 0], 16, AddrClass::Private),
        ([198, 18, 0, 0], 15, AddrClass::Benchmark),
        ([198, 51, 100, 0], 24, AddrClass::Documentation),
        ([203, 0, 113, 0], 24, AddrClass::Documentation),
        ([224, 0, 0, 0], 4, AddrClass::Multicast),
        ([255, 255, 255, 255], 32, AddrClass::Broadcast),
        ([240, 0, 0, 0], 4, AddrClass::Reserved),
    ];
    TABLE.iter().find(|(net, len, _)| in_v4(ip, *net, *len)).map(|(_, _, c)| *c)
}

/// The IPv4 addresses an IPv6 address carries (mapped, compatible, NAT64,
/// 6to4, Teredo server and client).
pub fn embedded_v4(ip: IpAddr) -> Vec<Ipv4Addr> {
    let IpAddr::V6(v6) = ip else { return Vec::new() };
    let bits = u128::from(v6);
    let low = Ipv4Addr::from(bits as u32);
    let s = v6.segments();
    if s[..5] == [0; 5] && s[5] == 0xffff {
        return vec![low];
    }
    if s[..6] == [0; 6] && !v6.is_unspecified() && !v6.is_loopback() {
        return vec![low];
    }
    if in_v6(v6, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        return vec![low];
    }
    if s[0] == 0x2002 {
        return vec![Ipv4Addr::from(((s[1] as u32) << 16) | s[2] as u32)];
    }
    if s[0] == 0x2001 && s[1] == 0 {
        let server = Ipv4Addr::from(((s[2] as u32) << 16) | s[3] as u32);
        let client = Ipv4Addr::from(!(bits as u32));
        return vec![server, client];
    }
    Vec::new()
}

fn classify_v6(ip: Ipv6Addr) -> Option<(AddrClass, Option<Ipv4Addr>)> {
    if ip.is_unspecified() {
        return Some((AddrClass::Unspecified, None));
    }
    if ip.is_loopback() {
        return Some((AddrClass::Loopback, None));
    }
    // Forms that carry IPv4: the embedded address decides first.
    for v4 in embedded_v4(IpAddr::V6(ip)) {
        if let Some(class) = classify_v4(v4) {
            return Some((class, Some(v4)));
        }
    }
    let s = ip.segments();
    if s[..6] == [0; 6] {
        return Some((AddrClass::Ipv4Compatible, None));
    }
    if s[..5] == [0; 5] && s[5] == 0xffff {
        return None; // mapped public IPv4
    }
    if in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        return None; // NAT64 of a public IPv4
    }
    const TABLE: &[([u16; 8], u32, AddrClass)] = &[
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, AddrClass::UniqueLocal),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, AddrClass::LinkLocal),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, AddrClass::Multicast),
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, AddrClass::Documentation),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, AddrClass::Documentation),
        ([0x2001, 0x2, 0, 0, 0, 0, 0, 0], 48, AddrClass::Benchmark),
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, AddrClass::Reserved), // Teredo: checked below
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, AddrClass::IetfAssignment),
    ];
    for (net, len, class) in TABLE {
        if in_v6(ip, *net, *len) {
            // A Teredo address whose embedded addresses are public is global.
            if *len == 32 && net[0] == 0x2001 && net[1] == 0 {
                return None;
            }
            return Some((*class, None));
        }
    }
    // Only 2000::/3 is global unicast; the rest is reserved or special
    // (site-local fec0::/10, discard 100::/64, local NAT64 64:ff9b:1::/48...).
    if !in_v6(ip, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3) {
        return Some((AddrClass::Reserved, None));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Option<AddrClass> {
        classify(s.parse().unwrap()).map(|(c, _)| c)
    }

    #[test]
    fn classification_table() {
        use AddrClass::*;
        let table: &[(&str, Option<AddrClass>)] = &[
            ("0.0.0.0", Some(Unspecified)),
            ("0.1.2.3", Some(Unspecified)),
            ("127.0.0.1", Some(Loopback)),
            ("127.255.255.254", Some(Loopback)),
            ("10.0.0.1", Some(Private)),
            ("172.16.0.1", Some(Private)),
            ("172.31.255.255", Some(Private)),
            ("172.32.0.1", None),
            ("192.168.1.1", Some(Private)),
            ("100.64.0.1", Some(Cgnat)),
            ("100.127.255.255", Some(Cgnat)),
            ("100.128.0.1", None),
            ("169.254.169.254", Some(LinkLocal)),
            ("192.0.0.8", Some(IetfAssignment)),
            ("192.0.2.1", Some(Documentation)),
            ("198.51.100.1", Some(Documentation)),
            ("203.0.113.7", Some(Documentation)),
            ("198.18.0.1", Some(Benchmark)),
            ("198.19.255.255", Some(Benchmark)),
            ("198.20.0.1", None),
            ("224.0.0.1", Some(Multicast)),
            ("239.255.255.255", Some(Multicast)),
            ("240.0.0.1", Some(Reserved)),
            ("255.255.255.255", Some(Broadcast)),
            ("192.88.99.1", Some(Reserved)),
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("::", Some(Unspecified)),
            ("::1", Some(Loopback)),
            ("fc00::1", Some(UniqueLocal)),
            ("fd12:3456::1", Some(UniqueLocal)),
            ("fe80::1", Some(LinkLocal)),
            ("febf::1", Some(LinkLocal)),
            ("fec0::1", Some(Reserved)),
            ("ff02::1", Some(Multicast)),
            ("2001:db8::1", Some(Documentation)),
            ("3fff::1", Some(Documentation)),
            ("2001:2::1", Some(Benchmark)),
            ("2001:10::1", Some(IetfAssignment)),
            ("100::1", Some(Reserved)),
            ("64:ff9b:1::1", Some(Reserved)),
            ("::ffff:127.0.0.1", Some(Loopback)),
            ("::ffff:10.0.0.1", Some(Private)),
            ("::ffff:169.254.169.254", Some(LinkLocal)),
            ("::ffff:8.8.8.8", None),
            ("::127.0.0.1", Some(Loopback)),
            ("::8.8.8.8", Some(Ipv4Compatible)),
            ("64:ff9b::a9fe:a9fe", Some(LinkLocal)),
            ("64:ff9b::0a00:0001", Some(Private)),
            ("64:ff9b::808:808", None),
            ("2002:a9fe:a9fe::1", Some(LinkLocal)),
            ("2002:c0a8:0101::1", Some(Private)),
            ("2002:808:808::1", None),
            // Teredo: server 8.8.8.8, client !0xf5f5f5fe = 10.10.10.1
            ("2001:0:808:808::f5f5:f5fe", Some(Private)),
            // Teredo: server 127.0.0.1
            ("2001:0:7f00:1::f7f7:f7f7", Some(Loopback)),
            // Teredo: server 8.8.8.8, client !0xf7f7f7f7 = 8.8.8.8
            ("2001:0:808:808::f7f7:f7f7", None),
            ("2606:4700::1111", None),
            ("2a00:1450::1", None),
        ];
        for (ip, want) in table {
            assert_eq!(class(ip), *want, "{ip}");
        }
    }

    #[test]
    fn embedded_address_is_reported() {
        let d = AddressPolicy::default().check("64:ff9b::a9fe:a9fe".parse().unwrap(), 443, false, &[]).unwrap_err();
        assert_eq!(d.to_string(), "64:ff9b::a9fe:a9fe embeds 169.254.169.254, which is link-local (incl. the metadata service)");
    }

    #[test]
    fn overrides_and_extra_denials() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p = AddressPolicy::new(
            vec![net("8.8.8.0/24"), net("127.0.0.64/26"), net("10.96.0.0/12")],
            vec![net("127.0.0.0/8"), net("10.96.0.10/32")],
        );
        assert_eq!(p.check(ip("127.0.0.1"), 80, false, &[]), Ok(()));
        // The longer deny wins over the shorter allow...
        assert!(matches!(p.check(ip("127.0.0.70"), 80, false, &[]).unwrap_err().why, DenyReason::DenyCidr(_)));
        // ...and the longer allow over the shorter deny.
        assert_eq!(p.check(ip("10.96.0.10"), 80, false, &[]), Ok(()));
        assert!(matches!(p.check(ip("10.96.0.11"), 80, false, &[]).unwrap_err().why, DenyReason::DenyCidr(_)));
        // A public address in a deny CIDR, directly or embedded.
        assert!(matches!(p.check(ip("8.8.8.8"), 443, false, &[]).unwrap_err().why, DenyReason::DenyCidr(_)));
        assert!(matches!(p.check(ip("::ffff:8.8.8.8"), 443, false, &[]).unwrap_err().why, DenyReason::DenyCidr(_)));
        // The allowance matches the exact form only.
        assert!(p.check(ip("::ffff:127.0.0.1"), 80, false, &[]).is_err());
        // Loopback without the allowance.
        assert!(AddressPolicy::default().check(ip("127.0.0.1"), 80, false, &[]).is_err());
        // The proxy's own socket, even where loopback is allowed.
        let own: SocketAddr = "127.0.0.1:3128".parse().unwrap();
        assert_eq!(p.check(ip("127.0.0.1"), 3128, false, &[own]).unwrap_err().why, DenyReason::ProxyItself);
        assert_eq!(p.check(ip("::ffff:127.0.0.1"), 3128, false, &[own]).unwrap_err().why, DenyReason::ProxyItself);
        let any: SocketAddr = "0.0.0.0:3128".parse().unwrap();
        assert_eq!(p.check(ip("127.0.0.9"), 3128, false, &[any]).unwrap_err().why, DenyReason::ProxyItself);
        assert_eq!(p.check(ip("127.0.0.9"), 3129, false, &[any]), Ok(()));
        // Documentation: only when listed.
        assert!(AddressPolicy::default().check(ip("203.0.113.7"), 443, false, &[]).is_err());
        assert_eq!(AddressPolicy::default().check(ip("203.0.113.7"), 443, true, &[]), Ok(()));
        assert!(AddressPolicy::default().check(ip("10.0.0.1"), 443, true, &[]).is_err());
    }
}
