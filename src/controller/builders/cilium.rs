//! The egress proxy's CiliumNetworkPolicy (`cilium.io/v2`), an optional
//! defence in depth beside the standard policies.
//!
//! Run pods never reach allowed hosts themselves: their NetworkPolicy lets
//! them reach the artifact endpoint and the proxy, nothing else. The one
//! workload that connects to allowed hosts is the proxy, so this is where a
//! host-name rule means something: with it a Cilium cluster lets the proxy
//! pods reach only names some SkillPackage's runtime profile allows, on that
//! entry's ports, and a bug in the proxy's own host matching cannot reach
//! anything else.
//!
//! What it says (egress only; ingress stays the standard policy's):
//!
//! - DNS to the cluster DNS pods, UDP and TCP 53, with an L7 `dns` rule.
//!   Cilium's `toFQDNs` works by watching DNS answers in its DNS proxy: a
//!   name's addresses are allowed only once the proxy pod has looked the name
//!   up through it, so the lookups must pass that DNS proxy, which only an L7
//!   `dns` rule arranges. The pattern there is `*` because the pod's resolver
//!   first tries the names of its search list (`ndots:5`), which a narrower
//!   pattern would refuse, and the egress proxy only resolves names its own
//!   allowlist has already matched. This rule is the proxy's: the per-run
//!   NetworkPolicy still has no DNS rule at all.
//! - `toFQDNs` per port set: an exact host becomes `matchName`, `*.suffix`
//!   becomes `matchPattern: "**.suffix"`. The allowlist's wildcard matches
//!   names any number of labels below the suffix; in Cilium `*.` matches one
//!   label only and `**.` (1.19 and later) any number. Older releases read
//!   `**.` as `*.`, one label: narrower than the allowlist, never wider.
//!   Names are already lower-case punycode (the allowlist's form).
//! - `toCIDR` with the address itself (`/32`, `/128`) for an IP entry, the
//!   only way an IP is ever allowed (as in the proxy).
//!
//! Fail closed: no allowed hosts leaves the DNS rule alone (an egress
//! section that allows nothing else, never an empty one, which Cilium would
//! read as "no egress policy"); never a host pattern made only of `*`, never
//! `toEntities`, never a CIDR wider than one address. Cilium allows the
//! union of every policy selecting a pod, so this only narrows anything when
//! the standard policy for the proxy has no internet rule (the chart drops it
//! when this policy is on).

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::{is_dns1123_subdomain, is_label_key, is_label_value, LABEL_MANAGED_BY, MANAGED_BY};
use crate::core::limits::{CILIUM_FQDN_MAX_HOSTS, CILIUM_PORTS_PER_RULE};
use crate::egress::allowlist::{Allowlist, HostPattern};

/// The resource's API version.
pub const API_VERSION: &str = "cilium.io/v2";
/// The resource's kind.
pub const KIND: &str = "CiliumNetworkPolicy";
/// Its plural (the REST path and the RBAC resource name).
pub const PLURAL: &str = "ciliumnetworkpolicies";
/// Cilium's label key for a pod's namespace in endpoint selectors.
const NAMESPACE_LABEL: &str = "k8s:io.kubernetes.pod.namespace";

/// Why the policy was not built; each names what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CiliumError {
    #[error("{field} {value:?} is not a DNS-1123 name")]
    InvalidName { field: &'static str, value: String },
    #[error("{field}: no labels; an empty selector would select every pod, give at least one label")]
    EmptySelector { field: &'static str },
    #[error("{field}: label {key:?}={value:?} is not a valid label")]
    InvalidLabel { field: &'static str, key: String, value: String },
    #[error("allowlist host {0:?} cannot be written as a Cilium DNS name; allowlist entries come from Allowlist::parse")]
    InvalidHost(String),
    #[error(
        "the SkillPackages allow {count} host entries together, more than the {max} this policy carries; remove entries from runtime.allowedEgress or turn the Cilium policy off"
    )]
    TooManyHosts { count: usize, max: usize },
}

/// Everything [`build_cilium_policy`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CiliumParams {
    /// The object's name.
    pub name: String,
    /// The egress proxy's namespace (the policy's own).
    pub namespace: String,
    /// Labels of the egress proxy pods (the chart's selector labels).
    pub proxy_pod_labels: BTreeMap<String, String>,
    /// The cluster DNS pods' namespace and labels.
    pub dns_namespace: String,
    pub dns_pod_labels: BTreeMap<String, String>,
    /// What the proxy may reach: the union of every package's allowed hosts.
    pub allowlist: Allowlist,
}

/// The object, typed as far as this builder writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CiliumNetworkPolicy {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: CiliumSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CiliumSpec {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub endpoint_selector: Selector,
    pub egress: Vec<EgressRule>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    pub match_labels: BTreeMap<String, String>,
}

/// One egress rule: one kind of peer (Cilium refuses mixing `toFQDNs` with
/// other peers in a rule) and its ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressRule {
    #[serde(rename = "toEndpoints", default, skip_serializing_if = "Option::is_none")]
    pub to_endpoints: Option<Vec<Selector>>,
    #[serde(rename = "toFQDNs", default, skip_serializing_if = "Option::is_none")]
    pub to_fqdns: Option<Vec<FqdnSelector>>,
    #[serde(rename = "toCIDR", default, skip_serializing_if = "Option::is_none")]
    pub to_cidr: Option<Vec<String>>,
    #[serde(rename = "toPorts")]
    pub to_ports: Vec<PortRule>,
}

/// `{matchName: ...}` or `{matchPattern: ...}` (a map in YAML as in JSON,
/// hence untagged struct variants rather than a tagged enum).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FqdnSelector {
    MatchName {
        #[serde(rename = "matchName")]
        match_name: String,
    },
    MatchPattern {
        #[serde(rename = "matchPattern")]
        match_pattern: String,
    },
}

impl FqdnSelector {
    pub fn name(name: impl Into<String>) -> Self {
        FqdnSelector::MatchName { match_name: name.into() }
    }

    pub fn pattern(pattern: impl Into<String>) -> Self {
        FqdnSelector::MatchPattern { match_pattern: pattern.into() }
    }

    /// The name or the pattern.
    pub fn text(&self) -> &str {
        match self {
            FqdnSelector::MatchName { match_name } => match_name,
            FqdnSelector::MatchPattern { match_pattern } => match_pattern,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortRule {
    pub ports: Vec<PortProtocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<L7Rules>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortProtocol {
    /// Cilium writes ports as strings.
    pub port: String,
    pub protocol: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct L7Rules {
    pub dns: Vec<FqdnSelector>,
}

fn check_name(field: &'static str, value: &str) -> Result<(), CiliumError> {
    if is_dns1123_subdomain(value) {
        Ok(())
    } else {
        Err(CiliumError::InvalidName { field, value: value.to_string() })
    }
}

fn check_labels(field: &'static str, labels: &BTreeMap<String, String>) -> Result<(), CiliumError> {
    if labels.is_empty() {
        return Err(CiliumError::EmptySelector { field });
    }
    match labels.iter().find(|(k, v)| !is_label_key(k) || !is_label_value(v) || k.contains(':')) {
        Some((k, v)) => Err(CiliumError::InvalidLabel { field, key: k.clone(), value: v.clone() }),
        None => Ok(()),
    }
}

/// The peer one allowlist entry becomes.
enum Peer {
    Fqdn(FqdnSelector),
    Cidr(String),
}

fn peer_of(host: &HostPattern) -> Result<Peer, CiliumError> {
    let invalid = || CiliumError::InvalidHost(host.to_string());
    match host {
        HostPattern::Exact(name) if is_dns1123_subdomain(name) => Ok(Peer::Fqdn(FqdnSelector::name(name.clone()))),
        // At least two labels under the wildcard, as the allowlist requires:
        // `**.com` would be every name of a top-level domain.
        HostPattern::Suffix(suffix) if is_dns1123_subdomain(suffix) && suffix.contains('.') => {
            Ok(Peer::Fqdn(FqdnSelector::pattern(format!("**.{suffix}"))))
        }
        HostPattern::Ip(ip) if !ip.is_unspecified() => Ok(Peer::Cidr(match ip {
            IpAddr::V4(v4) => format!("{v4}/32"),
            IpAddr::V6(v6) => format!("{v6}/128"),
        })),
        _ => Err(invalid()),
    }
}

fn tcp_ports(ports: &[u16]) -> Vec<PortRule> {
    // Cilium's schema caps a PortRule at 40 ports; several PortRules in one
    // rule are alternatives, so splitting changes nothing else.
    ports
        .chunks(CILIUM_PORTS_PER_RULE)
        .map(|chunk| PortRule {
            ports: chunk.iter().map(|p| PortProtocol { port: p.to_string(), protocol: "TCP".into() }).collect(),
            rules: None,
        })
        .collect()
}

fn dns_rule(p: &CiliumParams) -> EgressRule {
    let mut labels: BTreeMap<String, String> = p.dns_pod_labels.iter().map(|(k, v)| (format!("k8s:{k}"), v.clone())).collect();
    labels.insert(NAMESPACE_LABEL.into(), p.dns_namespace.clone());
    let port = |protocol: &str| PortProtocol { port: "53".into(), protocol: protocol.into() };
    EgressRule {
        to_endpoints: Some(vec![Selector { match_labels: labels }]),
        to_fqdns: None,
        to_cidr: None,
        to_ports: vec![PortRule { ports: vec![port("UDP"), port("TCP")], rules: Some(L7Rules { dns: vec![FqdnSelector::pattern("*")] }) }],
    }
}

/// Builds the policy, or says which input is wrong (nothing is built then;
/// the caller decides what stays in force, see `controller::cilium`).
pub fn build_cilium_policy(p: &CiliumParams) -> Result<CiliumNetworkPolicy, CiliumError> {
    check_name("name", &p.name)?;
    check_name("namespace", &p.namespace)?;
    check_name("dns namespace", &p.dns_namespace)?;
    check_labels("proxy pod labels", &p.proxy_pod_labels)?;
    check_labels("dns pod labels", &p.dns_pod_labels)?;
    let entries = p.allowlist.entries();
    if entries.len() > CILIUM_FQDN_MAX_HOSTS {
        return Err(CiliumError::TooManyHosts { count: entries.len(), max: CILIUM_FQDN_MAX_HOSTS });
    }
    // Grouped by port set, in a stable order, so the same allowlist always
    // renders the same object (the controller applies only on a change).
    let mut names: BTreeMap<&[u16], Vec<FqdnSelector>> = BTreeMap::new();
    let mut cidrs: BTreeMap<&[u16], Vec<String>> = BTreeMap::new();
    for entry in entries {
        match peer_of(&entry.host)? {
            Peer::Fqdn(s) => names.entry(entry.ports()).or_default().push(s),
            Peer::Cidr(c) => cidrs.entry(entry.ports()).or_default().push(c),
        }
    }
    let mut egress = vec![dns_rule(p)];
    for (ports, mut selectors) in names {
        selectors.sort();
        selectors.dedup();
        egress.push(EgressRule { to_endpoints: None, to_fqdns: Some(selectors), to_cidr: None, to_ports: tcp_ports(ports) });
    }
    for (ports, mut blocks) in cidrs {
        blocks.sort();
        blocks.dedup();
        egress.push(EgressRule { to_endpoints: None, to_fqdns: None, to_cidr: Some(blocks), to_ports: tcp_ports(ports) });
    }
    Ok(CiliumNetworkPolicy {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        metadata: ObjectMeta {
            name: Some(p.name.clone()),
            namespace: Some(p.namespace.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
                ("app.kubernetes.io/component".to_string(), "egress-proxy".to_string()),
            ])),
            ..Default::default()
        },
        spec: CiliumSpec {
            description:
                "skill-operator: the egress proxy reaches only the hosts SkillPackages allow (runtime.allowedEgress), on their ports".into(),
            endpoint_selector: Selector { match_labels: p.proxy_pod_labels.clone() },
            egress,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::allowlist::Entry;

    fn params(list: Allowlist) -> CiliumParams {
        CiliumParams {
            name: "p".into(),
            namespace: "skill-system".into(),
            proxy_pod_labels: BTreeMap::from([("app".into(), "proxy".into())]),
            dns_namespace: "kube-system".into(),
            dns_pod_labels: BTreeMap::from([("k8s-app".into(), "kube-dns".into())]),
            allowlist: list,
        }
    }

    #[test]
    fn entries_built_around_the_parser_are_refused() {
        // `Entry::from_parts` skips the parser's checks: a one-label suffix
        // (`**.com`) or an unspecified address must not reach the policy.
        for host in [HostPattern::Suffix("com".into()), HostPattern::Exact("*".into()), HostPattern::Ip("0.0.0.0".parse().unwrap())] {
            let list = Allowlist::new([Entry::from_parts(host.clone(), &[443]).unwrap()]);
            assert_eq!(build_cilium_policy(&params(list)).unwrap_err(), CiliumError::InvalidHost(host.to_string()));
        }
    }

    #[test]
    fn selectors_must_select_something_specific() {
        let mut p = params(Allowlist::default());
        p.proxy_pod_labels.clear();
        assert!(matches!(build_cilium_policy(&p), Err(CiliumError::EmptySelector { .. })));
        let mut p = params(Allowlist::default());
        p.dns_pod_labels = BTreeMap::from([("k8s:k8s-app".into(), "kube-dns".into())]);
        assert!(matches!(build_cilium_policy(&p), Err(CiliumError::InvalidLabel { .. })));
        let mut p = params(Allowlist::default());
        p.namespace = "Not_A_Name".into();
        assert!(matches!(build_cilium_policy(&p), Err(CiliumError::InvalidName { .. })));
    }

    #[test]
    fn too_many_hosts_is_an_error_naming_the_limit() {
        let list = Allowlist::new((0..=CILIUM_FQDN_MAX_HOSTS).map(|i| Entry::parse(&format!("h{i}.example.com")).unwrap()));
        let Err(err) = build_cilium_policy(&params(list)) else { panic!("{} hosts rendered", CILIUM_FQDN_MAX_HOSTS + 1) };
        assert_eq!(err, CiliumError::TooManyHosts { count: CILIUM_FQDN_MAX_HOSTS + 1, max: CILIUM_FQDN_MAX_HOSTS });
        assert!(err.to_string().contains("runtime.allowedEgress"), "{err}");
        let at_limit = Allowlist::new((0..CILIUM_FQDN_MAX_HOSTS).map(|i| Entry::parse(&format!("h{i}.example.com")).unwrap()));
        assert!(build_cilium_policy(&params(at_limit)).is_ok());
    }

    #[test]
    fn more_ports_than_a_port_rule_holds_are_split() {
        let ports: Vec<String> = (1000..1000 + 64).map(|p| p.to_string()).collect();
        let list = Allowlist::parse([format!("api.example.com:{}", ports.join(",")).as_str()]).unwrap();
        let policy = build_cilium_policy(&params(list)).unwrap();
        let rule = &policy.spec.egress[1];
        assert_eq!(rule.to_ports.len(), 2);
        assert!(rule.to_ports.iter().all(|r| r.ports.len() <= CILIUM_PORTS_PER_RULE));
        let got: Vec<&str> = rule.to_ports.iter().flat_map(|r| r.ports.iter().map(|p| p.port.as_str())).collect();
        assert_eq!(got, ports.iter().map(String::as_str).collect::<Vec<_>>());
    }
}
