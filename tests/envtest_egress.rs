//! Gated (KUBEBUILDER_ASSETS, like tests/envtest.rs): the cluster half of
//! egress against a real API server, with the controller and the proxy's
//! SkillJob watch in process and the real proxy on loopback.
//!
//! Walks one run: the profile allows hosts, the binding narrows them (and
//! what would widen is dropped and said), the namespace's egress policy adds
//! the proxy peer for the run's pod and never DNS (and is put back when
//! someone deletes it), the pod gets the proxy URL; a pod made from
//! the Job's template gets an address (here 127.0.0.2, so the test can
//! connect from it), the controller records it sealed, the proxy's watch
//! serves the job from that address only: the allowed host is reached, the
//! same credential from 127.0.0.1 and any other host are refused. A status
//! edited by someone else stops the job being served; a finished run gets
//! the egress note and is no longer served.
//!
//! No kubelet runs here: pod and Job status are patched by the test, as the
//! kubelet and the Job controller would.

#[path = "envtest/harness.rs"]
mod harness;
#[path = "egress/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use skill_operator::api::{SkillBinding, SkillJob, SkillJobPhase, SkillPackage};
use skill_operator::controller::builders::{RUNS_EGRESS_POLICY, RUNS_POLICY};
use skill_operator::controller::context::EgressProxyTarget;
use skill_operator::controller::egress::NetworkPolicyEnforcement;
use skill_operator::egress::{proxy_token, JobId};
use support::{http_get, Harness};

const PROXY_ADDRESS: &str = "10.0.0.60:3128";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_reaches_its_allowed_host_from_its_own_pod_only() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip(
            "the real API server egress suite",
            "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver",
        );
        return;
    };
    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    harness::install_crds(&client).await;
    harness::create_namespace(&client, "team", true).await;

    // The allowed upstream, and the proxy (its registry fed by the watch).
    let (up, seen) = support::http_upstream(Default::default()).await;
    let proxy = Harness::start(support::test_config()).await;
    proxy.resolver.set("upstream.test", &["127.0.0.1"]);
    proxy.resolver.set("other.test", &["127.0.0.1"]);
    let watch = tokio::spawn(skill_operator::egress::cluster::watch(
        Api::<SkillJob>::all(client.clone()),
        Default::default(),
        proxy.registry.clone(),
        support::KEY.to_vec(),
    ));

    let _controller = harness::spawn_controller_with(client.clone(), "weather-brief", |c| {
        c.token_key = support::KEY.to_vec();
        c.egress_proxy = Some(EgressProxyTarget {
            address: PROXY_ADDRESS.into(),
            namespace: "skill-system".into(),
            pod_labels: BTreeMap::from([("app.kubernetes.io/component".to_string(), "egress-proxy".to_string())]),
            pod_port: 3128,
            cilium_fqdn_policy: None,
        });
        c.network_policy = NetworkPolicyEnforcement::NotEnforced;
    });

    let allowed_entry = format!("upstream.test:{}", up.port());
    let packages: Api<SkillPackage> = Api::all(client.clone());
    harness::create(
        &packages,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage",
            "metadata": { "name": "weather-1" },
            "spec": {
                "source": { "oci": { "reference": "registry.local/skills/weather-brief:1" } },
                "runtime": { "interpreter": "node", "image": "node@sha256:1111111111111111111111111111111111111111111111111111111111111111",
                             "allowedScripts": ["scripts/forecast.js"], "allowedEgress": [allowed_entry, "other.test"] }
            }
        }),
    )
    .await;
    let pstatus = harness::wait_for(
        || async {
            let s = packages.get("weather-1").await.ok()?.status?;
            harness::ready(&s.conditions)?;
            Some(s)
        },
        "the SkillPackage to be Ready",
    )
    .await;
    assert_eq!(pstatus.egress, ["api.open-meteo.com"], "the proposal is shown");
    assert_eq!(pstatus.allowed_egress, [allowed_entry.clone(), "other.test:443".into()]);
    assert_eq!(pstatus.egress_not_allowed.len(), 1, "{:?}", pstatus.egress_not_allowed);
    assert!(pstatus.egress_not_allowed[0].starts_with("api.open-meteo.com"), "{:?}", pstatus.egress_not_allowed);

    let bindings: Api<SkillBinding> = Api::namespaced(client.clone(), "team");
    harness::create(
        &bindings,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding",
            "metadata": { "name": "weather", "namespace": "team" },
            "spec": { "package": "weather-1", "egress": true, "egressHosts": [allowed_entry, "evil.test"],
                      "env": [{ "name": "WEATHER_API_KEY", "secretKeyRef": { "name": "weather", "key": "key" } }] }
        }),
    )
    .await;
    let bstatus = harness::wait_for(
        || async {
            let s = bindings.get("weather").await.ok()?.status?;
            harness::ready(&s.conditions)?;
            Some(s)
        },
        "the SkillBinding to be Ready",
    )
    .await;
    assert_eq!(bstatus.effective_egress, std::slice::from_ref(&allowed_entry), "narrowed to one host; other.test is not in the narrowing");
    assert_eq!(bstatus.dropped_egress.len(), 1, "{:?}", bstatus.dropped_egress);
    assert!(bstatus.dropped_egress[0].contains("evil.test"), "a narrowing entry that would widen is dropped and said");

    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), "team");
    let sj: SkillJob = harness::create(
        &skilljobs,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
            "metadata": { "name": "forecast", "namespace": "team" },
            "spec": { "binding": "weather", "script": "scripts/forecast.js", "args": ["52.52", "13.41"] }
        }),
    )
    .await;
    let uid = sj.metadata.uid.clone().unwrap();
    let token = proxy_token(&support::KEY, &JobId::new("team", &uid));

    let jobs: Api<Job> = Api::namespaced(client.clone(), "team");
    let job = harness::wait_for(|| async { jobs.list(&ListParams::default()).await.ok()?.items.into_iter().next() }, "the Job").await;
    let template = job.spec.clone().unwrap().template;
    let run = template.spec.as_ref().unwrap().containers.iter().find(|c| c.name == "run").unwrap().clone();
    // The API server drops empty values: a plain variable without one is set empty.
    let env: BTreeMap<String, String> = run
        .env
        .iter()
        .flatten()
        .filter(|e| e.value_from.is_none())
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    let url = format!("http://job:{token}@{PROXY_ADDRESS}");
    for name in ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "PIP_PROXY", "npm_config_https_proxy"] {
        assert_eq!(env.get(name), Some(&url), "{name}");
    }
    assert_eq!(env.get("NODE_USE_ENV_PROXY").map(String::as_str), Some("1"));
    assert_eq!(env.get("NO_PROXY").map(String::as_str), Some(""), "nothing bypasses the proxy");

    // The namespace's policies: every run pod sealed to the artifact endpoint,
    // and the proxy pods added for the runs granted egress; nothing else, never DNS.
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), "team");
    let seal = harness::wait_for(|| async { policies.get_opt(RUNS_POLICY).await.ok().flatten() }, "the runs' policy").await;
    let open = harness::wait_for(|| async { policies.get_opt(RUNS_EGRESS_POLICY).await.ok().flatten() }, "the egress policy").await;
    let pod_labels = job.spec.as_ref().unwrap().template.metadata.as_ref().unwrap().labels.clone().unwrap();
    for (policy, rules_wanted) in [(&seal, 1), (&open, 1)] {
        let spec = policy.spec.clone().unwrap();
        // Ingress in policyTypes with no rule (the API server drops the empty list): none allowed.
        assert!(spec.policy_types.as_ref().unwrap().contains(&"Ingress".to_string()));
        assert!(spec.ingress.unwrap_or_default().is_empty(), "no ingress");
        let rules = spec.egress.unwrap();
        assert_eq!(rules.len(), rules_wanted, "{rules:?}");
        assert!(!serde_json::to_string(&rules).unwrap().contains("53"), "a DNS rule: {rules:?}");
        // This run's pod is selected by both.
        let selector = spec.pod_selector.unwrap();
        assert!(selector.match_labels.iter().flatten().all(|(k, v)| pod_labels.get(k) == Some(v)), "{selector:?} vs {pod_labels:?}");
        assert!(selector.match_expressions.iter().flatten().all(|e| e.operator == "Exists" && pod_labels.contains_key(&e.key)));
    }
    let seal_rule = serde_json::to_value(&seal.spec.as_ref().unwrap().egress.as_ref().unwrap()[0]).unwrap();
    assert_eq!(seal_rule["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "skill-system");
    let proxy_rule = serde_json::to_value(&open.spec.as_ref().unwrap().egress.as_ref().unwrap()[0]).unwrap();
    assert_eq!(proxy_rule["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"], "egress-proxy");
    assert_eq!(proxy_rule["ports"], json!([{ "protocol": "TCP", "port": 3128 }]));

    // Deleted by someone while runs are going: put back at once, as it was.
    policies.delete(RUNS_POLICY, &Default::default()).await.unwrap();
    let back = harness::wait_for(
        || async { policies.get_opt(RUNS_POLICY).await.ok().flatten().filter(|p| p.metadata.uid != seal.metadata.uid) },
        "the runs' policy put back after its deletion",
    )
    .await;
    assert_eq!(back.spec, seal.spec, "put back as it was");

    let status = skilljobs.get("forecast").await.unwrap().status.unwrap();
    let egress = status.egress.clone().unwrap();
    assert_eq!(
        (egress.proposed.as_slice(), egress.allowed.as_slice()),
        (&["api.open-meteo.com".to_string()][..], &[allowed_entry.clone()][..])
    );
    assert_eq!(egress.pod_ip, None, "no pod yet");
    let cond = status.conditions.iter().find(|c| c.type_ == "NetworkPolicyEnforced").expect("the CNI condition");
    assert_eq!((cond.status.as_str(), cond.reason.as_str()), ("False", "NotEnforced"));

    // Before the pod has an address the job is not served at all.
    let (reply, _) = http_get(proxy.addr, &format!("http://{allowed_entry}/"), Some(&token), "").await;
    assert_eq!(reply.status, 407, "{}", reply.body);
    assert!(reply.body.contains("not (or no longer) registered"), "{}", reply.body);

    // The Job's pod, as the Job controller makes it, then its address, as the kubelet reports it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team");
    let mut pod: Pod = serde_json::from_value(json!({ "apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "forecast-pod", "namespace": "team",
        "ownerReferences": [{ "apiVersion": "batch/v1", "kind": "Job", "name": job.metadata.name.clone().unwrap(),
                              "uid": job.metadata.uid.clone().unwrap(), "controller": true }] } }))
    .unwrap();
    pod.metadata.labels = template.metadata.as_ref().and_then(|m| m.labels.clone());
    assert_eq!(pod.metadata.labels.as_ref().unwrap()["skill-operator.dev/egress"], "true");
    pod.spec = template.spec.clone();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        "forecast-pod",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "phase": "Running", "podIP": "127.0.0.2", "podIPs": [{ "ip": "127.0.0.2" }] } })),
    )
    .await
    .unwrap();
    let id = JobId::new("team", &uid);
    harness::wait_for(
        || async { proxy.registry.job_spec(&id).filter(|s| s.source == Some("127.0.0.2".parse().unwrap())) },
        "the proxy to serve the job",
    )
    .await;
    let recorded = skilljobs.get("forecast").await.unwrap().status.unwrap().egress.unwrap();
    assert_eq!(recorded.pod_ip.as_deref(), Some("127.0.0.2"));
    assert!(recorded.seal.is_some());

    // From the pod's address: the allowed host answers; another host is refused.
    let from_pod = |target: String| {
        let token = token.clone();
        async move {
            let mut s = support::connect_from(proxy.addr, Some("127.0.0.2")).await;
            let auth = skill_operator::egress::identity::authorization_value(&token);
            let req = format!("GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\nProxy-Authorization: {auth}\r\n\r\n");
            tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes()).await.unwrap();
            support::read_reply(&mut s).await
        }
    };
    let reply = from_pod(allowed_entry.clone()).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply.body.contains("host=upstream.test"), "{}", reply.body);
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
    let reply = from_pod(format!("other.test:{}", up.port())).await;
    assert_eq!(reply.status, 403, "allowed by the profile but not by the binding's narrowing: {}", reply.body);
    // The same credential from another address (a copied token).
    let (reply, _) = http_get(proxy.addr, &format!("http://{allowed_entry}/"), Some(&token), "").await;
    assert_eq!((reply.status, reply.refused()), (403, Some("wrong_source")), "{}", reply.body);
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1, "nothing refused reached the upstream");

    // Someone with skilljobs/status widening the allowlist: the seal breaks, the job is dropped.
    let widened = json!({ "status": { "egress": { "allowed": [allowed_entry, format!("other.test:{}", up.port())] } } });
    skilljobs.patch_status("forecast", &PatchParams::default(), &Patch::Merge(widened)).await.unwrap();
    harness::wait_for(|| async { proxy.registry.job_spec(&id).is_none().then_some(()) }, "the tampered record to be dropped").await;
    let reply = from_pod(format!("other.test:{}", up.port())).await;
    assert_eq!(reply.status, 407, "{}", reply.body);
    let reply = from_pod(allowed_entry.clone()).await;
    assert_eq!(reply.status, 407, "not even the host it was allowed: {}", reply.body);

    // The run ends (the pod stopped, then the Job failed): the note names the allowlist.
    pods.patch_status("forecast-pod", &PatchParams::default(), &Patch::Merge(json!({ "status": { "phase": "Failed" } }))).await.unwrap();
    let now = serde_json::to_value(skill_operator::api::conditions::now()).unwrap();
    jobs.patch_status(
        job.metadata.name.as_deref().unwrap(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "startTime": "2026-01-01T00:00:00Z", "failed": 1,
            "conditions": [
                { "type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy", "message": "exit 1", "lastTransitionTime": now },
                { "type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "exit 1", "lastTransitionTime": now }] } })),
    )
    .await
    .unwrap();
    let done = harness::wait_for(
        || async {
            let s = skilljobs.get("forecast").await.ok()?.status?;
            matches!(s.phase?, SkillJobPhase::Failed | SkillJobPhase::TimedOut).then_some(s)
        },
        "the run to be recorded as failed",
    )
    .await;
    let message = done.message.unwrap_or_default();
    assert!(message.contains("egress proxy") && message.contains("upstream.test") && message.contains("403"), "{message}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(proxy.registry.job_spec(&id).is_none(), "a finished run is not served");
    watch.abort();
    proxy.stop().await;
}
