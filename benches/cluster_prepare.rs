//! What a prepared image saves a SkillJob on a real node: the same skill (a
//! 15 MB package of incompressible data and a one-line Python script) bound
//! twice, once from a SkillPackage with `prepare: true` (the package is a
//! layer of the run image: the fetch container brings only the launcher)
//! and once fetched (the fetch container downloads and unpacks the package
//! into an emptyDir at every run). Both run on the same base image, pinned
//! by the same digest.
//!
//! The controller and the artifact endpoint run in this process, as in the
//! suite `tests/cluster_prepare.rs` (shared helpers in
//! `tests/cluster_prepare/common.rs`); pods reach them at the pod gateway.
//! One warm-up run each (image pulls) is not counted, then `BENCH_RUNS`
//! (default 7) runs each, alternating, one at a time. Reported per mode:
//! median, min and max of created -> Succeeded (this machine's clock, the
//! SkillJob's phase seen through a watch) and the median time the fetch
//! container ran (from the pod's container timestamps, whole seconds).
//!
//! Gated: needs `KUBECONFIG` (a cluster with a Ready node pulling from
//! `127.0.0.1:5000`, and the pod gateway 10.88.0.1 on this machine);
//! prints SKIPPED otherwise. Run: `cargo bench --bench cluster_prepare`.

#[path = "../tests/cluster_prepare/common.rs"]
mod common;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;

use common::*;
use skill_operator::api::SkillJobPhase;

/// Deterministic incompressible bytes (xorshift64*), as in the image_compose bench.
fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Seconds the fetch init container of `uid`'s pod ran, from its timestamps.
fn fetch_secs(pods: &std::collections::HashMap<String, Pod>, uid: &str) -> Option<f64> {
    let pod = pods.values().find(|p| p.labels().get("skill-operator.dev/skilljob-uid").map(String::as_str) == Some(uid))?;
    let fetch = pod.status.as_ref()?.init_container_statuses.iter().flatten().find(|c| c.name == "fetch")?;
    let t = fetch.state.as_ref()?.terminated.as_ref()?;
    let (start, end) = (t.started_at.as_ref()?, t.finished_at.as_ref()?);
    Some((end.0.as_millisecond() - start.0.as_millisecond()) as f64 / 1000.0)
}

struct Row {
    total: Vec<f64>,
    fetch: Vec<f64>,
}

impl Row {
    fn report(&mut self, name: &str) -> f64 {
        let m = median(&mut self.total);
        let f = median(&mut self.fetch);
        println!(
            "{name:<9} created -> Succeeded median {m:.2} s (min {:.2}, max {:.2}, n {}); fetch container median {f:.1} s",
            self.total[0],
            self.total[self.total.len() - 1],
            self.total.len()
        );
        m
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let client = match cluster().await {
        Ok(c) => c,
        Err(why) => return skill_operator::gated::skip("cluster_prepare bench", &why),
    };
    let runs: usize = std::env::var("BENCH_RUNS").ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(7);
    let id = format!("prepare-bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (ns_p, ns_f) = (format!("{id}-p"), format!("{id}-f"));
    let namespaces = vec![id.clone(), ns_p.clone(), ns_f.clone()];
    let _cleanup = Cleanup { namespaces: namespaces.clone(), label: id.clone() };
    install_crds(&client).await;
    for ns in &namespaces {
        create_namespace(&client, ns).await;
    }
    let operator_image = operator_image(&id).await;
    let stack = Stack::start(&client, &id, &operator_image).await;

    let blob = noise(15 * 1024 * 1024);
    let dir = skill("benchskill", "scripts/hello.py", &[("scripts/hello.py", b"print('ok')\n"), ("data/blob.bin", &blob)]);
    let reference = push_package(&id, "benchskill", dir.path()).await;
    let packages: Api<skill_operator::api::SkillPackage> = Api::all(client.clone());
    let runtime = |image: &str, prepare: bool| {
        json!({ "interpreter": "python", "image": image, "interpreterPath": "/usr/bin/python3",
                "allowedScripts": ["scripts/hello.py"], "prepare": prepare })
    };
    let (prepared, fetched) = (format!("{id}-prepared"), format!("{id}-fetched"));
    let base = format!("{REGISTRY}/runtime:trixie");
    packages.create(&PostParams::default(), &package_object(&prepared, &id, &reference, runtime(&base, true))).await.unwrap();
    let done = wait_package(&packages, &prepared, Duration::from_secs(600), "Prepared", |p| is(p, "Prepared") && is(p, "Ready")).await;
    let status = done.status.unwrap();
    // The fetched package runs on exactly the base the prepared image was composed on.
    let pinned = status.base_image.clone().expect("a prepared package names its base by digest");
    packages.create(&PostParams::default(), &package_object(&fetched, &id, &reference, runtime(&pinned, false))).await.unwrap();
    wait_package(&packages, &fetched, Duration::from_secs(120), "Ready", |p| is(p, "Ready")).await;
    println!("prepared image {} on base {pinned}", status.image.clone().unwrap_or_default());
    bind(&client, &ns_p, &id, "benchskill", &prepared).await;
    bind(&client, &ns_f, &id, "benchskill", &fetched).await;
    let pods_p = record(Api::<Pod>::namespaced(client.clone(), &ns_p), watcher::Config::default());
    let pods_f = record(Api::<Pod>::namespaced(client.clone(), &ns_f), watcher::Config::default());

    let once = |ns: String, name: String| {
        let client = client.clone();
        let id = id.clone();
        async move {
            let (sj, took) = run_once(&client, &ns, &id, &name, "benchskill", "scripts/hello.py").await;
            let s = sj.status.clone().unwrap_or_default();
            assert_eq!(s.phase, Some(SkillJobPhase::Succeeded), "{ns}/{name}: {s:#?}");
            (sj.uid().unwrap_or_default(), took)
        }
    };
    let (_, warm_p) = once(ns_p.clone(), "warm".into()).await;
    let (_, warm_f) = once(ns_f.clone(), "warm".into()).await;
    let (mut p, mut f) = (Row { total: vec![], fetch: vec![] }, Row { total: vec![], fetch: vec![] });
    for i in 0..runs {
        for (ns, row, pods) in [(&ns_p, &mut p, &pods_p), (&ns_f, &mut f, &pods_f)] {
            let (uid, took) = once(ns.clone(), format!("run-{i}")).await;
            row.total.push(took);
            // The pod is deleted with the finished Job; the watch kept its last state.
            if let Some(s) = fetch_secs(&pods.lock().unwrap(), &uid) {
                row.fetch.push(s);
            }
        }
    }
    println!("cluster_prepare: 15 MB package, {runs} runs each, alternating; warm-up (image pulls) {warm_p:.2} s prepared, {warm_f:.2} s fetched");
    let mp = p.report("prepared");
    let mf = f.report("fetched");
    println!("saved per run: {:.2} s (prepared/fetched = {:.2})", mf - mp, mp / mf);
    stack.stop(&client, &namespaces, &id).await;
}
