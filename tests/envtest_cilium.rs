//! Gated (KUBEBUILDER_ASSETS, like tests/envtest.rs): the egress proxy's
//! CiliumNetworkPolicy (`--egress-cilium-fqdn-policy`) against a real API
//! server, with the controller in process.
//!
//! Cilium itself cannot run here (no kernel datapath, no agent, no DNS
//! proxy), so the resource is a stand-in CRD: `ciliumnetworkpolicies.cilium.io`
//! v2 with a schema that keeps every field (`x-kubernetes-preserve-unknown-fields`).
//! What is tested is what the controller applies and when; whether Cilium
//! enforces it is Cilium's (the builder's output follows its CRD's fields,
//! tests/builders_cilium.rs).
//!
//! - Two packages allow hosts: the applied object's `toFQDNs`/`toCIDR` are
//!   exactly their union, each with its ports, plus the DNS rule. Deleting
//!   one shrinks it; deleting both leaves DNS only.
//! - Without the CRD the controller keeps reconciling packages and says so
//!   (the metric `skill_operator_egress_cilium_policy{state="crd_missing"}`).
//! - With the flag off nothing is applied even where the CRD is served.

#[path = "envtest/harness.rs"]
mod harness;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::Client;
use serde_json::json;

use skill_operator::api::SkillPackage;
use skill_operator::controller::builders::cilium::CiliumNetworkPolicy;
use skill_operator::controller::cilium::CiliumPolicyConfig;
use skill_operator::controller::context::EgressProxyTarget;

const PROXY_NS: &str = "skill-system";

fn proxy_target(cilium: bool) -> EgressProxyTarget {
    EgressProxyTarget {
        address: "10.0.0.60:3128".into(),
        namespace: PROXY_NS.into(),
        pod_labels: BTreeMap::from([("app.kubernetes.io/component".to_string(), "egress-proxy".to_string())]),
        pod_port: 3128,
        cilium_fqdn_policy: cilium.then(CiliumPolicyConfig::default),
    }
}

fn cilium_api(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "cilium.io".into(),
        version: "v2".into(),
        api_version: "cilium.io/v2".into(),
        kind: "CiliumNetworkPolicy".into(),
        plural: "ciliumnetworkpolicies".into(),
    };
    Api::namespaced_with(client.clone(), PROXY_NS, &ar)
}

/// The stand-in for Cilium's CRD (see the module docs): same group, version,
/// kind and scope, a schema that keeps whatever it is given.
async fn install_stand_in_crd(client: &Client) {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": { "name": "ciliumnetworkpolicies.cilium.io" },
        "spec": {
            "group": "cilium.io", "scope": "Namespaced",
            "names": { "kind": "CiliumNetworkPolicy", "listKind": "CiliumNetworkPolicyList",
                       "plural": "ciliumnetworkpolicies", "singular": "ciliumnetworkpolicy", "shortNames": ["cnp"] },
            "versions": [{ "name": "v2", "served": true, "storage": true,
                           "schema": { "openAPIV3Schema": { "type": "object", "x-kubernetes-preserve-unknown-fields": true } } }]
        }
    }))
    .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let api = cilium_api(client);
    harness::wait_for(|| async { api.list(&ListParams::default()).await.ok().map(|_| ()) }, "the stand-in CRD to be served").await;
}

async fn create_package(client: &Client, name: &str, allowed: &[&str]) {
    let packages: Api<SkillPackage> = Api::all(client.clone());
    let pkg = serde_json::from_value(json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage",
        "metadata": { "name": name },
        "spec": {
            "source": { "oci": { "reference": format!("registry.local/skills/{name}:1") } },
            "runtime": { "interpreter": "python", "image": "python@sha256:1111111111111111111111111111111111111111111111111111111111111111",
                         "interpreterPath": "/usr/bin/python3", "allowedScripts": ["scripts/stats.py"], "allowedEgress": allowed }
        }
    }))
    .unwrap();
    packages.create(&PostParams::default(), &pkg).await.unwrap();
}

/// What the applied policy lets the proxy reach: selector or CIDR -> ports;
/// `None` while there is no object. Panics when the DNS rule is missing.
async fn reach(api: &Api<DynamicObject>) -> Option<BTreeMap<String, BTreeSet<u16>>> {
    let obj = api.get_opt(skill_operator::controller::cilium::DEFAULT_NAME).await.ok()??;
    let managers: Vec<String> = obj.metadata.managed_fields.iter().flatten().filter_map(|m| m.manager.clone()).collect();
    assert_eq!(managers, ["skill-operator"], "applied server-side by the controller's field manager");
    let mut value = serde_json::to_value(&obj).unwrap();
    value["metadata"]["managedFields"] = json!(null);
    let policy: CiliumNetworkPolicy = serde_json::from_value(value).unwrap();
    assert_eq!(policy.spec.endpoint_selector.match_labels, proxy_target(true).pod_labels, "selects the proxy pods");
    let dns = &policy.spec.egress[0];
    assert!(dns.to_endpoints.is_some() && dns.to_ports[0].rules.is_some(), "the DNS rule first: {dns:?}");
    let mut out = BTreeMap::new();
    for rule in &policy.spec.egress[1..] {
        let ports: BTreeSet<u16> = rule.to_ports.iter().flat_map(|r| &r.ports).map(|p| p.port.parse().unwrap()).collect();
        for s in rule.to_fqdns.iter().flatten() {
            out.insert(s.text().to_string(), ports.clone());
        }
        for c in rule.to_cidr.iter().flatten() {
            out.insert(c.clone(), ports.clone());
        }
    }
    Some(out)
}

fn want(entries: &[(&str, &[u16])]) -> BTreeMap<String, BTreeSet<u16>> {
    entries.iter().map(|(h, p)| (h.to_string(), p.iter().copied().collect())).collect()
}

async fn wait_for_reach(api: &Api<DynamicObject>, expected: BTreeMap<String, BTreeSet<u16>>, what: &str) {
    let mut last = None;
    for _ in 0..60 {
        last = reach(api).await;
        if last.as_ref() == Some(&expected) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    panic!("timed out after 30 s waiting for {what}: want {expected:?}, last {last:?}");
}

async fn delete_package(client: &Client, name: &str) {
    let packages: Api<SkillPackage> = Api::all(client.clone());
    packages.delete(name, &DeleteParams::default()).await.unwrap();
    harness::wait_for(|| async { packages.get_opt(name).await.ok()?.is_none().then_some(()) }, "the package to be gone").await;
}

/// A real API server with the CRDs (and the stand-in Cilium CRD when
/// `stand_in`), the proxy's namespace and the controller running, its
/// Cilium policy on when `cilium`; `None` (SKIPPED) without the assets.
struct Started {
    env: harness::Envtest,
    client: Client,
    controller: tokio::task::JoinHandle<()>,
    ctx: std::sync::Arc<skill_operator::controller::context::Context>,
}

async fn start(stand_in: bool, cilium: bool) -> Option<Started> {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip(
            "the CiliumNetworkPolicy envtest suite",
            "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver",
        );
        return None;
    };
    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    harness::install_crds(&client).await;
    if stand_in {
        install_stand_in_crd(&client).await;
    }
    harness::create_namespace(&client, PROXY_NS, false).await;
    let (controller, ctx) = harness::spawn_controller_ctx(client.clone(), "csv-stats", |c| c.egress_proxy = Some(proxy_target(cilium)));
    Some(Started { env, client, controller, ctx })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_is_the_union_of_the_packages_allowed_hosts() {
    let Some(Started { env: _env, client, controller: _controller, ctx }) = start(true, true).await else { return };
    let api = cilium_api(&client);

    // With no package at all it is applied at start, DNS only.
    wait_for_reach(&api, want(&[]), "the DNS-only policy at start").await;

    create_package(&client, "alpha", &["api.example.com", "*.files.example.org:443,8443"]).await;
    create_package(&client, "beta", &["api.example.com:8080", "bücher.example", "203.0.113.7:22"]).await;
    wait_for_reach(
        &api,
        want(&[
            ("api.example.com", &[443, 8080]),
            ("**.files.example.org", &[443, 8443]),
            ("xn--bcher-kva.example", &[443]),
            ("203.0.113.7/32", &[22]),
        ]),
        "the union of both packages",
    )
    .await;
    let metrics = ctx.metrics.render();
    assert!(metrics.contains(r#"skill_operator_egress_cilium_policy{state="applied"} 1"#), "{metrics}");
    assert!(metrics.contains("skill_operator_egress_cilium_policy_hosts 4"), "{metrics}");

    delete_package(&client, "beta").await;
    wait_for_reach(&api, want(&[("api.example.com", &[443]), ("**.files.example.org", &[443, 8443])]), "the policy without beta").await;

    delete_package(&client, "alpha").await;
    wait_for_reach(&api, want(&[]), "DNS only once no package allows anything").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_crd_packages_still_reconcile_and_it_is_reported() {
    let Some(Started { env: _env, client, controller, ctx }) = start(false, true).await else { return };

    let packages: Api<SkillPackage> = Api::all(client.clone());
    for name in ["gamma", "delta"] {
        create_package(&client, name, &["api.example.com"]).await;
        harness::wait_for(
            || async { harness::ready(&packages.get(name).await.ok()?.status?.conditions) },
            "the SkillPackage to be Ready without the CiliumNetworkPolicy resource",
        )
        .await;
    }
    let metrics = ctx.metrics.render();
    assert!(metrics.contains(r#"skill_operator_egress_cilium_policy{state="crd_missing"} 1"#), "{metrics}");
    assert!(metrics.contains(r#"skill_operator_egress_cilium_policy{state="applied"} 0"#), "{metrics}");
    assert!(!metrics.contains(r#"error="kube""#), "no reconcile failed over it: {metrics}");
    assert!(!controller.is_finished(), "the controller is still running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_by_default_nothing_is_applied() {
    let Some(Started { env: _env, client, controller: _controller, ctx }) = start(true, false).await else { return };
    create_package(&client, "epsilon", &["api.example.com"]).await;
    let packages: Api<SkillPackage> = Api::all(client.clone());
    harness::wait_for(|| async { harness::ready(&packages.get("epsilon").await.ok()?.status?.conditions) }, "the SkillPackage to be Ready")
        .await;
    // The package reconcile (where the policy would be applied) has run.
    let list = cilium_api(&client).list(&ListParams::default()).await.unwrap();
    assert!(list.items.is_empty(), "{:?}", list.items);
    assert!(!ctx.metrics.render().contains("skill_operator_egress_cilium_policy{"), "no state series while off");
}
