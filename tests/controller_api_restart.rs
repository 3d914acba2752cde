//! Gated fault suite (`KUBEBUILDER_ASSETS`, as tests/envtest.rs): the API
//! server SIGKILLed and started again, twice, while a backlog of
//! `API_RESTART_SKILLJOBS` SkillJobs (default 300) drains past one real
//! `skill-operator controller` process. The controller must back off, relist
//! and finish by itself: it is never restarted, and it must still be
//! running at the end. As in tests/controller_failover.rs the test stands in
//! for the kubelet (every Job is failed as it appears), and checks that no
//! SkillJob got two Jobs, that every one reached a terminal phase, and that
//! no phase went back. It prints how long the backlog took to move again
//! after each restart.

#[path = "envtest/backlog.rs"]
mod backlog;
#[path = "envtest/harness.rs"]
mod harness;
#[path = "oci/common.rs"]
mod oci_common;
#[allow(dead_code)]
#[path = "envtest/stack.rs"]
mod stack;

use std::time::{Duration, Instant};

const NS: &str = "api-restart";
const DOWN: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_recovers_from_api_server_restarts_by_itself() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip(
            "the API server restart suite",
            "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver",
        );
        return;
    };
    let count: usize = std::env::var("API_RESTART_SKILLJOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let mut stack = stack::Stack::start(&assets, env!("CARGO_BIN_EXE_skill-operator"), NS).await;
    let client = stack.client.clone();
    let metrics_port = stack::free_port();
    let mut controller = stack.controller(metrics_port, &[], "ctl");
    stack::wait_http(&format!("http://127.0.0.1:{metrics_port}/readyz")).await;
    stack.bind_csv_stats(NS).await;

    let backlog = backlog::Backlog::start(&client, NS, count);
    let mut recoveries = Vec::new();
    for (restart, share) in [(1, 4), (2, 2)] {
        // Restart once a share of the backlog is done, mid-drain.
        let deadline = Instant::now() + Duration::from_secs(300);
        while backlog.terminal() < count / share {
            assert!(Instant::now() < deadline, "the backlog did not reach {} of {count} before restart {restart}", count / share);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stack.env.restart_apiserver(DOWN).await;
        let back = Instant::now();
        let before = backlog.terminal();
        while backlog.terminal() == before && back.elapsed() < Duration::from_secs(300) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        recoveries.push(back.elapsed());
        assert!(controller.0.try_wait().unwrap().is_none(), "the controller exited after restart {restart}: it must recover by itself");
    }
    let outcome = backlog.finish(Duration::from_secs(600)).await;
    let still_running = controller.0.try_wait().unwrap().is_none();
    println!(
        "controller_api_restart: 2 API server restarts ({} s down each) while {count} SkillJobs drained: the first verdict after each came {} later; {} terminal, {} with two Jobs, {} phase regressions, the controller {}",
        DOWN.as_secs(),
        recoveries.iter().map(|d| format!("{:.2} s", d.as_secs_f64())).collect::<Vec<_>>().join(" and "),
        outcome.terminal,
        outcome.duplicates.len(),
        outcome.regressions.len(),
        if still_running { "never restarted" } else { "exited" }
    );
    assert!(still_running, "the controller exited: it must recover by itself");
    outcome.assert_nothing_lost_or_doubled(count);
}
