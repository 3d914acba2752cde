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

#[allow(dead_code)]
#[path = "envtest/harness.rs"]
mod harness;
#[path = "oci/common.rs"]
mod oci_common;
#[allow(dead_code)]
#[path = "envtest/stack.rs"]
mod stack;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;
use skill_operator::api::job::SkillJobPhase;
use skill_operator::api::SkillJob;

const NS: &str = "failover";
const OPERATOR_NS: &str = "skill-system";
const LEASE: &str = "failover-controller";
const REPLICAS: usize = 2;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn rank(phase: Option<&SkillJobPhase>) -> u8 {
    match phase {
        None => 0,
        Some(SkillJobPhase::Pending) => 1,
        Some(SkillJobPhase::Running) => 2,
        Some(_) => 3,
    }
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

    // What a watch sees: each SkillJob's phases in order, each SkillJob's Jobs.
    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), NS);
    let history: Arc<Mutex<HashMap<String, Vec<Option<SkillJobPhase>>>>> = Arc::default();
    let watch_phases = {
        let (api, history) = (skilljobs.clone(), history.clone());
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Ok(Some(event)) = events.try_next().await {
                if let watcher::Event::Apply(sj) | watcher::Event::InitApply(sj) = event {
                    let phase = sj.status.as_ref().and_then(|s| s.phase);
                    let mut h = history.lock().unwrap();
                    let seen = h.entry(sj.name_any()).or_default();
                    if seen.last() != Some(&phase) {
                        seen.push(phase);
                    }
                }
            }
        })
    };
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    let jobs_of: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
    // The kubelet's and Job controller's part: each new Job failed, no pod run.
    let (failing_tx, failing_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let watch_jobs = {
        let (api, jobs_of) = (jobs.clone(), jobs_of.clone());
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
            while let Ok(Some(event)) = events.try_next().await {
                if let watcher::Event::Apply(job) | watcher::Event::InitApply(job) = event {
                    let Some(owner) = job.owner_references().iter().find(|o| o.kind == "SkillJob").map(|o| o.uid.clone()) else { continue };
                    let fresh = jobs_of.lock().unwrap().entry(owner).or_default().insert(job.name_any());
                    let done = job.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| !c.is_empty());
                    if fresh && !done {
                        let _ = failing_tx.send(job.name_any());
                    }
                }
            }
        })
    };
    let fail_jobs = {
        let api = jobs.clone();
        tokio::spawn(async move {
            tokio_stream_of(failing_rx)
                .for_each_concurrent(8, |name| {
                    let api = api.clone();
                    async move { fail_job(&api, &name).await }
                })
                .await
        })
    };

    // The backlog, created while the kills go on.
    let creating = {
        let api = skilljobs.clone();
        tokio::spawn(async move {
            futures::stream::iter(0..count)
                .for_each_concurrent(16, |i| {
                    let api = api.clone();
                    async move {
                        let sj: SkillJob = serde_json::from_value(json!({
                            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob", "metadata": { "name": format!("run-{i}") },
                            "spec": { "binding": "csv-stats", "script": "scripts/stats.py", "args": ["data.csv"] }
                        }))
                        .unwrap();
                        api.create(&PostParams::default(), &sj).await.unwrap_or_else(|e| panic!("create run-{i}: {e}"));
                    }
                })
                .await
        })
    };

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
    creating.await.expect("every SkillJob was created");
    let kill_phase = started.elapsed();

    // Every SkillJob reaches a terminal phase.
    let deadline = Instant::now() + Duration::from_secs(600);
    let terminal = loop {
        let done = history.lock().unwrap().values().filter(|h| rank(h.last().and_then(|p| p.as_ref())) == 3).count();
        if done == count || Instant::now() > deadline {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    watch_phases.abort();
    watch_jobs.abort();
    fail_jobs.abort();
    drop(replicas);

    let jobs_of = jobs_of.lock().unwrap().clone();
    let duplicates: Vec<_> = jobs_of.iter().filter(|(_, j)| j.len() > 1).collect();
    let history = history.lock().unwrap().clone();
    let mut regressions = Vec::new();
    for (name, phases) in &history {
        let mut top = 0;
        let mut last_terminal: Option<&SkillJobPhase> = None;
        for p in phases {
            let r = rank(p.as_ref());
            if r < top || (last_terminal.is_some() && p.as_ref() != last_terminal) {
                regressions.push(format!("{name}: {phases:?}"));
                break;
            }
            top = top.max(r);
            if r == 3 {
                last_terminal = p.as_ref();
            }
        }
    }
    failovers.sort();
    let median = failovers.get(failovers.len() / 2).copied().unwrap_or_default();
    let max = failovers.last().copied().unwrap_or_default();
    println!(
        "controller_failover: {kills} SIGKILLs of the leader (2 replicas, lease 3 s) over {:.1} s while {count} SkillJobs drained: \
         failover median {:.2} s, max {:.2} s; {} SkillJobs terminal, {} with two Jobs, {} phase regressions",
        kill_phase.as_secs_f64(),
        median.as_secs_f64(),
        max.as_secs_f64(),
        terminal,
        duplicates.len(),
        regressions.len()
    );
    assert!(duplicates.is_empty(), "SkillJobs with more than one Job: {duplicates:?}");
    assert!(regressions.is_empty(), "phases that went back: {regressions:?}");
    assert_eq!(terminal, count, "SkillJobs left without a terminal phase");
    assert_eq!(jobs_of.len(), count, "SkillJobs that never got a Job");
}

fn tokio_stream_of<T>(mut rx: tokio::sync::mpsc::UnboundedReceiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// What the Job controller writes when a Job's pod could not run: the
/// failure target, then Failed.
async fn fail_job(api: &Api<Job>, name: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |type_: &str| {
        json!({ "type": type_, "status": "True", "reason": "BackoffLimitExceeded", "message": "the test's stand-in for the kubelet ran no pod",
                "lastProbeTime": now, "lastTransitionTime": now })
    };
    let status = json!({ "status": { "startTime": now, "failed": 1, "conditions": [condition("FailureTarget"), condition("Failed")] } });
    for _ in 0..20 {
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await {
            Ok(_) => return,
            Err(kube::Error::Api(e)) if e.code == 404 => return,
            Err(kube::Error::Api(e)) if e.code == 422 => panic!("the API server refused the failed status of {name}: {}", e.message),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
