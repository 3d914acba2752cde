//! Building a namespace snapshot from cached packages: 100 SkillBindings
//! over 10 packages (90 of them duplicates, reported), and 100 bindings
//! over 100 packages (100 skills served), against the baseline of `serve`
//! scanning the same skill directories (`Snapshot::scan`). Packages are
//! pushed to a real `docker-registry` on loopback and pulled into the
//! cache once before timing: the rows measure the rebuild a binding
//! change causes, not the pull.
//!
//! Run: `cargo bench --bench gateway_catalog` (needs /usr/bin/docker-registry).
//! `GATEWAY_BENCH_RUNS` (default 30) builds per row; medians reported.

#[path = "../tests/oci/common.rs"]
mod common;

#[path = "support/skills.rs"]
mod skills;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use skill_operator::api::binding::{SkillBinding, SkillBindingSpec, SkillBindingStatus};
use skill_operator::api::conditions::set_condition;
use skill_operator::core::declaration::Interpreter;
use skill_operator::core::grants::Grants;
use skill_operator::gateway::catalog::{CacheOptions, NamespaceCatalog, PackageCache};
use skill_operator::mcp::snapshot::Snapshot;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    if !Path::new(common::REGISTRY_BIN).exists() {
        println!("SKIPPED: gateway_catalog bench: {} not installed", common::REGISTRY_BIN);
        return;
    }
    let runs: usize = std::env::var("GATEWAY_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let reg = rt.block_on(common::TestRegistry::start());
    let skills = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = PackageCache::new(CacheOptions::new(cache_dir.path())).unwrap();

    // 100 packages, each pushed and described as the controller would.
    let mut packages = BTreeMap::new();
    for i in 0..100 {
        let name = format!("skill-{i:03}");
        let dir = skills::skill(skills.path(), &name, "catalog");
        let p = skills::ready_package(&rt, &reg.registry(), reg.reference(&format!("skills/{name}:1")), &dir, &name);
        packages.insert(format!("{name}-1"), p);
    }
    let bindings = |over: usize| -> Vec<SkillBinding> {
        (0..100)
            .map(|i| {
                let mut b = SkillBinding::new(
                    &format!("binding-{i:03}"),
                    SkillBindingSpec {
                        package: format!("skill-{:03}-1", i % over),
                        env: vec![],
                        egress: false,
                        egress_hosts: None,
                        warm: None,
                    },
                );
                // The gateway serves only bindings the controller called Ready.
                let mut status = SkillBindingStatus::default();
                set_condition(&mut status.conditions, "Ready", true, "Bound", "bound", None);
                b.status = Some(status);
                b
            })
            .collect()
    };
    let (ten, hundred) = (bindings(10), bindings(100));
    // Pull everything once: the timed builds find every package cached.
    let warm = rt.block_on(NamespaceCatalog::build("bench", &hundred, &packages, &cache));
    assert_eq!(warm.catalog.skills.len(), 100, "{:?}", warm.problems);
    drop(warm);

    let time = |f: &dyn Fn() -> usize| -> (Duration, usize) {
        let mut out = 0;
        let samples = (0..runs)
            .map(|_| {
                let t = Instant::now();
                out = f();
                t.elapsed()
            })
            .collect();
        (median(samples), out)
    };
    let gw = |b: &[SkillBinding]| rt.block_on(NamespaceCatalog::build("bench", b, &packages, &cache)).catalog.skills.len();
    let roots: Vec<PathBuf> = vec![skills.path().to_path_buf()];
    let (serve, served) = time(&|| Snapshot::scan(&roots, Grants::resolve(&|_| None, None), Interpreter::ALL.into()).catalog.skills.len());
    let (g10, s10) = time(&|| gw(&ten));
    let (g100, s100) = time(&|| gw(&hundred));
    let fp = time(&|| NamespaceCatalog::fingerprint("bench", &hundred, &packages).to_string().len()).0;

    println!("namespace snapshot builds from cached packages, {runs} runs per row, medians");
    println!();
    println!("| case                                              | skills | median (ms) | vs serve scan |");
    println!("|---------------------------------------------------|-------:|------------:|--------------:|");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("| serve: Snapshot::scan of the 100 skill directories | {served:>6} | {:>11.2} | {:>13} |", ms(serve), "1.00x");
    for (label, d, n) in
        [("gateway: 100 bindings over 10 cached packages", g10, s10), ("gateway: 100 bindings over 100 cached packages", g100, s100)]
    {
        println!("| {label:<49} | {n:>6} | {:>11.2} | {:>12.2}x |", ms(d), d.as_secs_f64() / serve.as_secs_f64());
    }
    println!(
        "| fingerprint of 100 bindings                       | {:>6} | {:>11.3} | {:>12.3}x |",
        "-",
        ms(fp),
        fp.as_secs_f64() / serve.as_secs_f64()
    );
    println!();
    println!("cache after the runs: {:?}", cache.stats());
}
