//! build_network_policies and build_service_account: one test per rule, with
//! the fail-closed cases (a run pod is always selected by the sealing
//! policy; nothing but the proxy is ever added).

#[path = "builders/common.rs"]
mod common;

use std::collections::BTreeMap;

use common::*;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyEgressRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use skill_operator::controller::builders::network_policy::ANNOTATION_POLICY_DIGEST;
use skill_operator::controller::builders::{
    build_build_job, build_job, build_network_policies, build_service_account, Error, NetPolParams, Peer, RUNS_EGRESS_POLICY, RUNS_POLICY,
};

fn egress(np: &NetworkPolicy) -> &[NetworkPolicyEgressRule] {
    np.spec.as_ref().unwrap().egress.as_deref().unwrap()
}

fn ports(rule: &NetworkPolicyEgressRule) -> Vec<(String, i32)> {
    rule.ports
        .iter()
        .flatten()
        .map(|p| {
            let IntOrString::Int(n) = p.port.clone().unwrap() else { panic!("named port") };
            (p.protocol.clone().unwrap(), n)
        })
        .collect()
}

/// Whether `selector` selects a pod labelled `labels` (matchLabels, and
/// the `Exists` expressions the builder uses).
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        assert_eq!(e.operator, "Exists", "the builder uses Exists only");
        labels.contains_key(&e.key)
    });
    by_labels && by_expressions
}

fn pod_selector(np: &NetworkPolicy) -> &LabelSelector {
    np.spec.as_ref().unwrap().pod_selector.as_ref().unwrap()
}

fn pod_labels(p: &skill_operator::controller::builders::JobParams) -> BTreeMap<String, String> {
    build_job(p).spec.unwrap().template.metadata.unwrap().labels.unwrap()
}

/// No rule may be wider than "these pods in these namespaces on these ports".
fn assert_no_wildcards(np: &NetworkPolicy) {
    let selector = pod_selector(np);
    assert!(!selector.match_labels.as_ref().unwrap().is_empty(), "selects every pod");
    assert!(!selector.match_expressions.as_ref().unwrap().is_empty(), "selects pods that are not runs");
    for rule in egress(np) {
        let to = rule.to.as_ref().expect("an egress rule without `to` allows every destination");
        assert!(!to.is_empty(), "an empty `to` allows every destination");
        assert!(!rule.ports.as_ref().expect("a rule without ports allows every port").is_empty());
        for peer in to {
            assert!(peer.ip_block.is_none(), "no CIDR peers");
            let ns = peer.namespace_selector.as_ref().expect("namespaceSelector");
            let pods = peer.pod_selector.as_ref().expect("podSelector");
            assert!(!ns.match_labels.as_ref().unwrap().is_empty(), "empty namespaceSelector = every namespace");
            assert!(!pods.match_labels.as_ref().unwrap().is_empty(), "empty podSelector = every pod");
            assert!(ns.match_expressions.is_none() && pods.match_expressions.is_none());
        }
    }
}

#[test]
fn denies_all_ingress_and_restricts_egress() {
    for np in build_network_policies(&netpol_params_egress()) {
        let spec = np.spec.as_ref().unwrap();
        assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]));
        assert_eq!(spec.ingress.as_deref(), Some(&[][..]), "no ingress rule: deny all");
        assert_no_wildcards(&np);
    }
}

#[test]
fn the_sealing_policy_selects_every_run_pod_and_no_build_pod() {
    let [seal] = build_network_policies(&netpol_params()).try_into().expect("one policy without a proxy");
    assert_eq!(seal.metadata.name.as_deref(), Some(RUNS_POLICY));
    // Every run's pod, with egress or without, prepared or fetched.
    for p in [params(), params_full(), params_prepared(), params_image_volume()] {
        assert!(selects(pod_selector(&seal), &pod_labels(&p)), "a run pod the sealing policy misses: {:?}", pod_labels(&p));
    }
    // A package build's pod is not a run (it has its own policy).
    let build = build_build_job(&build_params()).spec.unwrap().template.metadata.unwrap().labels.unwrap();
    assert!(!selects(pod_selector(&seal), &build), "the sealing policy selects a build pod: {build:?}");
}

#[test]
fn the_egress_policy_selects_only_runs_granted_egress() {
    let [_, open] = build_network_policies(&netpol_params_egress()).try_into().expect("two policies with a proxy");
    assert_eq!(open.metadata.name.as_deref(), Some(RUNS_EGRESS_POLICY));
    assert!(params_full().egress_proxy.is_some() && params().egress_proxy.is_none());
    assert!(selects(pod_selector(&open), &pod_labels(&params_full())), "a run granted egress is not given the proxy");
    assert!(!selects(pod_selector(&open), &pod_labels(&params())), "a run granted nothing is given the proxy");
}

#[test]
fn without_egress_only_the_artifact_endpoint_is_reachable() {
    let policies = build_network_policies(&netpol_params());
    assert_eq!(policies.len(), 1, "no proxy: no egress policy");
    let rules = egress(&policies[0]);
    assert_eq!(rules.len(), 1);
    let peer = &rules[0].to.as_ref().unwrap()[0];
    assert_eq!(
        peer.namespace_selector.as_ref().unwrap().match_labels,
        Some(BTreeMap::from([("kubernetes.io/metadata.name".to_string(), "skill-system".to_string())]))
    );
    assert_eq!(
        peer.pod_selector.as_ref().unwrap().match_labels,
        Some(BTreeMap::from([("app.kubernetes.io/name".to_string(), "skill-operator".to_string())]))
    );
    assert_eq!(ports(&rules[0]), [("TCP".to_string(), 8081)]);
    // With a proxy, the sealing policy still allows the artifact endpoint alone.
    let with_proxy = build_network_policies(&netpol_params_egress());
    assert_eq!(egress(&with_proxy[0]), rules);
}

#[test]
fn empty_selectors_never_mean_allow_all() {
    let p = NetPolParams {
        artifact: Peer::default(),
        egress_proxy: Some(Peer { port: 3128, ..Peer::default() }),
        dns: Some(Peer { port: 53, ..Peer::default() }),
        ..netpol_params()
    };
    let policies = build_network_policies(&p);
    assert_eq!(policies.len(), 1, "no valid proxy: no egress policy");
    assert_eq!(egress(&policies[0]), &[][..], "nothing valid to allow: deny all egress");
    assert_eq!(policies[0].spec.as_ref().unwrap().policy_types.as_ref().unwrap().len(), 2);
    assert!(matches!(p.validate(), Err(Error::InvalidPeer { field: "artifact", .. })));
}

#[test]
fn the_egress_policy_adds_exactly_the_proxy() {
    let p = netpol_params_egress();
    p.validate().unwrap();
    let policies = build_network_policies(&p);
    let rules = egress(&policies[1]);
    assert_eq!(rules.len(), 1);
    let proxy = &rules[0].to.as_ref().unwrap()[0];
    assert_eq!(
        proxy.pod_selector.as_ref().unwrap().match_labels,
        Some(BTreeMap::from([("app.kubernetes.io/name".to_string(), "egress-proxy".to_string())]))
    );
    assert_eq!(ports(&rules[0]), [("TCP".to_string(), 3128)]);
}

#[test]
fn no_dns_unless_opted_in() {
    for np in build_network_policies(&netpol_params_egress()) {
        for rule in egress(&np) {
            assert!(ports(rule).iter().all(|(_, port)| *port != 53), "DNS allowed without opt-in");
        }
    }
}

#[test]
fn dns_opt_in_needs_the_proxy_and_goes_to_the_egress_policy_alone() {
    let p = NetPolParams { dns: Some(Peer::kube_dns()), ..netpol_params() };
    let policies = build_network_policies(&p);
    assert_eq!(policies.len(), 1);
    assert_eq!(egress(&policies[0]).len(), 1, "no proxy: DNS stays closed");
    let p = NetPolParams { dns: Some(Peer::kube_dns()), ..netpol_params_egress() };
    let policies = build_network_policies(&p);
    assert_eq!(egress(&policies[0]).len(), 1, "the sealing policy never gets DNS");
    let rules = egress(&policies[1]);
    assert_eq!(rules.len(), 2);
    assert_eq!(ports(&rules[1]), [("UDP".to_string(), 53), ("TCP".to_string(), 53)]);
    let dns = &rules[1].to.as_ref().unwrap()[0];
    assert_eq!(dns.namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"], "kube-system");
}

#[test]
fn named_per_namespace_owned_by_no_run_and_stamped_with_one_digest() {
    let policies = build_network_policies(&netpol_params_egress());
    let digests: Vec<&String> = policies.iter().map(|p| &p.metadata.annotations.as_ref().unwrap()[ANNOTATION_POLICY_DIGEST]).collect();
    assert_eq!(digests.len(), 2);
    assert_eq!(digests[0], digests[1], "one digest for the set");
    for np in &policies {
        assert_eq!(np.metadata.namespace.as_deref(), Some(NS));
        assert!(np.metadata.owner_references.is_none(), "a run's deletion must not take the namespace's policy with it");
        assert_eq!(np.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"], "skill-operator");
    }
    // What they should say changes: so does the digest (the controller re-applies).
    let other = NetPolParams { egress_proxy: Some(Peer { port: 3129, ..proxy_peer() }), ..netpol_params_egress() };
    let digest_of =
        |p: &NetPolParams| build_network_policies(p)[0].metadata.annotations.as_ref().unwrap()[ANNOTATION_POLICY_DIGEST].clone();
    assert_ne!(&digest_of(&other), digests[0]);
    assert_ne!(&digest_of(&netpol_params()), digests[0]);
}

#[test]
fn validate_refuses_wide_or_broken_peers() {
    let wide_ns = Peer { namespace_labels: BTreeMap::new(), ..artifact_peer() };
    assert!(matches!(NetPolParams { artifact: wide_ns, ..netpol_params() }.validate(), Err(Error::InvalidPeer { field: "artifact", .. })));
    let wide_pods = Peer { pod_labels: BTreeMap::new(), ..proxy_peer() };
    assert!(matches!(
        NetPolParams { egress_proxy: Some(wide_pods), ..netpol_params_egress() }.validate(),
        Err(Error::InvalidPeer { field: "egress_proxy", .. })
    ));
    let no_port = Peer { port: 0, ..Peer::kube_dns() };
    assert!(matches!(
        NetPolParams { dns: Some(no_port), ..netpol_params_egress() }.validate(),
        Err(Error::InvalidPeer { field: "dns", .. })
    ));
    assert!(matches!(NetPolParams { namespace: "Team_A".into(), ..netpol_params() }.validate(), Err(Error::InvalidName { .. })));
}

#[test]
fn service_account_never_automounts() {
    let sa = build_service_account("skill-runner", NS, &BTreeMap::from([("team".into(), "a".into())]));
    assert_eq!(sa.automount_service_account_token, Some(false));
    assert_eq!(sa.metadata.name.as_deref(), Some("skill-runner"));
    assert_eq!(sa.metadata.namespace.as_deref(), Some(NS));
    assert_eq!(sa.metadata.labels.as_ref().unwrap()["app.kubernetes.io/managed-by"], "skill-operator");
    assert!(sa.secrets.is_none() && sa.image_pull_secrets.is_none());
}

/// A small deterministic generator (splitmix64): the property test below
/// explores the same cases on every run, and a failure names its seed.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The policy the controller asks for (no DNS, ever), over random inputs:
/// - never a DNS rule (no port 53, no UDP), never an allow-all rule, no CIDR peers;
/// - exactly the expected peers: the artifact endpoint in the sealing
///   policy, the proxy in the egress policy exactly when one is configured,
///   nothing else.
#[test]
fn property_never_dns_never_allow_all_exactly_the_expected_peers() {
    let labels = [
        BTreeMap::from([("app.kubernetes.io/component".to_string(), "egress-proxy".to_string())]),
        BTreeMap::from([("app".to_string(), "proxy".to_string()), ("tier".to_string(), "edge".to_string())]),
    ];
    let namespaces = ["skill-system", "egress", "ops"];
    for seed in 0..2000u64 {
        let mut g = Gen(seed);
        let peer = |g: &mut Gen| {
            let namespace: &&str = g.pick(&namespaces);
            Peer::in_namespace(namespace, g.pick(&labels).clone(), 1 + g.below(65535) as i32)
        };
        let proxy = (g.below(3) > 0).then(|| peer(&mut g));
        let artifact = peer(&mut g);
        let p = NetPolParams { egress_proxy: proxy.clone(), artifact: artifact.clone(), ..netpol_params() };
        let policies = build_network_policies(&p);
        let mut rules = Vec::new();
        for np in &policies {
            assert_no_wildcards(np);
            for rule in egress(np) {
                for (protocol, port) in ports(rule) {
                    assert!(port != 53 && protocol == "TCP", "seed {seed}: a DNS-shaped rule {protocol}/{port}");
                }
                rules.push(rule.clone());
            }
        }
        let expect_proxy = proxy.is_some();
        assert_eq!(policies.len(), 1 + usize::from(expect_proxy), "seed {seed}");
        assert_eq!(rules.len(), 1 + usize::from(expect_proxy), "seed {seed}: {rules:?}");
        let peer_of = |rule: &NetworkPolicyEgressRule| {
            let to = &rule.to.as_ref().unwrap()[0];
            (
                to.namespace_selector.clone().unwrap().match_labels.unwrap(),
                to.pod_selector.clone().unwrap().match_labels.unwrap(),
                ports(rule),
            )
        };
        let want = |peer: &Peer| (peer.namespace_labels.clone(), peer.pod_labels.clone(), vec![("TCP".to_string(), peer.port)]);
        assert_eq!(peer_of(&rules[0]), want(&artifact), "seed {seed}");
        if expect_proxy {
            assert_eq!(peer_of(&rules[1]), want(proxy.as_ref().unwrap()), "seed {seed}");
        }
        p.validate().unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    }
}
