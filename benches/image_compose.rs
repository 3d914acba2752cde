//! Composing a run image: wall time and peak RSS of `skill-operator image
//! compose` (the release binary, as its own process, so the peak RSS is
//! its own: `wait4`'s `ru_maxrss`) for a 15 MB package plus a 50 MB
//! dependency layer onto a small base in a real `docker-registry` on
//! loopback, then the same at 2× the sizes (memory must stay flat: the
//! layers are spooled and streamed), then the cache-hit path (unchanged
//! inputs: zero registry writes). Contents are pseudo-random, so gzip
//! cannot shrink them: the worst case for I/O.
//!
//! Run: `cargo bench --bench image_compose` (needs /usr/bin/docker-registry).
//! `IMAGE_BENCH_RUNS` (default 5) runs per row; medians reported.
//! `IMAGE_BENCH_SCALES` (default `1,2`): size multipliers to run;
//! `IMAGE_BENCH_MANY_FILES` (default 20000, 0 to skip): a row with the 50 MB
//! of dependencies in that many files.

#[path = "../tests/image/common.rs"]
mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use skill_operator::image::layer::{self, LayerOptions};
use skill_operator::image::{compose, BaseSpec, ComposeSpec, Platform};

const BIN: &str = env!("CARGO_BIN_EXE_skill-operator");
const MIB: usize = 1024 * 1024;
/// The goal from the issue.
const RSS_GOAL_MIB: f64 = 64.0;

/// Deterministic incompressible bytes (xorshift64*).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
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

/// A skill tree of `mib` MiB in 512 KiB files.
fn package(dir: &Path, mib: usize) {
    std::fs::write(dir.join("SKILL.md"), "---\nname: bench\ndescription: benchmark skill\n---\n").unwrap();
    std::fs::create_dir_all(dir.join("data")).unwrap();
    for i in 0..mib * 2 {
        std::fs::write(dir.join(format!("data/f{i:04}.bin")), noise(i as u64 + 1, MIB / 2)).unwrap();
    }
}

/// A dependency tree of `mib` MiB in `files` files, half Python, half npm,
/// 20 files per package directory.
fn deps(dir: &Path, mib: usize, files: usize) {
    let size = mib * MIB / files;
    for i in 0..files {
        let sub = if i % 2 == 0 { format!("python/pkg{:04}", i / 20) } else { format!("node/node_modules/mod{:04}", i / 20) };
        std::fs::create_dir_all(dir.join(&sub)).unwrap();
        std::fs::write(dir.join(sub).join(format!("m{i:06}.bin")), noise(1_000_000 + i as u64, size)).unwrap();
    }
}

struct Run {
    secs: f64,
    rss_mib: f64,
    writes: u64,
    uploaded_mib: f64,
}

/// One `image compose` process; its own peak RSS from `wait4`.
// The child is reaped by `wait4` (which also gives its peak RSS), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
fn compose_process(registry: &str, base: &str, repo: &str, pkg: &Path, deps: &Path, spool: &Path) -> Run {
    let start = Instant::now();
    let mut child = Command::new(BIN)
        .args(["image", "compose", "--plain-http", "--json", "--platform", "linux/amd64"])
        .args(["--base", base, "--registry", &format!("{registry}/{repo}"), "--tag", "run"])
        .arg("--package")
        .arg(pkg)
        .arg("--deps")
        .arg(deps)
        .arg("--spool-dir")
        .arg(spool)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the release binary");
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our own un-reaped child; pointers are to locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    let secs = start.elapsed().as_secs_f64();
    assert!(pid > 0 && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "image compose failed (status {status}): {out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let u = &v["uploads"];
    let writes = ["blobsMounted", "blobsCopied", "blobsUploaded", "manifestsPushed"].iter().map(|k| u[k].as_u64().unwrap()).sum();
    Run { secs, rss_mib: ru.ru_maxrss as f64 / 1024.0, writes, uploaded_mib: u["bytesUploaded"].as_u64().unwrap() as f64 / MIB as f64 }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn row(name: &str, runs: &[Run]) -> (f64, f64) {
    let t = median(runs.iter().map(|r| r.secs).collect());
    let rss = median(runs.iter().map(|r| r.rss_mib).collect());
    let max_rss = runs.iter().map(|r| r.rss_mib).fold(0.0, f64::max);
    let writes = median(runs.iter().map(|r| r.writes as f64).collect());
    let up = median(runs.iter().map(|r| r.uploaded_mib).collect());
    println!("| {name:<52} | {:>4} | {t:>8.2} | {rss:>8.1} | {max_rss:>8.1} | {writes:>6} | {up:>8.1} |", runs.len());
    (t, max_rss)
}

fn main() {
    if !Path::new(common::REGISTRY_BIN).exists() {
        println!("SKIPPED: image_compose bench: {} not installed", common::REGISTRY_BIN);
        return;
    }
    // `cargo test --all-targets` runs this without --bench: one small pass then.
    let quick = !std::env::args().any(|a| a == "--bench");
    let runs: usize = std::env::var("IMAGE_BENCH_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(if quick { 1 } else { 5 });
    let rt = tokio::runtime::Runtime::new().unwrap();
    let reg = rt.block_on(common::TestRegistry::start());

    // A small base: one 1 MiB layer on the empty base, pushed in-process.
    let base_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(base_dir.path().join("usr/lib")).unwrap();
    std::fs::write(base_dir.path().join("usr/lib/base.bin"), noise(7, MIB)).unwrap();
    let base_layer = layer::from_dir(base_dir.path(), "", &[], "bench base", &LayerOptions::default()).unwrap();
    let base = rt.block_on(async {
        let mut s = ComposeSpec::new(BaseSpec::Empty { platform: Platform::linux("amd64") }, reg.reference("bench/base"));
        s.tag = Some("1".into());
        s.layers = vec![&base_layer];
        compose(&reg.remote(), &s).await.unwrap().reference
    });

    println!("image compose (release binary, own process), {runs} runs per row, medians; base {base}");
    println!();
    println!("| case                                                 | runs | time (s) | RSS (MiB) | max RSS | writes | up (MiB) |");
    println!("|------------------------------------------------------|-----:|---------:|----------:|--------:|-------:|---------:|");
    let spool = tempfile::tempdir().unwrap();
    let mut worst_rss: f64 = 0.0;
    let scales: Vec<usize> = std::env::var("IMAGE_BENCH_SCALES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| if quick { vec![1] } else { vec![1, 2] });
    let many: usize = std::env::var("IMAGE_BENCH_MANY_FILES").ok().and_then(|s| s.parse().ok()).unwrap_or(if quick { 0 } else { 20_000 });
    // (scale, deps file count): 100 KiB files, then one row of many small
    // files (memory grows with the file count, not the bytes).
    let mut cases: Vec<(usize, usize)> = scales.iter().map(|&s| (s, s * 500)).collect();
    if many > 0 {
        cases.push((1, many));
    }
    for (scale, files) in cases {
        let label = format!("{} MB package + {} MB deps in {files} files, first", 15 * scale, 50 * scale);
        let (pkg, dep) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        package(pkg.path(), 15 * scale);
        deps(dep.path(), 50 * scale, files);
        let mut first = Vec::new();
        for i in 0..runs {
            // A fresh repository each time: every new layer is uploaded.
            first.push(compose_process(&reg.addr, &base, &format!("bench/s{scale}-f{files}-r{i}"), pkg.path(), dep.path(), spool.path()));
        }
        worst_rss = worst_rss.max(row(&label, &first).1);
        let mut hit = Vec::new();
        for _ in 0..runs {
            let r = compose_process(&reg.addr, &base, &format!("bench/s{scale}-f{files}-r0"), pkg.path(), dep.path(), spool.path());
            assert_eq!(r.writes, 0, "an unchanged compose must write nothing");
            hit.push(r);
        }
        worst_rss = worst_rss.max(row("  same inputs again (cache hit: zero writes)", &hit).1);
    }
    println!();
    let verdict = if worst_rss <= RSS_GOAL_MIB { "met" } else { "NOT met" };
    println!("peak RSS goal <= {RSS_GOAL_MIB} MiB: {verdict} (worst {worst_rss:.1} MiB)");
}
