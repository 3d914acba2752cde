//! SkillJob -> Job latency and throughput against a real API server, and the
//! controller's RSS idle and under that load. Gated like the envtest suite:
//! it needs `KUBEBUILDER_ASSETS` (etcd and kube-apiserver) and prints SKIPPED
//! otherwise. Run: `cargo bench --bench controller_throughput`.
//!
//! Everything on the SkillJob path is real and runs as it would in a
//! cluster, each in its own process: the `skill-operator controller` binary
//! (so its RSS is its own), the `skill-operator artifacts` endpoint it stages
//! every job's package through, and a Debian `docker-registry` holding the
//! package and the staged copies. Only the kubelet is missing: Jobs are
//! created, never run.
//!
//! Latency is measured here, not from `creationTimestamp` (1 s resolution):
//! from the moment the SkillJob create call returned to the moment a watch
//! on Jobs delivered its Job. The baseline is the same round trip through
//! the same API server with no controller in it (a ConfigMap created and seen
//! by a watch), so `SkillJob->Job minus baseline` is what the controller adds.
//!
//! Knobs: `SKILLJOBS` (default 1000), `CONCURRENCY` (default 16 creates in
//! flight), `AS_KUBECTL=1` (SkillJobs made without the controller's
//! finalizer, as `kubectl create` makes them; by default they carry it, as
//! the gateway makes them, so the controller need not add it), `RETAINED`
//! (default 0) finished SkillJobs across `NAMESPACES` (default 100)
//! namespaces kept in the API server for every phase after the idle one
//! (the backlog's controller starts on them too), `WARM_POOL` (default 10;
//! 0: skip) warm pods kept for the one binding, to weigh a pool in the
//! controller's memory.

// Shared with tests/envtest.rs, which uses the parts this bench does not.
#[allow(dead_code)]
#[path = "../tests/envtest/harness.rs"]
mod harness;
#[path = "../tests/oci/common.rs"]
mod oci_common;
#[allow(dead_code)]
#[path = "../tests/envtest/stack.rs"]
mod stack;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use skill_operator::api::SkillJob;

const NS: &str = "bench";

/// One `/proc/<pid>/status` field in KiB (`VmRSS`, `RssAnon`, `RssFile`, `VmHWM`).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A controller's idle RSS, median of ten samples 5 s after it is ready,
/// and its anon and file parts (MiB): the binary's own pages are the file part.
async fn idle_rss(pid: u32) -> (f64, f64, f64) {
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut idle: Vec<u64> = Vec::new();
    for _ in 0..10 {
        idle.push(rss_kib(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    idle.sort();
    let mib = |kib: u64| kib as f64 / 1024.0;
    (mib(idle[idle.len() / 2]), mib(status_kib(pid, "RssAnon")), mib(status_kib(pid, "RssFile")))
}

fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS")
}

/// `apiserver_request_total` by verb and resource, from the API server's own metrics.
async fn api_requests(client: &kube::Client) -> HashMap<String, f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(req).await.unwrap_or_default();
    let mut out = HashMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let label = |name: &str| line.split(&format!("{name}=\"")).nth(1).and_then(|r| r.split('"').next()).unwrap_or("").to_string();
        let (Some(value), sub) = (line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()), label("subresource")) else { continue };
        let resource = if sub.is_empty() { label("resource") } else { format!("{}/{sub}", label("resource")) };
        *out.entry(format!("{} {resource}", label("verb"))).or_insert(0.0) += value;
    }
    out
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted.get(((sorted.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(f64::NAN)
}

/// Watch `api` and record when each object (keyed by `key`) was first seen.
fn record_arrivals<K>(api: Api<K>, key: fn(&K) -> Option<String>) -> Arc<Mutex<HashMap<String, Instant>>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let sink = seen.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Ok(Some(event)) = events.try_next().await {
            let now = Instant::now();
            let objects = match event {
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) => vec![o],
                _ => vec![],
            };
            for o in objects {
                if let Some(k) = key(&o) {
                    sink.lock().unwrap().entry(k).or_insert(now);
                }
            }
        }
    });
    seen
}

/// Create `count` objects `concurrency` at a time; return when each create returned.
async fn create_all<K>(api: &Api<K>, count: usize, concurrency: usize, make: impl Fn(usize) -> K) -> (HashMap<String, Instant>, Duration)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let start = Instant::now();
    let objects: Vec<K> = (0..count).map(make).collect();
    let created: HashMap<String, Instant> = futures::stream::iter(objects)
        .map(|o| async move {
            let name = o.meta().name.clone().unwrap();
            api.create(&PostParams::default(), &o).await.unwrap_or_else(|e| panic!("create {name}: {e}"));
            (name, Instant::now())
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    (created, start.elapsed())
}

async fn wait_count(seen: &Mutex<HashMap<String, Instant>>, count: usize, limit: Duration) {
    let start = Instant::now();
    while seen.lock().unwrap().len() < count && start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Arrival minus creation, in ms, sorted.
fn latencies(created: &HashMap<String, Instant>, seen: &HashMap<String, Instant>) -> Vec<f64> {
    let mut v: Vec<f64> =
        created.iter().filter_map(|(name, t0)| seen.get(name).map(|t1| t1.saturating_duration_since(*t0).as_secs_f64() * 1000.0)).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("the controller benchmark", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    let count: usize = std::env::var("SKILLJOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let concurrency: usize = std::env::var("CONCURRENCY").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let stack = stack::Stack::start(&assets, env!("CARGO_BIN_EXE_skill-operator"), NS).await;
    let client = stack.client.clone();
    let metrics_port = stack::free_port();
    let spawn_controller = || stack.controller(metrics_port, &[], "bench-controller");

    // Idle: caches synced, one package and one binding, nothing to do. The
    // baseline first: a controller that keeps its start-up code mapped
    // (`--release-startup-code false`), then the default one, same state.
    let baseline = stack.controller(metrics_port, &["--release-startup-code", "false"], "bench-controller");
    stack::wait_http(&format!("http://127.0.0.1:{metrics_port}/readyz")).await;
    stack.bind_csv_stats(NS).await;
    let (kept_mib, kept_anon, kept_file) = idle_rss(baseline.0.id()).await;
    drop(baseline);
    let controller = spawn_controller();
    let pid = controller.0.id();
    stack::wait_http(&format!("http://127.0.0.1:{metrics_port}/readyz")).await;
    let (idle_mib, idle_anon, idle_file) = idle_rss(pid).await;

    // A warm pool of `WARM_POOL` (default 10) pods for the one package:
    // what its pods in the cache and the pool's bookkeeping cost the
    // controller. The pods are made but never start (no kubelet, no
    // scheduler): Pending pods, as a pool on a full node has them.
    let warm: usize = std::env::var("WARM_POOL").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    if warm > 0 {
        use kube::api::{Patch, PatchParams};
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        let budget = json!({ "metadata": { "annotations": { "skill-operator.dev/warm-pods": warm.to_string() } } });
        namespaces.patch(NS, &PatchParams::default(), &Patch::Merge(&budget)).await.expect("set the warm-pod budget");
        let bindings: Api<skill_operator::api::SkillBinding> = Api::namespaced(client.clone(), NS);
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
        let pool = ListParams::default().labels("skill-operator.dev/warm-pool");
        // A pool of one first: its first pod stages the package, the
        // controller's first registry use (oci-client compiles its
        // reference regex, the package cache fills), which any first run
        // would pay as well. Then the same pool grown to `warm`.
        let mut sizes = Vec::new();
        for n in [1, warm] {
            let spec = json!({ "spec": { "warm": { "min": n, "max": n, "idleTimeoutSeconds": 3600 } } });
            bindings.patch("csv-stats", &PatchParams::default(), &Patch::Merge(&spec)).await.expect("give the binding a warm pool");
            let t = Instant::now();
            while pods.list(&pool).await.map(|l| l.items.len()).unwrap_or(0) < n {
                assert!(t.elapsed() < Duration::from_secs(120), "the pool of {n} was not made within 120 s");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            // Settled: the pool loop has seen them in its cache a few times.
            tokio::time::sleep(Duration::from_secs(6)).await;
            let mut rss: Vec<u64> = (0..10).map(|_| rss_kib(pid)).collect();
            rss.sort();
            let anon = status_kib(pid, "RssAnon") as f64 / 1024.0;
            sizes.push((n, rss[rss.len() / 2] as f64 / 1024.0, anon));
        }
        let (one, many) = (sizes[0], sizes[1]);
        println!(
            "  warm pool: 1 pod: controller RSS {:.1} MiB ({:+.2} over idle {idle_mib:.1}, heap {:+.2}: the first staging); {} pods: {:.1} MiB, {:+.2} over the pool of one (heap {:+.2}; goal <= 10 MiB for 10)",
            one.1,
            one.1 - idle_mib,
            one.2 - idle_anon,
            many.0,
            many.1,
            many.1 - one.1,
            many.2 - one.2
        );
        let off = json!({ "spec": { "warm": null } });
        bindings.patch("csv-stats", &PatchParams::default(), &Patch::Merge(&off)).await.expect("remove the warm pool");
        let t = Instant::now();
        while pods.list(&pool).await.map(|l| l.items.len()).unwrap_or(1) > 0 {
            assert!(t.elapsed() < Duration::from_secs(120), "the pool was not drained within 120 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // Retained: `RETAINED` finished SkillJobs across `NAMESPACES` namespaces
    // (each refused by the fence, as a run that asked for a script its
    // binding does not allow: a terminal phase and no Job), so every phase
    // after this one runs with them in the controller's caches.
    let retained: usize = std::env::var("RETAINED").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let spread: usize = std::env::var("NAMESPACES").ok().and_then(|v| v.parse().ok()).unwrap_or(100).max(1);
    if retained > 0 {
        let ended = record_arrivals(Api::<SkillJob>::all(client.clone()), |sj: &SkillJob| {
            let ended = sj.status.as_ref()?.phase.is_some_and(skill_operator::controller::decide::is_final);
            ended.then(|| format!("{}/{}", sj.metadata.namespace.as_deref().unwrap_or(""), sj.metadata.name.as_deref().unwrap_or("")))
        });
        for k in 0..spread {
            harness::create_namespace(&client, &format!("retained-{k}"), true).await;
            stack.bind_csv_stats(&format!("retained-{k}")).await;
        }
        let t = Instant::now();
        let all: Vec<(usize, usize)> = (0..retained).map(|i| (i % spread, i)).collect();
        futures::stream::iter(all)
            .map(|(k, i)| {
                let api: Api<SkillJob> = Api::namespaced(client.clone(), &format!("retained-{k}"));
                async move {
                    let sj: SkillJob = serde_json::from_value(json!({
                        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
                        "metadata": { "name": format!("done-{i}"), "finalizers": [skill_operator::controller::skilljob::FINALIZER] },
                        "spec": { "binding": "csv-stats", "script": "scripts/not-allowed.py" }
                    }))
                    .unwrap();
                    api.create(&PostParams::default(), &sj).await.unwrap_or_else(|e| panic!("create done-{i}: {e}"));
                }
            })
            .buffer_unordered(concurrency)
            .collect::<Vec<()>>()
            .await;
        wait_count(&ended, retained, Duration::from_secs(900)).await;
        let n = ended.lock().unwrap().len();
        assert_eq!(n, retained, "only {n} of {retained} retained SkillJobs ended in 900 s");
        println!(
            "  retained: {retained} SkillJobs across {spread} namespaces created and refused by the controller in {:.1} s; controller RSS now {:.1} MiB",
            t.elapsed().as_secs_f64(),
            rss_kib(pid) as f64 / 1024.0
        );
    }

    // Baseline: create -> watch round trip through the same API server, no controller.
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let cm_seen = record_arrivals(configmaps.clone(), |o: &ConfigMap| o.metadata.name.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (cm_created, cm_elapsed) = create_all(&configmaps, count, concurrency, |i| {
        serde_json::from_value(json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": format!("baseline-{i}") }, "data": { "i": i.to_string() } })).unwrap()
    })
    .await;
    wait_count(&cm_seen, count, Duration::from_secs(120)).await;
    let baseline = latencies(&cm_created, &cm_seen.lock().unwrap());

    // Latency at a load the machine can carry: one SkillJob at a time.
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let job_seen = record_arrivals(jobs.clone(), |j: &Job| j.metadata.owner_references.as_ref()?.first().map(|o| o.name.clone()));
    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), NS);
    let as_kubectl = std::env::var("AS_KUBECTL").is_ok_and(|v| v == "1");
    let finalizers: Vec<&str> = if as_kubectl { Vec::new() } else { vec![skill_operator::controller::skilljob::FINALIZER] };
    println!(
        "  SkillJobs made {}",
        if as_kubectl { "as kubectl makes them (no finalizer)" } else { "as the gateway makes them (with the controller's finalizer)" }
    );
    let skilljob = |prefix: &'static str| {
        let finalizers = finalizers.clone();
        move |i: usize| -> SkillJob {
            serde_json::from_value(json!({
                "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
                "metadata": { "name": format!("{prefix}-{i}"), "finalizers": finalizers },
                "spec": { "binding": "csv-stats", "script": "scripts/stats.py", "args": ["data.csv"] }
            }))
            .unwrap()
        }
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let quiet = count.min(100);
    let mut quiet_created = HashMap::new();
    for i in 0..quiet {
        let sj = skilljob("quiet")(i);
        skilljobs.create(&PostParams::default(), &sj).await.unwrap();
        let name = sj.metadata.name.clone().unwrap();
        quiet_created.insert(name.clone(), Instant::now());
        // Wait for its Job before the next, so each is measured alone.
        let t = Instant::now();
        while !job_seen.lock().unwrap().contains_key(&name) && t.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let quiet_latency = latencies(&quiet_created, &job_seen.lock().unwrap());

    // Ceiling: the same Jobs created directly by this client, no controller.
    let job_template =
        jobs.list(&ListParams::default().limit(1)).await.unwrap().items.into_iter().next().expect("a Job from the quiet phase");
    let direct_jobs: Api<Job> = Api::namespaced(client.clone(), "direct");
    harness::create_namespace(&client, "direct", true).await;
    let (_, direct_elapsed) = create_all(&direct_jobs, count, concurrency, |i| {
        // The controller's Job minus what the API server filled in.
        let server_set = |labels: &mut Option<std::collections::BTreeMap<String, String>>| {
            if let Some(l) = labels.as_mut() {
                l.retain(|k, _| !k.ends_with("controller-uid") && !k.ends_with("job-name"));
            }
        };
        let mut j = job_template.clone();
        j.metadata = kube::api::ObjectMeta { name: Some(format!("direct-{i}")), labels: j.metadata.labels.clone(), ..Default::default() };
        server_set(&mut j.metadata.labels);
        let spec = j.spec.as_mut().unwrap();
        spec.selector = None;
        server_set(&mut spec.template.metadata.as_mut().unwrap().labels);
        j.status = None;
        j
    })
    .await;

    // The backlog: `count` SkillJobs waiting while the controller is down,
    // then a controller started on them. Its rate is the controller's own,
    // not capped by how fast this client can create SkillJobs.
    drop(controller);
    let (created, _) = create_all(&skilljobs, count, concurrency, skilljob("run")).await;
    let requests_before = api_requests(&client).await;
    let start = Instant::now();
    let controller = spawn_controller();
    let pid = controller.0.id();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    wait_count(&job_seen, quiet + count, Duration::from_secs(600)).await;
    let seen = job_seen.lock().unwrap().clone();
    let first = created.keys().filter_map(|k| seen.get(k)).min().copied().unwrap_or(start);
    let last = created.keys().filter_map(|k| seen.get(k)).max().copied().unwrap_or(start);
    let elapsed = last.saturating_duration_since(start);
    let startup = first.saturating_duration_since(start);
    let done = created.keys().filter(|k| seen.contains_key(*k)).count();
    assert_eq!(done, count, "only {done} of {count} SkillJobs got a Job in 600 s");
    // Let the reconciles that follow each Job (status, events) finish, then count.
    tokio::time::sleep(Duration::from_secs(5)).await;
    sampler.abort();
    let peak_mib = peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0;
    let hwm_mib = status_kib(pid, "VmHWM") as f64 / 1024.0;
    let requests_after = api_requests(&client).await;
    let mut per_job: Vec<(String, f64)> = requests_after
        .iter()
        .map(|(k, v)| (k.clone(), (v - requests_before.get(k).copied().unwrap_or(0.0)) / count as f64))
        .filter(|(_, v)| *v >= 0.05)
        .collect();
    per_job.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap());

    let (b50, b99) = (percentile(&baseline, 0.5), percentile(&baseline, 0.99));
    let (q50, q99) = (percentile(&quiet_latency, 0.5), percentile(&quiet_latency, 0.99));
    let direct_rate = count as f64 / direct_elapsed.as_secs_f64();
    let rate = count as f64 / elapsed.as_secs_f64();
    let steady = count as f64 / last.saturating_duration_since(first).as_secs_f64();
    println!("controller_throughput: real controller, artifact endpoint and registry processes; {concurrency} creates in flight");
    println!(
        "  API round trip (ConfigMap create -> watch, no controller): median {b50:.1} ms, p99 {b99:.1} ms; {:.0} creates/s",
        count as f64 / cm_elapsed.as_secs_f64()
    );
    println!(
        "  one SkillJob at a time ({quiet}): SkillJob -> Job median {q50:.1} ms, p99 {q99:.1} ms; added by the controller (minus the round trip) median {:.1} ms, p99 {:.1} ms (goal p99 <= 30 ms)",
        q50 - b50,
        q99 - b99
    );
    println!("  ceiling: the same {count} Jobs created directly by this client: {direct_rate:.0} Jobs/s");
    println!(
        "  backlog of {count} SkillJobs, controller started on it: all Jobs {:.2} s after the start = {rate:.0} Jobs/s including start-up ({:.2} s to the first Job), {steady:.0} Jobs/s from the first Job to the last ({:.0}% of the direct ceiling; goal >= 40%)",
        elapsed.as_secs_f64(),
        startup.as_secs_f64(),
        100.0 * steady / direct_rate
    );
    println!(
        "  API requests per SkillJob in the backlog run (controller and this bench's watches): {:.1} = {}",
        per_job.iter().map(|(_, v)| v).sum::<f64>(),
        per_job.iter().map(|(k, v)| format!("{k} {v:.2}")).collect::<Vec<_>>().join(", ")
    );
    println!(
        "  controller RSS: idle {idle_mib:.1} MiB (anon {idle_anon:.1}, file {idle_file:.1}; goal <= 25), peak on the backlog {peak_mib:.1} MiB, VmHWM {hwm_mib:.1} MiB (goal <= 100)"
    );
    println!(
        "  idle RSS with start-up code kept mapped (--release-startup-code false): {kept_mib:.1} MiB (anon {kept_anon:.1}, file {kept_file:.1}); released / kept {:.3}x",
        idle_mib / kept_mib
    );
}
