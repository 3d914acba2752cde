//! Gated suite: leader election among controller replicas on a real API
//! server's Lease (`KUBEBUILDER_ASSETS`, as tests/envtest.rs). Without the
//! assets it prints SKIPPED and checks nothing.
//!
//! What it tries to break: two leaders at once (a standby taking a lease
//! that is still being renewed, whatever the holder's clock says), a dead
//! leader's lease never handed over (or handed over before it expired), a
//! leader that keeps writing after losing, a standby that writes, and a
//! failover that creates a second Job for a SkillJob.

#[path = "envtest/harness.rs"]
mod harness;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use skill_operator::api::{SkillJob, SkillPackage};
use skill_operator::controller::context::Context;
use skill_operator::controller::leader::{Elector, Ended, Leadership, LeaseConfig};
use skill_operator::shutdown::Shutdown;

const NS: &str = "skill-system";
const DURATION: Duration = Duration::from_secs(3);
const RETRY: Duration = Duration::from_millis(250);

fn fast(name: &str, identity: &str) -> LeaseConfig {
    LeaseConfig { duration: DURATION, renew_deadline: Duration::from_secs(2), retry_period: RETRY, ..LeaseConfig::new(NS, name, identity) }
}

/// A candidate running until `stop` is triggered; its end comes back.
struct Candidate {
    leadership: Leadership,
    stop: Shutdown,
    task: tokio::task::JoinHandle<Ended>,
}

fn candidate(client: &Client, lease: &str, identity: &str) -> Candidate {
    let leadership = Leadership::standby();
    let elector = Elector::new(client.clone(), fast(lease, identity), leadership.clone()).expect("valid timings");
    let stop = Shutdown::new();
    let task = tokio::spawn(elector.run(stop.wait_owned()));
    Candidate { leadership, stop, task }
}

async fn leads_within(leadership: &Leadership, limit: Duration, who: &str) -> Instant {
    let mut changes = leadership.changes();
    tokio::time::timeout(limit, changes.wait_for(|leading| *leading))
        .await
        .unwrap_or_else(|_| panic!("{who} did not lead within {limit:?}"))
        .expect("the leadership outlives the test");
    Instant::now()
}

async fn holder(leases: &Api<Lease>, name: &str) -> (Option<String>, i32) {
    let spec = leases.get(name).await.expect("the lease exists").spec.unwrap_or_default();
    (spec.holder_identity, spec.lease_transitions.unwrap_or(0))
}

/// Another process holding `name` and renewing it every [`RETRY`], its
/// clock `skew` away from ours; counts its renewals until stopped.
fn ghost(leases: Api<Lease>, name: &str, skew: i64, stop: Shutdown) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let renewals = Arc::new(AtomicU64::new(0));
    let counted = renewals.clone();
    let name = name.to_string();
    // Callers wait for the first renewal ([`held_by_ghost`]) before a candidate starts.
    let task = tokio::spawn(async move {
        while !stop.is_triggered() {
            let now = k8s_openapi::jiff::Timestamp::now().as_second() + skew;
            let renew = MicroTime(k8s_openapi::jiff::Timestamp::from_second(now).unwrap());
            let mut lease = match leases.get_opt(&name).await.unwrap() {
                Some(lease) => lease,
                None => serde_json::from_value(json!({ "metadata": { "name": name, "namespace": NS } })).unwrap(),
            };
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = Some("ghost".into());
            spec.lease_duration_seconds = Some(DURATION.as_secs() as i32);
            spec.renew_time = Some(renew);
            let written = if lease.metadata.resource_version.is_some() {
                leases.replace(&name, &PostParams::default(), &lease).await
            } else {
                leases.create(&PostParams::default(), &lease).await
            };
            if written.is_ok() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(RETRY).await;
        }
    });
    (renewals, task)
}

/// Waits until the ghost has written the lease once.
async fn held_by_ghost(renewals: &AtomicU64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while renewals.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the test's holder could not write its lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `renewals` has grown by `n`, asserting `standby` never led meanwhile.
async fn standby_while_renewed(renewals: &AtomicU64, n: u64, standby: &Leadership, what: &str) {
    let from = renewals.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut changes = standby.changes();
    while renewals.load(Ordering::SeqCst) < from + n {
        assert!(Instant::now() < deadline, "{what}: the holder stopped renewing");
        assert!(!*changes.borrow_and_update(), "{what}: a standby took a lease that was being renewed");
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    assert!(!standby.is_leading(), "{what}: a standby took a lease that was being renewed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_against_a_real_api_server() {
    let Some(assets) = harness::assets() else {
        skill_operator::gated::skip("the leader election suite", "KUBEBUILDER_ASSETS is not set to a folder with etcd and kube-apiserver");
        return;
    };
    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    harness::create_namespace(&client, NS, false).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), NS);

    // --- One leader; a killed one is replaced after its lease expired, not before.
    let a = candidate(&client, "ctl", "a");
    leads_within(&a.leadership, Duration::from_secs(10), "the first candidate").await;
    let b = candidate(&client, "ctl", "b");
    let renewals = Arc::new(AtomicU64::new(0));
    {
        // Count a's renewals by the lease's versions while b stands by.
        let mut last = leases.get("ctl").await.unwrap().resource_version();
        let deadline = Instant::now() + Duration::from_secs(30);
        while renewals.load(Ordering::SeqCst) < (2 * DURATION.as_millis() / RETRY.as_millis()) as u64 {
            assert!(Instant::now() < deadline, "the leader stopped renewing");
            assert!(!b.leadership.is_leading(), "two leaders: b took a lease a renews");
            let now = leases.get("ctl").await.unwrap().resource_version();
            if now != last {
                renewals.fetch_add(1, Ordering::SeqCst);
                last = now;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(holder(&leases, "ctl").await, (Some("a".into()), 0));
    // SIGKILL-like: the task goes, nothing is released.
    a.task.abort();
    let killed = Instant::now();
    let took = leads_within(&b.leadership, DURATION * 3, "the standby after the leader died").await - killed;
    // a's last renewal was at most one retry (with jitter) before the kill.
    let earliest = DURATION - RETRY.mul_f32(1.2) - Duration::from_millis(100);
    assert!(took >= earliest, "b took the lease {took:?} after a died, before it could have expired ({earliest:?})");
    eprintln!("leader election: failover after a killed leader took {took:?} (lease duration {DURATION:?})");
    assert_eq!(holder(&leases, "ctl").await, (Some("b".into()), 1), "the holder and one transition");

    // --- A leader that stops releases: its standby takes over at once.
    let c = candidate(&client, "ctl", "c");
    b.stop.trigger();
    let stopped = Instant::now();
    match b.task.await.unwrap() {
        Ended::Stopped(elector) => elector.release().await,
        Ended::Lost(err) => panic!("b lost the lease instead of stopping: {err}"),
    }
    assert!(!b.leadership.is_leading(), "a released lease still leads");
    let took = leads_within(&c.leadership, DURATION * 3, "the standby after a release").await - stopped;
    assert!(took < DURATION, "after a release the standby waited {took:?}, as if the lease had only expired");
    eprintln!("leader election: handover after a release took {took:?}");
    assert_eq!(holder(&leases, "ctl").await, (Some("c".into()), 2));

    // --- A leader that finds another holder stops leading at its next renewal.
    let mut lease = leases.get("ctl").await.unwrap();
    lease.spec.as_mut().unwrap().holder_identity = Some("ghost".into());
    leases.replace("ctl", &PostParams::default(), &lease).await.unwrap();
    let taken = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(5), c.task).await.expect("c went on leading a lease it lost").unwrap();
    assert!(!c.leadership.is_leading(), "c still leads");
    match ended {
        Ended::Lost(err) => {
            let msg = err.to_string();
            assert!(msg.contains("ghost holds it") && msg.contains("exiting"), "{msg}");
        }
        Ended::Stopped(_) => panic!("c stopped instead of losing"),
    }
    assert!(taken.elapsed() < Duration::from_secs(2), "c noticed only after its renew deadline");

    // --- Clocks are never compared: a live holder whose clock is an hour
    // behind keeps its lease; a dead one whose clock is an hour ahead loses it
    // after one duration, not after an hour.
    let stop_ghost = Shutdown::new();
    let (renewals, ghost_task) = ghost(leases.clone(), "behind", -3600, stop_ghost.clone());
    held_by_ghost(&renewals).await;
    let d = candidate(&client, "behind", "d");
    standby_while_renewed(&renewals, 2 * (DURATION.as_millis() / RETRY.as_millis()) as u64, &d.leadership, "a holder an hour behind").await;
    stop_ghost.trigger();
    ghost_task.await.unwrap();
    leads_within(&d.leadership, DURATION * 3, "the standby after the slow-clocked holder stopped").await;

    let stop_ghost = Shutdown::new();
    let (renewals, ghost_task) = ghost(leases.clone(), "ahead", 3600, stop_ghost.clone());
    held_by_ghost(&renewals).await;
    stop_ghost.trigger();
    ghost_task.await.unwrap();
    let dead = Instant::now();
    let e = candidate(&client, "ahead", "e");
    let took = leads_within(&e.leadership, DURATION * 3, "the standby after a fast-clocked holder died").await - dead;
    assert!(took >= DURATION, "e took a lease unchanged for only {took:?}");
    d.task.abort();
    e.task.abort();

    // --- Two candidates racing for a free lease: exactly one wins.
    let racers: Vec<Candidate> = (0..4).map(|i| candidate(&client, "race", &format!("r{i}"))).collect();
    let mut any = racers[0].leadership.changes();
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if racers.iter().any(|r| r.leadership.is_leading()) {
                break;
            }
            tokio::select! {
                _ = any.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
    })
    .await;
    // Two full renewals later, still exactly one.
    let (winner, _) = holder(&leases, "race").await;
    for _ in 0..3 {
        let leading: Vec<usize> = (0..racers.len()).filter(|i| racers[*i].leadership.is_leading()).collect();
        assert_eq!(leading.len(), 1, "leaders among the racers: {leading:?}");
        assert_eq!(winner.as_deref(), Some(format!("r{}", leading[0]).as_str()));
        tokio::time::sleep(RETRY * 2).await;
    }
    for r in racers {
        r.task.abort();
    }

    controllers_write_only_while_leading(&client, &leases).await;
}

/// Two controllers with election on: the standby writes nothing while the
/// leader lives (a lease held by the test first, then by the other
/// controller), and a kill mid-backlog leaves every SkillJob with exactly
/// one Job.
async fn controllers_write_only_while_leading(client: &Client, leases: &Api<Lease>) {
    harness::install_crds(client).await;
    harness::create_namespace(client, "team", true).await;

    let controller = |identity: &str| -> (Arc<Context>, tokio_util::task::AbortOnDropHandle<()>) {
        let lease = fast("controller", identity);
        let (ctx, task) = spawn_elected(client.clone(), lease);
        (ctx, task)
    };

    // The test holds the lease: a standby controller must not write at all
    // (not a finalizer, not a status, not a Job).
    let stop_ghost = Shutdown::new();
    let (renewals, ghost_task) = ghost(leases.clone(), "controller", 0, stop_ghost.clone());
    held_by_ghost(&renewals).await;
    let (first, first_task) = controller("first");
    let mut first_task = Some(first_task);
    let packages: Api<SkillPackage> = Api::all(client.clone());
    harness::create(&packages, harness::csv_stats_package()).await;
    let bindings: Api<skill_operator::api::SkillBinding> = Api::namespaced(client.clone(), "team");
    harness::create(
        &bindings,
        json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillBinding",
            "metadata": { "name": "csv-stats", "namespace": "team" }, "spec": { "package": "csv-stats-1" }
        }),
    )
    .await;
    let skilljobs: Api<SkillJob> = Api::namespaced(client.clone(), "team");
    harness::create(&skilljobs, skilljob("early")).await;
    standby_while_renewed(&renewals, 2 * (DURATION.as_millis() / RETRY.as_millis()) as u64, &first.leadership, "a standby controller")
        .await;
    let package = packages.get("csv-stats-1").await.unwrap();
    assert!(package.finalizers().is_empty() && package.status.is_none(), "a standby wrote the package: {:?}", package.metadata);
    let jobs: Api<Job> = Api::namespaced(client.clone(), "team");
    assert!(jobs.list(&ListParams::default()).await.unwrap().items.is_empty(), "a standby created a Job");
    assert_eq!(first.metrics.leading.get(), 0);

    // The test's holder goes; the standby leads from its warm caches.
    stop_ghost.trigger();
    ghost_task.await.unwrap();
    leads_within(&first.leadership, DURATION * 3, "the standby controller").await;
    // The gauge follows the leadership from its own task.
    harness::wait_for(|| async { (first.metrics.leading.get() == 1).then_some(()) }, "the leading gauge at 1").await;
    harness::wait_for(|| async { harness::ready(&packages.get("csv-stats-1").await.ok()?.status?.conditions) }, "the package Ready").await;
    harness::wait_for(|| async { jobs.list(&ListParams::default()).await.ok()?.items.into_iter().next() }, "the early run's Job").await;

    // A second controller stands by; the first is killed mid-backlog.
    let (second, _second_task) = controller("second");
    for i in 0..30 {
        harness::create(&skilljobs, skilljob(&format!("run-{i}"))).await;
        if i == 10 {
            drop(first_task.take());
        }
    }
    leads_within(&second.leadership, DURATION * 3, "the second controller after the first was killed").await;
    let want = 31;
    let all = harness::wait_for(
        || async {
            let items = jobs.list(&ListParams::default()).await.ok()?.items;
            (items.len() >= want).then_some(items)
        },
        "a Job for every SkillJob",
    )
    .await;
    let mut owners: Vec<String> =
        all.iter().filter_map(|j| j.owner_references().iter().find(|o| o.kind == "SkillJob").map(|o| o.name.clone())).collect();
    owners.sort();
    let before = owners.len();
    owners.dedup();
    assert_eq!((all.len(), before, owners.len()), (want, want, want), "Jobs per SkillJob after a failover: {owners:?}");
}

fn skilljob(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillJob",
        "metadata": { "name": name, "namespace": "team" },
        "spec": { "binding": "csv-stats", "script": "scripts/stats.py", "args": ["data.csv"] }
    })
}

/// A controller as the test harness makes them, with leader election on the
/// given lease; dropping the handle kills it (no release).
fn spawn_elected(client: Client, lease: LeaseConfig) -> (Arc<Context>, tokio_util::task::AbortOnDropHandle<()>) {
    let (ctx, _) = harness::context_with(client.clone(), "csv-stats", |config| config.leader_election = Some(lease.clone()));
    let elector = Elector::new(client, lease, ctx.leadership.clone()).expect("valid timings");
    let run = ctx.clone();
    let task = tokio::spawn(async move {
        let listen = "127.0.0.1:0".parse().unwrap();
        if let Err(err) =
            skill_operator::controller::run::run_elected(run, listen, Default::default(), Shutdown::new(), Some(elector)).await
        {
            eprintln!("controller stopped: {err:#}");
        }
    });
    (ctx, tokio_util::task::AbortOnDropHandle::new(task))
}
