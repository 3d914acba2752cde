//! Gated fault suite (`KUBEBUILDER_ASSETS`, as tests/envtest.rs): one real
//! `skill-operator controller` process reaches a real kube-apiserver only
//! through a fault-injecting proxy of the tests (tests/envtest/faulty.rs):
//! every request delayed, bursts of 429 / 500 / 503 answers, watches
//! answered 410 Gone (a relist), watches dropped mid-stream, requests
//! never answered and watches gone silent (a peer gone without a reset:
//! the controller runs with short `--api-timeout` and `--watch-timeout` so
//! that it gives them up within the test's time). A backlog
//! of `LOSSY_API_SKILLJOBS` SkillJobs (default 200) must drain through it
//! by itself: the controller is never restarted, no SkillJob gets two Jobs,
//! every one reaches a terminal phase, none goes back, and every kind of
//! fault was injected along the way. As in tests/controller_failover.rs
//! the test stands in for the kubelet (each Job is failed as it appears);
//! the test's own watches go straight to the API server.

#[path = "envtest/backlog.rs"]
mod backlog;
#[path = "envtest/faulty.rs"]
mod faulty;
#[path = "envtest/harness.rs"]
mod harness;
#[path = "oci/common.rs"]
mod oci_common;
#[allow(dead_code)]
#[path = "envtest/stack.rs"]
mod stack;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const NS: &str = "lossy-api";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_drains_a_backlog_through_a_slow_lossy_api_server() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("the lossy API server suite", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    let count: usize = std::env::var("LOSSY_API_SKILLJOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let stack = stack::Stack::start(&assets, env!("CARGO_BIN_EXE_skill-operator"), NS).await;
    let client = stack.client.clone();
    let faults = faulty::Faults {
        max_delay: Duration::from_millis(40),
        burst: Duration::from_millis(1500),
        burst_every: Duration::from_secs(6),
        gone_every: 3,
        hold_every: 200,
        silence_every: 10,
    };
    let proxy = faulty::FaultyProxy::start(client.clone(), faults).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = proxy.kubeconfig(&stack.env.kubeconfig, dir.path());
    let metrics_port = stack::free_port();
    // Watches renewed every 10 s, so a silenced one holds its kind's events
    // for 15-20 s at most. Each renewal meets the proxy's faults again; with
    // every watch backing off by itself (controller::triggers) the churn
    // costs nothing else.
    let timeouts = ["--api-timeout", "5", "--watch-timeout", "10"];
    let mut controller = stack.controller_via(&kubeconfig, metrics_port, &timeouts, "ctl");
    stack::wait_http(&format!("http://127.0.0.1:{metrics_port}/readyz")).await;
    let set_up = Instant::now();
    stack.bind_csv_stats(NS).await;
    let set_up = set_up.elapsed();

    let started = Instant::now();
    let backlog = backlog::Backlog::start(&client, NS, count);
    let outcome = backlog.finish(Duration::from_secs(600)).await;
    let took = started.elapsed();
    let still_running = controller.0.try_wait().unwrap().is_none();
    let failures = reconcile_failures(metrics_port).await;
    println!(
        "controller_lossy_api: package and binding Ready in {:.1} s, then {count} SkillJobs drained in {:.1} s through the proxy ({}); {} terminal, {} with two Jobs, {} phase regressions; reconcile failures retried: {failures}; the controller {}",
        set_up.as_secs_f64(),
        took.as_secs_f64(),
        proxy.counts.summary(),
        outcome.terminal,
        outcome.duplicates.len(),
        outcome.regressions.len(),
        if still_running { "never restarted" } else { "exited" }
    );
    assert!(still_running, "the controller exited: it must ride out a lossy API server by itself");
    // Every watch silenced by now is given up by the controller, not left
    // open for good (kube-runtime alone waits 295 s for a silent stream, and
    // for ever for an answer that never began): the deadline only bounds a hang.
    let c = &proxy.counts;
    let silenced = c.silenced_watches.lock().unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(90);
    let open = || silenced.difference(&c.given_up_watches.lock().unwrap()).count();
    while open() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(open(), 0, "of {} silenced watches, the controller kept {} open: {}", silenced.len(), open(), c.summary());
    outcome.assert_nothing_lost_or_doubled(count);
    // A run in which a fault never happened proves nothing about it.
    let c = &proxy.counts;
    for (what, n) in [
        ("429 answers", &c.throttled),
        ("500/503 answers", &c.server_errors),
        ("410 Gone watches", &c.gone),
        ("watches cut mid-stream", &c.cut),
        ("requests never answered", &c.held),
        ("watches gone silent", &c.silenced),
    ] {
        assert!(n.load(Ordering::Relaxed) > 0, "the proxy injected no {what}: {}", c.summary());
    }
}

/// The controller's `reconcile_failures` counters, summed per error kind.
async fn reconcile_failures(port: u16) -> String {
    let Ok(text) = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.unwrap().text().await else {
        return "unknown".into();
    };
    let mut by_error = std::collections::BTreeMap::<String, f64>::new();
    for line in text.lines().filter(|l| l.starts_with("skill_operator_reconcile_failures_total{")) {
        let error = line.split("error=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("?").to_string();
        let n: f64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        *by_error.entry(error).or_default() += n;
    }
    if by_error.is_empty() {
        return "none".into();
    }
    by_error.iter().map(|(e, n)| format!("{n} {e}")).collect::<Vec<_>>().join(", ")
}
