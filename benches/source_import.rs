//! Importing a 300-skill repository through a SkillSource, against a real
//! API server: the `skill-operator controller` binary in its own process
//! (so its memory is its own), a Debian `docker-registry` it pushes to and
//! pulls from, and `git daemon` serving the repository on loopback. Gated
//! like the envtest suites (`KUBEBUILDER_ASSETS`, docker-registry, git
//! daemon); prints SKIPPED otherwise. Run: `cargo bench --bench source_import`.
//!
//! Each round imports a different commit (every skill's files differ, so
//! every package is pushed anew) under a new SkillSource, and times:
//! - published: from the create call's return to the source's `Ready` with
//!   all skills in `status.skills` (fetched, cut, pushed, SkillPackages made);
//! - all Ready: to the moment every one of its SkillPackages is Ready (each
//!   pulled back and checked by the package reconciler).
//!
//! Then it deletes the round's packages and waits until they are gone. Peak
//! controller memory is its VmHWM at the end of all rounds.
//!
//! Knobs: `SKILLS` (default 300), `ROUNDS` (default 5).

#[allow(dead_code)]
#[path = "../tests/envtest/harness.rs"]
mod harness;
#[path = "../tests/oci/common.rs"]
mod oci_common;
#[path = "../tests/source/repo.rs"]
mod repo_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, ListParams};
use serde_json::json;
use skill_operator::api::source::{SkillSource, SOURCE_LABEL};
use skill_operator::api::SkillPackage;

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        .unwrap_or(0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A bare repository with one branch per round: `skills` skills in
/// category folders (`skills/<category>/<name>`), each with a script and a
/// reference file that name the round.
fn repository(dir: &Path, skills: usize, rounds: usize) {
    assert!(Command::new("git").args(["init", "-q", "--bare"]).arg(dir).status().unwrap().success());
    repo_support::fast_import(dir, |w| {
        let inline = |w: &mut dyn std::io::Write, path: &str, text: &str| {
            writeln!(w, "M 100644 inline {path}\ndata {}\n{text}", text.len()).unwrap();
        };
        for round in 0..rounds {
            writeln!(w, "commit refs/heads/r{round}\ncommitter t <t@example.invalid> 1767225600 +0000\ndata 1\nx").unwrap();
            inline(w, "LICENSE", "MIT License\n");
            for i in 0..skills {
                let name = format!("skill-{i:04}");
                let dir = format!("skills/cat-{}/{name}", i % 12);
                let md = format!(
                    "---\nname: {name}\ndescription: Skill {i} of the import benchmark, round {round}. Use it when asked about {name}.\nlicense: MIT\n---\n# {name}\n\nRun `scripts/run.py`.\n"
                );
                inline(w, &format!("{dir}/SKILL.md"), &md);
                inline(w, &format!("{dir}/scripts/run.py"), &format!("print('{name} {round}')\n"));
                inline(w, &format!("{dir}/references/notes.md"), &format!("{}\n", "notes ".repeat(200)));
            }
            writeln!(w).unwrap();
        }
    });
}

async fn wait_for<T, F, Fut>(mut probe: F, what: &str, limit: Duration) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let quick = !std::env::args().any(|a| a == "--bench");
    let Some(assets) = harness::assets() else {
        println!("SKIPPED: set KUBEBUILDER_ASSETS to run the source import benchmark");
        return;
    };
    for (bin, what) in [(oci_common::REGISTRY_BIN, "docker-registry"), ("/usr/lib/git-core/git-daemon", "git daemon")] {
        if !Path::new(bin).exists() {
            println!("SKIPPED: {what} is not installed ({bin})");
            return;
        }
    }
    let skills = env_or("SKILLS", if quick { 20 } else { 300 });
    let rounds = env_or("ROUNDS", if quick { 1 } else { 5 });
    let bin = env!("CARGO_BIN_EXE_skill-operator");

    let base = tempfile::tempdir().unwrap();
    repository(&base.path().join("repo"), skills, rounds);
    let git_port = free_port();
    let _daemon = Process(
        repo_support::git_daemon_command()
            .args(["--export-all", "--reuseaddr", "--listen=127.0.0.1", &format!("--port={git_port}")])
            .arg(format!("--base-path={}", base.path().display()))
            .arg(base.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let registry = oci_common::TestRegistry::start().await;
    let env = harness::Envtest::start(&assets).await;
    let client = env.client.clone();
    harness::install_crds(&client).await;
    harness::create_namespace(&client, "skill-system", false).await;

    let key = base.path().join("token-key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let metrics_port = free_port();
    let controller = Process(
        Command::new(bin)
            .args(["controller", "--listen", &format!("127.0.0.1:{metrics_port}")])
            .args(skill_operator::gated::CONTROLLER_WITHOUT_CLUSTER)
            .args([
                "--operator-image",
                "registry.local/skill-operator@sha256:0000000000000000000000000000000000000000000000000000000000000000",
            ])
            .args(["--artifact-endpoint", "http://127.0.0.1:9"])
            .args(["--operator-namespace", "skill-system"])
            .arg("--token-key-file")
            .arg(&key)
            .args(["--plain-http-registry", &registry.addr])
            .args(["--source-repository", &format!("{}/sources", registry.addr)])
            .env("KUBECONFIG", &env.kubeconfig)
            .env("SKILL_OPERATOR_LOG", std::env::var("CONTROLLER_LOG").unwrap_or_else(|_| "warn".into()))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = controller.0.id();
    let ready = format!("http://127.0.0.1:{metrics_port}/readyz");
    wait_for(|| async { reqwest::get(&ready).await.ok().filter(|r| r.status().is_success()) }, "the controller", Duration::from_secs(60))
        .await;
    let idle = status_kib(pid, "VmRSS:");

    let sources: Api<SkillSource> = Api::all(client.clone());
    let packages: Api<SkillPackage> = Api::all(client.clone());
    let (mut published, mut all_ready) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let name = format!("import-{round}");
        let object: SkillSource = serde_json::from_value(json!({
            "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillSource", "metadata": { "name": name },
            "spec": { "git": { "url": format!("git://127.0.0.1:{git_port}/repo"), "ref": format!("r{round}") } }
        }))
        .unwrap();
        sources.create(&Default::default(), &object).await.unwrap();
        let started = Instant::now();
        let limit = Duration::from_secs(600);
        wait_for(
            || async {
                let s = sources.get(&name).await.ok()?.status?;
                (s.skill_count as usize == skills && harness::ready(&s.conditions).is_some()).then_some(())
            },
            "the source published",
            limit,
        )
        .await;
        published.push(started.elapsed().as_secs_f64());
        let selector = ListParams::default().labels(&format!("{SOURCE_LABEL}={name}"));
        wait_for(
            || async {
                let list = packages.list(&selector).await.ok()?;
                let ready = list.items.iter().filter(|p| p.status.as_ref().is_some_and(|s| harness::ready(&s.conditions).is_some()));
                (ready.count() == skills).then_some(())
            },
            "every package Ready",
            limit,
        )
        .await;
        all_ready.push(started.elapsed().as_secs_f64());
        println!(
            "round {round}: {skills} skills published in {:.2} s, all Ready in {:.2} s",
            published.last().unwrap(),
            all_ready.last().unwrap()
        );
        // No garbage collector here (no kube-controller-manager): delete the
        // packages, then the source.
        packages.delete_collection(&DeleteParams::default(), &selector).await.unwrap();
        wait_for(|| async { packages.list(&selector).await.ok()?.items.is_empty().then_some(()) }, "the packages gone", limit).await;
        sources.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    let hwm = status_kib(pid, "VmHWM:");
    println!(
        "source import of {skills} skills over {rounds} rounds: published median {:.2} s, all SkillPackages Ready median {:.2} s (goal <= 15 s); controller RSS idle {:.1} MiB, peak (VmHWM) {:.1} MiB (goal <= 100 MiB)",
        median(published),
        median(all_ready),
        idle as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
}
