//! Gated fault suite (`KUBEBUILDER_ASSETS`, as tests/envtest.rs): the
//! components a run needs besides the API server go down while SkillJobs
//! wait to start, one real `skill-operator controller` process beside them.
//! - The artifact endpoint (it stages each run's package) is killed: every
//!   SkillJob waits, Pending, with `ArtifactEndpointUnavailable` and a
//!   message naming the endpoint, and no Job is made. Started again, every
//!   one goes on by itself.
//! - The registry that holds the package is stopped and the controller
//!   restarted (so no pulled copy is kept in memory): every SkillJob waits
//!   with `RegistryUnavailable`; the registry back, every one goes on.
//!
//! As in tests/controller_failover.rs the test stands in for the kubelet
//! (each Job is failed as it appears), so each run ends with a verdict of
//! the controller's; none may get two Jobs or go back a phase. The verdict
//! side (an endpoint down when a finished run's outputs are read) is
//! src/controller/mock_tests.rs's: envtest runs no pod to store any.

#[path = "envtest/backlog.rs"]
mod backlog;
#[path = "envtest/harness.rs"]
mod harness;
#[path = "oci/common.rs"]
mod oci_common;
#[allow(dead_code)]
#[path = "envtest/stack.rs"]
mod stack;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams};
use skill_operator::api::SkillJob;

const RUNS: usize = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_wait_for_a_component_that_is_down_say_which_and_go_on_when_it_is_back() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("the components-down suite", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    let mut stack = stack::Stack::start(&assets, env!("CARGO_BIN_EXE_skill-operator"), "artifacts-down").await;
    let client = stack.client.clone();
    harness::create_namespace(&client, "registry-down", true).await;
    let metrics_port = stack::free_port();
    let controller = stack.controller(metrics_port, &[], "ctl");
    stack::wait_http(&format!("http://127.0.0.1:{metrics_port}/readyz")).await;
    stack.bind_csv_stats("artifacts-down").await;
    stack.bind_csv_stats("registry-down").await;

    // The artifact endpoint down while runs are staged.
    stack.stop_artifacts();
    let backlog = backlog::Backlog::start(&client, "artifacts-down", RUNS);
    let waiting = all_waiting(&client, "artifacts-down", "ArtifactEndpointUnavailable", "the artifact endpoint cannot be reached").await;
    println!("artifact endpoint down: {waiting}");
    assert_no_jobs(&client, "artifacts-down").await;
    stack.start_artifacts().await;
    backlog.finish(Duration::from_secs(120)).await.assert_nothing_lost_or_doubled(RUNS);

    // The registry down, and a controller that has not pulled the package.
    drop(controller);
    stack.registry.stop();
    let metrics_port = stack::free_port();
    let _controller = stack.controller(metrics_port, &[], "ctl-2");
    stack::wait_http(&format!("http://127.0.0.1:{metrics_port}/readyz")).await;
    let backlog = backlog::Backlog::start(&client, "registry-down", RUNS);
    let waiting = all_waiting(&client, "registry-down", "RegistryUnavailable", "the registry holding the package cannot be reached").await;
    println!("registry down: {waiting}");
    assert_no_jobs(&client, "registry-down").await;
    stack.registry.restart().await;
    backlog.finish(Duration::from_secs(120)).await.assert_nothing_lost_or_doubled(RUNS);
}

/// Waits until all [`RUNS`] SkillJobs in `ns` are Pending and say they wait
/// for the component (`reason` on their Complete condition, `says` in the
/// message); returns one message.
async fn all_waiting(client: &kube::Client, ns: &str, reason: &str, says: &str) -> String {
    let api: Api<SkillJob> = Api::namespaced(client.clone(), ns);
    let mut last = Vec::new();
    for _ in 0..120 {
        let list = api.list(&ListParams::default()).await.unwrap();
        last = list
            .items
            .iter()
            .map(|sj| {
                let status = sj.status.clone().unwrap_or_default();
                let why = status.conditions.iter().find(|c| c.type_ == "Complete").map(|c| c.reason.clone()).unwrap_or_default();
                (format!("{:?}", status.phase), why, status.message.unwrap_or_default())
            })
            .collect();
        let waiting = last.iter().filter(|(phase, why, message)| phase == "Some(Pending)" && why == reason && message.contains(says));
        if list.items.len() == RUNS && waiting.count() == RUNS {
            return last[0].2.clone();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("not every SkillJob in {ns} waited with {reason}: {last:#?}");
}

async fn assert_no_jobs(client: &kube::Client, ns: &str) {
    let jobs = Api::<Job>::namespaced(client.clone(), ns).list(&ListParams::default()).await.unwrap();
    assert!(jobs.items.is_empty(), "a Job was made while a component it needs was down: {:?}", jobs.items.len());
}
