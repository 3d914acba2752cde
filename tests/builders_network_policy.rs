//! build_network_policy and build_service_account: one test per rule, with
//! the fail-closed cases (an empty allowlist never means allow-all).

#[path = "builders/common.rs"]
mod common;

use std::collections::BTreeMap;

use common::*;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyEgressRule};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use skill_operator::controller::builders::network_policy::ANNOTATION_EGRESS_HOSTS;
use skill_operator::controller::builders::{
    build_job, build_network_policy, build_service_account, Error, NetPolParams, Peer, LABEL_SKILLJOB_UID,
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

/// No rule may be wider than "these pods in these namespaces on these ports".
fn assert_no_wildcards(np: &NetworkPolicy) {
    let spec = np.spec.as_ref().unwrap();
    assert!(!spec.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap().is_empty(), "selects every pod");
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
    let np = build_network_policy(&netpol_params());
    let spec = np.spec.as_ref().unwrap();
    assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]));
    assert_eq!(spec.ingress.as_deref(), Some(&[][..]), "no ingress rule: deny all");
    assert_no_wildcards(&np);
}

#[test]
fn selects_exactly_this_jobs_pods() {
    let np = build_network_policy(&netpol_params());
    let selector = np.spec.as_ref().unwrap().pod_selector.clone().unwrap();
    assert_eq!(selector.match_labels, Some(BTreeMap::from([(LABEL_SKILLJOB_UID.to_string(), UID.to_string())])));
    assert!(selector.match_expressions.is_none());
    // ...and the Job's pods carry exactly that label.
    let job = build_job(&params());
    let pod_labels = job.spec.unwrap().template.metadata.unwrap().labels.unwrap();
    for (k, v) in selector.match_labels.unwrap() {
        assert_eq!(pod_labels.get(&k), Some(&v));
    }
}

#[test]
fn without_egress_only_the_artifact_endpoint_is_reachable() {
    let np = build_network_policy(&netpol_params());
    let rules = egress(&np);
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
    assert!(np.metadata.annotations.is_none());
}

#[test]
fn empty_allowlist_never_means_allow_all() {
    // Empty hosts with a proxy configured: still no proxy rule.
    let p = NetPolParams { egress_hosts: vec![], egress_proxy: Some(proxy_peer()), dns: Some(Peer::kube_dns()), ..netpol_params() };
    p.validate().unwrap();
    let np = build_network_policy(&p);
    assert_eq!(egress(&np).len(), 1, "only the artifact endpoint");
    assert_no_wildcards(&np);
    // Empty selectors everywhere: no rule at all (deny all egress), never `{}`.
    let p = NetPolParams {
        artifact: Peer::default(),
        egress_hosts: vec!["x.example".into()],
        egress_proxy: Some(Peer { port: 3128, ..Peer::default() }),
        dns: Some(Peer { port: 53, ..Peer::default() }),
        ..netpol_params()
    };
    let np = build_network_policy(&p);
    assert_eq!(egress(&np), &[][..], "nothing valid to allow: deny all egress");
    assert_eq!(np.spec.as_ref().unwrap().policy_types.as_ref().unwrap().len(), 2);
    assert!(matches!(p.validate(), Err(Error::InvalidPeer { field: "artifact", .. })));
}

#[test]
fn granted_hosts_without_a_proxy_add_nothing_and_are_refused() {
    let p = NetPolParams { egress_hosts: vec!["api.github.com".into()], egress_proxy: None, ..netpol_params() };
    assert!(matches!(p.validate(), Err(Error::EgressWithoutProxy(_))));
    let np = build_network_policy(&p);
    assert_eq!(egress(&np).len(), 1, "fail closed: artifact endpoint only");
}

#[test]
fn granted_hosts_add_exactly_the_proxy() {
    let p = netpol_params_egress();
    p.validate().unwrap();
    let np = build_network_policy(&p);
    let rules = egress(&np);
    assert_eq!(rules.len(), 2);
    let proxy = &rules[1].to.as_ref().unwrap()[0];
    assert_eq!(
        proxy.pod_selector.as_ref().unwrap().match_labels,
        Some(BTreeMap::from([("app.kubernetes.io/name".to_string(), "egress-proxy".to_string())]))
    );
    assert_eq!(ports(&rules[1]), [("TCP".to_string(), 3128)]);
    assert_no_wildcards(&np);
}

#[test]
fn granted_hosts_are_recorded_for_the_proxy() {
    let np = build_network_policy(&netpol_params_egress());
    assert_eq!(np.metadata.annotations.unwrap()[ANNOTATION_EGRESS_HOSTS], "api.github.com,*.pypi.org");
}

#[test]
fn no_dns_unless_opted_in() {
    let np = build_network_policy(&netpol_params_egress());
    for rule in egress(&np) {
        assert!(ports(rule).iter().all(|(_, port)| *port != 53), "DNS allowed without opt-in");
    }
}

#[test]
fn dns_opt_in_needs_granted_egress() {
    let p = NetPolParams { dns: Some(Peer::kube_dns()), ..netpol_params() };
    let np = build_network_policy(&p);
    assert_eq!(egress(&np).len(), 1, "no egress granted: DNS stays closed");
    let p = NetPolParams { dns: Some(Peer::kube_dns()), ..netpol_params_egress() };
    let np = build_network_policy(&p);
    let rules = egress(&np);
    assert_eq!(rules.len(), 3);
    assert_eq!(ports(&rules[2]), [("UDP".to_string(), 53), ("TCP".to_string(), 53)]);
    let dns = &rules[2].to.as_ref().unwrap()[0];
    assert_eq!(dns.namespace_selector.as_ref().unwrap().match_labels.as_ref().unwrap()["kubernetes.io/metadata.name"], "kube-system");
    assert_no_wildcards(&np);
}

#[test]
fn named_and_owned_like_the_job() {
    let np = build_network_policy(&netpol_params());
    assert_eq!(np.metadata.name.as_deref(), Some("skilljob-0f1e2d3c4b5a"));
    assert_eq!(np.metadata.namespace.as_deref(), Some(NS));
    let owner = &np.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.controller, owner.block_owner_deletion), (Some(true), Some(true)));
    assert_eq!(np.metadata.labels.as_ref().unwrap()[LABEL_SKILLJOB_UID], UID);
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
}

#[test]
fn validate_refuses_malformed_hosts_and_foreign_owners() {
    let p = NetPolParams { egress_hosts: vec!["https://evil.example/".into()], ..netpol_params_egress() };
    assert!(matches!(p.validate(), Err(Error::InvalidEgressHost(_))));
    let p = NetPolParams { owner: owner("other", UID), ..netpol_params() };
    assert!(matches!(p.validate(), Err(Error::OwnerMismatch { .. })));
    let p = NetPolParams { skilljob_uid: "".into(), ..netpol_params() };
    assert!(matches!(p.validate(), Err(Error::InvalidUid(_))));
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
/// - exactly the expected peers: the artifact endpoint always, the proxy
///   exactly when hosts are allowed and a proxy is configured, nothing else;
/// - when `validate` accepts the parameters, that is what is built; hosts
///   without a proxy are refused by `validate` and get no rule.
#[test]
fn property_never_dns_never_allow_all_exactly_the_expected_peers() {
    const HOSTS: [&str; 8] = [
        "api.example.com",
        "*.pypi.org",
        "files.example.org:8443",
        "203.0.113.7",
        "10.88.0.1:8080",
        "2001:db8::1",
        "a.b.c.d.example",
        "x.test:80",
    ];
    let labels = [
        BTreeMap::from([("app.kubernetes.io/component".to_string(), "egress-proxy".to_string())]),
        BTreeMap::from([("app".to_string(), "proxy".to_string()), ("tier".to_string(), "edge".to_string())]),
    ];
    let namespaces = ["skill-system", "egress", "ops"];
    for seed in 0..2000u64 {
        let mut g = Gen(seed);
        let hosts: Vec<String> = (0..g.below(4)).map(|_| (*g.pick(&HOSTS)).to_string()).collect();
        let peer = |g: &mut Gen| {
            let namespace: &&str = g.pick(&namespaces);
            Peer::in_namespace(namespace, g.pick(&labels).clone(), 1 + g.below(65535) as i32)
        };
        let proxy = (g.below(3) > 0).then(|| peer(&mut g));
        let artifact = peer(&mut g);
        let p = NetPolParams { egress_hosts: hosts.clone(), egress_proxy: proxy.clone(), artifact: artifact.clone(), ..netpol_params() };
        let np = build_network_policy(&p);
        assert_no_wildcards(&np);
        let rules = egress(&np);
        for rule in rules {
            for (protocol, port) in ports(rule) {
                assert!(port != 53 && protocol == "TCP", "seed {seed}: a DNS-shaped rule {protocol}/{port}");
            }
        }
        let expect_proxy = !hosts.is_empty() && proxy.is_some();
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
            assert_eq!(np.metadata.annotations.as_ref().unwrap()[ANNOTATION_EGRESS_HOSTS], hosts.join(","), "seed {seed}");
        }
        match p.validate() {
            Ok(()) => assert!(hosts.is_empty() || proxy.is_some(), "seed {seed}: hosts without a proxy validated"),
            Err(Error::EgressWithoutProxy(_)) => assert!(!hosts.is_empty() && proxy.is_none(), "seed {seed}"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
    }
}
