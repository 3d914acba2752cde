//! SkillJob -> Job latency and throughput against a real API server, and the
//! controller's RSS idle and under load. Gated like the envtest suite: it
//! needs `KUBEBUILDER_ASSETS` (etcd and kube-apiserver) and prints SKIPPED
//! otherwise. Run: `cargo bench --bench controller_throughput`.
//!
//! The controller runs in this process, so its RSS is this process's RSS
//! minus the baseline measured before the controller starts.

#[path = "../tests/envtest/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use skill_operator::api::{SkillBinding, SkillJob, SkillPackage};

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(assets) = harness::assets() else {
        println!("SKIPPED: KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver; the controller benchmark did not run");
        return;
    };
    let count: usize = std::env::var("SKILLJOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    harness::install_crds(&client).await;
    let base = rss_kib();
    let _controller = harness::spawn_controller(client.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = rss_kib().saturating_sub(base);

    let packages: Api<SkillPackage> = Api::all(client.clone());
    packages
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage", "metadata": { "name": "csv-stats-1" },
            "spec": { "source": { "oci": { "reference": "r/csv-stats:1" } },
                      "runtime": { "interpreter": "python", "image": "python@sha256:1111111111111111111111111111111111111111111111111111111111111111", "allowedScripts": ["scripts/stats.py"] } }
        })).unwrap())
        .await
        .unwrap();
    harness::wait_for(|| async { harness::ready(&packages.get("csv-stats-1").await.ok()?.status?.conditions) }, "package Ready").await;
    let bindings: Api<SkillBinding> = Api::namespaced(client.clone(), "default");
    bindings
        .create(&PostParams::default(), &serde_json::from_value(json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding", "metadata": { "name": "csv-stats" }, "spec": { "package": "csv-stats-1" }
        })).unwrap())
        .await
        .unwrap();
    harness::wait_for(|| async { harness::ready(&bindings.get("csv-stats").await.ok()?.status?.conditions) }, "binding Ready").await;

    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), "default");
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let start = Instant::now();
    let mut created_at = Vec::with_capacity(count);
    for i in 0..count {
        let sj: SkillJob = serde_json::from_value(json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob", "metadata": { "name": format!("run-{i}") },
            "spec": { "binding": "csv-stats", "script": "scripts/stats.py" }
        }))
        .unwrap();
        skilljobs.create(&PostParams::default(), &sj).await.unwrap();
        created_at.push(Instant::now());
    }
    let mut peak = 0;
    loop {
        peak = peak.max(rss_kib().saturating_sub(base));
        let n = jobs.list(&ListParams::default()).await.unwrap().items.len();
        if n >= count || start.elapsed() > Duration::from_secs(600) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = start.elapsed();
    // Latency: a Job's creationTimestamp minus its SkillJob's.
    let mut latency: Vec<f64> = Vec::new();
    for sj in skilljobs.list(&ListParams::default()).await.unwrap() {
        if let (Some(name), Some(t0)) = (sj.status.and_then(|s| s.job_name), sj.metadata.creation_timestamp) {
            if let Ok(job) = jobs.get(&name).await {
                if let Some(t1) = job.metadata.creation_timestamp {
                    latency.push(t1.0.duration_since(t0.0).as_secs_f64() * 1000.0);
                }
            }
        }
    }
    latency.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let p = |q: f64| latency.get(((latency.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN);
    println!(
        "{count} SkillJobs -> {} Jobs in {:.1} s ({:.0} Jobs/s); SkillJob->Job latency median {:.0} ms, p99 {:.0} ms (1 s timestamp resolution); controller RSS idle {:.1} MiB, peak {:.1} MiB",
        latency.len(),
        elapsed.as_secs_f64(),
        latency.len() as f64 / elapsed.as_secs_f64(),
        p(0.5),
        p(0.99),
        idle as f64 / 1024.0,
        peak as f64 / 1024.0
    );
    let _ = created_at;
}
