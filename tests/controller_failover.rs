//! Gated fault suite (`KUBEBUILDER_ASSETS`, as tests/envtest.rs): two real
//! `skill-operator controller` processes electing a leader on a Lease, and
//! the leader SIGKILLed `FAILOVER_KILLS` times (default 50) at random points
//! while a backlog of `FAILOVER_SKILLJOBS` SkillJobs (default 1,000) drains.
//! A killed process is started again at once, as the kubelet restarts a
//! container, and competes as a new candidate.
//!
//! There is no kubelet here, so the test stands in for it and for the Job
//! controller: every Job the controller makes is marked failed (no pod ever
//! ran) as soon as it appears, and the controller must then record a
//! truthful terminal verdict on its SkillJob. Checked at the end:
//! - 0 duplicate Jobs: no SkillJob ever had two Jobs, whatever got killed when;
//! - 0 SkillJobs lost: every one reaches a terminal phase;
//! - 0 status regressions: no SkillJob's phase, as a watch saw it, ever went
//!   back (Running to Pending, or a terminal phase to any other);
//! - the failover times (from the SIGKILL to a new Lease holder), median and
//!   max, printed for docs/benchmarks.md.

#[path = "envtest/backlog.rs"]
mod backlog;
#[allow(dead_code)]
#[path = "envtest/harness.rs"]
mod harness;
#[path = "oci/common.rs"]
mod oci_common;
#[allow(dead_code)]
#[path = "envtest/stack.rs"]
mod stack;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;

const NS: &str = "failover";
const OPERATOR_NS: &str = "skill-system";
const LEASE: &str = "failover-controller";
const REPLICAS: usize = 2;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A random pause of 100 to 1,600 ms: the kills land anywhere in a reconcile.
fn random_pause() -> Duration {
    let b = uuid::Uuid::new_v4();
    let n = u16::from_le_bytes([b.as_bytes()[0], b.as_bytes()[1]]) % 1500;
    Duration::from_millis(100 + u64::from(n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_loses_nothing_and_duplicates_nothing() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip(
            "the controller failover suite",
            "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver",
        );
        return;
    };
    let count = knob("FAILOVER_SKILLJOBS", 1000);
    let kills = knob("FAILOVER_KILLS", 50);
    let stack = stack::Stack::start(&assets, env!("CARGO_BIN_EXE_skill-operator"), NS).await;
    let client = stack.client.clone();
    harness::create_namespace(&client, OPERATOR_NS, false).await;

    // Short timings so 50 failovers fit in minutes; the rule is the same.
    let flags = [
        "--leader-elect",
        "--leader-elect-lease-name",
        LEASE,
        "--leader-elect-lease-duration",
        "3",
        "--leader-elect-renew-deadline",
        "2",
        "--leader-elect-retry-period",
        "1",
    ];
    let names: Vec<String> = (0..REPLICAS).map(|i| format!("ctl-{i}")).collect();
    let mut replicas: Vec<stack::Process> = names.iter().map(|n| stack.controller(stack::free_port(), &flags, n)).collect();
    stack.bind_csv_stats(NS).await;

    let backlog = backlog::Backlog::start(&client, NS, count);

    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NS);
    let holder = || {
        let leases = leases.clone();
        async move { leases.get_opt(LEASE).await.ok().flatten().and_then(|l| l.spec?.holder_identity).unwrap_or_default() }
    };
    let started = Instant::now();
    let mut failovers: Vec<Duration> = Vec::new();
    for k in 0..kills {
        tokio::time::sleep(random_pause()).await;
        let old = harness::wait_for(
            || async {
                let h = holder().await;
                (!h.is_empty()).then_some(h)
            },
            "a leader",
        )
        .await;
        let i = names.iter().position(|n| old.starts_with(&format!("{n}_"))).unwrap_or_else(|| panic!("holder {old} is none of {names:?}"));
        // SIGKILL (Child::kill), then the "container restart".
        let _ = replicas[i].0.kill();
        let _ = replicas[i].0.wait();
        let killed = Instant::now();
        replicas[i] = stack.controller(stack::free_port(), &flags, &names[i]);
        let deadline = killed + Duration::from_secs(60);
        loop {
            let now = holder().await;
            if !now.is_empty() && now != old {
                failovers.push(killed.elapsed());
                break;
            }
            assert!(Instant::now() < deadline, "kill {k}: nobody took the lease from {old} in 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let kill_phase = started.elapsed();
    let outcome = backlog.finish(Duration::from_secs(600)).await;
    drop(replicas);

    failovers.sort();
    let median = failovers.get(failovers.len() / 2).copied().unwrap_or_default();
    let max = failovers.last().copied().unwrap_or_default();
    println!(
        "controller_failover: {kills} SIGKILLs of the leader (2 replicas, lease 3 s) over {:.1} s while {count} SkillJobs drained: \
         failover median {:.2} s, max {:.2} s; {} SkillJobs terminal, {} with two Jobs, {} phase regressions",
        kill_phase.as_secs_f64(),
        median.as_secs_f64(),
        max.as_secs_f64(),
        outcome.terminal,
        outcome.duplicates.len(),
        outcome.regressions.len()
    );
    outcome.assert_nothing_lost_or_doubled(count);
}
