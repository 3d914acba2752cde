//! The NetworkPolicy probe's two objects: a pod that tries to reach a peer,
//! and a policy that denies that pod every egress. Where the CNI enforces
//! NetworkPolicy the pod cannot connect; where it does not, it can, and
//! then no run pod is kept from any peer by its policy either.
//!
//! The pod is an operator pod like a run's (no token, no service links,
//! restricted, read-only root, no DNS), running `skill-operator
//! probe-network --connect IP:PORT`, and it ends by itself.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::job::{guaranteed, hardened_pod_spec, operator_pull_policy, restricted_security, PodShape, DEFAULT_RUN_AS, OPERATOR_BIN};
use super::{LABEL_MANAGED_BY, MANAGED_BY};

/// The probe pod's and policy's name (one probe at a time per namespace).
pub const PROBE_NAME: &str = "skill-operator-netpol-probe";
/// The label the policy selects the probe pod by (its value: the probe's nonce).
pub const LABEL_PROBE: &str = "skill-operator.dev/netpol-probe";
/// The probe pod's own deadline.
pub const PROBE_DEADLINE_SECS: i64 = 60;

fn labels(nonce: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()), (LABEL_PROBE.to_string(), nonce.to_string())])
}

/// Deny all egress of the probe pod `nonce` names.
pub fn deny_all(namespace: &str, nonce: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(PROBE_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels(nonce)),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(LABEL_PROBE.to_string(), nonce.to_string())])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Egress".into()]),
            egress: Some(Vec::new()),
            ingress: None,
        }),
    }
}

/// The pod that tries to reach `target` (`IP:PORT`) from under [`deny_all`].
pub fn probe_pod(namespace: &str, nonce: &str, image: &str, image_pull_policy: Option<&str>, target: &str) -> Pod {
    let container = Container {
        name: "probe".into(),
        image: Some(image.into()),
        image_pull_policy: Some(operator_pull_policy(image, image_pull_policy)),
        command: Some(vec![OPERATOR_BIN.into(), "probe-network".into(), "--connect".into(), target.into()]),
        security_context: Some(restricted_security(DEFAULT_RUN_AS, DEFAULT_RUN_AS)),
        resources: Some(guaranteed("50m", "32Mi", "16Mi")),
        ..Default::default()
    };
    let mut spec = hardened_pod_spec(PodShape {
        init_containers: Vec::new(),
        containers: vec![container],
        volumes: Vec::new(),
        service_account: "default",
        run_as_user: DEFAULT_RUN_AS,
        run_as_group: DEFAULT_RUN_AS,
        allow_dns: false,
        host_aliases: &BTreeMap::new(),
        image_pull_secrets: &[],
    });
    spec.init_containers = None;
    spec.volumes = None;
    spec.active_deadline_seconds = Some(PROBE_DEADLINE_SECS);
    Pod {
        metadata: ObjectMeta {
            name: Some(PROBE_NAME.into()),
            namespace: Some(namespace.into()),
            labels: Some(labels(nonce)),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_denies_the_probe_pod_all_egress_and_the_pod_is_restricted() {
        let policy = deny_all("skill-system", "n1");
        let spec = policy.spec.as_ref().unwrap();
        assert_eq!(spec.policy_types.as_deref(), Some(&["Egress".to_string()][..]));
        assert_eq!(spec.egress.as_deref(), Some(&[][..]), "no egress rule: nothing is allowed");
        let pod = probe_pod("skill-system", "n1", "registry.local/op@sha256:aa", None, "10.0.0.50:8443");
        let selected = spec.pod_selector.as_ref().unwrap().match_labels.as_ref().unwrap();
        let pod_labels = pod.metadata.labels.as_ref().unwrap();
        assert!(selected.iter().all(|(k, v)| pod_labels.get(k) == Some(v)), "the policy selects the pod");
        let problems = super::super::pod_security::restricted_violations(pod.spec.as_ref().unwrap());
        assert!(problems.is_empty(), "{problems:?}");
        let pod_spec = pod.spec.unwrap();
        assert_eq!(pod_spec.automount_service_account_token, Some(false));
        assert_eq!(pod_spec.containers[0].command.as_ref().unwrap()[1..], ["probe-network", "--connect", "10.0.0.50:8443"]);
    }
}
