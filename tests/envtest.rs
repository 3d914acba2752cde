//! Gated suite against a real API server, envtest-style: when
//! `KUBEBUILDER_ASSETS` names a folder with `etcd` and `kube-apiserver`, the
//! test starts both on loopback, installs the CRDs, runs the controller in
//! process and walks a SkillPackage, SkillBinding and SkillJob through their
//! lives. Without the assets it prints SKIPPED and checks nothing.
//!
//! Extra apiserver flags can be given in `ENVTEST_APISERVER_FLAGS` (e.g.
//! `--feature-gates=WatchList=false` with Debian's etcd 3.4).

#[path = "envtest/harness.rs"]
mod harness;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use skill_operator::api::{SkillBinding, SkillJob, SkillPackage};
use skill_operator::controller::builders::pod_security::{hardening_violations, restricted_violations};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_against_a_real_api_server() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("the real API server suite", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    harness::install_crds(&client).await;

    harness::create_namespace(&client, "team", true).await;

    let controller = harness::spawn_controller(client.clone());

    harness::csv_stats_bound(&client).await;
    let packages: Api<SkillPackage> = Api::all(client.clone());
    let bindings: Api<SkillBinding> = Api::namespaced(client.clone(), "team");

    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), "team");
    let sj: SkillJob = harness::create(
        &skilljobs,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
            "metadata": { "name": "stats", "namespace": "team" },
            "spec": { "binding": "csv-stats", "script": "scripts/stats.py", "args": ["data.csv", "; rm -rf /"] }
        }),
    )
    .await;

    // The spec is immutable (CEL).
    let change = json!({ "spec": { "args": ["other"] } });
    assert!(skilljobs.patch("stats", &PatchParams::default(), &Patch::Merge(change)).await.is_err(), "a SkillJob spec change was accepted");

    let jobs: Api<Job> = Api::namespaced(client.clone(), "team");
    let job = harness::wait_for(|| async { jobs.list(&ListParams::default()).await.ok()?.items.into_iter().next() }, "the Job").await;
    let pod_spec = job.spec.clone().unwrap().template.spec.unwrap();
    assert!(restricted_violations(&pod_spec).is_empty(), "{:?}", restricted_violations(&pod_spec));
    assert!(hardening_violations(&pod_spec).is_empty(), "{:?}", hardening_violations(&pod_spec));
    assert_eq!(job.spec.as_ref().unwrap().backoff_limit, Some(0));
    assert_eq!(job.metadata.owner_references.as_ref().unwrap()[0].uid, sj.metadata.uid.clone().unwrap());

    // A pod made from the Job's template is admitted by Pod Security `restricted`...
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team");
    let mut pod: Pod =
        serde_json::from_value(json!({ "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "from-template", "namespace": "team" } }))
            .unwrap();
    pod.spec = Some(pod_spec.clone());
    pods.create(&PostParams { dry_run: true, ..Default::default() }, &pod)
        .await
        .expect("a pod from the Job template was refused by Pod Security restricted");
    // ... and a deliberately broken one is refused.
    let mut broken = pod.clone();
    let spec = broken.spec.as_mut().unwrap();
    spec.containers[0].security_context.as_mut().unwrap().allow_privilege_escalation = Some(true);
    let refused = pods.create(&PostParams { dry_run: true, ..Default::default() }, &broken).await;
    assert!(
        refused.is_err_and(|e| e.to_string().contains("PodSecurity") || e.to_string().contains("violates")),
        "a privilege-escalating pod was admitted"
    );

    // Status follows a patched Job status.
    let name = job.metadata.name.clone().unwrap();
    jobs.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "active": 1, "startTime": "2026-01-01T00:00:00Z" } })),
    )
    .await
    .unwrap();
    harness::wait_for(
        || async { (skilljobs.get("stats").await.ok()?.status?.phase? == skill_operator::api::SkillJobPhase::Running).then_some(()) },
        "phase Running",
    )
    .await;

    // A deleted Job fails its SkillJob visibly and is not re-created.
    jobs.delete(&name, &DeleteParams::background()).await.unwrap();
    let failed = harness::wait_for(
        || async {
            let s = skilljobs.get("stats").await.ok()?.status?;
            (s.phase? == skill_operator::api::SkillJobPhase::Failed).then_some(s)
        },
        "phase Failed after the Job was deleted",
    )
    .await;
    assert!(failed.message.unwrap_or_default().contains("not re-run"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(jobs.list(&ListParams::default()).await.unwrap().items.is_empty(), "a deleted Job was re-created");

    // A namespace that does not enforce `restricted` is reported on the SkillJob.
    harness::create_namespace(&client, "lax", false).await;
    let lax_bindings: Api<SkillBinding> = Api::namespaced(client.clone(), "lax");
    harness::create(
        &lax_bindings,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding",
            "metadata": { "name": "csv-stats", "namespace": "lax" }, "spec": { "package": "csv-stats-1" }
        }),
    )
    .await;
    harness::wait_for(
        || async { harness::ready(&lax_bindings.get("csv-stats").await.ok()?.status?.conditions) },
        "the lax SkillBinding to be Ready",
    )
    .await;
    let lax_jobs: Api<SkillJob> = Api::namespaced(client.clone(), "lax");
    harness::create(
        &lax_jobs,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
            "metadata": { "name": "stats", "namespace": "lax" }, "spec": { "binding": "csv-stats", "script": "scripts/stats.py" }
        }),
    )
    .await;
    let condition = harness::wait_for(
        || async { lax_jobs.get("stats").await.ok()?.status?.conditions.into_iter().find(|c| c.type_ == "NamespaceRestricted") },
        "the NamespaceRestricted condition",
    )
    .await;
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "NotEnforced"));

    // Two bindings serving the same skill in one namespace: both refused.
    harness::create(
        &bindings,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding",
            "metadata": { "name": "csv-stats-again", "namespace": "team" }, "spec": { "package": "csv-stats-1" }
        }),
    )
    .await;
    for name in ["csv-stats", "csv-stats-again"] {
        harness::wait_for(
            || async {
                let conditions = bindings.get(name).await.ok()?.status?.conditions;
                conditions.iter().any(|c| c.type_ == "Ready" && c.status == "False").then_some(())
            },
            "both bindings of one skill to be refused",
        )
        .await;
    }
    bindings.delete("csv-stats-again", &DeleteParams::default()).await.unwrap();

    // Deletion rules: a binding with SkillJobs and a package with bindings stay.
    bindings.delete("csv-stats", &DeleteParams::default()).await.unwrap();
    packages.delete("csv-stats-1", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(bindings.get("csv-stats").await.is_ok(), "a binding with SkillJobs was deleted");
    assert!(packages.get("csv-stats-1").await.is_ok(), "a package with bindings was deleted");

    // Killing and restarting the controller creates no second Job.
    controller.abort();
    let _ = controller.await;
    let controller = harness::spawn_controller(client.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        jobs.list(&ListParams::default()).await.unwrap().items.is_empty(),
        "a restarted controller created a Job for a finished SkillJob"
    );
    assert_eq!(
        Api::<Job>::namespaced(client.clone(), "lax").list(&ListParams::default()).await.unwrap().items.len(),
        1,
        "a restarted controller created a second Job"
    );
    controller.abort();
    drop(Arc::new(env));
}
