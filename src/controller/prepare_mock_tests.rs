//! The preparation's request sequences against the mock API server: the
//! build Job is created once (and a restarted controller finds it), a
//! finished build is composed once and cleaned up, a failed one records
//! why and keeps the last good image, a package without dependencies is
//! composed with no Job at all, and a SkillJob of a prepared package runs
//! from the image with no package staged.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use futures::future::BoxFuture;

use super::*;
use crate::api::package::SkillPackage;
use crate::artifacts::{OutputManifest, SetFile};
use crate::controller::context::{ArtifactError, ArtifactStore};
use crate::controller::package;
use crate::controller::prepare::{ComposeRequest, ImageService, PrepareConfig, PrepareError, PreparedImage};

const PKG_UID: &str = "99999999-8888-7777-6666-555555555555";
const LOCK: &str = "sha256:4444444444444444444444444444444444444444444444444444444444444444";
const BASE_PINNED: &str = "127.0.0.1:5000/runtime@sha256:2222222222222222222222222222222222222222222222222222222222222222";
const IMAGE: &str = "127.0.0.1:5000/prepared@sha256:1111111111111111111111111111111111111111111111111111111111111111";
const OLD_IMAGE: &str = "127.0.0.1:5000/prepared@sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Counts what the preparation asked of the registry.
#[derive(Default)]
struct FakeImages {
    pins: AtomicUsize,
    composes: AtomicUsize,
    checks: AtomicUsize,
    /// (base, had deps) of each compose.
    seen: Mutex<Vec<(String, bool)>>,
}

impl ImageService for FakeImages {
    fn pin<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<String, PrepareError>> {
        self.pins.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(BASE_PINNED.to_string()) })
    }
    fn compose(&self, req: ComposeRequest) -> BoxFuture<'_, Result<PreparedImage, PrepareError>> {
        self.composes.fetch_add(1, Ordering::SeqCst);
        let has_deps = req.deps.as_ref().is_some_and(|(dir, _)| dir.join("python/tinypkg/__init__.py").is_file());
        self.seen.lock().unwrap().push((req.base.clone(), has_deps));
        Box::pin(async move {
            Ok(PreparedImage {
                reference: IMAGE.into(),
                base_image: BASE_PINNED.into(),
                base_digest: Some("sha256:2222222222222222222222222222222222222222222222222222222222222222".into()),
                sbom_digest: Some("sha256:3333333333333333333333333333333333333333333333333333333333333333".into()),
                env: if has_deps { vec!["PYTHONPATH=/deps/python".into()] } else { vec![] },
                writes: 5,
            })
        })
    }
    fn check_package<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<(), PrepareError>> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
}

/// Records staging and deletes; serves one build's outputs.
#[derive(Default)]
struct FakeArtifacts {
    staged: Mutex<Vec<String>>,
    deleted: Mutex<Vec<String>>,
    outputs: Option<(OutputManifest, BTreeMap<String, Vec<u8>>)>,
}

impl ArtifactStore for FakeArtifacts {
    fn stage_package<'a>(&'a self, ns: &'a str, uid: &'a str, _: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>> {
        self.staged.lock().unwrap().push(format!("{ns}/{uid}"));
        Box::pin(async { Ok(()) })
    }
    fn stage_namespace_package<'a>(&'a self, ns: &'a str, digest: &'a str, _: Vec<u8>) -> BoxFuture<'a, Result<(), ArtifactError>> {
        self.staged.lock().unwrap().push(format!("{ns} {digest}"));
        Box::pin(async { Ok(()) })
    }
    fn delete<'a>(&'a self, ns: &'a str, uid: &'a str) -> BoxFuture<'a, Result<(), ArtifactError>> {
        self.deleted.lock().unwrap().push(format!("{ns}/{uid}"));
        Box::pin(async { Ok(()) })
    }
    fn outputs<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<Option<OutputManifest>, ArtifactError>> {
        Box::pin(async { Ok(self.outputs.as_ref().map(|(m, _)| m.clone())) })
    }
    fn output_file<'a>(&'a self, _: &'a str, _: &'a str, path: &'a str) -> BoxFuture<'a, Result<Vec<u8>, ArtifactError>> {
        Box::pin(async move {
            self.outputs.as_ref().and_then(|(_, f)| f.get(path).cloned()).ok_or_else(|| ArtifactError::Refused {
                what: path.into(),
                status: 404,
                code: None,
                body: String::new(),
            })
        })
    }
}

/// What the build's upload sidecar stores for build `uid`: exit `exit`.
fn build_outputs(uid: &str, exit: i32) -> (OutputManifest, BTreeMap<String, Vec<u8>>) {
    let result = json!({ "exitCode": exit, "signal": null, "timedOut": false, "durationMs": 900, "stdoutBytes": 10, "stderrBytes": 60 });
    let report = json!({ "lockDigest": LOCK, "python": true, "node": false,
                         "dependencies": [{ "ecosystem": "pypi", "name": "tinypkg", "version": "1.0", "purl": "pkg:pypi/tinypkg@1.0" }],
                         "lifecycleScripts": [] });
    let mut files = BTreeMap::new();
    files.insert("result/result.json".to_string(), serde_json::to_vec(&result).unwrap());
    files.insert("result/stderr".to_string(), b"ERROR: no wheel of sdistonly==1.0 on the index: refused\n".to_vec());
    files.insert("work/deps-report.json".to_string(), serde_json::to_vec(&report).unwrap());
    files.insert("work/deps/python/tinypkg/__init__.py".to_string(), b"VALUE = 1\n".to_vec());
    let manifest = OutputManifest {
        schema_version: 1,
        namespace: "skill-system".into(),
        uid: uid.into(),
        complete: true,
        files: files
            .iter()
            .map(|(p, b)| SetFile { path: p.clone(), size: b.len() as u64, digest: crate::artifacts::sha256_digest(b) })
            .collect(),
        skipped: vec![],
        skipped_omitted: 0,
    };
    (manifest, files)
}

/// The package archive the resolver hands out, under the pinned digest.
struct PinnedPackage;
impl PackageResolver for PinnedPackage {
    fn fetch<'a>(
        &'a self,
        source: &'a crate::api::package::OciSource,
    ) -> BoxFuture<'a, Result<FetchedPackage, crate::controller::context::ResolveError>> {
        Box::pin(async move {
            assert!(source.reference.ends_with("@sha256:abc"), "fetched by the pinned digest: {}", source.reference);
            Ok(FetchedPackage { digest: "sha256:abc".into(), archive: vec![1, 2, 3] })
        })
    }
}

fn prepare_context(artifacts: FakeArtifacts) -> (Arc<Context>, Handle, Arc<FakeImages>, Arc<FakeArtifacts>) {
    let (plain, handle) = context();
    let images = Arc::new(FakeImages::default());
    let artifacts = Arc::new(artifacts);
    let mut config = (*plain.config).clone();
    config.prepare = PrepareConfig {
        repository: Some("127.0.0.1:5000/prepared".into()),
        build_namespace: "skill-system".into(),
        build_platform: crate::image::Platform::linux("amd64"),
        ..Default::default()
    };
    let ctx = Context {
        config: Arc::new(config),
        resolver: Arc::new(PinnedPackage),
        artifacts: artifacts.clone(),
        images: images.clone(),
        ..(*plain).clone()
    };
    (Arc::new(ctx), handle, images, artifacts)
}

/// A resolved, valid package asking for preparation (`deps`: it has a requirements.txt).
fn prepared_package(deps: bool) -> SkillPackage {
    let ready = json!([
        { "type": "Resolved", "status": "True", "reason": "Resolved", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1 },
        { "type": "Validated", "status": "True", "reason": "Validated", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1 },
        { "type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1 }
    ]);
    serde_json::from_value(json!({
        "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage",
        "metadata": { "name": "weather-1", "uid": PKG_UID, "generation": 1, "finalizers": [crate::controller::package::FINALIZER] },
        "spec": { "source": { "oci": { "reference": "r/weather:1" } },
                  "runtime": { "interpreter": "python", "image": "127.0.0.1:5000/runtime:trixie", "prepare": true,
                               "dependencies": { "pipIndexUrl": "http://10.88.0.1:8999/simple" },
                               "allowedScripts": ["scripts/forecast.py"] } },
        "status": { "digest": "sha256:abc", "skillName": "weather", "observedGeneration": 1, "requirements": "requirements.txt",
                    "dependencies": if deps { json!({ "lockDigest": LOCK, "python": true, "node": false }) } else { json!({}) },
                    "scripts": [{ "script": "scripts/forecast.py", "interpreter": "python", "env": [], "timeoutSeconds": 30, "allowed": true }],
                    "problems": [], "conditions": ready }
    }))
    .unwrap()
}

fn build_name(pkg: &SkillPackage) -> (String, String) {
    let cfg = PrepareConfig {
        repository: Some("127.0.0.1:5000/prepared".into()),
        build_namespace: "skill-system".into(),
        build_platform: crate::image::Platform::linux("amd64"),
        ..Default::default()
    };
    let w = crate::controller::prepare::plan::wanted(pkg, pkg.status.as_ref().unwrap(), &cfg).unwrap();
    let b = w.build.unwrap();
    (b.name, b.uid)
}

/// The build Job as the API server would hold it, in `state`.
fn build_job_object(name: &str, state: &str) -> Value {
    let status = match state {
        "running" => json!({ "active": 1 }),
        "complete" => json!({ "succeeded": 1, "conditions": [{ "type": "Complete", "status": "True" }] }),
        _ => {
            json!({ "failed": 1, "conditions": [{ "type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "build exited 1" }] })
        }
    };
    json!({ "apiVersion": "batch/v1", "kind": "Job",
            "metadata": { "name": name, "namespace": "skill-system", "uid": "77777777-0000-0000-0000-000000000000",
                          "labels": { "skill-operator.dev/build": name },
                          "ownerReferences": [{ "apiVersion": "skill-operator.dev/v1alpha1", "kind": "SkillPackage", "name": "weather-1",
                                                "uid": PKG_UID, "controller": true }] },
            "spec": { "template": { "spec": { "containers": [{ "name": "build", "image": BASE_PINNED }] } } },
            "status": status })
}

fn conflict() -> Response<Body> {
    let status =
        json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409, "message": "exists" });
    Response::builder().status(409).body(Body::from(serde_json::to_vec(&status).unwrap())).unwrap()
}

fn package_patched(body: Value) -> Response<Body> {
    let mut obj = serde_json::to_value(prepared_package(true)).unwrap();
    obj["status"] = body["status"].clone();
    ok(obj)
}

const STATUS_PATH: &str = "/apis/skill-operator.dev/v1alpha1/skillpackages/weather-1/status";

fn condition(status: &Value, t: &str) -> (String, String, String) {
    let c = status["conditions"].as_array().unwrap().iter().find(|c| c["type"] == t).unwrap_or_else(|| panic!("no {t}"));
    (c["status"].as_str().unwrap().into(), c["reason"].as_str().unwrap().into(), c["message"].as_str().unwrap().into())
}

#[tokio::test]
async fn the_first_step_pins_the_base_stages_the_package_and_creates_the_build_once() {
    let (ctx, mut handle, images, artifacts) = prepare_context(FakeArtifacts::default());
    let pkg = prepared_package(true);
    let (name, uid) = build_name(&pkg);
    let server = tokio::spawn(async move {
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/skill-system/jobs/{name}"), |_| not_found()).await;
        let sa = expect(&mut handle, "PATCH", "/api/v1/namespaces/skill-system/serviceaccounts/skill-operator-build", ok).await;
        assert_eq!(sa["automountServiceAccountToken"], false);
        let job = expect(&mut handle, "POST", "/apis/batch/v1/namespaces/skill-system/jobs", |b| {
            let mut b = b;
            b["metadata"]["uid"] = json!("77777777-0000-0000-0000-000000000000");
            ok(b)
        })
        .await;
        let job: Job = serde_json::from_value(job).unwrap();
        assert_eq!(job.metadata.name.as_deref(), Some(name.as_str()));
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert!(crate::controller::builders::pod_security::restricted_violations(&pod).is_empty());
        assert!(crate::controller::builders::pod_security::hardening_violations(&pod).is_empty());
        let build = pod.containers.iter().find(|c| c.name == "build").unwrap();
        assert_eq!(build.image.as_deref(), Some(BASE_PINNED), "the build runs in the pinned base");
        let cmd = build.command.clone().unwrap();
        assert!(cmd.windows(2).any(|w| w == ["--index-url", "http://10.88.0.1:8999/simple"]));
        assert!(cmd.windows(2).any(|w| w == ["--trusted-host", "10.88.0.1"]));
        assert!(cmd.contains(&"--refuse-lifecycle-scripts".to_string()));
        // The policy before the Secret: the pod cannot start before its policy exists.
        let policy = expect(&mut handle, "POST", "/apis/networking.k8s.io/v1/namespaces/skill-system/networkpolicies", ok).await;
        assert_eq!(policy["metadata"]["ownerReferences"][0]["kind"], "Job");
        let egress = policy["spec"]["egress"].as_array().unwrap();
        assert_eq!(egress.len(), 2, "the artifact endpoint and the index, nothing else: {egress:?}");
        assert_eq!(egress[1]["to"][0]["ipBlock"]["cidr"], "10.88.0.1/32");
        assert_eq!(egress[1]["ports"][0]["port"], 8999);
        let secret = expect(&mut handle, "POST", "/api/v1/namespaces/skill-system/secrets", ok).await;
        assert_eq!(secret["stringData"]["token"], crate::core::token::job_token(b"test-key", "skill-system", &uid));
        let status = expect(&mut handle, "PATCH", STATUS_PATH, package_patched).await;
        let s = &status["status"];
        assert_eq!(condition(s, "Preparing").0, "True");
        assert_eq!(condition(s, "Ready").1, "Preparing", "not ready while the image is made");
        assert_eq!(s["preparation"]["buildJob"], format!("skill-system/{name}"));
        assert_eq!(s["preparation"]["pinnedBase"], BASE_PINNED);
        no_more_calls(&mut handle).await;
    });
    package::reconcile(Arc::new(pkg), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    assert_eq!(images.pins.load(Ordering::SeqCst), 1);
    assert_eq!(images.composes.load(Ordering::SeqCst), 0);
    assert_eq!(artifacts.staged.lock().unwrap().clone(), vec![format!("skill-system/{}", build_name(&prepared_package(true)).1)]);
}

#[tokio::test]
async fn a_restarted_controller_finds_the_running_build_and_creates_no_second_one() {
    let (ctx, mut handle, images, artifacts) = prepare_context(FakeArtifacts::default());
    let pkg = prepared_package(true);
    let (name, _) = build_name(&pkg);
    let server = tokio::spawn(async move {
        let n = name.clone();
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/skill-system/jobs/{name}"), move |_| {
            ok(build_job_object(&n, "running"))
        })
        .await;
        // Children are re-made if a stop came between two creates; 409 is "there".
        expect(&mut handle, "POST", "/apis/networking.k8s.io/v1/namespaces/skill-system/networkpolicies", |_| conflict()).await;
        expect(&mut handle, "POST", "/api/v1/namespaces/skill-system/secrets", |_| conflict()).await;
        let status = expect(&mut handle, "PATCH", STATUS_PATH, package_patched).await;
        assert_eq!(condition(&status["status"], "Preparing").1, "Building");
        // No POST of a Job may follow.
        no_more_calls(&mut handle).await;
    });
    package::reconcile(Arc::new(pkg), ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    assert_eq!(images.pins.load(Ordering::SeqCst), 0, "the running build's base is read from its Job");
    assert!(artifacts.staged.lock().unwrap().is_empty(), "nothing staged twice");
}

#[tokio::test]
async fn a_finished_build_is_composed_once_cleaned_up_and_then_left_alone() {
    let pkg = prepared_package(true);
    let (name, uid) = build_name(&pkg);
    let (ctx, mut handle, images, artifacts) =
        prepare_context(FakeArtifacts { outputs: Some(build_outputs(&uid, 0)), ..Default::default() });
    let n = name.clone();
    let server = tokio::spawn(async move {
        let n2 = n.clone();
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/skill-system/jobs/{n}"), move |_| {
            ok(build_job_object(&n2, "complete"))
        })
        .await;
        expect(&mut handle, "DELETE", &format!("/apis/batch/v1/namespaces/skill-system/jobs/{n}"), ok).await;
        let status = expect(&mut handle, "PATCH", STATUS_PATH, package_patched).await;
        no_more_calls(&mut handle).await;
        status
    });
    package::reconcile(Arc::new(pkg), ctx).await.expect("reconcile");
    let status = tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    let s = &status["status"];
    assert_eq!(s["image"], IMAGE);
    assert_eq!(s["imageMode"], "composed");
    assert_eq!(s["baseImage"], BASE_PINNED);
    assert_eq!(s["lockDigest"], LOCK);
    assert_eq!(s["sbomDigest"], "sha256:3333333333333333333333333333333333333333333333333333333333333333");
    assert_eq!(s["preparation"]["env"], json!(["PYTHONPATH=/deps/python"]));
    assert_eq!(s["preparation"]["preparedKey"], s["preparation"]["key"]);
    assert_eq!(condition(s, "Prepared").0, "True");
    assert_eq!(condition(s, "Ready").0, "True");
    assert_eq!(images.composes.load(Ordering::SeqCst), 1);
    assert_eq!(images.seen.lock().unwrap().clone(), vec![(BASE_PINNED.to_string(), true)], "composed on the build's base with its tree");
    assert_eq!(artifacts.deleted.lock().unwrap().clone(), vec![format!("skill-system/{uid}")]);

    // The next reconcile (the Job's deletion wakes it) finds the image prepared: no call, no compose.
    let mut again = prepared_package(true);
    again.status = Some(serde_json::from_value(s.clone()).unwrap());
    let (ctx2, mut handle2, images2, _) = prepare_context(FakeArtifacts::default());
    let server = tokio::spawn(async move { no_more_calls(&mut handle2).await });
    package::reconcile(Arc::new(again), ctx2).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
    assert_eq!(images2.composes.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_failed_build_records_why_and_keeps_the_last_good_image() {
    let mut pkg = prepared_package(true);
    {
        let s = pkg.status.as_mut().unwrap();
        s.image = Some(OLD_IMAGE.into());
        s.image_mode = Some(crate::api::package::ImageMode::Composed);
    }
    let (name, uid) = build_name(&pkg);
    let (ctx, mut handle, images, _) = prepare_context(FakeArtifacts { outputs: Some(build_outputs(&uid, 1)), ..Default::default() });
    let server = tokio::spawn(async move {
        let n = name.clone();
        expect(&mut handle, "GET", &format!("/apis/batch/v1/namespaces/skill-system/jobs/{name}"), move |_| {
            ok(build_job_object(&n, "failed"))
        })
        .await;
        let status = expect(&mut handle, "PATCH", STATUS_PATH, package_patched).await;
        no_more_calls(&mut handle).await;
        status
    });
    package::reconcile(Arc::new(pkg), ctx).await.expect("reconcile");
    let status = tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    let s = &status["status"];
    let (failed, reason, message) = condition(s, "PreparationFailed");
    assert_eq!((failed.as_str(), reason.as_str()), ("True", "NoWheel"));
    assert!(
        message.contains("exited 1") && message.contains("--- build log (tail) ---") && message.contains("no wheel of sdistonly"),
        "{message}"
    );
    assert_eq!(s["image"], OLD_IMAGE, "the last good image is kept");
    assert_eq!(condition(s, "Ready").1, "PreparationFailed");
    assert!(s["preparation"]["failedAttempt"].as_str().is_some());
    assert_eq!(images.composes.load(Ordering::SeqCst), 0);

    // The same attempt again: the failure stands, nothing is asked of anyone.
    let mut again = prepared_package(true);
    again.status = Some(serde_json::from_value(s.clone()).unwrap());
    let (ctx2, mut handle2, images2, artifacts2) = prepare_context(FakeArtifacts::default());
    let server = tokio::spawn(async move { no_more_calls(&mut handle2).await });
    package::reconcile(Arc::new(again), ctx2).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(15), server).await.unwrap().unwrap();
    assert_eq!(images2.pins.load(Ordering::SeqCst) + images2.composes.load(Ordering::SeqCst), 0);
    assert!(artifacts2.staged.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_package_without_dependencies_is_composed_with_no_job() {
    let (ctx, mut handle, images, artifacts) = prepare_context(FakeArtifacts::default());
    let pkg = prepared_package(false);
    let server = tokio::spawn(async move {
        let status = expect(&mut handle, "PATCH", STATUS_PATH, package_patched).await;
        no_more_calls(&mut handle).await;
        status
    });
    package::reconcile(Arc::new(pkg), ctx).await.expect("reconcile");
    let status = tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    assert_eq!(status["status"]["image"], IMAGE);
    assert_eq!(condition(&status["status"], "Prepared").0, "True");
    assert_eq!(images.composes.load(Ordering::SeqCst), 1);
    assert_eq!(images.seen.lock().unwrap()[0], ("127.0.0.1:5000/runtime:trixie".to_string(), false), "composed on the base as configured");
    assert!(artifacts.staged.lock().unwrap().is_empty());
}

/// A package prepared for its current profile, as the reconciler leaves it.
fn prepared_package_value() -> Value {
    let mut p = package();
    p["metadata"]["generation"] = json!(1);
    p["spec"]["runtime"]["prepare"] = json!(true);
    let s = &mut p["status"];
    s["image"] = json!(IMAGE);
    s["imageMode"] = json!("composed");
    s["baseImage"] = json!(BASE_PINNED);
    s["preparation"] =
        json!({ "key": "sha256:k", "preparedKey": "sha256:k", "packageDigest": PACKAGE_DIGEST, "env": ["PYTHONPATH=/deps/python"] });
    s["conditions"] = json!([
        { "type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1 },
        { "type": "Prepared", "status": "True", "reason": "Prepared", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1 }
    ]);
    p
}

#[tokio::test]
async fn a_skilljob_of_a_prepared_package_runs_from_its_image_and_stages_no_package() {
    let (ctx, mut handle, images, artifacts) = prepare_context(FakeArtifacts::default());
    let job = Arc::new(skilljob());
    let server = tokio::spawn(async move {
        expect(&mut handle, "GET", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skillbindings/weather", |_| ok(binding())).await;
        expect(&mut handle, "GET", "/apis/skill-operator.dev/v1alpha1/skillpackages/weather-1", |_| ok(prepared_package_value())).await;
        expect_restricted_namespace(&mut handle).await;
        expect_term_list(&mut handle, &[(UID, "41")]).await;
        expect(&mut handle, "PATCH", "/api/v1/namespaces/team/serviceaccounts/skill-operator-run", ok).await;
        expect(&mut handle, "PATCH", "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies/skill-operator-runs", ok).await;
        let created = expect(&mut handle, "POST", "/apis/batch/v1/namespaces/team/jobs", ok).await;
        let job: Job = serde_json::from_value(created).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert!(crate::controller::builders::pod_security::restricted_violations(&pod).is_empty());
        let run = pod.containers.iter().find(|c| c.name == "run").unwrap();
        assert_eq!(run.image.as_deref(), Some(IMAGE), "runs by the prepared digest");
        let cmd = run.command.clone().unwrap();
        assert!(cmd.contains(&"/skill/scripts/forecast.py".to_string()), "{cmd:?}");
        assert!(cmd.windows(2).any(|w| w == ["--allow-env", "PYTHONPATH"]), "the image's PYTHONPATH reaches the script: {cmd:?}");
        let fetch = pod.init_containers.as_ref().unwrap().iter().find(|c| c.name == "fetch").unwrap();
        assert!(!fetch.command.clone().unwrap().contains(&"--package".to_string()), "no package fetch");
        assert!(pod.volumes.unwrap().iter().all(|v| v.name != "package"));
        expect(&mut handle, "PATCH", "/apis/skill-operator.dev/v1alpha1/namespaces/team/skilljobs/report/status", patched).await;
    });
    skilljob::reconcile(job, ctx).await.expect("reconcile");
    tokio::time::timeout(Duration::from_secs(5), server).await.unwrap().unwrap();
    assert!(artifacts.staged.lock().unwrap().is_empty(), "a prepared package is not staged");
    assert_eq!(images.checks.load(Ordering::SeqCst), 1, "the image's package annotation is checked before the run");
}
