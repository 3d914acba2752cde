//! Gated suite: packages staged once per namespace, on a real API server
//! (`KUBEBUILDER_ASSETS`, as tests/envtest.rs) with the real controller,
//! artifact endpoint and Debian `docker-registry` processes of
//! tests/envtest/stack.rs. Without the assets it prints SKIPPED.
//!
//! What it tries to break: a package staged per run again (the registry
//! holding a job tag per run), a namespace served another's copy, and the
//! sweep deleting a copy a Job still names, or deleting one at its first
//! unnamed look.

#[path = "envtest/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "oci/common.rs"]
mod oci_common;
#[path = "envtest/stack.rs"]
#[allow(dead_code)]
mod stack;

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use skill_operator::api::{SkillJob, SkillPackage};
use skill_operator::artifacts::operator::{ArtifactStore, HttpArtifacts};
use skill_operator::artifacts::NamespacePackage;
use skill_operator::controller::builders::job::ANNOTATION_PACKAGE_DIGEST;
use skill_operator::controller::builders::{LABEL_MANAGED_BY, MANAGED_BY};
use skill_operator::controller::context::Context;
use skill_operator::controller::metrics::Metrics;
use skill_operator::controller::staged;

const TEAM: &str = "team";
const OTHER: &str = "other";

async fn skilljobs(client: &kube::Client, ns: &str, n: usize) {
    let api: Api<SkillJob> = Api::namespaced(client.clone(), ns);
    for i in 0..n {
        let sj = serde_json::from_value(json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob", "metadata": { "name": format!("run-{i}") },
            "spec": { "binding": "csv-stats", "script": "scripts/stats.py", "args": ["data.csv"] }
        }))
        .unwrap();
        api.create(&PostParams::default(), &sj).await.unwrap();
    }
}

async fn jobs_of(client: &kube::Client, ns: &str) -> Vec<Job> {
    Api::<Job>::namespaced(client.clone(), ns).list(&ListParams::default()).await.unwrap().items
}

#[tokio::test]
async fn a_package_is_staged_once_per_namespace_and_swept_once_no_job_names_it() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("envtest_staged", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    let stack = stack::Stack::start(&assets, env!("CARGO_BIN_EXE_skill-operator"), TEAM).await;
    let client = stack.client.clone();
    harness::create_namespace(&client, OTHER, true).await;
    let port = stack::free_port();
    let controller = stack.controller(port, &[], "staged-controller");
    stack::wait_http(&format!("http://127.0.0.1:{port}/readyz")).await;
    stack.bind_csv_stats(TEAM).await;
    stack.bind_csv_stats(OTHER).await;
    let digest = Api::<SkillPackage>::all(client.clone()).get("csv-stats-1").await.unwrap().status.unwrap().digest.unwrap();

    skilljobs(&client, TEAM, 6).await;
    skilljobs(&client, OTHER, 2).await;
    harness::wait_for(
        || async { (jobs_of(&client, TEAM).await.len() == 6 && jobs_of(&client, OTHER).await.len() == 2).then_some(()) },
        "8 Jobs",
    )
    .await;
    // The controller goes: nothing of it changes what the sweep sees from here.
    drop(controller);

    // Every Job names its namespace's copy of the pinned package.
    for ns in [TEAM, OTHER] {
        for job in jobs_of(&client, ns).await {
            assert_eq!(job.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_PACKAGE_DIGEST)), Some(&digest), "{ns}");
        }
    }
    // One copy per namespace, none per run (the registry's own tag list).
    let endpoint = HttpArtifacts::new(&format!("http://127.0.0.1:{}/v1", stack.artifacts_port), &stack::TOKEN_KEY);
    let mut held = endpoint.namespace_packages().await.unwrap();
    held.sort_by(|a, b| a.namespace.cmp(&b.namespace));
    let copy = |ns: &str| NamespacePackage { namespace: ns.into(), digest: digest.clone() };
    assert_eq!(held, vec![copy(OTHER), copy(TEAM)]);
    let tags = reqwest::get(format!("http://{}/v2/jobs/tags/list", stack.registry.addr)).await.unwrap().text().await.unwrap();
    assert!(!tags.contains("_package"), "a package was staged per run: {tags}");

    // The sweep, run as the leader would (its gate, its two looks).
    let ctx = Context::new(
        client.clone(),
        Arc::new(Metrics::default()),
        harness::operator_config(),
        Arc::new(skill_operator::controller::resolver::OciResolver {
            plain_http: vec![stack.registry.addr.clone()],
            credentials: Vec::new(),
        }),
        Arc::new(HttpArtifacts::new(&format!("http://127.0.0.1:{}/v1", stack.artifacts_port), &stack::TOKEN_KEY)),
    );
    let (gone, unnamed) = staged::sweep(&ctx, &BTreeSet::new()).await.unwrap();
    assert_eq!((gone, unnamed.len()), (0, 0), "a copy named by a Job was doomed");

    // `other`'s runs are over (their Jobs deleted, as after a verdict).
    let jobs: Api<Job> = Api::namespaced(client.clone(), OTHER);
    jobs.delete_collection(&DeleteParams::background(), &ListParams::default()).await.unwrap();
    harness::wait_for(|| async { jobs_of(&client, OTHER).await.is_empty().then_some(()) }, "other's Jobs gone").await;
    let (gone, unnamed) = staged::sweep(&ctx, &unnamed).await.unwrap();
    assert_eq!(gone, 0, "a copy went at its first unnamed look (a run may be about to name it)");
    assert_eq!(unnamed, BTreeSet::from([(OTHER.to_string(), digest.clone())]));
    let (gone, unnamed) = staged::sweep(&ctx, &unnamed).await.unwrap();
    assert_eq!(gone, 1);
    assert_eq!(unnamed, BTreeSet::from([(OTHER.to_string(), digest.clone())]), "still unnamed (it is gone)");
    assert_eq!(endpoint.namespace_packages().await.unwrap(), vec![copy(TEAM)], "team's Jobs still name its copy");
    // Gone for good: the next sweep has nothing of it to delete.
    let (gone, _) = staged::sweep(&ctx, &unnamed).await.unwrap();
    assert_eq!(gone, 0);
}

/// The sweep reads Jobs a page at a time: every page counts, and only Jobs
/// of the operator that name a digest do. A sweep that stopped at its first
/// page would miss the runs on the others and delete the copies they fetch.
#[tokio::test]
async fn the_sweep_reads_every_page_of_jobs() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("envtest_staged paging", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    let managed = format!("{LABEL_MANAGED_BY}={MANAGED_BY}");
    let job = |name: String, labels: serde_json::Value, annotations: serde_json::Value| {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": { "name": name, "labels": labels, "annotations": annotations },
            "spec": { "template": { "spec": { "restartPolicy": "Never", "containers": [{ "name": "run", "image": "registry.local/run:1" }] } } }
        })
    };
    let mut expected = BTreeSet::new();
    for ns in ["paged-a", "paged-b"] {
        harness::create_namespace(&client, ns, false).await;
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        for i in 0..4 {
            let digest = format!("sha256:{ns}-{i}");
            let labels = json!({ LABEL_MANAGED_BY: MANAGED_BY });
            harness::create::<Job>(&jobs, job(format!("run-{i}"), labels, json!({ ANNOTATION_PACKAGE_DIGEST: digest }))).await;
            expected.insert((ns.to_string(), digest));
        }
        // Someone else's Job naming a digest, and one of ours naming none.
        harness::create::<Job>(&jobs, job("theirs".into(), json!({}), json!({ ANNOTATION_PACKAGE_DIGEST: "sha256:theirs" }))).await;
        harness::create::<Job>(&jobs, job("bare".into(), json!({ LABEL_MANAGED_BY: MANAGED_BY }), json!({}))).await;
    }
    // 10 of ours in pages of 3: four pages, the last one short.
    let paged = staged::named_by::<Job>(&client, &managed, 3).await.unwrap();
    assert_eq!(paged, expected, "a page of Jobs was missed or a Job not ours counted");
    assert_eq!(staged::named_by::<Job>(&client, &managed, staged::LIST_PAGE).await.unwrap(), expected);
}
