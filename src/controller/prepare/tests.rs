//! The preparation's pure parts (the key, the build's identity, the
//! refusals) and the read-back of a build's outputs against a fake
//! artifact store (the tree checked file by file, tampering refused).

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures::future::BoxFuture;

use super::outputs::{check_content, classify, collect, tail};
use super::plan::wanted;
use super::*;
use crate::api::outcome::{LaunchResult, RunOutcome};
use crate::api::package::{
    DependencyPlanStatus, DependencySource, OciSource, PackageSource, RunResources, RuntimeProfile, SkillPackageSpec,
};
use crate::artifacts::{OutputManifest, SetFile, SkipReason, Skipped};
use crate::controller::context::ArtifactStore;
use crate::image::deps::DepsReport;

const LOCK: &str = "sha256:4444444444444444444444444444444444444444444444444444444444444444";

fn profile() -> RuntimeProfile {
    RuntimeProfile {
        interpreter: Interpreter::Python,
        image: Some("127.0.0.1:5000/runtime:trixie".into()),
        interpreter_path: Some("/usr/bin/python3".into()),
        allowed_scripts: vec!["scripts/a.py".into()],
        allowed_egress: vec![],
        timeout_seconds: Some(60),
        resources: RunResources::default(),
        prepare: true,
        image_mode: None,
        dependencies: Some(DependencySource { pip_index_url: Some("http://10.88.0.1:8999/simple".into()), npm_registry: None }),
    }
}

fn pkg(profile: RuntimeProfile) -> SkillPackage {
    let mut p = SkillPackage::new(
        "weather-1",
        SkillPackageSpec {
            source: PackageSource { oci: OciSource { reference: "r/weather:1".into(), pull_secret: None, insecure: false } },
            runtime: Some(profile),
        },
    );
    p.metadata.generation = Some(1);
    p
}

fn status(python: bool) -> SkillPackageStatus {
    SkillPackageStatus {
        digest: Some("sha256:abc".into()),
        skill_name: Some("weather".into()),
        dependencies: Some(DependencyPlanStatus { lock_digest: python.then(|| LOCK.to_string()), python, node: false, refused: None }),
        ..Default::default()
    }
}

fn config() -> PrepareConfig {
    PrepareConfig {
        repository: Some("127.0.0.1:5000/prepared".into()),
        build_namespace: "skill-system".into(),
        build_platform: Platform::linux("amd64"),
        ..Default::default()
    }
}

#[test]
fn the_key_covers_what_the_image_is_made_of_and_nothing_else() {
    let base = wanted(&pkg(profile()), &status(true), &config()).unwrap();
    // Allowed scripts, timeouts and resources do not change the image.
    let p = RuntimeProfile {
        allowed_scripts: vec![],
        timeout_seconds: Some(5),
        resources: RunResources { cpu: "2".into(), ..Default::default() },
        ..profile()
    };
    let same = wanted(&pkg(p), &status(true), &config()).unwrap();
    assert_eq!(same.key, base.key);
    assert_eq!(same.build, base.build, "the same inputs name the same build");
    // The base, the index, the mode and the package digest do.
    let other_base =
        wanted(&pkg(RuntimeProfile { image: Some("127.0.0.1:5000/python:3.13".into()), ..profile() }), &status(true), &config());
    let other_index = wanted(
        &pkg(RuntimeProfile {
            dependencies: Some(DependencySource { pip_index_url: Some("http://10.88.0.1:9000/simple".into()), npm_registry: None }),
            ..profile()
        }),
        &status(true),
        &config(),
    );
    let other_mode = wanted(&pkg(RuntimeProfile { image_mode: Some(PrepareMode::Composed), ..profile() }), &status(true), &{
        let mut c = config();
        c.image_volumes = Ok(());
        c.mode = PrepareMode::ImageVolume;
        c
    });
    let mut moved = status(true);
    moved.digest = Some("sha256:abd".into());
    let other_package = wanted(&pkg(profile()), &moved, &config());
    for other in [other_base, other_index, other_package] {
        let other = other.unwrap();
        assert_ne!(other.key, base.key);
        assert_ne!(other.build.as_ref().unwrap().name, base.build.as_ref().unwrap().name);
    }
    // The mode changes the image, not the dependency tree (the same build serves both).
    let m = other_mode.unwrap();
    assert_eq!(m.key, base.key, "an explicit composed profile equals the composed default");
}

#[test]
fn the_build_has_a_short_deterministic_identity() {
    let w = wanted(&pkg(profile()), &status(true), &config()).unwrap();
    let b = w.build.unwrap();
    assert!(b.name.starts_with("skillbuild-") && b.name.len() == 23, "{}", b.name);
    assert!(crate::controller::builders::is_dns1123_label(&b.name));
    assert!(b.uid.starts_with("build-") && b.uid.len() == 38);
    crate::artifacts::check_uid(&b.uid).unwrap();
    assert_eq!(b.lock_digest, LOCK);
    assert_eq!(b.pip_index_url.as_deref(), Some("http://10.88.0.1:8999/simple"));
    assert_eq!(w.platforms, vec![Platform::linux("amd64")], "dependencies are installed for the build's platform only");
    assert!(w.tag.starts_with("weather-") && w.tag.len() == "weather-".len() + 12);
}

#[test]
fn a_retry_annotation_names_a_new_build_but_not_a_new_image() {
    let first = wanted(&pkg(profile()), &status(true), &config()).unwrap();
    let mut p = pkg(profile());
    p.metadata.annotations = Some(BTreeMap::from([(crate::api::package::PREPARE_ANNOTATION.to_string(), "retry-1".to_string())]));
    let retry = wanted(&p, &status(true), &config()).unwrap();
    assert_eq!(retry.key, first.key);
    assert_ne!(retry.attempt, first.attempt);
    assert_ne!(retry.build.unwrap().name, first.build.unwrap().name, "a retry must not find the failed Job of the last attempt");
}

#[test]
fn without_dependencies_there_is_no_build_and_every_platform_stays() {
    let w = wanted(&pkg(profile()), &status(false), &config()).unwrap();
    assert!(w.build.is_none());
    assert_eq!(w.platforms, Platform::defaults());
}

#[test]
fn refusals_come_before_anything_runs() {
    let mut c = config();
    c.repository = None;
    assert!(matches!(wanted(&pkg(profile()), &status(true), &c), Err(PrepareError::NoRepository)));
    let no_index = pkg(RuntimeProfile { dependencies: None, ..profile() });
    let e = wanted(&no_index, &status(true), &config()).unwrap_err();
    assert!(matches!(e, PrepareError::NoIndex { .. }) && e.to_string().contains("--pip-index-url"), "{e}");
    // ... unless the controller names one.
    let mut c = config();
    c.pip_index_url = Some("http://10.88.0.1:8999/simple".into());
    assert!(wanted(&no_index, &status(true), &c).is_ok());
    let mut refused = status(true);
    refused.dependencies =
        Some(DependencyPlanStatus { refused: Some("requirements.txt line \"-e .\": options".into()), ..Default::default() });
    assert!(matches!(wanted(&pkg(profile()), &refused, &config()), Err(PrepareError::Refused(_))));
    let volumes = pkg(RuntimeProfile { image_mode: Some(PrepareMode::ImageVolume), ..profile() });
    let e = wanted(&volumes, &status(true), &config()).unwrap_err();
    assert_eq!(e.reason(), "ImageVolumesUnsupported");
}

#[test]
fn the_base_defaults_to_the_interpreter_s() {
    let w = wanted(&pkg(RuntimeProfile { image: None, ..profile() }), &status(false), &config()).unwrap();
    assert_eq!(w.base, "python:3.12-slim");
    let mut c = config();
    c.bases.python = "127.0.0.1:5000/runtime:trixie".into();
    let w = wanted(&pkg(RuntimeProfile { image: None, ..profile() }), &status(false), &c).unwrap();
    assert_eq!(w.base, "127.0.0.1:5000/runtime:trixie");
}

#[test]
fn transient_errors_are_retried_refusals_are_not() {
    let unreachable =
        PrepareError::Artifacts(crate::controller::context::ArtifactError::Unreachable { what: "x".into(), detail: "y".into() });
    assert!(unreachable.is_transient());
    assert!(!PrepareError::NoRepository.is_transient());
    assert!(!PrepareError::Build { reason: "NoWheel", message: "x".into() }.is_transient());
    assert!(!PrepareError::Outputs("tampered".into()).is_transient());
}

// ------------------------------------------------------------- outputs

/// Outputs of one build, as the upload sidecar would have stored them.
#[derive(Default)]
struct FakeOutputs {
    manifest: Option<OutputManifest>,
    files: BTreeMap<String, Vec<u8>>,
    /// Bytes served instead of the stored ones (a tampered store).
    tampered: BTreeMap<String, Vec<u8>>,
    reads: Mutex<Vec<String>>,
}

impl ArtifactStore for FakeOutputs {
    fn stage_package<'a>(&'a self, _: &'a str, _: &'a str, _: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Ok(()) })
    }
    fn delete<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>> {
        Box::pin(async { Ok(()) })
    }
    fn outputs<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<Option<OutputManifest>, ArtifactError>> {
        Box::pin(async { Ok(self.manifest.clone()) })
    }
    fn output_file<'a>(&'a self, _: &'a str, _: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, ArtifactError>> {
        Box::pin(async move {
            self.reads.lock().unwrap().push(path.to_string());
            let got = self.tampered.get(path).or_else(|| self.files.get(path)).cloned();
            got.ok_or_else(|| ArtifactError::Refused { what: path.into(), status: 404, code: None, body: String::new() })
        })
    }
}

fn sha(b: &[u8]) -> String {
    crate::artifacts::sha256_digest(b)
}

/// A successful build of one wheel: result, stderr, report, two files.
fn build_outputs(exit: i32, lock: &str) -> FakeOutputs {
    let result = LaunchResult { outcome: RunOutcome { exit_code: Some(exit), ..Default::default() }, error: None, times: None };
    let report = DepsReport { lock_digest: Some(lock.into()), python: true, node: false, dependencies: vec![], lifecycle_scripts: vec![] };
    let mut files = BTreeMap::new();
    files.insert("result/result.json".to_string(), serde_json::to_vec(&result).unwrap());
    files.insert("result/stderr".to_string(), b"Collecting tinypkg==1.0\nERROR: no wheel of tinypkg==1.0 on the index\n".to_vec());
    files.insert("work/deps-report.json".to_string(), serde_json::to_vec(&report).unwrap());
    files.insert("work/deps/python/tinypkg/__init__.py".to_string(), b"VALUE = 1\n".to_vec());
    files.insert("work/deps/python/tinypkg-1.0.dist-info/METADATA".to_string(), b"Name: tinypkg\nVersion: 1.0\n".to_vec());
    let manifest = OutputManifest {
        schema_version: 1,
        namespace: "skill-system".into(),
        uid: "build-1".into(),
        complete: true,
        files: files.iter().map(|(p, b)| SetFile { path: p.clone(), size: b.len() as u64, digest: sha(b) }).collect(),
        skipped: vec![],
        skipped_omitted: 0,
    };
    FakeOutputs { manifest: Some(manifest), files, ..Default::default() }
}

#[tokio::test]
async fn a_good_build_comes_back_as_a_checked_tree() {
    let store = build_outputs(0, LOCK);
    let c = collect(&store, "skill-system", "build-1", LOCK, None).await.unwrap();
    let tree = c.tree();
    assert_eq!(std::fs::read(tree.join("python/tinypkg/__init__.py")).unwrap(), b"VALUE = 1\n");
    assert!(tree.join("python/tinypkg-1.0.dist-info/METADATA").is_file());
    assert_eq!(c.report.lock_digest.as_deref(), Some(LOCK));
    // Only the tree went to disk: the result and stderr stay out of it.
    assert!(!tree.join("result").exists() && !tree.join("deps-report.json").exists());
}

#[tokio::test]
async fn a_tampered_file_of_the_tree_is_refused() {
    let mut store = build_outputs(0, LOCK);
    store.tampered.insert("work/deps/python/tinypkg/__init__.py".into(), b"import os; os.system('id')\n".to_vec());
    let e = collect(&store, "skill-system", "build-1", LOCK, None).await.unwrap_err();
    assert!(matches!(&e, PrepareError::Outputs(m) if m.contains("tampered")), "{e}");
}

#[tokio::test]
async fn a_tree_for_another_lock_is_refused() {
    let store = build_outputs(0, "sha256:5555555555555555555555555555555555555555555555555555555555555555");
    let e = collect(&store, "skill-system", "build-1", LOCK, None).await.unwrap_err();
    assert!(matches!(&e, PrepareError::Outputs(m) if m.contains("lock")), "{e}");
}

#[tokio::test]
async fn a_path_escaping_the_tree_is_refused() {
    let mut store = build_outputs(0, LOCK);
    let evil = b"x".to_vec();
    let m = store.manifest.as_mut().unwrap();
    m.files.push(SetFile { path: "work/deps/../../etc/x".into(), size: 1, digest: sha(&evil) });
    store.files.insert("work/deps/../../etc/x".into(), evil);
    let e = collect(&store, "skill-system", "build-1", LOCK, None).await.unwrap_err();
    assert!(matches!(e, PrepareError::Outputs(_)), "{e}");
}

#[tokio::test]
async fn an_incomplete_or_clipped_tree_is_refused_but_skipped_links_are_counted() {
    let mut store = build_outputs(0, LOCK);
    store.manifest.as_mut().unwrap().complete = false;
    assert!(matches!(collect(&store, "skill-system", "build-1", LOCK, None).await, Err(PrepareError::Outputs(_))));
    let mut store = build_outputs(0, LOCK);
    store.manifest.as_mut().unwrap().skipped =
        vec![Skipped { path: "work/deps/big.bin".into(), reason: SkipReason::FileTooLarge, size: Some(1 << 30) }];
    let e = collect(&store, "skill-system", "build-1", LOCK, None).await.unwrap_err();
    assert!(e.to_string().contains("not carried"), "{e}");
    let mut store = build_outputs(0, LOCK);
    store.manifest.as_mut().unwrap().skipped =
        vec![Skipped { path: "work/deps/node/node_modules/.bin/x".into(), reason: SkipReason::Symlink, size: None }];
    assert_eq!(collect(&store, "skill-system", "build-1", LOCK, None).await.unwrap().skipped_links, 1);
}

#[tokio::test]
async fn a_failed_build_says_why_with_its_log_tail() {
    let store = build_outputs(1, LOCK);
    let e = collect(&store, "skill-system", "build-1", LOCK, None).await.unwrap_err();
    assert_eq!(e.reason(), "NoWheel");
    assert!(e.to_string().contains("exited 1") && e.to_string().contains("no wheel of tinypkg"), "{e}");
    let e = outputs::failure(&store, "skill-system", "build-1", "skillbuild-x", Some(("PodFailurePolicy".into(), "exit 1".into()))).await;
    assert_eq!(e.reason(), "NoWheel");
    assert!(e.to_string().contains("--- build log (tail) ---"), "{e}");
    let none = FakeOutputs::default();
    let e = outputs::failure(&none, "skill-system", "build-1", "skillbuild-x", Some(("DeadlineExceeded".into(), "too long".into()))).await;
    assert_eq!(e.reason(), "BuildTimedOut");
    assert!(e.to_string().contains("kubectl -n skill-system describe job skillbuild-x"), "{e}");
}

#[test]
fn content_checks_and_log_tails() {
    assert!(check_content("f", b"abc", 3, &sha(b"abc")).is_ok());
    assert!(check_content("f", b"abd", 3, &sha(b"abc")).is_err());
    assert!(check_content("f", b"abc", 4, &sha(b"abc")).is_err());
    let long: String = (0..2000).map(|i| format!("line {i}\n")).collect();
    let t = tail(long.as_bytes());
    assert!(t.len() <= crate::core::limits::BUILD_LOG_TAIL_BYTES);
    assert!(t.starts_with("line ") && t.ends_with("line 1999"), "cut at a line start: {:?}", &t[..20]);
    let timed_out = LaunchResult { outcome: RunOutcome { timed_out: true, ..Default::default() }, error: None, times: None };
    assert_eq!(classify(&timed_out, ""), "BuildTimedOut");
    let failed = LaunchResult { outcome: RunOutcome { exit_code: Some(1), ..Default::default() }, error: None, times: None };
    assert_eq!(classify(&failed, "these dependencies declare install scripts, which are never run: x"), "LifecycleScripts");
    assert_eq!(classify(&failed, "pip failed"), "BuildFailed");
}
