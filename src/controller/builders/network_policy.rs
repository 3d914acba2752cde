//! The namespace's run policies and the runner ServiceAccount.
//!
//! Two NetworkPolicies per namespace, made once and shared by every run
//! there (a policy per run cost two API writes per run: its create and its
//! delete):
//!
//! - [`RUNS_POLICY`] selects every run pod of the namespace (the
//!   `skill-operator.dev/skilljob-uid` label the Job builder puts on each,
//!   with the managed-by label) and has both policy types, so everything not
//!   listed is denied. Ingress: none at all. Egress: the artifact endpoint
//!   only (namespaceSelector + podSelector of the operator's pods, TCP on the
//!   pods' port). For a run granted nothing this is its *only* reachable peer.
//! - [`RUNS_EGRESS_POLICY`], made only when the controller has an egress
//!   proxy, selects the run pods that also carry `skill-operator.dev/egress:
//!   "true"` (the builder sets it only on runs granted egress hosts) and adds
//!   the egress proxy (namespaceSelector + podSelector, TCP port).
//!   NetworkPolicy cannot name host names (no FQDN rules upstream; Cilium's
//!   `toFQDNs` and Calico's DNS policy are vendor-only), so the host
//!   allowlist is enforced by that proxy, which matches the CONNECT/Host name
//!   against the job's sealed grant (its hosts are in the SkillJob's status).
//! - DNS: never by default, even with egress: a proxy-aware client sends the
//!   host name to the proxy and needs no resolver, and DNS is a tunnel. A
//!   caller can opt in (`dns: Some(Peer::kube_dns())`), which only takes
//!   effect in the egress policy.
//!
//! Policies only ever add peers to the pods they select, so a pod that
//! someone else labels `egress: "true"` gains a path to the proxy's port and
//! nothing through it: the proxy serves only a job's own credential, from
//! the address sealed for that job, to the hosts granted to it.
//!
//! Fail closed: a peer whose namespace or pod selector is empty (which would
//! match every namespace or pod) is dropped rather than emitted, and
//! [`NetPolParams::validate`] reports it.
//!
//! Ports are the *pods'* ports (targetPort): NetworkPolicy is evaluated
//! after the Service VIP has been translated to a pod address.
//!
//! NetworkPolicy is per pod, not per container: `run` can reach the artifact
//! endpoint too. What keeps it out is that only fetch and upload hold the
//! job's credential.

use std::collections::BTreeMap;

use sha2::{Digest as _, Sha256};

use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    is_label_key, is_label_value, require_label_name, validate_labels, Error, Result, LABEL_EGRESS, LABEL_MANAGED_BY, LABEL_SKILLJOB_UID,
    MANAGED_BY,
};

/// The namespace's policy sealing every run pod (artifact endpoint only).
pub const RUNS_POLICY: &str = "skill-operator-runs";
/// The namespace's policy adding the egress proxy for runs granted egress.
pub const RUNS_EGRESS_POLICY: &str = "skill-operator-runs-egress";
/// On each run policy: the digest of the whole set as built, so a cached
/// copy is compared by it and not by a spec the API server may default.
pub const ANNOTATION_POLICY_DIGEST: &str = "skill-operator.dev/policy-digest";

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

/// Everything [`build_network_policies`] needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NetPolParams {
    /// The runs' namespace.
    pub namespace: String,
    /// Extra labels (reserved keys refused).
    pub labels: BTreeMap<String, String>,
    /// The operator's artifact endpoint pods.
    pub artifact: Peer,
    /// The host-matching egress proxy. `None`: no run of the namespace reaches
    /// anything beyond the artifact endpoint (and no egress policy is made).
    pub egress_proxy: Option<Peer>,
    /// Cluster DNS, opt-in; used only together with the proxy. UDP and TCP.
    pub dns: Option<Peer>,
}

impl NetPolParams {
    /// Refuses anything the builder would have to drop to stay closed.
    pub fn validate(&self) -> Result<()> {
        require_label_name("namespace", &self.namespace)?;
        validate_labels(&self.labels)?;
        if let Some(problem) = self.artifact.problem() {
            return Err(Error::InvalidPeer { field: "artifact", problem });
        }
        if let Some(problem) = self.egress_proxy.as_ref().and_then(Peer::problem) {
            return Err(Error::InvalidPeer { field: "egress_proxy", problem });
        }
        if let Some(problem) = self.dns.as_ref().and_then(Peer::problem) {
            return Err(Error::InvalidPeer { field: "dns", problem });
        }
        Ok(())
    }
}

fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort { protocol: Some("TCP".into()), port: Some(IntOrString::Int(port)), end_port: None }
}

fn rule(peer: &Peer, ports: Vec<NetworkPolicyPort>) -> Option<NetworkPolicyEgressRule> {
    // Fail closed: an empty selector would widen the rule to everything.
    peer.problem().is_none().then(|| NetworkPolicyEgressRule { to: Some(vec![peer.to_peer()]), ports: Some(ports) })
}

/// Every run pod of a namespace, and only those: a run pod carries its
/// SkillJob's UID label and the managed-by label (build pods carry neither
/// the first, nor live in run namespaces).
pub fn run_pod_selector(egress: bool) -> LabelSelector {
    let mut labels = BTreeMap::from([(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string())]);
    if egress {
        labels.insert(LABEL_EGRESS.to_string(), "true".to_string());
    }
    LabelSelector {
        match_labels: Some(labels),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: LABEL_SKILLJOB_UID.to_string(),
            operator: "Exists".to_string(),
            values: None,
        }]),
    }
}

/// Builds the namespace's run policies: [`RUNS_POLICY`], and
/// [`RUNS_EGRESS_POLICY`] when there is a proxy. Never fails; see
/// [`NetPolParams::validate`].
pub fn build_network_policies(p: &NetPolParams) -> Vec<NetworkPolicy> {
    let policy = |name: &str, egress_selected: bool, rules: Vec<NetworkPolicyEgressRule>| {
        let mut labels = p.labels.clone();
        labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
        NetworkPolicy {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(p.namespace.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(NetworkPolicySpec {
                pod_selector: Some(run_pod_selector(egress_selected)),
                policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
                ingress: Some(Vec::new()),
                egress: Some(rules),
            }),
        }
    };
    let mut policies = vec![policy(RUNS_POLICY, false, rule(&p.artifact, vec![tcp(p.artifact.port)]).into_iter().collect())];
    if let Some(proxy_rule) = p.egress_proxy.as_ref().and_then(|proxy| rule(proxy, vec![tcp(proxy.port)])) {
        let mut rules = vec![proxy_rule];
        if let Some(dns) = &p.dns {
            let udp = NetworkPolicyPort { protocol: Some("UDP".into()), ..tcp(dns.port) };
            rules.extend(rule(dns, vec![udp, tcp(dns.port)]));
        }
        policies.push(policy(RUNS_EGRESS_POLICY, true, rules));
    }
    let specs: Vec<_> = policies.iter().map(|p| (&p.metadata.name, &p.spec)).collect();
    let digest = hex::encode(Sha256::digest(serde_json::to_vec(&specs).unwrap_or_default()));
    for p in &mut policies {
        p.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_POLICY_DIGEST.to_string(), digest.clone())]));
    }
    policies
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
