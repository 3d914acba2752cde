//! The egress proxy's CiliumNetworkPolicy builder: a golden rendering (YAML)
//! of a representative allowlist, the empty allowlist, and a property test
//! over seeded random allowlists: never a host pattern of only `*`, never
//! `toEntities` (`world`), never a CIDR wider than one address, every
//! allowed host with exactly its ports, the DNS rule always there, and the
//! wildcards select what the proxy's allowlist matches.
//!
//! After an intended change: `UPDATE_GOLDEN=1 cargo test --test builders_cilium`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;

use skill_operator::controller::builders::cilium::{
    build_cilium_policy, CiliumNetworkPolicy, CiliumParams, EgressRule, FqdnSelector, PortProtocol,
};
use skill_operator::egress::allowlist::{Allowlist, Entry, HostPattern};
use skill_operator::egress::host::Host;

fn params(allowlist: Allowlist) -> CiliumParams {
    CiliumParams {
        name: "rel-skill-operator-egress-proxy".into(),
        namespace: "skill-system".into(),
        proxy_pod_labels: BTreeMap::from([
            ("app.kubernetes.io/component".into(), "egress-proxy".into()),
            ("app.kubernetes.io/instance".into(), "rel".into()),
            ("app.kubernetes.io/name".into(), "skill-operator".into()),
        ]),
        dns_namespace: "kube-system".into(),
        dns_pod_labels: BTreeMap::from([("k8s-app".into(), "kube-dns".into())]),
        allowlist,
    }
}

fn golden_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/cilium-egress-proxy.yaml")
}

#[test]
fn golden_rendering_of_a_representative_allowlist() {
    let list = Allowlist::parse([
        "api.example.com",
        "*.files.example.org:443,8443",
        // An IDN: the allowlist holds it as punycode, and so does the policy.
        "bücher.example:8443,443",
        "pypi.org:80,443",
        "203.0.113.7:22",
        "[2001:db8::1]",
    ])
    .unwrap();
    let policy = build_cilium_policy(&params(list)).unwrap();
    let text = serde_norway::to_string(&policy).unwrap();
    if std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v == "1") {
        std::fs::write(golden_path(), &text).unwrap();
    }
    let want = std::fs::read_to_string(golden_path()).expect("tests/golden/cilium-egress-proxy.yaml (UPDATE_GOLDEN=1 writes it)");
    assert_eq!(text, want, "the rendering changed; review and run with UPDATE_GOLDEN=1");
    // The golden file reads back as the same object (it is what gets applied).
    let back: CiliumNetworkPolicy = serde_norway::from_str(&want).unwrap();
    assert_eq!(back, policy);
}

/// The DNS rule: kube-dns in kube-system, UDP and TCP 53, through Cilium's
/// DNS proxy (an L7 `dns` rule, pattern `*`).
fn assert_dns_rule(rule: &EgressRule, why: &str) {
    let selectors = rule.to_endpoints.as_ref().unwrap_or_else(|| panic!("{why}: the first rule is not the DNS rule: {rule:?}"));
    assert_eq!(selectors.len(), 1, "{why}");
    assert_eq!(
        selectors[0].match_labels,
        BTreeMap::from([
            ("k8s:io.kubernetes.pod.namespace".to_string(), "kube-system".to_string()),
            ("k8s:k8s-app".to_string(), "kube-dns".to_string())
        ]),
        "{why}"
    );
    assert!(rule.to_fqdns.is_none() && rule.to_cidr.is_none(), "{why}: {rule:?}");
    assert_eq!(rule.to_ports.len(), 1, "{why}");
    let ports: Vec<(&str, &str)> = rule.to_ports[0].ports.iter().map(|p| (p.port.as_str(), p.protocol.as_str())).collect();
    assert_eq!(ports, [("53", "UDP"), ("53", "TCP")], "{why}");
    let l7 = rule.to_ports[0].rules.as_ref().unwrap_or_else(|| panic!("{why}: no L7 dns rule: Cilium would not learn addresses"));
    assert_eq!(l7.dns, [FqdnSelector::pattern("*")], "{why}");
}

#[test]
fn no_allowed_hosts_allows_dns_only_never_an_empty_egress() {
    let policy = build_cilium_policy(&params(Allowlist::default())).unwrap();
    // An empty egress list would be "no egress policy" to Cilium.
    assert_eq!(policy.spec.egress.len(), 1, "{:?}", policy.spec.egress);
    assert_dns_rule(&policy.spec.egress[0], "empty allowlist");
    let json = serde_json::to_value(&policy).unwrap();
    assert_eq!(json["spec"]["egress"].as_array().map(Vec::len), Some(1));
    assert!(json["spec"].get("ingress").is_none(), "ingress stays the standard policy's");
}

/// What the policy says each peer may reach: peer text -> ports.
fn reach(policy: &CiliumNetworkPolicy) -> BTreeMap<String, BTreeSet<u16>> {
    let mut out: BTreeMap<String, BTreeSet<u16>> = BTreeMap::new();
    for rule in &policy.spec.egress[1..] {
        assert!(rule.to_endpoints.is_none(), "only the DNS rule names endpoints: {rule:?}");
        assert!(rule.to_fqdns.is_some() != rule.to_cidr.is_some(), "one kind of peer per rule: {rule:?}");
        let ports: Vec<&PortProtocol> = rule.to_ports.iter().flat_map(|r| &r.ports).collect();
        assert!(!ports.is_empty(), "a rule without ports would allow every port: {rule:?}");
        assert!(rule.to_ports.iter().all(|r| r.rules.is_none()), "L7 rules only on DNS: {rule:?}");
        let ports: BTreeSet<u16> = ports
            .iter()
            .map(|p| {
                assert_eq!(p.protocol, "TCP", "{rule:?}");
                p.port.parse().unwrap()
            })
            .collect();
        let peers: Vec<String> = match (&rule.to_fqdns, &rule.to_cidr) {
            (Some(f), _) => f.iter().map(|s| s.text().to_string()).collect(),
            (_, Some(c)) => c.clone(),
            _ => unreachable!(),
        };
        assert!(!peers.is_empty(), "a rule without peers: {rule:?}");
        for peer in peers {
            let before = out.insert(peer.clone(), ports.clone());
            assert!(before.is_none(), "{peer} in two rules");
        }
    }
    out
}

/// The peer text an allowlist entry must become.
fn expected_peer(host: &HostPattern) -> String {
    match host {
        HostPattern::Exact(n) => n.clone(),
        HostPattern::Suffix(s) => format!("**.{s}"),
        HostPattern::Ip(IpAddr::V4(ip)) => format!("{ip}/32"),
        HostPattern::Ip(IpAddr::V6(ip)) => format!("{ip}/128"),
    }
}

/// Cilium's matching of a `toFQDNs` selector (1.19: `**.` is any number of
/// labels; a name is compared without its trailing dot, case-insensitively).
fn cilium_selects(selector: &str, name: &str) -> bool {
    match selector.strip_prefix("**.") {
        Some(suffix) => {
            name.len() > suffix.len() + 1
                && name.ends_with(suffix)
                && name[..name.len() - suffix.len()].ends_with('.')
                && name[..name.len() - suffix.len() - 1].split('.').all(|l| !l.is_empty())
        }
        None => !selector.contains('*') && selector.eq_ignore_ascii_case(name),
    }
}

/// A tiny deterministic generator (splitmix64): every run explores the same
/// cases, and a failure names its seed.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const LABELS: &[&str] = &["api", "cdn", "files", "example", "pypi", "a-b", "x1", "bücher", "münchen", "org", "net", "com", "io"];
const PORTS: &[u16] = &[22, 80, 443, 8080, 8443, 9000, 65535];

fn random_name(g: &mut Gen, labels: usize) -> String {
    (0..labels).map(|_| *g.pick(LABELS)).collect::<Vec<_>>().join(".")
}

fn random_entry(g: &mut Gen) -> String {
    let host = match g.below(6) {
        0 => format!("203.0.113.{}", g.below(256)),
        1 => format!("[2001:db8::{:x}]", g.below(65536)),
        2 | 3 => {
            let labels = 2 + g.below(2);
            format!("*.{}", random_name(g, labels))
        }
        _ => {
            let labels = 2 + g.below(3);
            random_name(g, labels)
        }
    };
    let ports: Vec<String> = (0..g.below(4)).map(|_| g.pick(PORTS).to_string()).collect();
    if ports.is_empty() {
        host
    } else {
        format!("{host}:{}", ports.join(","))
    }
}

#[test]
fn property_never_wide_every_host_with_exactly_its_ports_dns_always() {
    for seed in 0..2000u64 {
        let mut g = Gen(seed);
        let texts: Vec<String> = (0..g.below(12)).map(|_| random_entry(&mut g)).collect();
        let list = Allowlist::parse(texts.iter().map(String::as_str)).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        let policy = build_cilium_policy(&params(list.clone())).unwrap_or_else(|e| panic!("seed {seed}: {e}"));

        // Structure: the proxy pods only, DNS first, then hosts.
        assert_eq!(policy.spec.endpoint_selector.match_labels, params(Allowlist::default()).proxy_pod_labels, "seed {seed}");
        assert!(!policy.spec.egress.is_empty(), "seed {seed}: an empty egress list is no policy");
        assert_dns_rule(&policy.spec.egress[0], &format!("seed {seed}"));

        // Never wide: no entity, no all-`*` host pattern, no CIDR but one address.
        let json = serde_json::to_string(&policy).unwrap();
        assert!(!json.contains("toEntities") && !json.contains("world"), "seed {seed}: {json}");
        for rule in &policy.spec.egress[1..] {
            for s in rule.to_fqdns.iter().flatten() {
                let text = s.text();
                assert!(text.trim_matches(['*', '.']).contains('.'), "seed {seed}: pattern {text:?} is (nearly) everything");
                if let FqdnSelector::MatchName { match_name } = s {
                    assert!(!match_name.contains('*'), "seed {seed}: {match_name}");
                }
                assert!(text.is_ascii(), "seed {seed}: {text} is not punycode");
            }
            for c in rule.to_cidr.iter().flatten() {
                assert!(c.ends_with("/32") && !c.contains(':') || c.ends_with("/128"), "seed {seed}: CIDR {c}");
            }
        }

        // Every allowed host with exactly its ports, and nothing else.
        let want: BTreeMap<String, BTreeSet<u16>> =
            list.entries().iter().map(|e| (expected_peer(&e.host), e.ports().iter().copied().collect())).collect();
        assert_eq!(reach(&policy), want, "seed {seed}: {texts:?}");

        // The selectors select what the allowlist matches: try names below,
        // at and beside each entry.
        let selectors: Vec<String> = reach(&policy).into_keys().filter(|k| !k.contains('/')).collect();
        for entry in list.entries() {
            let base = match &entry.host {
                HostPattern::Exact(n) | HostPattern::Suffix(n) => n.clone(),
                HostPattern::Ip(_) => continue,
            };
            for name in [
                base.clone(),
                format!("a.{base}"),
                format!("a.b.{base}"),
                format!("x{base}"),
                base[base.find('.').unwrap() + 1..].to_string(),
            ] {
                let allowed = list.entries().iter().any(|e| e.host.matches(&Host::Name(name.clone())));
                let selected = selectors.iter().any(|s| cilium_selects(s, &name));
                assert_eq!(selected, allowed, "seed {seed}: {name} (allowlist {list})");
            }
        }
    }
}

#[test]
fn the_same_hosts_in_any_order_render_the_same_object() {
    // The controller applies only when the rendering changes: order must not matter.
    let a = Allowlist::parse(["b.example.com", "a.example.com", "*.c.example.com:8443", "203.0.113.9"]).unwrap();
    let b = Allowlist::parse(["*.c.example.com:8443", "203.0.113.9", "a.example.com", "b.example.com"]).unwrap();
    let (pa, pb) = (build_cilium_policy(&params(a)).unwrap(), build_cilium_policy(&params(b)).unwrap());
    assert_eq!(serde_json::to_string(&pa).unwrap(), serde_json::to_string(&pb).unwrap());
    // One entry made by hand with an unparsed wildcard is refused, not rendered.
    let bad = Allowlist::new([Entry::from_parts(HostPattern::Suffix("org".into()), &[443]).unwrap()]);
    assert!(build_cilium_policy(&params(bad)).is_err());
}
