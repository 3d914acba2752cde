//! SkillJob created → script started → Succeeded, on a real node.
//!
//! Gated: needs `KUBECONFIG` pointing at a cluster where the operator is
//! installed and `BENCH_NS` (default `skills-e2e`) holds the bindings
//! `e2e-noop-py`, `e2e-noop-js` and `e2e-noop-sh` (trivial scripts, bound
//! by `tests/kind/run.sh` when `BENCH_RUNS` is set, which then runs this).
//! Prints SKIPPED otherwise.
//!
//! Then the same runs on warm pods (the binding given `spec.warm` for the
//! time: a pool of one, each run started once a pod waits for it), and
//! the two medians side by side.
//!
//! When `BENCH_NS` also holds `e2e-secret` (a bash script granted one
//! variable from a Secret the controller may read: `tests/kind/run.sh`
//! binds it and grants the Role), it is measured too, as "bash + a
//! variable": a warm run of it has its value read and sealed at the claim.
//! `BENCH_ONLY` (binding names, comma-separated) limits the runs to those.
//!
//! For each interpreter it runs `BENCH_RUNS` (default 20) SkillJobs one at a
//! time and stamps, on this machine's clock, when each step became visible
//! through the API (watch events: the pod created, scheduled, the fetch
//! container done, the run container running and done, the pod done, the
//! Job complete, the SkillJob Succeeded; the pod and the Job usually never
//! report done, and the script's end usually shows only after the verdict:
//! the verdict follows the stored result and deletes them).
//! Each run starts once the previous run's pod is gone, after an untimed
//! offset spread over one kubelet relist period. Medians and p90 per step and in
//! total. What a step costs is the gap between two stamps; a stamp is when
//! the API server learnt of it (the kubelet reports container states in its
//! status sync, so a step's end shows up when the next sync reports it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use serde_json::json;
use skill_operator::api::{SkillJob, SkillJobPhase};

const STEPS: [&str; 8] =
    ["pod created", "scheduled", "fetch done", "script started", "script done", "pod done", "Job complete", "Succeeded"];

type Stamps = Arc<Mutex<BTreeMap<String, BTreeMap<&'static str, Instant>>>>;

fn stamp(stamps: &Stamps, uid: &str, step: &'static str) {
    stamps.lock().unwrap().entry(uid.to_string()).or_default().entry(step).or_insert_with(Instant::now);
}

fn terminated(pod: &Pod, name: &str) -> bool {
    let s = pod.status.as_ref();
    s.into_iter()
        .flat_map(|s| s.init_container_statuses.iter().flatten().chain(s.container_statuses.iter().flatten()))
        .any(|c| c.name == name && c.state.as_ref().is_some_and(|st| st.terminated.is_some()))
}

fn running(pod: &Pod, name: &str) -> bool {
    let s = pod.status.as_ref();
    s.into_iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .any(|c| c.name == name && c.state.as_ref().is_some_and(|st| st.running.is_some() || st.terminated.is_some()))
}

/// Watch pods, Jobs and SkillJobs of the namespace and stamp every step.
fn watch_all(client: &Client, ns: &str, stamps: Stamps) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let s = stamps.clone();
    tokio::spawn(async move {
        let mut w = watcher::watcher(pods, watcher::Config::default()).boxed();
        while let Some(Ok(e)) = w.next().await {
            let (Event::Apply(pod) | Event::InitApply(pod)) = e else { continue };
            let Some(uid) = pod.labels().get("skill-operator.dev/skilljob-uid").cloned() else { continue };
            stamp(&s, &uid, "pod created");
            let scheduled = pod
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "PodScheduled" && c.status == "True"));
            if scheduled {
                stamp(&s, &uid, "scheduled");
            }
            if terminated(&pod, "fetch") {
                stamp(&s, &uid, "fetch done");
            }
            if running(&pod, "run") {
                stamp(&s, &uid, "script started");
            }
            if terminated(&pod, "run") {
                stamp(&s, &uid, "script done");
            }
            if matches!(pod.status.as_ref().and_then(|st| st.phase.as_deref()), Some("Succeeded" | "Failed")) {
                stamp(&s, &uid, "pod done");
            }
        }
    });
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let s = stamps.clone();
    tokio::spawn(async move {
        let mut w = watcher::watcher(jobs, watcher::Config::default()).boxed();
        while let Some(Ok(e)) = w.next().await {
            let (Event::Apply(job) | Event::InitApply(job)) = e else { continue };
            let Some(uid) = job.labels().get("skill-operator.dev/skilljob-uid").cloned() else { continue };
            let complete = job
                .status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Complete" && c.status == "True"));
            if complete {
                stamp(&s, &uid, "Job complete");
            }
        }
    });
    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), ns);
    tokio::spawn(async move {
        let mut w = watcher::watcher(skilljobs, watcher::Config::default()).boxed();
        while let Some(Ok(e)) = w.next().await {
            let (Event::Apply(sj) | Event::InitApply(sj)) = e else { continue };
            let uid = sj.uid().unwrap_or_default();
            if sj.status.as_ref().and_then(|s| s.phase) == Some(SkillJobPhase::Succeeded) {
                stamp(&stamps, &uid, "Succeeded");
            }
        }
    });
}

/// Creates the SkillJob `name` and waits for its Succeeded stamp: its uid,
/// when the create was sent, when it Succeeded.
async fn run_one(api: &Api<SkillJob>, stamps: &Stamps, name: &str, binding: &str, script: &str) -> (String, Instant, Instant) {
    let sj: SkillJob = serde_json::from_value(json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
        "metadata": { "name": name }, "spec": { "binding": binding, "script": script }
    }))
    .unwrap();
    let start = Instant::now();
    let created = api.create(&PostParams::default(), &sj).await.expect("create the SkillJob");
    let uid = created.uid().unwrap_or_default();
    let deadline = start + Duration::from_secs(120);
    loop {
        if let Some(at) = stamps.lock().unwrap().get(&uid).and_then(|s| s.get("Succeeded").copied()) {
            return (uid, start, at);
        }
        assert!(Instant::now() < deadline, "{name} did not succeed within 120 s");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::var_os("KUBECONFIG").is_none() {
        skill_operator::gated::skip("the real-node run benchmark", "KUBECONFIG is not set (tests/kind/run.sh with BENCH_RUNS runs it)");
        return;
    }
    let Ok(client) = Client::try_default().await else {
        skill_operator::gated::skip("the real-node run benchmark", "KUBECONFIG does not reach a cluster");
        return;
    };
    let ns = std::env::var("BENCH_NS").unwrap_or_else(|_| "skills-e2e".into());
    // The cluster is reachable but was not prepared (`cargo test` with a
    // KUBECONFIG of its own): nothing to measure, and not a failure.
    let bindings: Api<skill_operator::api::SkillBinding> = Api::namespaced(client.clone(), &ns);
    for binding in ["e2e-noop-py", "e2e-noop-js", "e2e-noop-sh"] {
        if !matches!(bindings.get_opt(binding).await, Ok(Some(_))) {
            skill_operator::gated::skip(
                "the real-node run benchmark",
                &format!("the binding {ns}/{binding} is missing (tests/kind/run.sh with BENCH_RUNS binds them)"),
            );
            return;
        }
    }
    let runs: usize = std::env::var("BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let only: Vec<String> = std::env::var("BENCH_ONLY").map(|v| v.split(',').map(str::to_string).collect()).unwrap_or_default();
    let mut cases = vec![
        ("python", "e2e-noop-py", "scripts/noop.py"),
        ("node", "e2e-noop-js", "scripts/noop.js"),
        ("bash", "e2e-noop-sh", "scripts/noop.sh"),
    ];
    if matches!(bindings.get_opt("e2e-secret").await, Ok(Some(_))) {
        cases.push(("bash + a variable", "e2e-secret", "scripts/show.sh"));
    }
    cases.retain(|(_, binding, _)| only.is_empty() || only.iter().any(|o| o == binding));
    let stamps: Stamps = Default::default();
    watch_all(&client, &ns, stamps.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let api: Api<SkillJob> = Api::namespaced(client.clone(), &ns);
    println!("SkillJob created → Succeeded on the real node, {runs} runs each, one at a time (ms on this machine's clock)\n");
    println!("| interpreter | step | median | p90 |\n|---|---|---:|---:|");
    let mut summary = Vec::new();
    for (interpreter, binding, script) in cases {
        let mut per_step: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut totals = Vec::new();
        let mut to_script = Vec::new();
        // Run 0 warms the node (first use of this package's staged blobs and
        // the pod sandbox for this image); it is not counted.
        for i in 0..=runs {
            let name = format!("bench-{binding}-{i}");
            // The previous pod's end was seen at a kubelet relist (1 s
            // period): starting right away would put every run at the same
            // phase of the relist clock, and every step that waits for a
            // relist would wait the same, lucky or unlucky, amount. An
            // untimed offset spread evenly over one period (golden-ratio
            // steps) makes the figures those of a run arriving at any time.
            let phase = (i as f64 * 0.618_033_988_75).fract();
            tokio::time::sleep(Duration::from_secs_f64(phase)).await;
            let (uid, start, _) = run_one(&api, &stamps, &name, binding, script).await;
            let s = stamps.lock().unwrap().get(&uid).cloned().unwrap_or_default();
            let _ = api.delete(&name, &DeleteParams::default()).await;
            // The verdict comes before the pod has stopped: the next run starts
            // once this one's pod is gone, so it is timed on a node with room
            // for it (a 2-CPU node fits one run pod; the next would wait in
            // the scheduler's backoff and that would be counted as latency).
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let selector = format!("skill-operator.dev/skilljob-uid={uid}");
            let gone_by = Instant::now() + Duration::from_secs(120);
            while !pods.list(&kube::api::ListParams::default().labels(&selector)).await.expect("list the run's pods").items.is_empty() {
                assert!(Instant::now() < gone_by, "{name}'s pod did not go within 120 s");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if i == 0 {
                continue;
            }
            let mut previous = start;
            let verdict = s["Succeeded"];
            for step in STEPS {
                // A step the API showed only after the verdict (the run
                // container's end, once the stored result decided) is not
                // on the way to it.
                if let Some(at) = s.get(step).filter(|at| **at <= verdict) {
                    per_step.entry(step).or_default().push(at.saturating_duration_since(previous).as_secs_f64() * 1e3);
                    previous = (*at).max(previous);
                }
            }
            totals.push(s["Succeeded"].duration_since(start).as_secs_f64() * 1e3);
            if let Some(at) = s.get("script started") {
                to_script.push(at.duration_since(start).as_secs_f64() * 1e3);
            }
        }
        for step in STEPS {
            let v = per_step.remove(step).unwrap_or_default();
            if v.is_empty() {
                // The verdict comes from the stored result: the script's
                // end, the pod and the Job are reported after it, if at all.
                println!("| {interpreter} | … → {step} | not before Succeeded | |");
                continue;
            }
            let n = if v.len() < runs { format!(" ({} of {runs} runs)", v.len()) } else { String::new() };
            println!("| {interpreter} | … → {step}{n} | {:.0} | {:.0} |", quantile(v.clone(), 0.5), quantile(v, 0.9));
        }
        println!(
            "| {interpreter} | created → script started | {:.0} | {:.0} |",
            quantile(to_script.clone(), 0.5),
            quantile(to_script, 0.9)
        );
        println!(
            "| **{interpreter}** | **created → Succeeded** | **{:.0}** | **{:.0}** |",
            quantile(totals.clone(), 0.5),
            quantile(totals.clone(), 0.9)
        );
        let warm = warm_runs(&client, &ns, binding, script, runs, &stamps).await;
        println!(
            "| **{interpreter}** | **warm: created → Succeeded** | **{:.0}** | **{:.0}** |",
            quantile(warm.clone(), 0.5),
            quantile(warm.clone(), 0.9)
        );
        summary.push((interpreter, quantile(totals, 0.5), quantile(warm, 0.5)));
    }
    println!("\n| interpreter | cold median | warm median | warm / cold |\n|---|---:|---:|---:|");
    for (interpreter, cold, warm) in summary {
        println!("| {interpreter} | {cold:.0} ms | {warm:.0} ms | {:.3} |", warm / cold);
    }
}

/// The same runs on warm pods: the binding keeps a pool of one (`spec.warm`),
/// and each run starts once a pod waits for it (untimed: the pool refills
/// after a claim). Run 0 is not counted. `spec.warm` is removed afterwards.
async fn warm_runs(client: &Client, ns: &str, binding: &str, script: &str, runs: usize, stamps: &Stamps) -> Vec<f64> {
    use kube::api::{ListParams, Patch, PatchParams};
    let bindings: Api<skill_operator::api::SkillBinding> = Api::namespaced(client.clone(), ns);
    let patch = json!({ "spec": { "warm": { "min": 1, "max": 1, "idleTimeoutSeconds": 600 } } });
    bindings.patch(binding, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("give the binding a warm pool");
    let binding_uid = bindings.get(binding).await.expect("read the binding").uid().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let waiting =
        ListParams::default().labels(&format!("skill-operator.dev/warm-binding={binding_uid},skill-operator.dev/warm-state=idle"));
    let api: Api<SkillJob> = Api::namespaced(client.clone(), ns);
    let mut totals = Vec::new();
    let mut cold = 0;
    for i in 0..=runs {
        let ready_by = Instant::now() + Duration::from_secs(180);
        loop {
            let list = pods.list(&waiting).await.expect("list the pool");
            let ready = list.items.iter().any(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
            if ready {
                break;
            }
            assert!(Instant::now() < ready_by, "no warm pod of {binding} was ready within 180 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Untimed: the controller's pod cache hears of the pod's readiness
        // through its own watch, a moment after this list did, and a pod
        // publishes its key (for sealed variables) just after it is ready.
        // A run arriving at a pool in use finds its pods waiting for longer.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let name = format!("bench-warm-{binding}-{i}");
        let (_, start, done) = run_one(&api, stamps, &name, binding, script).await;
        let got = api.get(&name).await.expect("read the SkillJob");
        let warm = got.status.as_ref().and_then(|s| s.warm_pod.as_ref()).is_some();
        let _ = api.delete(&name, &DeleteParams::default()).await;
        if i == 0 {
            continue;
        }
        if warm {
            totals.push(done.duration_since(start).as_secs_f64() * 1e3);
        } else {
            // Counted apart (and said), never mixed into the warm figures.
            cold += 1;
        }
    }
    if cold > 0 {
        println!("| {binding} | {cold} of {runs} runs found no waiting pod and ran cold (not in the warm figures) | | |");
    }
    let patch = json!({ "spec": { "warm": null } });
    bindings.patch(binding, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("remove the warm pool");
    totals
}
