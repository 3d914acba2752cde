//! Gated real-cluster suite for prepared run images: a package with a
//! `requirements.txt` whose wheel comes from an index this test serves on
//! the pod network's gateway, prepared on a real kubelet and then run from
//! the prepared digest with no package fetch.
//!
//! What runs for real: the kube-apiserver and kubelet of the cluster
//! `KUBECONFIG` names (Pod Security `restricted` enforced on the test's
//! namespace), containerd pulling from the plain-HTTP registry on
//! `127.0.0.1:5000`, the operator image made from this build's binary with
//! `image self`, the artifact endpoint and the controller as host tasks of
//! this test (pods reach them at 10.88.0.1), and `python3 -m http.server`
//! as the package index. The base is the cluster's `runtime:trixie` plus a
//! pip layer this test composes itself (that base has no pip).
//!
//! Checked: the build Job has every restricted and hardening field and its
//! pod is admitted and succeeds; its NetworkPolicy allows the endpoint and
//! the index only; the package moves Preparing -> Prepared with the image
//! pinned by digest, the base, lock and SBOM digests; the image verifies
//! blob by blob; a SkillJob then runs from that digest (the fetch container
//! gets no `--package`, nothing is staged for it) and imports the wheel.
//!
//! The helpers it shares with `benches/cluster_prepare.rs` (which times a
//! prepared run against a fetched one) are in `cluster_prepare/common.rs`.
//!
//! Gated: prints SKIPPED (fails with SKILL_OPERATOR_REQUIRE_GATED=1) when
//! the cluster, the registry or the gateway address is missing. It creates
//! namespaces and repositories named `prepare-<random>` and removes the
//! namespaces and its SkillPackages at the end (a guard does it on panic
//! too); registry repositories stay (the registry has no delete).

#[path = "cluster_prepare/common.rs"]
mod common;

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher;
use kube::ResourceExt;
use serde_json::json;
use sha2::{Digest, Sha256};

use common::*;
use skill_operator::api::{SkillJobPhase, SkillPackage};
use skill_operator::controller::builders::{hardening_violations, restricted_template_violations, restricted_violations};
use skill_operator::controller::context::ArtifactStore;
use skill_operator::image::layer::{self, LayerOptions};
use skill_operator::image::{compose, BaseSpec, ComposeSpec, Platform, Remote};

/// `python3 -m http.server` on the gateway: the package index.
struct Index {
    url: String,
    child: Child,
}

impl Drop for Index {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve_index(root: &Path) -> Index {
    let port = std::net::TcpListener::bind((GATEWAY, 0)).unwrap().local_addr().unwrap().port();
    let child = Command::new("python3")
        .args(["-m", "http.server", &port.to_string(), "--bind", GATEWAY, "--directory"])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
    let deadline = Instant::now() + Duration::from_secs(15);
    while TcpStream::connect((GATEWAY, port)).is_err() {
        assert!(Instant::now() < deadline, "the index did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Index { url: format!("http://{GATEWAY}:{port}/simple"), child }
}

/// A pure-Python wheel (PEP 427) written by hand.
fn write_wheel(dir: &Path, name: &str, version: &str) {
    let dist = format!("{name}-{version}.dist-info");
    let files: Vec<(String, String)> = vec![
        (format!("{name}/__init__.py"), format!("VALUE = {:?}\n", format!("{name} {version}"))),
        (format!("{dist}/METADATA"), format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")),
        (format!("{dist}/WHEEL"), "Wheel-Version: 1.0\nGenerator: skill-operator-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n".into()),
    ];
    let mut record = String::new();
    for (p, c) in &files {
        let h = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(c.as_bytes()));
        record.push_str(&format!("{p},sha256={h},{}\n", c.len()));
    }
    record.push_str(&format!("{dist}/RECORD,,\n"));
    let mut z = zip::ZipWriter::new(std::fs::File::create(dir.join(format!("{name}-{version}-py3-none-any.whl"))).unwrap());
    for (p, c) in files.iter().chain(std::iter::once(&(format!("{dist}/RECORD"), record))) {
        z.start_file(p.as_str(), zip::write::SimpleFileOptions::default()).unwrap();
        z.write_all(c.as_bytes()).unwrap();
    }
    z.finish().unwrap();
}

/// The newest pip wheel on this machine (`PREP_PIP_WHEEL` overrides).
fn pip_wheel() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PREP_PIP_WHEEL") {
        return Some(PathBuf::from(p));
    }
    let out = Command::new("python3").args(["-c", "import ensurepip, os; print(os.path.dirname(ensurepip.__file__))"]).output().ok()?;
    let mut dirs =
        vec![PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("_bundled"), PathBuf::from("/usr/share/python-wheels")];
    if let Ok(versions) = std::fs::read_dir("/root/.pyenv/versions") {
        for v in versions.flatten() {
            if let Ok(libs) = std::fs::read_dir(v.path().join("lib")) {
                dirs.extend(libs.flatten().map(|l| l.path().join("ensurepip/_bundled")));
            }
        }
    }
    let version = |p: &Path| -> Vec<u32> {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        name.trim_start_matches("pip-").split('-').next().unwrap_or("").split('.').filter_map(|x| x.parse().ok()).collect()
    };
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|r| r.flatten().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("pip-") && n.ends_with(".whl")))
        .max_by_key(|p| version(p))
}

/// runtime:trixie + pip (unpacked into /usr/lib/python3/dist-packages,
/// which Debian's python3 reads), composed and pushed by this test.
async fn base_with_pip(id: &str) -> String {
    let wheel = pip_wheel().expect("a pip wheel (ensurepip's, or PREP_PIP_WHEEL) to put pip into the test base");
    let root = tempfile::tempdir().unwrap();
    let site = root.path().join("usr/lib/python3/dist-packages");
    std::fs::create_dir_all(&site).unwrap();
    zip::ZipArchive::new(std::fs::File::open(&wheel).unwrap()).unwrap().extract(&site).unwrap();
    let dir = root.path().to_path_buf();
    let layer =
        tokio::task::spawn_blocking(move || layer::from_dir(&dir, "", &[], "test: pip", &LayerOptions::default()).unwrap()).await.unwrap();
    let remote = Remote::new(registry_options()).unwrap();
    let mut spec = ComposeSpec::new(BaseSpec::Image(format!("{REGISTRY}/runtime:trixie")), format!("{REGISTRY}/{id}/base"));
    spec.platforms = vec![Platform::linux("amd64")];
    spec.tag = Some("pip".into());
    spec.layers = vec![&layer];
    spec.sbom = None;
    let handle = tokio::runtime::Handle::current();
    // The composer's future is not Send: drive it on a thread of its own.
    let composed = std::thread::scope(|s| s.spawn(|| handle.block_on(compose(&remote, &spec))).join().unwrap()).unwrap();
    println!("test base with pip {}: {}", wheel.display(), composed.reference);
    composed.reference
}
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_package_is_prepared_on_the_node_and_runs_from_its_digest() {
    let client = match cluster().await {
        Ok(c) => c,
        Err(why) => return skill_operator::gated::skip("cluster_prepare", &why),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
    let id = format!("prepare-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let namespaces = vec![id.clone()];
    let _cleanup = Cleanup { namespaces: namespaces.clone(), label: id.clone() };
    let mut passed = 0;

    install_crds(&client).await;
    for ns in &namespaces {
        create_namespace(&client, ns).await;
    }
    let (operator_image, base) = tokio::join!(operator_image(&id), base_with_pip(&id));

    // The index: one wheel.
    let index_root = tempfile::tempdir().unwrap();
    let project = index_root.path().join("simple/tinypkg");
    std::fs::create_dir_all(&project).unwrap();
    write_wheel(&project, "tinypkg", "1.0");
    let index = serve_index(index_root.path());

    // The artifact endpoint and the controller, scoped to this test's objects.
    let stack = Stack::start(&client, &id, &operator_image).await;
    println!("image volumes on this cluster: {:?}", stack.image_volumes);
    let artifacts = stack.artifacts.clone();

    // ---- preparation: Preparing -> Prepared, on the node.
    let jobs_seen = record(Api::<Job>::namespaced(client.clone(), &id), watcher::Config::default());
    let pods_seen = record(Api::<Pod>::namespaced(client.clone(), &id), watcher::Config::default());
    let script = "import os, sys, tinypkg\nprint(tinypkg.VALUE)\nprint('PYTHONPATH=' + os.environ.get('PYTHONPATH', ''))\nprint('from ' + os.path.dirname(os.path.abspath(__file__)))\nprint('package dir present: ' + str(os.path.exists('/package')))\n";
    let dir = skill(
        "tinyuse",
        "scripts/run.py",
        &[("requirements.txt", b"# the test's wheel\ntinypkg==1.0\n"), ("scripts/run.py", script.as_bytes())],
    );
    let reference = push_package(&id, "tinyuse", dir.path()).await;
    let packages: Api<SkillPackage> = Api::all(client.clone());
    let pkg_name = format!("{id}-tinyuse");
    let runtime = json!({ "interpreter": "python", "image": base, "interpreterPath": "/usr/bin/python3",
                          "allowedScripts": ["scripts/run.py"], "prepare": true,
                          "dependencies": { "pipIndexUrl": index.url } });
    packages.create(&PostParams::default(), &package_object(&pkg_name, &id, &reference, runtime)).await.unwrap();
    let preparing = wait_package(&packages, &pkg_name, Duration::from_secs(120), "Preparing=True", |p| is(p, "Preparing")).await;
    let (_, reason, message) = condition(&preparing, "Preparing").unwrap();
    println!("Preparing: {reason}: {message}");
    assert!(!is(Some(&preparing), "Ready"), "not ready while preparing");
    let build_job = preparing.status.as_ref().unwrap().preparation.as_ref().unwrap().build_job.clone().unwrap();
    let build_name = build_job.split('/').nth(1).unwrap().to_string();
    // The build Job and its children as the API server holds them.
    let job = Api::<Job>::namespaced(client.clone(), &id).get(&build_name).await.expect("the build Job exists while preparing");
    let template = &job.spec.as_ref().unwrap().template;
    assert_eq!(restricted_violations(template.spec.as_ref().unwrap()), Vec::<String>::new());
    assert_eq!(restricted_template_violations(template), Vec::<String>::new());
    assert_eq!(hardening_violations(template.spec.as_ref().unwrap()), Vec::<String>::new());
    let policy = Api::<NetworkPolicy>::namespaced(client.clone(), &id).get(&build_name).await.unwrap();
    let egress = serde_json::to_value(&policy.spec.as_ref().unwrap().egress).unwrap();
    assert_eq!(egress.as_array().unwrap().len(), 2, "endpoint and index only: {egress}");
    assert_eq!(egress[1]["to"][0]["ipBlock"]["cidr"], format!("{GATEWAY}/32"));
    Api::<Secret>::namespaced(client.clone(), &id).get(&format!("{build_name}-token")).await.expect("the build's token Secret");
    passed += 1;

    let done = wait_package(&packages, &pkg_name, Duration::from_secs(480), "Prepared or PreparationFailed", |p| {
        is(p, "Prepared") || is(p, "PreparationFailed")
    })
    .await;
    if let Some((_, reason, message)) = condition(&done, "PreparationFailed").filter(|(s, _, _)| s == "True") {
        panic!("the preparation failed: {reason}: {message}");
    }
    let status = done.status.clone().unwrap();
    let image = status.image.clone().unwrap();
    println!(
        "Prepared: {image}\n  mode {:?}, base {:?}, lock {:?}, sbom {:?}",
        status.image_mode, status.base_image, status.lock_digest, status.sbom_digest
    );
    assert!(image.starts_with(&format!("{REGISTRY}/{id}/prepared@sha256:")), "{image}");
    assert_eq!(status.image_mode, Some(skill_operator::api::package::ImageMode::Composed));
    assert!(status.base_image.as_deref().is_some_and(|b| b.contains("@sha256:")));
    assert!(status.base_digest.is_some() && status.sbom_digest.is_some());
    assert_eq!(status.lock_digest, status.dependencies.as_ref().and_then(|d| d.lock_digest.clone()));
    assert_eq!(status.preparation.as_ref().unwrap().env, vec!["PYTHONPATH=/deps/python".to_string()]);
    assert!(is(Some(&done), "Ready"), "{:#?}", status.conditions);
    // The build pod ran on the node and succeeded, with every restricted field.
    let pods = pods_seen.lock().unwrap().clone();
    let build_pod = pods
        .values()
        .find(|p| p.labels().get("skill-operator.dev/build") == Some(&build_name))
        .unwrap_or_else(|| panic!("no build pod was seen: {:?}", pods.keys()));
    let pod_status = build_pod.status.as_ref().unwrap();
    println!(
        "build pod {} on {:?}: {:?}",
        build_pod.name_any(),
        build_pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        pod_status.phase
    );
    let build_exit = pod_status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "build")
        .and_then(|c| c.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code));
    assert_eq!(build_exit, Some(0), "{pod_status:#?}");
    assert_eq!(restricted_violations(build_pod.spec.as_ref().unwrap()), Vec::<String>::new());
    // The image, read back blob by blob.
    let verified = skill_operator::image::verify(&Remote::new(registry_options()).unwrap(), &image).await.unwrap();
    println!("verified {} manifest(s), {} layers, {} bytes", verified.manifests, verified.layers, verified.bytes);
    // The finished build is cleaned up.
    let gone = await_condition(Api::<Job>::namespaced(client.clone(), &id), &build_name, |j: Option<&Job>| j.is_none());
    tokio::time::timeout(Duration::from_secs(60), gone).await.expect("the build Job is deleted after the compose").unwrap();
    passed += 1;

    // ---- a run from the prepared digest, with no package fetch.
    bind(&client, &id, &id, "tinyuse", &pkg_name).await;
    let (sj, took) = run_once(&client, &id, &id, "run-1", "tinyuse", "scripts/run.py").await;
    let s = sj.status.clone().unwrap();
    assert_eq!(s.phase, Some(SkillJobPhase::Succeeded), "{s:#?}");
    let uid = sj.uid().unwrap();
    let stdout = String::from_utf8(artifacts.output_file(&id, &uid, "result/stdout").await.unwrap()).unwrap();
    println!("run-1 ({took:.1} s) stdout:\n{stdout}");
    assert!(stdout.contains("tinypkg 1.0"), "the wheel from the index is importable: {stdout}");
    assert!(stdout.contains("PYTHONPATH=/deps/python"), "from the image config: {stdout}");
    assert!(stdout.contains("from /skill/scripts"), "the script ran from the image: {stdout}");
    assert!(stdout.contains("package dir present: False"), "no fetched package beside the image: {stdout}");
    let run_job = jobs_seen.lock().unwrap().get(s.job_name.as_deref().unwrap()).cloned().expect("the run's Job was seen");
    let run_pod = run_job.spec.as_ref().unwrap().template.spec.clone().unwrap();
    assert_eq!(restricted_violations(&run_pod), Vec::<String>::new());
    let run = run_pod.containers.iter().find(|c| c.name == "run").unwrap();
    assert_eq!(run.image.as_deref(), Some(image.as_str()), "the run starts from the prepared digest");
    let fetch = run_pod.init_containers.iter().flatten().find(|c| c.name == "fetch").unwrap();
    assert!(!fetch.command.iter().flatten().any(|a| a == "--package"), "no package fetch: {:?}", fetch.command);
    let package_volume = skill_operator::controller::builders::job::VOL_PACKAGE;
    assert!(!run_pod.volumes.iter().flatten().any(|v| v.name == package_volume), "no package volume: {:?}", run_pod.volumes);
    assert!(
        !run_pod
            .init_containers
            .iter()
            .flatten()
            .chain(&run_pod.containers)
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .any(|m| m.mount_path == "/package"),
        "nothing mounted at /package"
    );
    let tags: serde_json::Value = reqwest::get(format!("http://{REGISTRY}/v2/{id}/jobs/tags/list")).await.unwrap().json().await.unwrap();
    let staged = format!("job_{id}_{uid}_package");
    assert!(!tags["tags"].as_array().into_iter().flatten().any(|t| t == &json!(staged)), "nothing staged for the run: {tags}");
    passed += 1;

    // ---- cleanup while the controller still runs (it removes the finalizers).
    stack.stop(&client, &namespaces, &id).await;
    drop(index);
    println!("cluster_prepare: {passed} passed, 0 failed");
}
