//! The per-SkillJob NetworkPolicy and the runner ServiceAccount.
//!
//! The policy selects exactly one SkillJob's pods (by the
//! `skill-operator.dev/skilljob-uid` label the Job builder puts on them) and
//! has both policy types, so everything not listed is denied:
//!
//! - Ingress: none at all.
//! - Egress, always: the artifact endpoint only (namespaceSelector +
//!   podSelector of the operator's pods, TCP on the pods' port). With nothing
//!   granted this is the pod's *only* reachable peer.
//! - Egress, only when the skill was granted egress hosts: the egress proxy
//!   (namespaceSelector + podSelector, TCP port). NetworkPolicy cannot name
//!   host names (no FQDN rules upstream; Cilium's `toFQDNs` and Calico's DNS
//!   policy are vendor-only), so the host allowlist is enforced by that
//!   proxy, which matches the CONNECT/Host name against the job's grant. The
//!   granted hosts are recorded on the policy in the
//!   `skill-operator.dev/egress-hosts` annotation for humans and the proxy.
//! - DNS: never by default, even with egress: a proxy-aware client sends the
//!   host name to the proxy and needs no resolver, and DNS is a tunnel. A
//!   caller can opt in (`dns: Some(Peer::kube_dns())`), which only takes
//!   effect together with granted egress hosts.
//!
//! Fail closed: an empty host list never means "allow all". A peer whose
//! namespace or pod selector is empty (which would match every namespace or
//! pod) is dropped rather than emitted, egress hosts without a proxy add no
//! rule, and [`NetPolParams::validate`] reports all three cases.
//!
//! Ports are the *pods'* ports (targetPort): NetworkPolicy is evaluated
//! after the Service VIP has been translated to a pod address.
//!
//! NetworkPolicy is per pod, not per container: `run` can reach the artifact
//! endpoint too. What keeps it out is that only fetch and upload hold the
//! per-job token.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::job::{controller_owner, job_name, object_labels, pod_selector_labels};
use super::{
    is_label_key, is_label_value, require_label_name, require_subdomain, uid_hex, validate_labels, Error, Result, LABEL_MANAGED_BY,
    MANAGED_BY,
};

/// Annotation listing the granted egress hosts (comma-separated).
pub const ANNOTATION_EGRESS_HOSTS: &str = "skill-operator.dev/egress-hosts";

/// A set of pods in a set of namespaces, reached on one port. The default
/// (empty selectors, port 0) is invalid and never emitted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Peer {
    /// Labels of the peer's namespace(s); must be non-empty
    /// (e.g. `kubernetes.io/metadata.name: skill-system`).
    pub namespace_labels: BTreeMap<String, String>,
    /// Labels of the peer pods; must be non-empty.
    pub pod_labels: BTreeMap<String, String>,
    /// The pods' port (not the Service port).
    pub port: i32,
}

impl Peer {
    /// Pods labelled `pod_labels` in the namespace named `namespace`.
    pub fn in_namespace(namespace: &str, pod_labels: BTreeMap<String, String>, port: i32) -> Self {
        Self { namespace_labels: BTreeMap::from([("kubernetes.io/metadata.name".to_string(), namespace.to_string())]), pod_labels, port }
    }

    /// The usual cluster DNS: `k8s-app=kube-dns` pods in kube-system, port 53.
    pub fn kube_dns() -> Self {
        Self::in_namespace("kube-system", BTreeMap::from([("k8s-app".into(), "kube-dns".into())]), 53)
    }

    pub(crate) fn problem(&self) -> Option<&'static str> {
        if self.namespace_labels.is_empty() {
            Some("namespace_labels is empty (would select every namespace)")
        } else if self.pod_labels.is_empty() {
            Some("pod_labels is empty (would select every pod)")
        } else if !(1..=65535).contains(&self.port) {
            Some("port must be 1-65535")
        } else if !self.namespace_labels.iter().chain(&self.pod_labels).all(|(k, v)| is_label_key(k) && is_label_value(v)) {
            Some("a selector label is malformed")
        } else {
            None
        }
    }

    pub(crate) fn to_peer(&self) -> NetworkPolicyPeer {
        NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector { match_labels: Some(self.namespace_labels.clone()), match_expressions: None }),
            pod_selector: Some(LabelSelector { match_labels: Some(self.pod_labels.clone()), match_expressions: None }),
            ip_block: None,
        }
    }
}

/// Everything [`build_network_policy`] needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NetPolParams {
    /// The SkillJob's name (for the informative label).
    pub skilljob_name: String,
    /// The SkillJob's namespace.
    pub namespace: String,
    /// The SkillJob's UID: the policy's name and pod selector derive from it.
    pub skilljob_uid: String,
    /// Reference to the SkillJob (controller/blockOwnerDeletion forced on).
    pub owner: OwnerReference,
    /// Extra labels (reserved keys refused).
    pub labels: BTreeMap<String, String>,
    /// The operator's artifact endpoint pods.
    pub artifact: Peer,
    /// The skill's granted egress hosts. Empty: no egress beyond the artifact endpoint.
    pub egress_hosts: Vec<String>,
    /// The host-matching egress proxy; used only when `egress_hosts` is non-empty.
    pub egress_proxy: Option<Peer>,
    /// Cluster DNS, opt-in; used only together with a proxy rule. UDP and TCP.
    pub dns: Option<Peer>,
}

impl NetPolParams {
    /// Refuses anything the builder would have to drop to stay closed.
    pub fn validate(&self) -> Result<()> {
        require_subdomain("skilljob_name", &self.skilljob_name)?;
        require_label_name("namespace", &self.namespace)?;
        if uid_hex(&self.skilljob_uid).is_none() {
            return Err(Error::InvalidUid(self.skilljob_uid.clone()));
        }
        if self.owner.uid != self.skilljob_uid || self.owner.name != self.skilljob_name {
            return Err(Error::OwnerMismatch {
                name: self.skilljob_name.clone(),
                uid: self.skilljob_uid.clone(),
                problem: format!("owner is {:?} ({})", self.owner.name, self.owner.uid),
            });
        }
        validate_labels(&self.labels)?;
        if let Some(problem) = self.artifact.problem() {
            return Err(Error::InvalidPeer { field: "artifact", problem });
        }
        for host in &self.egress_hosts {
            if !is_egress_host(host) {
                return Err(Error::InvalidEgressHost(host.clone()));
            }
        }
        match &self.egress_proxy {
            None if !self.egress_hosts.is_empty() => return Err(Error::EgressWithoutProxy(self.egress_hosts.clone())),
            Some(proxy) => {
                if let Some(problem) = proxy.problem() {
                    return Err(Error::InvalidPeer { field: "egress_proxy", problem });
                }
            }
            None => {}
        }
        if let Some(dns) = &self.dns {
            if let Some(problem) = dns.problem() {
                return Err(Error::InvalidPeer { field: "dns", problem });
            }
        }
        Ok(())
    }
}

/// A host name or `*.`-wildcard host name, optionally with `:port`.
fn is_egress_host(s: &str) -> bool {
    if s.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (s, None),
    };
    let host = host.strip_prefix("*.").unwrap_or(host);
    let host = host.to_ascii_lowercase();
    super::is_dns1123_subdomain(&host) && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|n| n > 0))
}

fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort { protocol: Some("TCP".into()), port: Some(IntOrString::Int(port)), end_port: None }
}

fn rule(peer: &Peer, ports: Vec<NetworkPolicyPort>) -> Option<NetworkPolicyEgressRule> {
    // Fail closed: an empty selector would widen the rule to everything.
    peer.problem().is_none().then(|| NetworkPolicyEgressRule { to: Some(vec![peer.to_peer()]), ports: Some(ports) })
}

/// Builds the policy (named like the Job). Never fails; see
/// [`NetPolParams::validate`].
pub fn build_network_policy(p: &NetPolParams) -> NetworkPolicy {
    let mut egress: Vec<NetworkPolicyEgressRule> = Vec::new();
    egress.extend(rule(&p.artifact, vec![tcp(p.artifact.port)]));
    let granted = !p.egress_hosts.is_empty();
    let mut proxied = false;
    if granted {
        if let Some(proxy_rule) = p.egress_proxy.as_ref().and_then(|proxy| rule(proxy, vec![tcp(proxy.port)])) {
            egress.push(proxy_rule);
            proxied = true;
        }
    }
    if proxied {
        if let Some(dns) = &p.dns {
            let udp = NetworkPolicyPort { protocol: Some("UDP".into()), ..tcp(dns.port) };
            egress.extend(rule(dns, vec![udp, tcp(dns.port)]));
        }
    }
    let annotations = granted.then(|| BTreeMap::from([(ANNOTATION_EGRESS_HOSTS.to_string(), p.egress_hosts.join(","))]));
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(job_name(&p.skilljob_uid)),
            namespace: Some(p.namespace.clone()),
            labels: Some(object_labels(&p.labels, &p.skilljob_name, &p.skilljob_uid)),
            annotations,
            owner_references: Some(vec![controller_owner(&p.owner)]),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector { match_labels: Some(pod_selector_labels(&p.skilljob_uid)), match_expressions: None }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(Vec::new()),
            egress: Some(egress),
        }),
    }
}

/// The runner ServiceAccount: no RBAC is ever bound to it, and its token is
/// never mounted (the pods say so too).
pub fn build_service_account(name: &str, namespace: &str, labels: &BTreeMap<String, String>) -> ServiceAccount {
    let mut labels = labels.clone();
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    ServiceAccount {
        metadata: ObjectMeta { name: Some(name.into()), namespace: Some(namespace.into()), labels: Some(labels), ..Default::default() },
        automount_service_account_token: Some(false),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_host_syntax() {
        for ok in ["api.github.com", "*.pypi.org", "files.pythonhosted.org:443", "EXAMPLE.com"] {
            assert!(is_egress_host(ok), "{ok}");
        }
        for bad in ["", "*", "http://x.com", "a b", "x.com:0", "x.com:99999", "*.", "a/b"] {
            assert!(!is_egress_host(bad), "{bad}");
        }
    }
}
