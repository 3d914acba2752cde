//! What running through the gateway's executor costs beyond the run itself,
//! on a real node.
//!
//! Gated: needs `KUBECONFIG` (the local cluster, or any cluster with the
//! CRDs; the same setup as `tests/gateway_executor.rs`: artifact endpoint,
//! registry and the controller's reconcilers in this process). Prints
//! SKIPPED otherwise. `BENCH_RUNS` (default 10) runs, one at a time, of a
//! trivial script with one inline input through `KubeExecutor::run_new`.
//!
//! A separate watch stamps, on this machine's clock, when the SkillJob
//! appeared and when it was Complete. Per run:
//! - before: `run_new` called → the SkillJob visible (the retry lookup,
//!   the cap count, the create, and staging the input);
//! - run: visible → Complete (the controller and the node: admission,
//!   Job, pod, upload; the baseline);
//! - after: Complete seen → `run_new` returned (reading result.json, the
//!   manifest, stdout and stderr back).
//!
//! Medians and p90, and the gateway's share (before + after) against the run.

#[path = "../tests/gateway_executor/cluster.rs"]
#[allow(dead_code)]
mod cluster;
#[path = "../tests/oci/common.rs"]
mod oci_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::ResourceExt;
use skill_operator::api::SkillJob;
use skill_operator::gateway::executor::{KubeExecutor, KubeOptions};
use skill_operator::mcp::executor::{Caller, Executor, RunControl};

#[derive(Default, Clone, Copy)]
struct Seen {
    created: Option<Instant>,
    complete: Option<Instant>,
}

fn quantile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[((values.len() - 1) as f64 * q).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(setup) = cluster::setup("the gateway run overhead benchmark").await else { return };
    let runs: usize = std::env::var("BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Default::default();
    let jobs: Api<SkillJob> = Api::namespaced(setup.client.clone(), cluster::NS_A);
    let stamps = seen.clone();
    tokio::spawn(async move {
        let mut events = watcher::watcher(jobs, watcher::Config::default()).boxed();
        while let Some(Ok(event)) = events.next().await {
            if let Event::Apply(sj) | Event::InitApply(sj) = event {
                let now = Instant::now();
                let mut map = stamps.lock().unwrap();
                let entry = map.entry(sj.name_any()).or_default();
                entry.created.get_or_insert(now);
                if skill_operator::gateway::executor::record::is_finished(&sj) {
                    entry.complete.get_or_insert(now);
                }
            }
        }
    });
    let exec = KubeExecutor::new(
        setup.client.clone(),
        setup.artifacts.clone(),
        setup.bindings.clone(),
        KubeOptions::new(cluster::NS_A, cluster::NS_GW, skill_operator::core::owner::OwnerSeal::new(cluster::KEY)),
    );
    let caller = Caller::named("bench");
    let (mut before, mut run, mut after) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..runs {
        let control = RunControl { key: format!("bench-{i}-{}", uuid::Uuid::new_v4().simple()), ..Default::default() };
        let started = Instant::now();
        let report = exec
            .run_new(&caller, cluster::plan(&["bench"]), vec![("in.txt".into(), b"bench input".to_vec())], control)
            .await
            .expect("a benchmark run failed");
        let returned = Instant::now();
        let name = report.record.id.clone();
        // The watch may trail the executor's own by a moment: wait for its stamps.
        let deadline = Instant::now() + Duration::from_secs(30);
        let stamp = loop {
            let s = seen.lock().unwrap().get(&name).copied().unwrap_or_default();
            if s.created.is_some() && s.complete.is_some() {
                break s;
            }
            assert!(Instant::now() < deadline, "the benchmark's watch never saw {name} complete");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let (created, complete) = (stamp.created.unwrap(), stamp.complete.unwrap());
        before.push(created.saturating_duration_since(started).as_secs_f64() * 1e3);
        run.push(complete.saturating_duration_since(created).as_secs_f64() * 1e3);
        after.push(returned.saturating_duration_since(complete).as_secs_f64() * 1e3);
        // Stay under the namespace cap over long runs.
        let _ = exec.delete(&caller, &name).await;
    }
    let total_gateway: Vec<f64> = before.iter().zip(&after).map(|(a, b)| a + b).collect();
    println!("gateway_runs: {runs} runs of a one-input bash script through KubeExecutor::run_new");
    for (label, values) in [
        ("before (lookup, cap, create, stage)", &mut before),
        ("run (controller + node)", &mut run),
        ("after (result read back)", &mut after),
    ] {
        println!("  {label:<38} median {:>8.1} ms  p90 {:>8.1} ms", quantile(values, 0.5), quantile(values, 0.9));
    }
    let mut gateway = total_gateway;
    let (g, r) = (quantile(&mut gateway, 0.5), quantile(&mut run, 0.5));
    println!("  gateway share: median {g:.1} ms = {:.3}x the run's median {r:.1} ms", g / r);
    setup.teardown().await;
}
